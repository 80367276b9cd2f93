"""The coordinator's gRPC health status through a real start, run and stop, in one process.

A real `coordinator serve` process starts in milliseconds, too fast to catch NOT_SERVING before
it is ready; here the plain health port is opened first, as the CLI does, and start_server is
called by the test, so every transition is seen (tests/e2e/test_observability.py checks the
serving process).
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.federation import free_port, make_workspace, write_plan
from trellis.coordinator.serving.observability import open_endpoints
from trellis.coordinator.serving.service import start_server
from trellis.crypto.pki import load_identity
from trellis.protos.plan import load_plan

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _check(channel: grpc.Channel, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def test_not_serving_until_started_serving_while_running_not_serving_once_stopped(
        tmp_path) -> None:
    ws = make_workspace(tmp_path, graphs=20)
    plan = load_plan(write_plan(ws, "health", port=0))
    address = f"127.0.0.1:{free_port()}"
    endpoints = open_endpoints(address, None)
    plain = grpc.insecure_channel(address)
    try:
        assert _check(plain) == NOT_SERVING                   # the plan is not served yet
        assert _check(plain, "trellis.v1.Federation") == NOT_SERVING
        running = start_server(plan, progress=False, listen="127.0.0.1:0",
                               health=endpoints.health)
        silo = load_identity(ws.identity("hospital-a"))
        creds = grpc.ssl_channel_credentials(root_certificates=silo.ca_pem,
                                             private_key=silo.key_pem,
                                             certificate_chain=silo.cert_pem)
        with grpc.secure_channel(f"127.0.0.1:{running.port}", creds) as secure:
            for channel in (plain, secure):
                assert _check(channel) == SERVING
                assert _check(channel, "trellis.v1.Federation") == SERVING
        running.stop(0)
        assert _check(plain) == NOT_SERVING
        assert _check(plain, "trellis.v1.Federation") == NOT_SERVING
    finally:
        plain.close()
        endpoints.close()
