"""`coordinator status` as the operator reads it: who is connected, and counts as counts."""

from __future__ import annotations

import re

from trellis.coordinator.operations.status import format_status, to_json
from trellis.protos.status import FederationStatus

SILOS = ("hospital-a", "pharma-b", "social-c")


def _status(stage: str) -> FederationStatus:
    return FederationStatus(
        federation="f", algorithm="fedstar", run_id="r1", round=3, rounds=3,
        rounds_completed=3 if stage == "done" else 2, stage=stage, connected=SILOS,
        metrics_round=2, reported=3,
        metrics={"test_acc": 0.75, "test_count": 36.0, "val_count": 12.5, "val_acc": 1.0},
        started_at=1.7e9, elapsed_s=30.0, round_mean_s=10.0, pid=42)


def test_after_the_end_nobody_is_shown_connected_and_the_list_says_at_the_end() -> None:
    """Before, a finished federation's status still listed every silo as connected."""
    for stage, state in (("done", "finished"), ("failed", "failed: too few silos"),
                         ("training", "stopped (not running; `coordinator serve --plan "
                                      "plan.toml` resumes)")):
        human = format_status(_status(stage), state, 30.0)
        row = re.search(r"^connected +(.*)$", human, re.M)
        assert row is not None, human
        assert row.group(1).startswith("nobody now"), row.group(1)
        assert "3 at the end: hospital-a, pharma-b, social-c" in row.group(1)
        doc = to_json(_status(stage), state, 30.0)
        assert doc["connected"] == [] and doc["connected_at_end"] == list(SILOS)


def test_while_running_the_connected_silos_are_listed() -> None:
    human = format_status(_status("training"), "running", 30.0)
    assert re.search(r"^connected +3: hospital-a, pharma-b, social-c$", human, re.M), human
    doc = to_json(_status("training"), "running", 30.0)
    assert doc["connected"] == list(SILOS) and "connected_at_end" not in doc


def test_counts_print_as_whole_numbers_and_scores_with_four_decimals() -> None:
    """Before, the mean test_count over silos printed as 36.0000."""
    human = format_status(_status("training"), "running", 30.0)
    row = re.search(r"^metrics +(.*)$", human, re.M)
    assert row is not None, human
    assert row.group(1).endswith(
        "test_acc 0.7500, val_acc 1.0000, test_count 36, val_count 12.5"), row.group(1)
