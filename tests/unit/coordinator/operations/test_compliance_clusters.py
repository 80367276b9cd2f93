"""`coordinator audit report` of a GCFL run shows its splits and the update norms received;
of a FedHGN run, why it stopped early. Read from a real audit log and results.json."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from trellis.coordinator.operations.compliance import report_state_dir
from trellis.crypto.audit import AuditLog
from trellis.protos.document import Section, Table, to_markdown

SHA = "c" * 64


def _report(state: Path) -> str:
    document, verification = report_state_dir(state, None, generated="now",
                                              now=datetime.now(UTC))
    assert verification.ok, verification.problems
    return to_markdown(document)


def _section(state: Path, title: str) -> Section:
    document, _ = report_state_dir(state, None, generated="now", now=datetime.now(UTC))
    return next(s for s in document.sections if s.title == title)


def test_gcfl_compliance_report_shows_the_split_and_each_norm_received(tmp_path: Path) -> None:
    with AuditLog(tmp_path / "audit.jsonl", writer="coordinator") as log:
        log.append("serve", federation="ward-7", algorithm="gcfl", rounds=22,
                   admitted=["a", "b", "c"])
        for silo, norm in (("a", 0.6), ("b", 0.4), ("c", 0.5)):
            for tensor in ("update", "unweighted_update"):     # GCFL masks twice
                log.append("received_tensor", silo=silo, round=21, attempt=1,
                           phase="MASKED_INPUT", tensor=tensor, dtype="uint32", shape=[8],
                           bytes=32, sha256=SHA,
                           statistics={"update_norm": norm, "grad_norm": 1.5})
        log.append("clusters", round=21, split={"members": ["a", "b", "c"],
                                                "into": [["a", "b"], ["c"]]})
    section = _section(tmp_path, "Clusters")
    splits, norms = (b for b in section.blocks if isinstance(b, Table))
    assert splits.rows == (("21", "a, b, c", "a, b / c", "", "", "8"),)
    assert [row[:5] for row in norms.rows] == [("21", "1", "a", "0.6", "1.5"),
                                               ("21", "1", "b", "0.4", "1.5"),
                                               ("21", "1", "c", "0.5", "1.5")]
    assert "## Clusters" in _report(tmp_path)


def test_fedhgn_compliance_report_says_why_the_run_stopped_early(tmp_path: Path) -> None:
    with AuditLog(tmp_path / "audit.jsonl", writer="coordinator") as log:
        log.append("serve", federation="ward-7", algorithm="fedhgn", rounds=50, admitted=["a"])
    metrics = [{"a": {"val_acc": v, "val_count": 10.0, "test_acc": v, "test_count": 10.0}}
               for v in (0.8, 0.7, 0.75)]
    (tmp_path / "results.json").write_text(json.dumps({
        "federation": "ward-7", "algorithm": "fedhgn", "status": "completed",
        "rounds_planned": 50, "rounds_completed": 3,
        "rounds": [{"round": i + 1, "participants": ["a"], "dropped": [], "metrics": m}
                   for i, m in enumerate(metrics)],
        "early_stopping": {"best_round": 1, "val_acc": 0.8, "test_acc": 0.8,
                           "stopped_after": 2, "patience": 1, "min_delta": 0.001}}))
    text = _report(tmp_path)
    assert ("Stopped by FedHGN's early-stopping rule (patience 1, min_delta 0.001): the "
            "validation accuracy weighted by validation nodes was best in round 1 (0.8000), "
            "and none of the 1 scored rounds after it reached 0.8000 + 0.001 (round 2 "
            "0.7000). So after round 2 the coordinator stopped, at the end of round 3 of 50"
            ) in text
    assert "## Clusters" not in text
