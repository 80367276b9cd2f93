"""The reproduction report: the reference code's aggregation and GCFL's snapshot protocol."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trellis.coordinator.operations.report import aggregate, snapshot_accuracy, write_report


def _doc(accs: list[dict[str, float]], splits: list[dict] | None = None) -> dict:
    rounds = [{"round": i + 1, "metrics": {s: {"test_acc": a} for s, a in acc.items()}}
              for i, acc in enumerate(accs)]
    doc = {"status": "completed", "rounds": rounds}
    if splits is not None:
        doc["clustering"] = {"splits": splits}
    return doc


def test_aggregate_is_mean_of_silo_means_and_mean_of_silo_stds() -> None:
    # silo a: 0.70, 0.80 -> mean 75, std 7.0711; silo b: 0.60, 0.60 -> mean 60, std 0.
    mean, pm = aggregate([{"a": 0.70, "b": 0.60}, {"a": 0.80, "b": 0.60}])
    assert mean == pytest.approx(67.5)
    assert pm == pytest.approx((7.0710678 + 0.0) / 2)


def test_gcfl_protocol_takes_the_best_of_split_snapshots_and_final() -> None:
    doc = _doc([{"a": 0.9, "b": 0.5}, {"a": 0.6, "b": 0.7}],
               splits=[{"round": 2, "members": ["a", "b"]}])
    # The split in round 2 snapshots round 1: a keeps 0.9, b's final 0.7 is better than 0.5.
    assert snapshot_accuracy(doc) == {"a": 0.9, "b": 0.7}


def test_report_writes_table_summary_and_curves(tmp_path: Path) -> None:
    results = tmp_path / "runs"
    for alg, accs in (("local", (0.70, 0.72)), ("fedstar", (0.80, 0.78))):
        for seed, acc in enumerate(accs, start=1):
            path = results / "CHEM" / alg / f"seed-{seed}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(_doc([{"x": acc - 0.1}, {"x": acc}])))
    out = tmp_path / "report"
    written = write_report(results, out)
    assert {p.name for p in written} == {"README.md", "summary.json", "curves-CHEM.png"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["CHEM"]["fedstar"] == {"mean": 79.0, "pm": pytest.approx(1.41, abs=0.01),
                                          "seeds": 2, "rounds": 2}
    table = (out / "README.md").read_text()
    assert "| fedstar | 79.00±1.41 | +8.00 |" in table and "79.79 (FedStar Tab. 1)" in table
    assert (out / "curves-CHEM.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_refuses_an_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no completed runs"):
        write_report(tmp_path, tmp_path / "out")
