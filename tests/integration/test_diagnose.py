"""A silo's diagnosis of a server that is no coordinator: real gRPC servers over real TLS."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from datetime import UTC, datetime

import grpc
import pytest

from tests.support.certs import identity_valid_from
from trellis.crypto.pki import (
    Identity,
    init_ca,
    issue_operator,
    load_identity,
    request_identity,
    sign_request,
)
from trellis.silo.federation.diagnose import diagnose


@pytest.fixture(scope="module")
def ids(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Identity]:
    root = tmp_path_factory.mktemp("diagnose")
    init_ca(root / "ca", ["127.0.0.1", "localhost"])
    sign_request(request_identity("hospital-a", root / "hospital-a"), root / "ca")
    sign_request(request_identity("pharma-b", root / "pharma-b"), root / "ca")
    issue_operator(root / "ca", "ops-alice", root / "ops-alice")
    # A client certificate whose name is the very host the silo dials.
    identity_valid_from(root / "ca", "localhost", root / "localhost", datetime.now(UTC), 30)
    return {p.name: load_identity(p) for p in root.iterdir() if p.name != "ca"}


@pytest.fixture
def serving(ids: dict[str, Identity]) -> Iterator[object]:
    servers: list[grpc.Server] = []

    def serve(holder: str) -> int:
        ident = ids[holder]
        server = grpc.server(futures.ThreadPoolExecutor(1))
        port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(
            [(ident.key_pem, ident.cert_pem)], root_certificates=ident.ca_pem,
            require_client_auth=True))
        server.start()
        servers.append(server)
        return port

    yield serve
    for server in servers:
        server.stop(0)


@pytest.mark.parametrize(("holder", "host", "whose"), [
    ("pharma-b", "127.0.0.1", "a silo's client certificate ('pharma-b')"),
    ("ops-alice", "127.0.0.1", "an operator's client certificate ('ops-alice')"),
    ("localhost", "localhost", "a silo's client certificate ('localhost')"),
])
def test_a_server_with_a_client_certificate_is_named_as_such_and_not_retried(
        ids: dict[str, Identity], serving, holder: str, host: str, whose: str) -> None:
    """Before, a silo dialling a server that presents a client certificate was told the names
    did not match (it names no coordinator host), or, when its name was the host dialled, was
    told nothing and retried for minutes as if the coordinator were not up yet."""
    port = serving(holder)
    found = diagnose(f"{host}:{port}", ids["hospital-a"], timeout=5)
    assert found is not None, "diagnosed as transient"
    assert found.final
    assert found.message.startswith(f"the server at {host}:{port} is not a coordinator: it "
                                    f"presents {whose}"), found.message
    assert "not a server certificate" in found.message

