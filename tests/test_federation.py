"""End to end: a real coordinator and three real silo processes over mTLS on loopback."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from coordinator.capture import read_capture
from coordinator.plan import load_plan
from coordinator.simulate import run_simulation
from crypto.audit import verify_audit_log
from protos import codec
from protos import federation_pb2 as pb
from silo.datasets import load_graph_folder
from tests.federation_helpers import (
    SILOS,
    Workspace,
    make_workspace,
    port_of,
    start_coordinator,
    start_silo,
    wait_all,
    write_plan,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(tmp_path_factory.mktemp("federation"))


@pytest.fixture(scope="module")
def real_run(ws: Workspace) -> dict:
    """One real FedStar federation with a wire capture; shared by the checks below."""
    plan = write_plan(ws, "real", rounds=4)
    capture = ws.root / "real" / "capture.bin"
    (ws.root / "real").mkdir(exist_ok=True)
    coordinator = start_coordinator(plan, ws.root / "real" / "coordinator.log", capture)
    silos = [start_silo(ws, s, port_of(plan), ws.root / "real" / s, ws.root / "real" /
                        f"{s}.log") for s in SILOS]
    codes = wait_all([*silos, coordinator], timeout=240)
    logs = {p.name: p.read_text() for p in (ws.root / "real").glob("*.log")}
    assert codes == [0, 0, 0, 0], logs
    results = json.loads((ws.root / "real" / "coordinator" / "results.json").read_text())
    return {"plan": plan, "capture": capture, "results": results}


def test_real_federation_matches_the_simulation(ws: Workspace, real_run: dict) -> None:
    results = real_run["results"]
    assert results["status"] == "completed" and results["rounds_completed"] == 4
    plan = load_plan(real_run["plan"])
    datasets = {s: load_graph_folder(plan.simulation_data[s]) for s in plan.silos}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # the silo processes run with one thread each
    try:
        simulated = run_simulation(plan, datasets, progress=False)
    finally:
        torch.set_num_threads(threads)
    for silo in SILOS:
        real_acc = results["final_metrics"][silo]["test_acc"]
        sim_acc = simulated["final_metrics"][silo]["test_acc"]
        assert abs(real_acc - sim_acc) <= 0.005, (silo, real_acc, sim_acc)


def test_coordinator_received_only_masked_vectors_keys_and_metrics(ws: Workspace,
                                                                   real_run: dict) -> None:
    records = list(read_capture(real_run["capture"]))
    methods = {m.rsplit("/", 1)[1] for m, _ in records}
    assert methods == {"Attend", "FetchState", "AdvertiseKey", "FetchKeys", "UploadMasked",
                       "ReportMetrics"}
    uploads = [pb.TensorChunk.FromString(body) for m, body in records
               if m.endswith("/UploadMasked")]
    streams: list[list[pb.TensorChunk]] = [[]]
    for chunk in uploads:
        streams[-1].append(chunk)
        if chunk.last:
            streams.append([])
    vectors = [codec.chunks_to_tensor(s, max_bytes=1 << 30)[2] for s in streams if s]
    assert len(vectors) == 4 * len(SILOS)
    for vector in vectors:
        assert vector.dtype == np.uint64 and vector.shape == (14592 + 1,)
        # Plain fixed-point encodings of small floats have top byte 0x00 or 0xFF; masked ones
        # are uniform (expected share 2/256).
        top = (vector >> np.uint64(56)).astype(np.uint8)
        assert np.mean((top == 0) | (top == 255)) < 0.05
    for m, body in records:
        if m.endswith("/AdvertiseKey"):
            advert = pb.KeyAdvertisement.FromString(body)
            assert len(advert.public_key) == 32 and advert.shared_length == 14592
        if m.endswith("/ReportMetrics"):
            names = {x.name for x in pb.MetricsReport.FromString(body).metrics}
            assert names <= {"val_acc", "test_acc", "train_loss"}
    # No private tensor of any silo crossed: search the capture for their raw float32 bytes.
    blob = real_run["capture"].read_bytes()
    for silo in SILOS:
        snapshot = torch.load(ws.root / "real" / silo / "final_model.pt", weights_only=True)
        for name, tensor in snapshot["model"].items():
            # Shared groups reach the coordinator only as their aggregate; 1-element buffers
            # (GIN's fixed eps = 0) are too short to search for meaningfully.
            if name.startswith(("embedding_s", "graph_convs_s_gcn")) or tensor.numel() < 8:
                continue
            raw = tensor.detach().reshape(-1)[:8].numpy().astype(np.float32).tobytes()
            assert raw not in blob, f"{silo}:{name} found in the coordinator's capture"


def test_audit_logs_of_both_sides_verify(ws: Workspace, real_run: dict) -> None:
    server_cert = (ws.ca / "server.crt").read_bytes()
    report = verify_audit_log(ws.root / "real" / "coordinator" / "audit.jsonl",
                              cert_pem=server_cert)
    assert report.ok and report.closed, report.problems
    text = (ws.root / "real" / "coordinator" / "audit.jsonl").read_text()
    assert '"event":"received_tensor"' in text and '"event":"round_completed"' in text
    for silo in SILOS:
        cert = (ws.identity(silo) / f"{silo}.crt").read_bytes()
        silo_report = verify_audit_log(ws.root / "real" / silo / "audit.jsonl", cert_pem=cert)
        assert silo_report.ok and silo_report.closed, silo_report.problems


def test_silo_killed_mid_round_aborts_and_the_round_is_retried(ws: Workspace) -> None:
    plan = write_plan(ws, "dropout", rounds=5, min_silos=2, round_s=60)
    folder = ws.root / "dropout"
    folder.mkdir(exist_ok=True)
    coordinator = start_coordinator(plan, folder / "coordinator.log")
    silos = {s: start_silo(ws, s, port_of(plan), folder / s, folder / f"{s}.log") for s in SILOS}
    audit = folder / "coordinator" / "audit.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not _round_opened(audit, 3):
        time.sleep(0.05)
    # SIGKILL: no goodbye; the coordinator sees the control stream die mid-round.
    silos["social-c"].send_signal(signal.SIGKILL)
    codes = wait_all([silos["hospital-a"], silos["pharma-b"], coordinator], timeout=180)
    assert codes == [0, 0, 0], (folder / "coordinator.log").read_text()
    results = json.loads((folder / "coordinator" / "results.json").read_text())
    assert results["status"] == "completed" and results["rounds_completed"] == 5
    retried = [r for r in results["rounds"] if r["attempts"] > 1]
    assert retried, results["rounds"]
    assert "social-c" not in retried[0]["participants"]
    assert results["rounds"][-1]["participants"] == ["hospital-a", "pharma-b"]
    log = (folder / "coordinator.log").read_text()
    assert "round aborted" in log and "silo social-c left" in log


def _round_opened(audit: Path, round_no: int) -> bool:
    if not audit.exists():
        return False
    for line in audit.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue            # a line being written right now
        if record.get("event") == "round_opened" and record.get("round") == round_no:
            return True
    return False
