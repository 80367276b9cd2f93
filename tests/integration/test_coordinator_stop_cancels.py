"""A coordinator that stops cancels its silos' calls in flight (CANCELLED): the silo retries as
for UNAVAILABLE, and does not give up on the federation (seen in `make deploy-check`: a silo
ended with "lost the coordinator: CANCELLED" when the coordinator was stopped for a restart, and
the restarted federation waited for it for ever)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from trellis.crypto.pki import Identity, init_ca, load_identity, request_identity, sign_request
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.silo.federation.agent import SiloAgent, SiloRefused
from trellis.silo.federation.session import SiloSession


class _StoppingThenRefusing(pb_grpc.FederationServicer):
    """Cancels the first Attend (a coordinator shutting down), refuses the next (ends the test)."""

    def __init__(self) -> None:
        self.attends = 0

    def Attend(self, request, context):  # type: ignore[no-untyped-def]
        self.attends += 1
        if self.attends == 1:
            context.abort(grpc.StatusCode.CANCELLED, "server shutting down")
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "second attend: refused to end here")


@pytest.fixture
def ids(tmp_path: Path) -> dict[str, Identity]:
    init_ca(tmp_path / "ca", ["127.0.0.1", "localhost"])
    sign_request(request_identity("hospital-a", tmp_path / "hospital-a"), tmp_path / "ca")
    return {"hospital-a": load_identity(tmp_path / "hospital-a"),
            "server": Identity("server", (tmp_path / "ca" / "server.key").read_bytes(),
                               (tmp_path / "ca" / "server.crt").read_bytes(),
                               (tmp_path / "ca" / "ca.crt").read_bytes())}


@pytest.fixture
def server(ids: dict[str, Identity]) -> Iterator[tuple[int, _StoppingThenRefusing]]:
    servicer = _StoppingThenRefusing()
    grpc_server = grpc.server(futures.ThreadPoolExecutor(2))
    pb_grpc.add_FederationServicer_to_server(servicer, grpc_server)
    ident = ids["server"]
    port = grpc_server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(
        [(ident.key_pem, ident.cert_pem)], root_certificates=ident.ca_pem,
        require_client_auth=True))
    grpc_server.start()
    yield port, servicer
    grpc_server.stop(0)


def test_a_cancelled_attend_is_retried(ids: dict[str, Identity], server: tuple,
                                       tmp_path: Path) -> None:
    port, servicer = server
    ident = ids["hospital-a"]
    lines: list[str] = []
    agent = SiloAgent(f"127.0.0.1:{port}", ident, SiloSession(ident, lambda plan: None),
                      tmp_path / "state", connect_timeout_s=30, log=lines.append,
                      sleep=lambda s: None)
    with pytest.raises(SiloRefused, match="second attend"):
        agent.run()
    assert servicer.attends == 2
    assert any("retrying" in line and "shutting down" in line for line in lines), lines
