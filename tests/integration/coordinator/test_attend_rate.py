"""Attend past a silo's rate: a real server over real TLS, its clock in the test's hands."""

from __future__ import annotations

import json

import grpc
import pytest

from tests.support.federation import make_workspace, write_plan
from trellis.coordinator.serving.attend_rate import BURST, REFILL_S
from trellis.coordinator.serving.service import start_server
from trellis.crypto.pki import load_identity
from trellis.protos import codec
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos.messages import PROTOCOL_VERSION, Envelope, Phase
from trellis.protos.plan import load_plan

FLOOD = 60


class ManualClock:
    """The coordinator's clock: it moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _attend(stub: pb_grpc.FederationStub) -> grpc.RpcError | Phase:
    """Open a control stream, read its first instruction, close it."""
    stream = stub.Attend(codec.attend_request(Envelope("", 0, 0, Phase.JOIN), PROTOCOL_VERSION),
                         timeout=10)
    try:
        return codec.instruction_from_pb(next(stream)).envelope.phase
    except grpc.RpcError as exc:
        return exc
    finally:
        stream.cancel()


@pytest.mark.parametrize("reconnect_after_s", [REFILL_S, 10 * REFILL_S])
def test_a_flood_of_attends_writes_a_bounded_number_of_audit_records(
        tmp_path_factory: pytest.TempPathFactory, reconnect_after_s: float) -> None:
    """Before, every Attend was taken: 600 of them wrote 2,400 audit records."""
    ws = make_workspace(tmp_path_factory.mktemp("flood"), graphs=20)
    plan = load_plan(write_plan(ws, "flood", port=0, algorithm="fedavg", min_silos=2))
    clock = ManualClock()
    running = start_server(plan, clock=clock, progress=False, listen="127.0.0.1:0")
    ident = load_identity(ws.identity("hospital-a"))
    credentials = grpc.ssl_channel_credentials(root_certificates=ident.ca_pem,
                                               private_key=ident.key_pem,
                                               certificate_chain=ident.cert_pem)
    try:
        with grpc.secure_channel(f"127.0.0.1:{running.port}", credentials) as channel:
            stub = pb_grpc.FederationStub(channel)
            flood = [_attend(stub) for _ in range(FLOOD)]
            clock.now += reconnect_after_s        # the silo reconnects later, as usual
            again = _attend(stub)
    finally:
        running.stop(0)
    assert flood[:BURST] == [Phase.JOIN] * BURST
    refused = flood[BURST:]
    assert all(isinstance(r, grpc.RpcError) for r in refused), refused
    codes = {r.code() for r in refused}
    assert codes == {grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert "'hospital-a' opened its control stream (Attend) more than" in refused[0].details()
    assert f"attend again in {REFILL_S:.0f} s" in refused[0].details()
    assert again is Phase.JOIN, again             # a normal reconnect still works
    records = [json.loads(line) for line in
               (plan.server.state_dir / "audit.jsonl").read_text().splitlines()]
    about_hospital_a = [r for r in records if "hospital-a" in (r.get("silo"), r.get("subject"))]
    # Four records for each stream taken (connected, joined; disconnected, left) and one for
    # the run of refusals, whatever the flood's length.
    assert len(about_hospital_a) <= 4 * (BURST + 1) + 1, len(about_hospital_a)
    refusals = [r for r in records if r["event"] == "refused"]
    assert [(r["subject"], r["reason"]) for r in refusals] == [("hospital-a",
                                                                "too many reconnects")]
