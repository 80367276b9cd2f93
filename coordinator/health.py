"""The standard gRPC health service (grpc.health.v1) of the coordinator, for probes.

NOT_SERVING until the plan is loaded, the CA and the server identity checked and the federation
service started; SERVING while the federation runs; NOT_SERVING once it has ended or the
coordinator stops, for good. The same status is served on the mTLS port (a probe presents a
certificate of the federation's CA) and, with `--health-listen`, on a plain-text port that
serves nothing else: Kubernetes' gRPC probe and compose health checks cannot present a client
certificate. That port must stay inside the pod or host network.
"""

from __future__ import annotations

from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from trellis.coordinator.exclusive import PortInUse, check_port_free
from trellis.protos.exposition import EndpointError, parse_listen

FEDERATION_SERVICE = "trellis.v1.Federation"
SERVICES = ("", FEDERATION_SERVICE)     # "" is the whole server, as probes ask by default


class FederationHealth:
    """The health status of one coordinator, shared by every server that serves it."""

    def __init__(self) -> None:
        self.servicer = health.HealthServicer()
        for service in SERVICES:
            self.servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)

    def add_to(self, server: grpc.Server) -> None:
        """Serve this status (grpc.health.v1.Health) on server."""
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    def serving(self) -> None:
        """The federation service is up: silos may join."""
        for service in SERVICES:
            self.servicer.set(service, health_pb2.HealthCheckResponse.SERVING)

    def ended(self) -> None:
        """The federation ended or the coordinator stops: NOT_SERVING from now on."""
        self.servicer.enter_graceful_shutdown()


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
