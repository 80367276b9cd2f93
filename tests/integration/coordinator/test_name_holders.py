"""One live connection per silo name, over real TLS: a second certificate for a connected name
is refused (and counted), the silo connected under it stays present, and the same certificate
reconnecting (a restarted silo) still takes its stream over."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.support.federation import assert_refused, make_workspace, write_plan
from trellis.coordinator.serving.holders import NAME_IN_USE
from trellis.coordinator.serving.metrics import CoordinatorMetrics
from trellis.coordinator.serving.service import RunningServer, start_server
from trellis.crypto.certificates import certificate_fingerprint
from trellis.crypto.pki import Identity, load_identity, request_identity, sign_request
from trellis.protos import codec
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos.messages import PROTOCOL_VERSION, Envelope, Phase
from trellis.protos.plan import load_plan


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("holders")
    ws = make_workspace(root, graphs=20)
    # A second certificate for hospital-a from the federation's own CA, as a CA issued it before
    # `coordinator pki sign` refused a second one (the raw signer does not check names).
    sign_request(request_identity("hospital-a", root / "impostor"), ws.ca)
    return ws


@pytest.fixture
def running(ws) -> Iterator[tuple[RunningServer, CoordinatorMetrics]]:
    metrics = CoordinatorMetrics()
    plan = load_plan(write_plan(ws, "holders", port=0, algorithm="fedavg", min_silos=2))
    server = start_server(plan, progress=False, listen="127.0.0.1:0", metrics=metrics)
    yield server, metrics
    server.stop(0)


def _channel(port: int, ident: Identity) -> tuple[grpc.Channel, pb_grpc.FederationStub]:
    creds = grpc.ssl_channel_credentials(root_certificates=ident.ca_pem,
                                         private_key=ident.key_pem,
                                         certificate_chain=ident.cert_pem)
    channel = grpc.secure_channel(f"127.0.0.1:{port}", creds)
    return channel, pb_grpc.FederationStub(channel)


def _attend(stub: pb_grpc.FederationStub):
    """Open a control stream; return it once its first instruction (JOIN) came: it is in."""
    stream = stub.Attend(codec.attend_request(Envelope("", 0, 0, Phase.JOIN), PROTOCOL_VERSION))
    first = codec.instruction_from_pb(next(stream))
    assert first.envelope.phase is Phase.JOIN
    return stream


def test_a_second_certificate_for_a_connected_name_is_refused_and_the_first_stays_present(
        ws, running: tuple[RunningServer, CoordinatorMetrics]) -> None:
    server, metrics = running
    real = load_identity(ws.identity("hospital-a"))
    impostor = load_identity(ws.root / "impostor")
    assert impostor.name == real.name and impostor.fingerprint != real.fingerprint
    real_channel, real_stub = _channel(server.port, real)
    fake_channel, fake_stub = _channel(server.port, impostor)
    with real_channel, fake_channel:
        stream = _attend(real_stub)
        # The impostor's control stream, and any other call it makes as hospital-a.
        assert_refused(fake_stub.Attend, codec.attend_request(
            Envelope("", 0, 0, Phase.JOIN), PROTOCOL_VERSION),
            grpc.StatusCode.PERMISSION_DENIED,
            "'hospital-a' is connected with another certificate")
        assert_refused(fake_stub.FetchKeys,
                       codec.stage_request(Envelope("holders", 1, 1, Phase.KEYS_READY)),
                       grpc.StatusCode.PERMISSION_DENIED, "a second live connection under "
                       "that name is refused")
        # The real silo was never displaced: still present, with its own certificate.
        assert server.core.machine.present == {"hospital-a": real.cert_pem}
        status = server.core.status()
        assert status.connected == ("hospital-a",)
        assert [(r.subject, r.reason) for r in status.refused] == [("hospital-a", NAME_IN_USE)]
        assert metrics.registry.get_sample_value(
            "trellis_coordinator_refusals_total", {"reason": "name_in_use"}) == 2
        # The same certificate reconnecting (a restarted silo) takes the name over as before.
        again_channel, again_stub = _channel(server.port, real)
        with again_channel:
            again = _attend(again_stub)
            assert server.core.machine.present == {"hospital-a": real.cert_pem}
            again.cancel()
        stream.cancel()
    records = _audit(server)
    refused = [r for r in records if r["event"] == "refused"]
    assert [(r["subject"], r["reason"], r["certificate"], r["connected"]) for r in refused] == [
        ("hospital-a", NAME_IN_USE, impostor.fingerprint, real.fingerprint)] * 2
    connected = [r["certificate"] for r in records if r["event"] == "connected"]
    assert connected == [certificate_fingerprint(real.cert_pem)] * 2
    assert [r.get("replaced") for r in records if r["event"] == "disconnected"][:1] == [True]


def _audit(server: RunningServer) -> list[dict]:
    import json

    path = Path(server.core.plan.server.state_dir) / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]
