"""The standard gRPC health service (grpc.health.v1) of the coordinator, for probes.

NOT_SERVING until the plan is loaded, the CA and the server identity checked and the federation
service started; SERVING while the federation runs; NOT_SERVING once it has ended or the
coordinator stops, for good. The same status is served on the mTLS port (a probe presents a
certificate of the federation's CA) and, with `--health-listen`, on a plain-text port that
serves nothing else: Kubernetes' gRPC probe and compose health checks cannot present a client
certificate. That port must stay inside the pod or host network. The mTLS port is an asyncio server
(coordinator/serving/service.py): it answers from the same status through an asyncio servicer.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from trellis.coordinator.state.exclusive import PortInUse, check_port_free
from trellis.protos.exposition import EndpointError, parse_listen

FEDERATION_SERVICE = "trellis.v1.Federation"
SERVICES = ("", FEDERATION_SERVICE)     # "" is the whole server, as probes ask by default


class FederationHealth:
    """The health status of one coordinator, shared by every server that serves it."""

    def __init__(self) -> None:
        self.servicer = health.HealthServicer()
        self._lock = threading.Lock()
        self._status: dict[str, int] = {}
        self._ended = False
        self._changed: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._set(health_pb2.HealthCheckResponse.NOT_SERVING)

    def add_to(self, server: grpc.Server) -> None:
        """Serve this status (grpc.health.v1.Health) on server."""
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    def add_to_aio(self, server: grpc.aio.Server) -> None:
        """Serve this status on an asyncio server."""
        health_pb2_grpc.add_HealthServicer_to_server(_AioHealth(self), server)

    def serving(self) -> None:
        """The federation service is up: silos may join."""
        self._set(health_pb2.HealthCheckResponse.SERVING)

    def ended(self) -> None:
        """The federation ended or the coordinator stops: NOT_SERVING from now on."""
        self.servicer.enter_graceful_shutdown()
        self._set(health_pb2.HealthCheckResponse.NOT_SERVING)
        with self._lock:
            self._ended = True

    def status(self, service: str) -> int | None:
        """The status of service now (None: not a service this coordinator serves)."""
        with self._lock:
            return self._status.get(service)

    def _set(self, status: int) -> None:
        with self._lock:
            if self._ended:
                return
            for service in SERVICES:
                self.servicer.set(service, status)
                self._status[service] = status
            changed, self._changed = self._changed, []
        for loop, event in changed:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:
                pass        # that server's loop has closed

    def _next_change(self) -> asyncio.Event:
        """An event set on the calling loop at the next change of status."""
        event = asyncio.Event()
        with self._lock:
            self._changed.append((asyncio.get_running_loop(), event))
        return event


class _AioHealth(health_pb2_grpc.HealthServicer):
    """grpc.health.v1.Health on an asyncio server, answered from a FederationHealth."""

    def __init__(self, status: FederationHealth) -> None:
        self.status = status

    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        status = self.status.status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND)
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext  # type: ignore[override]
                    ) -> AsyncIterator[Any]:
        last = None
        while True:
            changed = self.status._next_change()
            status = self.status.status(request.service)
            if status is None:
                status = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            if status != last:
                last = status
                yield health_pb2.HealthCheckResponse(status=status)
            await changed.wait()


def serve_plain(status: FederationHealth, address: str) -> grpc.Server:
    """Start a plain-text gRPC server at address that serves only the health status."""
    parse_listen("--health-listen", address)
    try:
        check_port_free(address)        # gRPC would log its own bind failure first
    except PortInUse:
        raise EndpointError(f"--health-listen {address}: cannot listen there (the port is in "
                            "use or the address is not this machine's); choose another") from None
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.so_reuseport", 0)])
    status.add_to(server)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if port == 0:
        raise EndpointError(f"--health-listen {address}: cannot listen there (the port is in "
                            "use or the address is not this machine's); choose another")
    server.start()
    return server


class HealthUnreachable(Exception):
    """No health status could be read at the address."""


def probe(address: str, timeout_s: float = 3.0) -> str:
    """The status (SERVING, NOT_SERVING, ...) a plain health port reports for the whole server."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.RpcError as exc:
            raise HealthUnreachable(f"no health status at {address}: {exc.code().name} "
                                    f"{exc.details()}") from None
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
