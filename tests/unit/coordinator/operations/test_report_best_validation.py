"""The report's best-validation column: the round of highest mean validation accuracy."""

from __future__ import annotations

import json
import math
from pathlib import Path

from trellis.coordinator.operations.report import best_validation_round, write_report


def _doc(rounds: list[dict[str, tuple[float, float]]], status: str = "completed") -> dict:
    """rounds: per round, silo -> (val_acc, test_acc)."""
    return {"federation": "crafted", "algorithm": "fedstar", "status": status,
            "rounds_planned": 4, "rounds_completed": len(rounds),
            "rounds": [{"round": i + 1, "metrics": {s: {"val_acc": v, "test_acc": t}
                                                    for s, (v, t) in r.items()}}
                       for i, r in enumerate(rounds)]}


# Mean val: r1 0.55, r2 0.80 (best), r3 0.70; test at r2: 0.60/0.70, at r3 (last): 0.90/0.80.
CRAFTED = [{"a": (0.5, 0.5), "b": (0.6, 0.5)}, {"a": (0.9, 0.6), "b": (0.7, 0.7)},
           {"a": (0.6, 0.9), "b": (0.8, 0.8)}]


def test_best_round_is_by_mean_validation_over_silos_earliest_of_equals() -> None:
    assert best_validation_round(_doc(CRAFTED)) == 2
    # a alone is best in round 2, but b's drop makes round 3's mean higher.
    assert best_validation_round(_doc([{"a": (0.5, 0), "b": (0.9, 0)},
                                       {"a": (0.9, 0), "b": (0.4, 0)},
                                       {"a": (0.7, 0), "b": (0.8, 0)}])) == 3
    assert best_validation_round(_doc([{"a": (0.7, 0)}, {"a": (0.7, 0)}])) == 1
    assert best_validation_round(_doc([{"a": (math.nan, 0)}])) is None


def test_table_shows_best_validation_round_beside_the_last(tmp_path: Path) -> None:
    results = tmp_path / "runs"
    for seed, rounds in ((1, CRAFTED), (2, [*CRAFTED[:2], {"a": (0.95, 0.4),
                                                             "b": (0.95, 0.4)}])):
        path = results / "CHEM" / "fedstar" / f"seed-{seed}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_doc(rounds)))
    write_report(results, tmp_path / "out")
    table = (tmp_path / "out" / "README.md").read_text()
    assert "| final round | best val. (round) |" in table
    # seed 1: best round 2 -> 65; seed 2: best round 3 -> 40; final: 85 and 40.
    assert "| fedstar | 62.50±31.82 | – | 62.50 | 52.50 (rounds 2–3) |" in table, table


def test_a_running_federations_results_file_is_reported(tmp_path: Path) -> None:
    doc = _doc([*CRAFTED, {}], status="running")
    doc["rounds"][-1]["metrics"] = {}      # round 4 completed, its metrics not yet reported
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    write_report(path, tmp_path / "out")
    table = (tmp_path / "out" / "README.md").read_text()
    assert "status running, 4 of 4 rounds completed" in table
    # The last metrics each silo reported are round 3's; the best-validation round is 2.
    assert "| silo | test_acc | val_acc | test_acc at best val. (round 2) |" in table, table
    assert "| mean over silos | 85.00 | 70.00 | 65.00 |" in table, table
