"""AuditLog.observe: observers see each record once it is written, and nothing before."""

from __future__ import annotations

from pathlib import Path

from trellis.crypto.audit import AuditLog


def test_observer_sees_each_record_after_it_is_written(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    seen: list[tuple[str, int, int]] = []
    with AuditLog(path, writer="coordinator") as log:
        log.append("before", n=0)
        log.observe(lambda r: seen.append((r["event"], r["n"],
                                           len(path.read_text().splitlines()))))
        log.append("first", n=1)
        log.append("second", n=2)
    # Not the record appended before observing; each one is on disk when its observer runs.
    assert seen == [("first", 1, 2), ("second", 2, 3)]
