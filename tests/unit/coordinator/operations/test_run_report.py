"""`coordinator report` of one run: its own figures, why FedHGN stopped, GCFL's splits and norms.

The FedHGN and GCFL runs' records come from the real strategies (their early-stop decision and
their split test), fed rounds of crafted metrics and norms.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from trellis.coordinator.operations.report import write_report
from trellis.coordinator.rounds.stages.base import RoundRecord
from trellis.coordinator.rounds.strategies import AggregateResult, make_strategy
from trellis.protos.plan import ClusteringConfig, HeteroConfig


def _results(algorithm: str, rounds: list[dict[str, dict[str, float]]], **extra: Any
             ) -> dict[str, Any]:
    final: dict[str, dict[str, float]] = {}
    for metrics in rounds:
        final.update(metrics)
    return {"federation": "ward-7", "algorithm": algorithm, "status": "completed",
            "failure": "", "rounds_planned": 50, "rounds_completed": len(rounds),
            "final_metrics": dict(sorted(final.items())),
            "rounds": [{"round": i + 1, "participants": sorted(m), "dropped": [],
                        "metrics": m} for i, m in enumerate(rounds)], **extra}


def _report(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    write_report(path, tmp_path / "out")
    return (tmp_path / "out" / "README.md").read_text()


def test_one_run_is_a_run_report_with_per_silo_figures_and_no_paper_columns(
        tmp_path: Path) -> None:
    text = _report(tmp_path, _results("fedstar", [
        {"a": {"val_acc": 0.5, "test_acc": 0.4}, "b": {"val_acc": 0.7, "test_acc": 0.6}},
        {"a": {"val_acc": 0.9, "test_acc": 0.8}, "b": {"val_acc": 0.8, "test_acc": 0.7}},
        {"a": {"val_acc": 0.6, "test_acc": 0.9}, "b": {"val_acc": 0.7, "test_acc": 0.5}}]))
    assert text.startswith("# Run report: federation ward-7\n")
    assert "Reproduction" not in text and "paper |" not in text and "Δ" not in text
    assert "status completed, 3 of 50 rounds completed." in text
    assert "| silo | test_acc | val_acc | test_acc at best val. (round 2) |" in text
    assert "| a | 90.00 | 60.00 | 80.00 |" in text
    assert "| b | 50.00 | 70.00 | 70.00 |" in text
    assert "| mean over silos | 70.00 | 65.00 | 75.00 |" in text


def test_fedhgns_early_stop_is_explained_in_words(tmp_path: Path) -> None:
    strategy = make_strategy("fedhgn", hetero=HeteroConfig(classes=2, patience=2,
                                                           min_delta=0.01))
    # Weighted validation accuracy: 0.6, 0.8 (best), 0.805 (not by min_delta), 0.7.
    values = [0.6, 0.8, 0.805, 0.7, 0.9]
    rounds = [{"a": {"val_acc": v, "val_count": 10.0, "test_acc": v - 0.1,
                     "test_count": 10.0}} for v in values]
    history = [RoundRecord(i + 1, 1, ("a",), 10, 0.0, 1.0, m) for i, m in enumerate(rounds)]
    assert not strategy.should_stop(history[:4]) and strategy.should_stop(history[:5])
    text = _report(tmp_path, _results("fedhgn", rounds,
                                      early_stopping=strategy.selection(history)))
    assert ("## Why the run stopped early\n\nStopped by FedHGN's early-stopping rule "
            "(patience 2, min_delta 0.01): the validation accuracy weighted by validation "
            "nodes was best in round 2 (0.8000), and none of the 2 scored rounds after it "
            "reached 0.8000 + 0.01 (round 3 0.8050, round 4 0.7000). So after round 4 the "
            "coordinator stopped, at the end of round 5 of 50") in text
    assert "The selected round 2 has a test accuracy weighted by test nodes of 0.7000." in text


def test_gcfl_run_report_shows_the_split_and_the_norms_received(tmp_path: Path) -> None:
    silos = ("a", "b", "c")
    strategy = make_strategy("gcfl", ClusteringConfig(eps1=0.1, eps2=0.3), silos)
    # GCFL splits from round 20 on (MIN_SPLIT_ROUND): round 20 is quiet, round 21 splits.
    quiet = AggregateResult(20, silos, np.array([0.5, 0.0]), 30, np.array([0.5, 0.0]))
    strategy.complete_round(20, {silos: quiet}, {s: {"update_norm": 0.2, "grad_norm": 1.0}
                                                 for s in silos})
    strategy.close_round(20)
    due = AggregateResult(21, silos, np.array([0.05, 0.0]), 30, np.array([0.05, 0.0]))
    stats = {"a": {"update_norm": 0.6, "grad_norm": 1.0},
             "b": {"update_norm": 0.4, "grad_norm": 1.0},
             "c": {"update_norm": 0.5, "grad_norm": 1.0}}
    assert strategy.complete_round(21, {silos: due}, stats) == [silos]
    strategy.apply_similarity(silos, np.array([[1.0, 0.9, -0.9], [0.9, 1.0, -0.9],
                                               [-0.9, -0.9, 1.0]]))
    strategy.close_round(21)
    clustering = {"clusters": [list(c) for c in strategy.state.clusters],
                  "splits": strategy.splits, "norms": strategy.norms,
                  "config": {"eps1": 0.1, "eps2": 0.3}}
    metrics = {s: {"test_acc": 0.5} for s in silos}
    text = _report(tmp_path, _results("gcfl", [metrics, metrics], clustering=clustering))
    assert "Final clusters: a, b; c." in text
    assert "| 21 | a, b, c | a, b / c | 0.05 | 0.6 |" in text
    assert "| 20 | a, b, c | 0.5 | 0.2 | a 0.2, b 0.2, c 0.2 |" in text
    assert "| 21 | a, b, c | 0.05 | 0.6 | a 0.6, b 0.4, c 0.5 |" in text
