"""The plan's validation metric picks the best round: in the report's best-validation columns,
in the run report, and in FedHGN's early stop (weighted by validation nodes)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from trellis.coordinator.operations.report import best_validation_round, write_report
from trellis.coordinator.rounds.stages.base import RoundRecord
from trellis.coordinator.rounds.strategies import make_strategy
from trellis.protos.plan import HeteroConfig

# Per round, silo -> (val_acc, val_balanced_acc, test_acc, test_balanced_acc). Accuracy is best
# in round 1 (a majority vote on imbalanced splits); balanced accuracy in round 2.
ROUNDS = [{"a": (0.90, 0.50, 0.88, 0.50), "b": (0.85, 0.50, 0.86, 0.50)},
          {"a": (0.80, 0.75, 0.78, 0.70), "b": (0.75, 0.80, 0.76, 0.72)},
          {"a": (0.82, 0.60, 0.80, 0.58), "b": (0.80, 0.62, 0.81, 0.60)}]


def _doc(metric: str | None, rounds: list[dict[str, tuple[float, ...]]] = ROUNDS,
         **extra: Any) -> dict[str, Any]:
    keys = ("val_acc", "val_balanced_acc", "test_acc", "test_balanced_acc")
    per_round = [{s: dict(zip(keys, v, strict=True)) for s, v in r.items()} for r in rounds]
    final: dict[str, dict[str, float]] = {}
    for metrics in per_round:
        final.update(metrics)
    return {"federation": "ward-7", "algorithm": "fedstar", "status": "completed",
            "failure": "", "rounds_planned": 3, "rounds_completed": len(rounds),
            "final_metrics": final, **({"validation_metric": metric} if metric else {}),
            "rounds": [{"round": i + 1, "participants": sorted(m), "dropped": [], "metrics": m}
                       for i, m in enumerate(per_round)], **extra}


def _report(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    write_report(path, tmp_path / "out")
    return (tmp_path / "out" / "README.md").read_text()


def test_the_best_round_follows_the_plans_metric() -> None:
    assert best_validation_round(_doc(None)) == 1             # accuracy, as always
    assert best_validation_round(_doc("acc")) == 1
    assert best_validation_round(_doc("balanced_acc")) == 2


def test_a_silo_without_roc_auc_is_left_out_of_the_mean_never_a_crash() -> None:
    doc = _doc("roc_auc")
    for record, values in zip(doc["rounds"], ([0.6, math.nan], [0.7, None], [0.65, 0.9]),
                              strict=True):
        for silo, value in zip(("a", "b"), values, strict=True):
            record["metrics"][silo]["val_roc_auc"] = value
    # Round 1: a alone (0.6); round 2: a alone (0.7); round 3: (0.65 + 0.9) / 2 = 0.775.
    assert best_validation_round(doc) == 3
    # Silos that never report it (an explicit --report without it): no round to select.
    assert best_validation_round(_doc("roc_auc")) is None


def test_run_report_names_the_metric_and_shows_its_test_value_at_the_best_round(
        tmp_path: Path) -> None:
    text = _report(tmp_path, _doc("balanced_acc"))
    assert ("Rounds are selected by validation balanced accuracy "
            '(`training.validation_metric = "balanced_acc"`, each silo\'s `val_balanced_acc`), '
            "not by accuracy.") in text
    assert ("and its test accuracy and test balanced accuracy in the round of highest mean "
            "validation balanced accuracy over silos.") in text
    assert ("| silo | test_acc | test_balanced_acc | val_acc | val_balanced_acc | test_acc at "
            "best val. (round 2) | test_balanced_acc at best val. (round 2) |") in text
    assert "| a | 80.00 | 58.00 | 82.00 | 60.00 | 78.00 | 70.00 |" in text
    assert "| mean over silos | 80.50 | 59.00 | 81.00 | 61.00 | 77.00 | 71.00 |" in text


def test_run_report_of_an_accuracy_plan_reads_as_it_always_did(tmp_path: Path) -> None:
    text = _report(tmp_path, _doc(None))
    assert "Rounds are selected by" not in text
    assert ("Each silo's last reported metrics (accuracies in percent), and its test accuracy "
            "in the round of highest mean validation accuracy over silos.") in text
    assert "| test_acc at best val. (round 1) |" in text and "balanced_acc at best" not in text


def test_fedhgn_stops_early_on_the_weighted_metric_and_the_report_says_which(
        tmp_path: Path) -> None:
    strategy = make_strategy("fedhgn", hetero=HeteroConfig(classes=2, patience=2,
                                                           min_delta=0.01),
                             metric="balanced_acc")
    # Weighted balanced accuracy: 0.6, 0.8 (best), 0.805 (not by min_delta), 0.7; accuracy
    # keeps rising all along, so an accuracy plan would not stop.
    values = [0.6, 0.8, 0.805, 0.7, 0.9]
    rounds = [{"a": {"val_acc": 0.5 + i / 10, "val_balanced_acc": v, "val_count": 10.0,
                     "test_acc": 0.9, "test_balanced_acc": v - 0.1, "test_count": 10.0}}
              for i, v in enumerate(values)]
    history = [RoundRecord(i + 1, 1, ("a",), 10, 0.0, 1.0, m) for i, m in enumerate(rounds)]
    accuracy = make_strategy("fedhgn", hetero=HeteroConfig(classes=2, patience=2,
                                                           min_delta=0.01))
    assert not accuracy.should_stop(history)
    assert not strategy.should_stop(history[:4]) and strategy.should_stop(history[:5])
    selection = strategy.selection(history)
    assert selection["best_round"] == 2 and selection["validation_metric"] == "balanced_acc"
    assert selection["val_balanced_acc"] == 0.8
    assert math.isclose(selection["test_balanced_acc"], 0.7) and selection["test_acc"] == 0.9
    doc = {"federation": "ward-7", "algorithm": "fedhgn", "status": "completed", "failure": "",
           "rounds_planned": 50, "rounds_completed": 5, "validation_metric": "balanced_acc",
           "final_metrics": rounds[-1], "early_stopping": selection,
           "rounds": [{"round": i + 1, "participants": ["a"], "dropped": [], "metrics": m}
                      for i, m in enumerate(rounds)]}
    text = _report(tmp_path, doc)
    assert ("the validation balanced accuracy weighted by validation nodes was best in round 2 "
            "(0.8000), and none of the 2 scored rounds after it reached 0.8000 + 0.01 (round 3 "
            "0.8050, round 4 0.7000)") in text
    assert ("The selected round 2 has a test accuracy weighted by test nodes of 0.9000 and a "
            "test balanced accuracy of 0.7000.") in text
