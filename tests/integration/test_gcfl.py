"""GCFL / GCFL+ through the round machine: cluster-wise secure aggregation, CKKS similarity.

Most runs use the one-process simulation (real certificates, real secure aggregation, real
CKKS); the last runs a real coordinator and silo processes over mTLS and compares the two.
"""

from __future__ import annotations

import pickle
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tenseal as ts

import trellis.coordinator.simulation.sequential as simulate
from tests.support.federation import write_plan
from trellis.coordinator.rounds.machine import RoundMachine
from trellis.coordinator.rounds.secagg_groups import SecAggGroups
from trellis.coordinator.simulation.sequential import run_simulation
from trellis.protos.plan import PlanError, load_plan
from trellis.silo.data.datasets import load_graph_folder

# Forces a split at the first allowed round (21): every mean norm is below eps1 and every
# silo's update norm above eps2.
FORCE_SPLIT = "[clustering]\neps1 = 1000.0\neps2 = 0.0\nseq_length = 3\n"
RECORDED = ("join", "advertise", "upload_shares", "masked_input", "sign_survivors",
            "reveal_shares", "report", "setup_advert", "setup_seal", "setup_opened",
            "encrypted_update", "decrypted", "key_bundle", "shares_for", "unmask_request",
            "state_for", "setup_bundle", "setup_box", "decrypt_request", "instruction")


@pytest.fixture(scope="module")
def ws(workspace_factory):
    return workspace_factory("gcfl", graphs=40, extra=1)


def _recording_machine(transcript: list[bytes]):
    """A RoundMachine factory whose every input and output is pickled into `transcript`."""
    def make(*args: Any, **kwargs: Any) -> RoundMachine:
        machine = RoundMachine(*args, **kwargs)
        for name in RECORDED:
            method = getattr(machine, name)

            def wrapped(*a: Any, _m: Any = method, **k: Any) -> Any:
                result = _m(*a, **k)
                transcript.append(pickle.dumps((a, k, result)))
                return result
            setattr(machine, name, wrapped)
        return machine
    return make


def _secret_key_bytes(secret_context: bytes) -> bytes:
    context = ts.context_from(secret_context)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sk"
        context.secret_key().data.save(str(path))
        return path.read_bytes()


def _windows(data: bytes, width: int = 48, count: int = 12) -> list[bytes]:
    step = max((len(data) - width) // count, 1)
    return [data[i:i + width] for i in range(0, len(data) - width, step)][:count]


def test_gcfl_splits_under_ckks_and_the_coordinator_never_holds_secrets(ws, monkeypatch) -> None:
    plan = load_plan(write_plan(ws, "gcfl-split", algorithm="gcfl", rounds=22, min_silos=4,
                                extra=FORCE_SPLIT))
    datasets = {s: load_graph_folder(plan.simulation_data[s]) for s in ws.silos}
    transcript: list[bytes] = []
    seen: dict[str, Any] = {}

    def inspect(machine: RoundMachine, sessions: dict) -> None:
        state = {k: v for k, v in vars(machine).items()
                 if k != "strategy" and not callable(v)}     # the recording wrappers
        seen["machine"] = pickle.dumps(state) + pickle.dumps(vars(machine.strategy))
        seen["secrets"] = {s: sess.group.secrets for s, sess in sessions.items()}
        seen["updates"] = {s: sess.trainer.last_update for s, sess in sessions.items()}

    monkeypatch.setattr(simulate, "RoundMachine", _recording_machine(transcript))
    results = run_simulation(plan, datasets, progress=False, inspect=inspect)

    assert results["status"] == "completed"
    splits = results["clustering"]["splits"]
    assert splits and splits[0]["round"] == 21
    first = splits[0]
    assert sorted(first["members"]) == sorted(ws.silos)
    side_a, side_b = first["into"]
    assert side_a and side_b and sorted(side_a + side_b) == sorted(ws.silos)
    final = results["clustering"]["clusters"]
    assert sorted(s for c in final for s in c) == sorted(ws.silos)     # a partition ...
    assert all(set(c) <= set(side_a) or set(c) <= set(side_b) for c in final)  # ... refining it

    # Every silo holds the same group secrets, drawn by the lowest-ranked silo.
    secrets = seen["secrets"]
    assert len({s.to_bytes() for s in secrets.values()}) == 1
    group = next(iter(secrets.values()))
    secret_key = _secret_key_bytes(group.ckks_secret)
    everything = b"".join(transcript) + seen["machine"]
    for window in _windows(secret_key):
        assert window not in everything, "CKKS secret key material reached the coordinator"
    assert group.group_key not in everything, "the silo group key reached the coordinator"
    # No silo's plain update (its float32 bytes) ever reached the coordinator.
    for silo, update in seen["updates"].items():
        raw = np.asarray(update, dtype=np.float32).tobytes()
        for window in _windows(raw, width=64):
            assert window not in everything, f"a plain update of {silo} reached the coordinator"


def test_gcfl_plus_splits_on_norm_sequences_without_ckks(ws) -> None:
    plan = load_plan(write_plan(ws, "gcflplus", algorithm="gcfl+", rounds=22, min_silos=4,
                                extra=FORCE_SPLIT + 'sequence = "update"\n'))
    datasets = {s: load_graph_folder(plan.simulation_data[s]) for s in ws.silos}
    results = run_simulation(plan, datasets, progress=False)
    assert results["status"] == "completed"
    splits = results["clustering"]["splits"]
    # The sequences are cleared after a split, so at most one split per round.
    assert len({s["round"] for s in splits}) == len(splits) and splits[0]["round"] == 21
    assert "mean_norm" in splits[0] and splits[0]["mean_norm"] < 1000.0


def test_split_test_uses_the_unweighted_mean_unless_the_plan_says_weighted() -> None:
    from trellis.coordinator.rounds.strategies import AggregateResult, make_strategy
    from trellis.protos.plan import ClusteringConfig

    silos = ("a", "b", "c")
    # A big silo dominates the weighted mean (norm 0.5); the unweighted mean is small (0.05).
    result = AggregateResult(21, silos, np.array([0.5, 0.0]), 1000, np.array([0.05, 0.0]))
    stats = {s: {"update_norm": 0.6, "grad_norm": 1.0} for s in silos}
    config = ClusteringConfig(eps1=0.1, eps2=0.3)
    unweighted = make_strategy("gcfl", config, silos)
    assert unweighted.complete_round(21, {silos: result}, stats) == [silos]
    assert unweighted.norms == [{"round": 21, "cluster": list(silos), "mean_norm": 0.05,
                                 "max_norm": 0.6,
                                 "update_norms": {"a": 0.6, "b": 0.6, "c": 0.6}}]
    weighted = make_strategy("gcfl", ClusteringConfig(eps1=0.1, eps2=0.3, mean_norm="weighted"),
                             silos)
    assert weighted.complete_round(21, {silos: result}, stats) == []
    assert weighted.norms[0]["mean_norm"] == 0.5


def test_cluster_groups_mask_only_among_members() -> None:
    from trellis.crypto.keyagreement import RoundContext
    from trellis.crypto.secagg import SecAggConfig

    groups = SecAggGroups(RoundContext("f", 1, 1, run="r"),
                          [SecAggConfig(2, 0, 1), SecAggConfig(1, 0, 1)],
                          [("a", "b", "c"), ("d",)], 5, np.uint64)
    assert groups.server_of("a").participants == ("a", "b", "c")
    assert groups.server_of("d").participants == ("d",)
    assert groups.expected() == ("a", "b", "c", "d")
    with pytest.raises(ValueError, match="one aggregation group only"):
        SecAggGroups(RoundContext("f", 1, 1, run="r"), [SecAggConfig(2, 0, 1)] * 2,
                     [("a", "b"), ("b", "c")], 5, np.uint64)


def test_clustering_plan_presets_and_errors(ws) -> None:
    plan = load_plan(write_plan(ws, "preset", algorithm="gcfl", rounds=2,
                                extra='[clustering]\npreset = "BIOCHEM"\n'))
    assert (plan.clustering.eps1, plan.clustering.eps2, plan.clustering.seq_length) == (
        0.07, 0.35, 5)
    # The public plan tells silos that the unweighted sum is revealed, and only for GCFL.
    assert plan.public.aggregation.unweighted_sum is True
    weighted = load_plan(write_plan(ws, "weighted", algorithm="gcfl", rounds=2,
                                    extra='[clustering]\nmean_norm = "weighted"\n'))
    assert weighted.public.aggregation.unweighted_sum is False
    assert load_plan(write_plan(ws, "star", rounds=2)).public.aggregation.unweighted_sum is False
    with pytest.raises(PlanError) as err:
        load_plan(write_plan(ws, "bad", algorithm="gcfl+", rounds=2,
                             extra='[clustering]\npreset = "NOPE"\nsequence = "weights"\n'
                                   'mean_norm = "median"\n'))
    text = str(err.value)
    assert "clustering.mean_norm: must be 'unweighted' or 'weighted'" in text
    assert "clustering.preset: 'NOPE' is not a preset" in text
    assert "clustering.sequence: must be 'gradient' or 'update'" in text



@pytest.mark.slow
def test_real_gcfl_federation_splits_like_the_simulation(ws) -> None:
    """Four silo processes and a coordinator over mTLS: group key, CKKS split, same result."""
    import json

    from tests.support.federation import (
        port_of,
        simulate_like_silo_processes,
        start_coordinator,
        start_silo,
        wait_all,
    )
    from trellis.coordinator.serving.capture import read_capture
    from trellis.crypto.audit import verify_audit_log

    plan_path = write_plan(ws, "gcfl-real", algorithm="gcfl", rounds=22, min_silos=4,
                           extra=FORCE_SPLIT)
    run = ws.root / "gcfl-real"
    run.mkdir(exist_ok=True)
    capture = run / "capture.bin"
    coordinator = start_coordinator(plan_path, run / "coordinator.log", capture)
    silos = [start_silo(ws, s, port_of(plan_path), run / s, run / f"{s}.log")
             for s in ws.silos]
    codes = wait_all([*silos, coordinator], timeout=400)
    logs = {p.name: p.read_text()[-2000:] for p in run.glob("*.log")}
    assert codes == [0] * (len(ws.silos) + 1), logs
    real = json.loads((run / "coordinator" / "results.json").read_text())
    assert real["status"] == "completed"

    simulated = simulate_like_silo_processes(load_plan(plan_path))
    # Same splits, the same clusters and accuracies within half a point.
    assert real["clustering"]["splits"] and (
        real["clustering"]["splits"] == simulated["clustering"]["splits"])
    assert real["clustering"]["clusters"] == simulated["clustering"]["clusters"]
    for silo in ws.silos:
        real_acc = real["final_metrics"][silo]["test_acc"]
        sim_acc = simulated["final_metrics"][silo]["test_acc"]
        assert abs(real_acc - sim_acc) <= 0.005, (silo, real_acc, sim_acc)

    # Over the wire the coordinator received a public CKKS context (no secret key), sealed
    # boxes, ciphertexts and single decrypted values, and never a silo's group secrets.
    records = list(read_capture(capture))
    methods = {m.rsplit("/", 1)[1] for m, _ in records}
    assert {"AdvertiseSetup", "FetchSetupBundle", "UploadGroupSeal", "FetchGroupBox",
            "ConfirmGroupOpen", "UploadEncryptedUpdate", "FetchBlinded",
            "UploadSimilarities"} <= methods
    from trellis.protos import codec
    from trellis.protos import federation_pb2 as pb
    seal = [pb.TensorChunk.FromString(b) for m, b in records if m.endswith("/UploadGroupSeal")]
    _, blobs = codec.chunks_to_blobs(seal, max_bytes=1 << 30)
    from trellis.crypto.groupkey import leader_of
    leader = leader_of(ws.silos)
    assert set(blobs) == {"ckks_public"} | {f"box/{s}" for s in ws.silos if s != leader}
    public = ts.context_from(blobs["ckks_public"])
    assert not public.has_secret_key()
    similarities = [pb.Similarities.FromString(b) for m, b in records
                    if m.endswith("/UploadSimilarities")]
    assert similarities and all(len(s.values) >= 1 for s in similarities)
    # Both sides' audit trails verify, and each silo recorded the norms it revealed.
    assert verify_audit_log(run / "coordinator" / "audit.jsonl",
                            cert_pem=(ws.ca / "server.crt").read_bytes()).ok
    for silo in ws.silos:
        cert = (ws.identity(silo) / f"{silo}.crt").read_bytes()
        assert verify_audit_log(run / silo / "audit.jsonl", cert_pem=cert).ok
        text = (run / silo / "audit.jsonl").read_text()
        assert '"plain_statistics"' in text and '"sent_encrypted_update"' in text
        step = '"sealed_group_secrets"' if silo == leader else '"opened_group_secrets"'
        assert step in text
        assert ('"decrypted_similarities"' in text) == (silo == leader)
    # The group seal and the encrypted updates each silo logged are the ones the coordinator
    # logged receiving, digest for digest.
    from trellis.crypto.audit_crosscheck import cross_check, read_records
    coordinator_records = read_records(run / "coordinator" / "audit.jsonl")
    for silo in ws.silos:
        checked = cross_check(read_records(run / silo / "audit.jsonl"), coordinator_records)
        assert checked.ok, [d.describe() for d in checked.discrepancies] + checked.problems
        events = [r["event"] for _, r in read_records(run / silo / "audit.jsonl")]
        assert checked.matched == sum(events.count(e) for e in (
            "sent_tensor", "sealed_group_secrets", "sent_encrypted_update"))
    # The update norms the coordinator received in plain are in its log, and its compliance
    # report shows them with the split.
    norms = [r["statistics"] for _, r in coordinator_records
             if r.get("event") == "received_tensor" and "statistics" in r]
    assert norms and all(set(n) == {"update_norm", "grad_norm"} for n in norms)
    from datetime import UTC, datetime

    from trellis.coordinator.operations.compliance import report_state_dir
    from trellis.protos.document import to_markdown
    document, _ = report_state_dir(run / "coordinator", ws.ca, generated="now",
                                   now=datetime.now(UTC))
    text = to_markdown(document)
    split = real["clustering"]["splits"][0]
    assert f"| {split['round']} | {', '.join(split['members'])} |" in text
