"""The coordinator's operational endpoints: its health status and its optional metrics.

`coordinator serve` opens them before the federation service (so a probe sees NOT_SERVING
while it starts) and may keep them up a moment after the federation ends (`--linger`): the
process exits at the end, and a Prometheus that scrapes every 15 s would otherwise never see the
last round.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from trellis.coordinator.serving.health import FederationHealth, serve_plain
from trellis.coordinator.serving.metrics import CoordinatorMetrics
from trellis.protos.exposition import MetricsEndpoint, parse_listen, serve_metrics


@dataclass
class Endpoints:
    """The health status (always served on the mTLS port) and what else was asked for."""

    health: FederationHealth
    plain_health: grpc.Server | None = None
    metrics: CoordinatorMetrics | None = None
    metrics_endpoint: MetricsEndpoint | None = None

    def linger(self, seconds: float, sleep: Callable[[float], None] = time.sleep) -> None:
        """Keep the plain health port and the metrics up for seconds, then close them."""
        if seconds > 0 and (self.plain_health is not None or self.metrics_endpoint is not None):
            sleep(seconds)
        self.close()

    def close(self) -> None:
        """Stop the plain health server and the metrics endpoint."""
        self.health.ended()
        if self.plain_health is not None:
            self.plain_health.stop(0)
            self.plain_health = None
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.stop()
            self.metrics_endpoint = None


def open_endpoints(health_listen: str | None, metrics_listen: str | None, *,
                   per_job: bool = False) -> Endpoints:
    """Start the plain health port and the metrics endpoint that were asked for (both address
    values are checked before either starts); per_job: a standing coordinator's metrics."""
    for option, address in (("--health-listen", health_listen),
                            ("--metrics-listen", metrics_listen)):
        if address is not None:
            parse_listen(option, address)
    endpoints = Endpoints(FederationHealth())
    try:
        if health_listen is not None:
            endpoints.plain_health = serve_plain(endpoints.health, health_listen)
        if metrics_listen is not None:
            endpoints.metrics = CoordinatorMetrics(per_job=per_job)
            endpoints.metrics_endpoint = serve_metrics(metrics_listen, endpoints.metrics.registry)
    except BaseException:
        endpoints.close()
        raise
    return endpoints
