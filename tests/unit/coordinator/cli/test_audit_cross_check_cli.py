"""``coordinator audit cross-check`` on real log files: a pair of logs that cannot match."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from trellis.coordinator.cli.app import app
from trellis.crypto.audit import AuditLog

SHA = "a" * 64


def test_logs_of_two_federations_are_one_line_and_exit_2(tmp_path: Path) -> None:
    silo_log, coordinator_log = tmp_path / "silo.jsonl", tmp_path / "coordinator.jsonl"
    with AuditLog(silo_log, writer="hospital-a") as log:
        log.append("joined", federation="fed-a")
        for round_ in range(1, 31):
            log.append("sent_tensor", round=round_, attempt=1, sha256=SHA)
    with AuditLog(coordinator_log, writer="coordinator") as log:
        log.append("serve", federation="fed-b")
        log.append("connected", silo="hospital-a")
        for round_ in range(1, 31):
            log.append("received_tensor", phase="MASKED_INPUT", silo="hospital-a",
                       round=round_, attempt=1, sha256=SHA)
    done = CliRunner().invoke(app, ["audit", "cross-check", str(silo_log),
                                    str(coordinator_log)])
    assert done.exit_code == 2, done.output
    assert "MISMATCH" not in done.output
    assert done.stderr.strip() == (
        "error: these logs are of different federations: the silo's log is of 'fed-a', the "
        "coordinator's of 'fed-b'; cross-check a silo's log against the coordinator log of "
        "the federation it joined")
