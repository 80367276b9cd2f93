"""FedHGN's schema privacy over a real federation (DESIGN.md §2): a coordinator process and three
silo processes over mTLS, each silo with its own, differently shaped schema of marked names.

The coordinator must see nothing of any silo's schema: no node-type or relation name in any
byte it received or stored, and no message whose size depends on a silo's number of node types
or relations. The silos must still have swapped their coefficient rows.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest
import torch

from tests.support.federation import (
    Workspace,
    assert_refused,
    drive_machine_until,
    hetero_graphs,
    hetero_sessions,
    keep_attending,
    make_hetero_workspace,
    port_of,
    schema_names,
    start_coordinator,
    start_silo,
    wait_all,
    write_hetero_plan,
)
from trellis.coordinator.rounds.machine import Stage
from trellis.coordinator.serving.capture import read_capture
from trellis.coordinator.serving.service import RunningServer, start_server
from trellis.coordinator.simulation.sequential import run_simulation
from trellis.crypto.audit import verify_audit_log
from trellis.crypto.audit_crosscheck import cross_check, read_records
from trellis.crypto.envelopes import sealed_size
from trellis.crypto.groupkey import SetupAdvert
from trellis.crypto.pki import load_identity
from trellis.protos import codec
from trellis.protos import federation_pb2 as pb
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos.messages import Envelope, Phase
from trellis.protos.plan import Plan, load_plan
from trellis.silo.data.hetero import HeteroGraph
from trellis.silo.federation.agent import SiloAgent

ROUNDS = 6
SLOTS = 8
BASES = 3          # FEDHGN_TABLE in federation_helpers
# Every schema name of the test graphs carries it; six bytes, so random ciphertext in a
# capture of megabytes does not contain it by chance (the three-byte "zq_" once matched).
MARKER = "zqxjv_"


@dataclass
class Federation:
    """A finished real FedHGN federation and where it left its traces."""

    ws: Workspace
    run: Path
    capture: Path
    graphs: dict[str, HeteroGraph]
    codes: list[int]
    plan: Plan

    @property
    def state_dir(self) -> Path:
        return self.run / "coordinator"

    def silo_audit(self, silo: str) -> list[dict]:
        return [json.loads(line) for line in (self.run / silo / "audit.jsonl").read_text()
                .splitlines() if line.strip()]


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Federation:
    ws = make_hetero_workspace(tmp_path_factory.mktemp("fedhgn-privacy"))
    plan = write_hetero_plan(ws, "hgn-real", rounds=ROUNDS, slots=SLOTS, patience=10)
    run = ws.root / "hgn-real"
    run.mkdir(exist_ok=True)
    capture = run / "capture.bin"
    coordinator = start_coordinator(plan, run / "coordinator.log", capture)
    silos = [start_silo(ws, s, port_of(plan), run / s, run / f"{s}.log") for s in ws.silos]
    codes = wait_all(silos, timeout=180)
    if codes != [0, 0, 0]:
        coordinator.kill()          # it would wait out its join timeout for them
    codes.append(wait_all([coordinator], timeout=30)[0])
    return Federation(ws, run, capture, hetero_graphs(), codes, load_plan(plan))


def _logs(fed: Federation) -> dict[str, str]:
    return {p.name: p.read_text()[-3000:] for p in fed.run.glob("*.log")}


@pytest.mark.slow
def test_real_fedhgn_federation_completes_and_both_sides_audit_logs_verify(
        federation: Federation) -> None:
    """Three silos with different schemas finish every round; every audit log verifies."""
    fed = federation
    assert fed.codes == [0] * 4, _logs(fed)
    # The schemas really differ in names and in shape.
    shapes = {s: (len(g.node_types), len(g.relations)) for s, g in fed.graphs.items()}
    assert len(set(shapes.values())) == 3, shapes
    assert all(not schema_names(a) & schema_names(b) for a in fed.graphs.values()
               for b in fed.graphs.values() if a is not b)
    results = json.loads((fed.state_dir / "results.json").read_text())
    assert results["status"] == "completed" and results["rounds_completed"] == ROUNDS
    assert set(results["final_metrics"]) == set(fed.ws.silos)
    # The processes learnt what the one-process simulation of the same plan learns.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)        # as each silo process trains
    try:
        simulated = run_simulation(fed.plan, fed.graphs, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert results["early_stopping"]["best_round"] == simulated["early_stopping"]["best_round"]
    for silo in fed.ws.silos:
        for name in ("val_acc", "test_acc"):
            real, sim = (r["final_metrics"][silo][name] for r in (results, simulated))
            assert abs(real - sim) <= 0.005, (silo, name, real, sim)
    report = verify_audit_log(fed.state_dir / "audit.jsonl",
                              cert_pem=(fed.ws.ca / "server.crt").read_bytes())
    assert report.ok and report.closed, report.problems
    for silo in fed.ws.silos:
        cert = (fed.ws.identity(silo) / f"{silo}.crt").read_bytes()
        report = verify_audit_log(fed.run / silo / "audit.jsonl", cert_pem=cert)
        assert report.ok and report.closed, report.problems
        # Its sealed envelopes and masked inputs are the ones the coordinator logged receiving.
        checked = cross_check(read_records(fed.run / silo / "audit.jsonl"),
                              read_records(fed.state_dir / "audit.jsonl"))
        assert checked.ok, [d.describe() for d in checked.discrepancies] + checked.problems
        events = [r["event"] for _, r in read_records(fed.run / silo / "audit.jsonl")]
        assert "sent_envelope" in events
        assert checked.matched == sum(events.count(e) for e in (
            "sent_tensor", "sent_envelope", "sealed_group_secrets"))


def _forms(name: str) -> list[bytes]:
    """The byte forms a name could take in a file or message: UTF-8 and JSON-escaped."""
    return sorted({name.encode(), json.dumps(name).encode(), json.dumps(name)[1:-1].encode()})


def _leaks(data: bytes, names: set[str]) -> list[str]:
    return sorted(n for n in names | {MARKER} if any(f in data for f in _forms(n)))


@pytest.mark.slow
def test_no_schema_name_reaches_the_coordinator_or_any_audit_trail(
        federation: Federation) -> None:
    """No node-type or relation name (nor the marker) is in the wire capture, in any file of
    the coordinator's state directory, in its log, or in a silo's audit trail or log."""
    fed = federation
    assert fed.codes == [0] * 4, _logs(fed)
    names = set().union(*(schema_names(g) for g in fed.graphs.values()))
    assert len(names) == (2 + 3 + 4) + (3 + 4 + 7)     # node types, relations
    # The search finds a name where one is (the silos' own data folders hold them all).
    for silo, graph in fed.graphs.items():
        meta = (fed.ws.data(silo) / "meta.json").read_bytes()
        assert set(_leaks(meta, names)) == schema_names(graph) | {MARKER}
    coordinator_side = [fed.capture, fed.run / "coordinator.log",
                        *sorted(p for p in fed.state_dir.rglob("*") if p.is_file())]
    assert {p.name for p in coordinator_side} >= {"capture.bin", "coordinator.log",
                                                  "results.json", "audit.jsonl",
                                                  "checkpoint.json"}
    assert any(p.name.startswith("durable_state-") for p in coordinator_side)
    assert fed.capture.stat().st_size > 10_000
    found = {str(p): _leaks(p.read_bytes(), names) for p in coordinator_side}
    assert not any(found.values()), found
    # The silos' own audit trails and logs name nothing of any schema either (DESIGN.md §6).
    for silo in fed.ws.silos:
        for path in (fed.run / silo / "audit.jsonl", fed.run / f"{silo}.log"):
            assert not _leaks(path.read_bytes(), names), path


# Fields that hold an ECDSA signature: DER encoding makes its length vary by a byte or two
# with the random nonce, whatever the silo's data.
_SIGNATURES = {"KeyAdvertisement": "signature", "SurvivorSignature": "signature"}


def _parsed_capture(path: Path) -> list[tuple[str, object]]:
    service = pb.DESCRIPTOR.services_by_name["Federation"]
    out = []
    for method, body in read_capture(path):
        name = method.rsplit("/", 1)[1]
        message = getattr(pb, service.methods_by_name[name].input_type.name).FromString(body)
        out.append((name, message))
    return out


def _without_signature(message):
    """A copy of the message with its ECDSA signature emptied (after checking its length)."""
    kind = type(message).__name__
    copy = type(message).FromString(message.SerializeToString())
    if kind in _SIGNATURES:
        signature = getattr(copy, _SIGNATURES[kind])
        setattr(copy, _SIGNATURES[kind], b"")
    elif kind == "SetupKey":
        advert = SetupAdvert.from_bytes(copy.advert)
        signature = advert.signature
        copy.advert = replace(advert, signature=b"").to_bytes()
    else:
        return copy
    assert 68 <= len(signature) <= 72, (kind, len(signature))      # DER ECDSA P-256
    return copy


@pytest.mark.slow
def test_every_message_the_coordinator_received_has_a_schema_independent_size(
        federation: Federation) -> None:
    """Per RPC method, round, attempt, phase (and streamed tensor name), the three silos'
    messages have one size, though their node-type and relation counts differ; envelopes are
    sealed_size(slots, 4 * bases) and masked inputs all of one length."""
    fed = federation
    assert fed.codes == [0] * 4, _logs(fed)
    sizes: dict[tuple[str, int, int, str, str], list[int]] = defaultdict(list)
    envelope_sizes, masked_sizes = [], []
    for name, message in _parsed_capture(fed.capture):
        message = _without_signature(message)
        env = message.envelope
        tensor = ""
        if isinstance(message, pb.TensorChunk):
            assert message.HasField("header") and message.last    # small: one chunk each
            tensor = message.header.name
            for silo in fed.ws.silos:                 # "box/<receiver>" of the group seal
                tensor = tensor.replace(silo, "<silo>")
        key = (name, env.round, env.attempt, pb.Phase.Name(env.phase), tensor)
        sizes[key].append(message.ByteSize())
        if name == "UploadEnvelope":
            assert tensor == "envelope"
            envelope_sizes.append(len(message.data))
        if name == "UploadMasked":
            masked_sizes.append(message.header.total_bytes)
    methods = {k[0] for k in sizes}
    assert {"UploadEnvelope", "FetchPool", "UploadMasked", "ReportMetrics", "AdvertiseKey",
            "UploadShares", "RevealShares", "AdvertiseSetup", "SignSurvivors"} <= methods
    uneven = {k: v for k, v in sizes.items() if len(set(v)) != 1}
    assert not uneven, uneven
    # One size per key means one size per silo: each silo sends one of each of these per round
    # (other calls may come from fewer silos, e.g. unmasking closes at the threshold).
    per_silo = ("UploadEnvelope", "FetchPool", "UploadMasked", "AdvertiseKey", "UploadShares",
                "ReportMetrics", "SignSurvivors", "AdvertiseSetup")
    for key, values in sizes.items():
        if key[0] in per_silo:
            assert len(values) == 3, (key, values)
    assert {k[1] for k in sizes if k[0] == "UploadEnvelope"} == set(range(1, ROUNDS + 1))
    assert envelope_sizes == [sealed_size(SLOTS, 4 * BASES)] * (3 * ROUNDS)
    assert len(masked_sizes) == 3 * ROUNDS and len(set(masked_sizes)) == 1
    # What the coordinator recorded of the envelopes is of that one size too.
    audit = [json.loads(line) for line in (fed.state_dir / "audit.jsonl").read_text()
             .splitlines() if line.strip()]
    stored = [r for r in audit if r["event"] == "envelope_received"]
    assert len(stored) == 3 * ROUNDS
    assert {r["bytes"] for r in stored} == {sealed_size(SLOTS, 4 * BASES)}


@pytest.mark.slow
def test_silos_pooled_the_other_silos_real_coefficient_rows(federation: Federation) -> None:
    """From round 2 on each silo opened two envelopes holding exactly the other silos' relation
    counts in rows: dummies were dropped, real rows arrived, the coordinator saw fixed blobs."""
    fed = federation
    assert fed.codes == [0] * 4, _logs(fed)
    relations = {s: len(g.relations) for s, g in fed.graphs.items()}
    for silo in fed.ws.silos:
        received = {r["round"]: r for r in fed.silo_audit(silo)
                    if r["event"] == "received_envelopes"}
        assert set(received) == set(range(1, ROUNDS + 1)), (silo, sorted(received))
        assert received[1]["envelopes"] == 0 and received[1]["pooled_vectors"] == 0
        others = sum(n for s, n in relations.items() if s != silo)
        for round_ in range(2, ROUNDS + 1):
            assert received[round_]["envelopes"] == 2, (silo, received[round_])
            assert received[round_]["pooled_vectors"] == others, (silo, received[round_])
        sent = [r for r in fed.silo_audit(silo) if r["event"] == "sent_envelope"]
        assert [r["bytes"] for r in sent] == [sealed_size(SLOTS, 4 * BASES)] * ROUNDS, silo


# -- the two FedHGN calls refuse bad input at the gRPC edge ------------------------------------
def _stub(port: int, silo: str, ws: Workspace) -> tuple[grpc.Channel, pb_grpc.FederationStub]:
    ident = load_identity(ws.identity(silo))
    creds = grpc.ssl_channel_credentials(root_certificates=ident.ca_pem,
                                         private_key=ident.key_pem,
                                         certificate_chain=ident.cert_pem)
    channel = grpc.secure_channel(f"127.0.0.1:{port}", creds)
    return channel, pb_grpc.FederationStub(channel)


@pytest.fixture
def hgn_server(tmp_path: Path) -> Iterator[tuple[RunningServer, Workspace]]:
    ws = make_hetero_workspace(tmp_path)
    running = start_server(load_plan(write_hetero_plan(ws, "hsvc", slots=SLOTS)),
                           progress=False, listen="127.0.0.1:0")
    yield running, ws
    running.stop(0)


@contextmanager
def _attending(running: RunningServer, ws: Workspace
               ) -> Iterator[dict[str, tuple[grpc.Channel, pb_grpc.FederationStub]]]:
    """Every silo attends over mTLS (so the group-key setup begins); channels closed after."""
    channels = {s: _stub(running.port, s, ws) for s in ws.silos}
    streams = [keep_attending(stub) for _, stub in channels.values()]
    try:
        for _ in range(100):
            if running.core.machine.group_setup is not None:
                break
            threading.Event().wait(0.05)
        assert running.core.machine.group_setup is not None   # fedhgn needs the group key
        yield channels
    finally:
        for stream in streams:
            stream.cancel()
        for channel, _ in channels.values():
            channel.close()


def _drive_server(running: RunningServer, ws: Workspace, stage: Stage) -> dict:
    """Real silo sessions take the coordinator's machine, in process, to `stage`."""
    machine = running.core.machine
    identities = {s: load_identity(ws.identity(s)) for s in ws.silos}
    sessions = hetero_sessions(machine.plan, hetero_graphs(), identities)
    for session in sessions.values():
        session.run_id = machine.run_id     # what a JOIN from this server tells a silo
    with running.core._cond:        # the deadline ticker must not move it meanwhile
        drive_machine_until(machine, sessions, lambda: machine.stage is stage)
    return sessions


def test_upload_envelope_and_fetch_pool_refuse_bad_input_with_clear_statuses(
        hgn_server: tuple[RunningServer, Workspace]) -> None:
    """Over real gRPC: UploadEnvelope with two entries, a wrong name, the wrong size, out of
    phase, before or after the masked input, and FetchPool out of phase or for another
    federation fail with the right status code and a clear detail, taking nothing in."""
    running, ws = hgn_server
    machine = running.core.machine
    with _attending(running, ws) as channels:
        stub = channels["silo-bb"][1]
        size = sealed_size(SLOTS, 4 * BASES)
        upload_env = Envelope("hsvc", 1, 1, Phase.MASKED_INPUT)
        blobs = codec.blobs_to_chunks
        assert_refused(stub.UploadEnvelope,
                       blobs({"envelope": bytes(size), "extra": b"x"}, upload_env),
                       grpc.StatusCode.INVALID_ARGUMENT, "carries one entry 'envelope'")
        assert_refused(stub.UploadEnvelope, blobs({"coefficients": bytes(size)}, upload_env),
                       grpc.StatusCode.INVALID_ARGUMENT, "carries one entry 'envelope'")
        assert_refused(stub.UploadEnvelope, blobs({"envelope": bytes(size)}, upload_env),
                       grpc.StatusCode.FAILED_PRECONDITION, "does not match")
        assert_refused(stub.UploadEnvelope,
                       blobs({"envelope": bytes(size)}, replace(upload_env, phase=Phase.REPORT)),
                       grpc.StatusCode.FAILED_PRECONDITION, "expected phase MASKED_INPUT")
        assert_refused(stub.UploadEnvelope,
                       blobs({"envelope": bytes(size)}, replace(upload_env, federation="other")),
                       grpc.StatusCode.FAILED_PRECONDITION, "federation 'other'")
        fetch_env = Envelope("hsvc", 1, 1, Phase.FETCH_STATE)
        assert_refused(stub.FetchPool, codec.stage_request(fetch_env),
                       grpc.StatusCode.FAILED_PRECONDITION, "asked for round 1 attempt 1")
        assert_refused(stub.FetchPool, codec.stage_request(replace(fetch_env, federation="other")),
                       grpc.StatusCode.FAILED_PRECONDITION, "federation 'other' is not 'hsvc'")
        assert machine.pending_envelopes == {} and machine.envelopes == {}

        sessions = _drive_server(running, ws, Stage.INPUT)
        ins = machine.instruction("silo-bb")
        masked = sessions["silo-bb"].masked_input(machine.shares_for("silo-bb", ins.envelope))
        sealed = sessions["silo-bb"].sealed_coefficients
        assert sealed is not None and len(sealed) == size
        upload_env = replace(ins.envelope, phase=Phase.MASKED_INPUT)
        masked_chunks = list(codec.tensor_to_chunks("masked_input", masked, upload_env))
        for wrong in (sealed[:-1], sealed + b"\0"):
            assert_refused(stub.UploadEnvelope, blobs({"envelope": wrong}, upload_env),
                           grpc.StatusCode.INVALID_ARGUMENT,
                           f"sealed envelope must be exactly {size} bytes (set by "
                           f"fedhgn.coefficient_slots); got {len(wrong)}")
        assert_refused(stub.UploadMasked, iter(masked_chunks), grpc.StatusCode.FAILED_PRECONDITION,
                       "must send its sealed coefficient envelope before its masked input")
        assert machine.pending_envelopes == {}
        stub.UploadEnvelope(blobs({"envelope": sealed}, upload_env), timeout=5)
        stub.UploadMasked(iter(masked_chunks), timeout=5)
        assert_refused(stub.UploadEnvelope, blobs({"envelope": bytes(size)}, upload_env),
                       grpc.StatusCode.ALREADY_EXISTS, "silo-bb already answered")
        assert machine.pending_envelopes == {"silo-bb": sealed} and machine.envelopes == {}


def test_a_silo_agent_reads_the_empty_pool_of_round_one(
        hgn_server: tuple[RunningServer, Workspace], tmp_path: Path) -> None:
    """In round 1 no envelope exists yet: a real silo agent fetching the pool over gRPC gets an
    empty pool (and audits it) instead of failing the federation."""
    running, ws = hgn_server
    with _attending(running, ws) as channels:
        sessions = _drive_server(running, ws, Stage.ADVERTISE)
        ins = running.core.machine.instruction("silo-aa")
        assert (ins.envelope.round, ins.envelope.phase) == (1, Phase.ROUND_OPEN)
        agent = SiloAgent(f"127.0.0.1:{running.port}", load_identity(ws.identity("silo-aa")),
                          sessions["silo-aa"], tmp_path / "agent-aa", log=lambda _: None)
        try:
            agent.link.stub = channels["silo-aa"][1]
            agent.driver._fetch_pool(replace(ins.envelope, phase=Phase.FETCH_STATE))
        finally:
            agent.audit.close()
    pool = sessions["silo-aa"].trainer.pool      # the origin: no peer has sent coefficients
    assert pool is not None and pool.shape[0] == 1 and not pool.any()
    records = [json.loads(line) for line in (tmp_path / "agent-aa" / "audit.jsonl")
               .read_text().splitlines()]
    received = [r for r in records if r["event"] == "received_envelopes"]
    assert [(r["envelopes"], r["pooled_vectors"]) for r in received] == [(0, 0)]
