"""End to end, [metrics] aggregate = true: a real coordinator and three real silo processes over
mTLS on loopback. The coordinator's audit log, status and results hold no silo's own figure
(searched for each one the silos kept in their metrics files) and hold, per round, federation-wide
figures equal to what the silos' own counts add up to; no silo sends a metrics report."""

from __future__ import annotations

import json
import math

import pytest

from tests.support.federation import (
    SILOS,
    Workspace,
    port_of,
    start_coordinator,
    start_silo,
    wait_all,
    write_plan,
)
from trellis.crypto.audit import verify_audit_log
from trellis.protos.metrics_plan import FEDERATION

pytestmark = pytest.mark.slow
ROUNDS = 3
FIGURES = ("val_acc", "test_acc", "val_loss", "test_loss", "train_loss")


@pytest.fixture(scope="module")
def run(workspace_factory) -> dict:
    ws: Workspace = workspace_factory("summed-real", graphs=60)
    plan = write_plan(ws, "summed-real", rounds=ROUNDS,
                      extra="[metrics]\naggregate = true\n")
    root = ws.root / "summed-real"
    root.mkdir(exist_ok=True)
    coordinator = start_coordinator(plan, root / "coordinator.log")
    silos = [start_silo(ws, s, port_of(plan), root / s, root / f"{s}.log") for s in SILOS]
    codes = wait_all([*silos, coordinator], timeout=300)
    logs = {p.name: p.read_text() for p in root.glob("*.log")}
    assert codes == [0, 0, 0, 0], logs
    state = root / "coordinator"
    own = {s: {r["round"]: r for r in map(json.loads, (root / s / "metrics.jsonl")
                                           .read_text().splitlines())} for s in SILOS}
    return {"root": root, "state": state, "own": own, "ws": ws,
            "results": json.loads((state / "results.json").read_text()),
            "status": json.loads((state / "status.json").read_text()),
            "audit": (state / "audit.jsonl").read_text()}


def test_each_round_holds_the_sum_of_the_silos_own_counts(run: dict) -> None:
    results, own = run["results"], run["own"]
    assert results["status"] == "completed" and results["rounds_completed"] == ROUNDS
    assert [set(r["metrics"]) for r in results["rounds"]] == [{FEDERATION}] * ROUNDS
    summed = [json.loads(line) for line in run["audit"].splitlines()
              if '"metrics_summed"' in line]
    assert len(summed) == ROUNDS
    for record in results["rounds"]:
        figures, r = record["metrics"][FEDERATION], record["round"]
        for split in ("val", "test"):
            count = sum(own[s][r][f"{split}_count"] for s in SILOS)
            correct = sum(own[s][r][f"{split}_correct"] for s in SILOS)
            assert figures[f"{split}_count"] == count
            assert figures[f"{split}_acc"] == pytest.approx(correct / count, abs=1e-6)
    status = run["status"]
    assert status["metrics_round"] == ROUNDS and status["reported"] == 0
    assert status["metrics"] == pytest.approx(results["rounds"][-1]["metrics"][FEDERATION])


def test_no_silo_figure_reaches_the_coordinator(run: dict) -> None:
    text = run["audit"] + json.dumps(run["results"]) + json.dumps(run["status"])
    federation = [v for r in run["results"]["rounds"] for v in r["metrics"][FEDERATION].values()]
    searched = 0
    for silo in SILOS:
        for record in run["own"][silo].values():
            for name in FIGURES:
                value = record.get(name)
                if value is None or any(math.isclose(value, f, abs_tol=1e-6)
                                        for f in federation):
                    continue        # equal to a federation figure: no way to tell them apart
                forms = {repr(value), repr(round(value, 6)), f"{value:.4f}"}
                if min(len(f.strip("-0.").replace(".", "")) for f in forms) < 3:
                    continue        # 1.0 or 0.75: too short to tell from a timestamp's digits
                searched += 1
                for form in forms:
                    assert form not in text, (silo, name, value)
    assert searched >= len(SILOS) * ROUNDS * 3
    records = [json.loads(line) for line in run["audit"].splitlines()]
    assert not [r for r in records if r.get("event") == "metrics"]
    report = verify_audit_log(run["state"] / "audit.jsonl")
    assert report.ok and report.closed, report.problems


def test_silos_send_no_report_and_say_what_their_vector_carried(run: dict) -> None:
    for silo in SILOS:
        records = [json.loads(line) for line in
                   (run["root"] / silo / "audit.jsonl").read_text().splitlines()]
        assert not [r for r in records if r.get("event") == "sent_metrics"]
        tensors = [r for r in records if r.get("event") == "sent_tensor"]
        # Every round, and the attempt after the last that sums the final state's counts.
        assert [r["round"] for r in tensors] == [*range(1, ROUNDS + 2)]
        assert {r["metric_slots"] for r in tensors} == {6}
