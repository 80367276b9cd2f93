"""[metrics] aggregate = true through the real simulation (the round machine and the silo driver
of a deployed federation): the coordinator holds only federation-wide figures, equal to what the
silos' own counts add up to; the best round and FedHGN's early stopping follow them exactly as
they followed the per-silo reports; with privacy the counts are noised and accounted."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.support.federation import HETERO_SILOS, SILOS, Workspace, write_hetero_plan, write_plan
from trellis.coordinator.operations.report import best_validation_round
from trellis.coordinator.rounds.errors import InvalidPayload
from trellis.coordinator.rounds.machine import RoundMachine
from trellis.coordinator.simulation.sequential import run_simulation
from trellis.protos.messages import Envelope, MetricsReport, Phase
from trellis.protos.metrics_plan import COUNT_UNITS, FEDERATION
from trellis.protos.plan import load_plan
from trellis.silo.data.datasets import load_graph_folder
from trellis.silo.data.hetero import save_hetero_folder
from trellis.silo.federation.session import SiloSession
from trellis.silo.privacy.private_step import INSECURE_SEED_VARIABLE

SUMMED = "[metrics]\naggregate = true\nclasses = 3\n"
BALANCED = '[training]\nvalidation_metric = "balanced_acc"\n'


@pytest.fixture(scope="module")
def ws(workspace_factory):
    return workspace_factory("summed-metrics", graphs=40)


def _run(ws: Workspace, name: str, extra: str, seen: dict | None = None) -> dict:
    plan = load_plan(write_plan(ws, name, algorithm="fedavg", rounds=3, extra=extra))
    datasets = {s: load_graph_folder(plan.simulation_data[s]) for s in SILOS}

    def inspect(machine: RoundMachine, sessions: Mapping[str, SiloSession]) -> None:
        if seen is not None:
            seen["own"] = {s: dict(x.own_metrics) for s, x in sessions.items()}
            seen["ledgers"] = {s: x.budget.ledger.events for s, x in sessions.items()
                               if x.budget is not None}
            report = MetricsReport(Envelope(plan.federation, 3, 0, Phase.REPORT),
                                   {"val_acc": 0.5})
            with pytest.raises(InvalidPayload, match="sums them inside the masked vectors"):
                machine.report(SILOS[0], report, 0.0)

    return run_simulation(plan, datasets, progress=False, inspect=inspect)


def test_the_coordinator_holds_only_the_federation_wide_sums_of_the_silos_counts(ws) -> None:
    seen: dict = {}
    results = _run(ws, "summed", BALANCED + SUMMED, seen)
    assert results["status"] == "completed" and results["rounds_completed"] == 3
    # Every round has its figures, the last one too (from the attempt that trains nothing),
    # and only the federation's: no silo's own entry anywhere.
    assert [set(r["metrics"]) for r in results["rounds"]] == [{FEDERATION}] * 3
    assert set(results["final_metrics"]) == {FEDERATION}
    final = results["rounds"][-1]["metrics"][FEDERATION]
    own = seen["own"]        # each silo's figures of the final state, kept at home
    for split in ("val", "test"):
        count = sum(own[s][f"{split}_count"] for s in SILOS)
        correct = sum(own[s][f"{split}_correct"] for s in SILOS)
        assert final[f"{split}_count"] == count
        assert final[f"{split}_acc"] == pytest.approx(correct / count, abs=1e-6)
        # ... which is the silos' own accuracies weighted by their graphs.
        weighted = sum(own[s][f"{split}_acc"] * own[s][f"{split}_count"] for s in SILOS)
        assert final[f"{split}_acc"] == pytest.approx(weighted / count, abs=1e-6)
        # Each silo's loss sum is rounded to loss_clip / COUNT_UNITS.
        losses = sum(own[s][f"{split}_loss_sum"] for s in SILOS)
        assert final[f"{split}_loss"] == pytest.approx(
            losses / count, abs=len(SILOS) * 0.5 * 10.0 / COUNT_UNITS / count + 1e-6)
        recalls = [sum(own[s][f"{split}_correct_{c}"] for s in SILOS)
                   / sum(own[s][f"{split}_count_{c}"] for s in SILOS) for c in range(3)
                   if sum(own[s][f"{split}_count_{c}"] for s in SILOS)]
        assert final[f"{split}_balanced_acc"] == pytest.approx(sum(recalls) / len(recalls),
                                                               abs=1e-6)
    # The best-round report reads the federation's figures.
    values = [r["metrics"][FEDERATION]["val_balanced_acc"] for r in results["rounds"]]
    assert best_validation_round(results) == values.index(max(values)) + 1


def test_without_the_option_silos_report_their_own_figures_as_before(ws) -> None:
    results = _run(ws, "reported", BALANCED)
    assert [set(r["metrics"]) for r in results["rounds"]] == [set(SILOS)] * 3
    assert FEDERATION not in results["final_metrics"]


def test_with_privacy_the_counts_are_noised_and_accounted_every_round(ws, monkeypatch) -> None:
    monkeypatch.setenv(INSECURE_SEED_VARIABLE, "summed-metrics")
    seen: dict = {}
    private = ('[privacy]\nmechanism = "ddg"\nnoise_multiplier = 1.1\nclip = 1.0\nbatch = 8\n'
               "design_graphs = 20\n")
    results = _run(ws, "summed-dp", private + "[metrics]\naggregate = true\n"
                   "noise_multiplier = 0.5\n", seen)
    assert results["status"] == "completed"
    assert [set(r["metrics"]) for r in results["rounds"]] == [{FEDERATION}] * 3
    for record in results["rounds"]:
        figures = record["metrics"][FEDERATION]
        assert 0.0 <= figures["val_acc"] <= 1.0 and figures["val_count"] > 0
    # Noised: the federation's count is not the silos' exact total.
    exact = sum(seen["own"][s]["val_count"] for s in SILOS)
    assert results["rounds"][-1]["metrics"][FEDERATION]["val_count"] != exact
    # Each silo's ledger: per round the model's release (subsampled) and the counts' (q = 1),
    # then the counts' alone for the attempt after the last round.
    for events in seen["ledgers"].values():
        assert [e.q == 1.0 for e in events] == [False, True] * 3 + [True]


def _hetero_run(tmp_path: Path, summed: bool) -> dict:
    from tests.support.federation import hetero_graphs

    ws = Workspace(tmp_path, HETERO_SILOS)
    graphs = hetero_graphs()
    for silo, graph in graphs.items():
        save_hetero_folder(graph, ws.data(silo))
    path = write_hetero_plan(ws, "hgn-summed", rounds=12, patience=3, port=1)
    if summed:
        path.write_text(path.read_text() + "\n[metrics]\naggregate = true\n")
    return run_simulation(load_plan(path), graphs, progress=False)


def test_fedhgn_stops_early_on_the_summed_figures_as_it_did_on_the_reports(
        tmp_path: Path) -> None:
    """Training does not depend on how figures travel, so the same plan stops at the same
    round and selects the same best round from the federation's sums as from the reports."""
    reported = _hetero_run(tmp_path / "reported", summed=False)
    summed = _hetero_run(tmp_path / "summed", summed=True)
    assert reported["status"] == summed["status"] == "completed"
    assert summed["rounds_completed"] == reported["rounds_completed"] < 12
    chosen, before = summed["early_stopping"], reported["early_stopping"]
    assert (chosen["best_round"], chosen["stopped_after"]) == (
        before["best_round"], before["stopped_after"])
    assert chosen["val_acc"] == pytest.approx(before["val_acc"], abs=1e-6)
    assert chosen["test_acc"] == pytest.approx(before["test_acc"], abs=1e-6)
    assert [set(r["metrics"]) for r in summed["rounds"]] == (
        [{FEDERATION}] * summed["rounds_completed"])
    assert all(not math.isnan(r["metrics"][FEDERATION]["val_acc"]) for r in summed["rounds"])
