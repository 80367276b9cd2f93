"""A plan that selects rounds by balanced accuracy, through the real simulation: silos report it
by default, the results name it, and the run report picks its best round by it. A plan on
ROC-AUC is refused by the silo with three classes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.federation import SILOS, write_plan
from trellis.coordinator.operations.report import best_validation_round, write_report
from trellis.coordinator.simulation.sequential import run_simulation
from trellis.protos.plan import load_plan
from trellis.silo.data.datasets import load_graph_folder


@pytest.fixture(scope="module")
def ws(workspace_factory):
    return workspace_factory("metric-sim", graphs=60)


def _run(ws, name: str, metric: str) -> dict:
    plan = load_plan(write_plan(ws, name, algorithm="fedavg", rounds=3,
                                extra=f'[training]\nvalidation_metric = "{metric}"\n'))
    datasets = {s: load_graph_folder(plan.simulation_data[s]) for s in SILOS}
    return run_simulation(plan, datasets, progress=False)


def test_a_balanced_accuracy_plan_is_reported_and_selected_by_it(ws, tmp_path: Path) -> None:
    results = _run(ws, "balanced", "balanced_acc")
    assert results["status"] == "completed" and results["validation_metric"] == "balanced_acc"
    for record in results["rounds"]:
        for metrics in record["metrics"].values():
            assert set(metrics) == {"val_acc", "test_acc", "train_loss", "val_balanced_acc",
                                    "test_balanced_acc"}
            assert 0.0 <= metrics["val_balanced_acc"] <= 1.0
    means = [sum(m["val_balanced_acc"] for m in r["metrics"].values()) / len(SILOS)
             for r in results["rounds"]]
    chosen = best_validation_round(results)
    assert chosen == means.index(max(means)) + 1
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    write_report(path, tmp_path / "out")
    text = (tmp_path / "out" / "README.md").read_text()
    assert "Rounds are selected by validation balanced accuracy" in text
    assert f"| test_balanced_acc at best val. (round {chosen}) |" in text


def test_a_roc_auc_plan_is_refused_by_the_silo_with_three_classes(ws) -> None:
    three = [s for s in SILOS if ws.domain(s) == "bio"]
    with pytest.raises(ValueError, match=f"silo {three[0]!r} has 3 classes in its data, so "
                                         "it refuses the plan"):
        _run(ws, "auc", "roc_auc")
