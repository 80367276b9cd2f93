"""The silo's own metrics file: one whole line per round, each round once across restarts."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from trellis.silo.operations.metrics_file import MetricsFile, read_metrics


def _now() -> datetime:
    return datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_a_restarted_silo_does_not_write_a_round_twice(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    first = MetricsFile(path, now=_now)
    assert first.record(1, {"test_acc": 0.5, "val_acc": float("nan")}, 1.25)
    assert not first.record(1, {"test_acc": 0.9}, 1.0)         # sent again: kept once
    again = MetricsFile(path, now=_now)                        # a restarted silo process
    assert again.rounds == {1}
    assert not again.record(1, {"test_acc": 0.9}, None)
    assert again.record(2, {"test_acc": 0.75}, None)
    assert read_metrics(path) == [
        {"round": 1, "time": "2025-01-02T03:04:05+00:00", "test_acc": 0.5, "val_acc": None,
         "train_seconds": 1.25},
        {"round": 2, "time": "2025-01-02T03:04:05+00:00", "test_acc": 0.75}]
    # Every line is whole JSON, NaN written as null (strict JSON readers accept it).
    for line in path.read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_a_damaged_file_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"round": 1}\n{"round": 2, "test_a\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl line 2 is not JSON"):
        MetricsFile(path)
