"""The compliance report of a standing coordinator's deployment: real audit logs signed with the
coordinator's key (the records JobHost writes, then a job's federation log), verified, summed up
per operator and per site, each job checked against what its operator signed and its sites
approved; `coordinator audit report --state-dir STATE_ROOT` writes it and fails on a bad log."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trellis.coordinator.cli.app import app
from trellis.coordinator.jobs.store import JobStore
from trellis.coordinator.operations.deployment_compliance import report_state_root
from trellis.crypto.audit import AuditLog
from trellis.crypto.pki import SERVER_KEY, init_ca
from trellis.protos.document import Facts, Table, Verdict, to_markdown

SILOS = ["hospital-a", "hospital-b", "hospital-c"]
SIGNED = "a" * 64


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("deployment-ca") / "ca"
    init_ca(folder, ["localhost"])
    return folder


def _deployment(root: Path, ca: Path, *, admitted_by_job: list[str] | None = None) -> Path:
    """A state root: the deployment's log, job 1 completed (with its federation log), job 2
    refused by a site, job 3 never offered; and the job table that marks it as a state root."""
    key = (ca / SERVER_KEY).read_bytes()
    root.mkdir(parents=True)
    JobStore.open(root / "jobs.sqlite").close()
    with AuditLog(root / "audit.jsonl", writer="coordinator", signing_key_pem=key) as log:
        log.append("serve_deployment", deployment="consortium", admitted=SILOS,
                   operators=["ops-alice", "ops-bob"], max_concurrent_jobs=1)
        for job, operator in ((1, "ops-alice"), (2, "ops-bob"), (3, "ops-alice")):
            log.append("job_submitted", job=job, operator=operator, federation=f"fed-{job}",
                       algorithm="fedstar", dataset="graphs", silos=SILOS[:2],
                       public_sha256=SIGNED if job == 1 else "b" * 64,
                       submission_sha256=f"{job}" * 64)
        log.append("job_state", job=1, state="awaiting_approval", reason="")
        log.append("job_answer", job=1, silo="hospital-a", answer="approved", reason="")
        log.append("job_answer", job=1, silo="hospital-b", answer="approved", reason="")
        log.append("job_state", job=1, state="queued", reason="")
        log.append("job_state", job=1, state="running", reason="")
        log.append("job_federation", job=1, resumed=False, participants=SILOS[:2],
                   run_id="0123")
        log.append("job_state", job=2, state="awaiting_approval", reason="")
        log.append("job_answer", job=2, silo="hospital-a", answer="refused",
                   reason="policy: dataset graphs is not offered")
        log.append("job_state", job=2, state="failed", reason="too few silos approved")
        log.append("refused", subject="mallory", service="Admin",
                   reason="not an operator's certificate")
        log.append("job_state", job=1, state="completed", reason="2 rounds")
        log.append("stopped")
    folder = root / "jobs" / "1"
    folder.mkdir(parents=True)
    with AuditLog(folder / "audit.jsonl", writer="coordinator", signing_key_pem=key) as log:
        log.append("serve", federation="fed-1", algorithm="fedstar", rounds=2,
                   resumed_at_round=1, admitted=admitted_by_job or SILOS[:2],
                   plan_sha256=SIGNED)
        for number in (1, 2):
            log.append("round_opened", round=number, attempt=1, participants=SILOS[:2])
            log.append("round_completed", round=number, attempt=1, seconds=1.0,
                       participants=SILOS[:2], dropped=[])
    return root


def _report(root: Path, ca: Path):  # type: ignore[no-untyped-def]
    return report_state_root(root, ca, generated="now", now=datetime.now(UTC))


def _table(document, title: str) -> Table:  # type: ignore[no-untyped-def]
    section = next(s for s in document.sections if s.title == title)
    return next(b for b in section.blocks if isinstance(b, Table))


def test_the_deployment_and_each_job_are_reported_and_verified(tmp_path: Path, ca: Path) -> None:
    document, verification, jobs = _report(_deployment(tmp_path / "state", ca), ca)
    assert verification.ok and verification.signatures_checked and verification.closed
    assert [(j.job_id, j.verification is not None and j.verification.ok) for j in jobs] == [
        (1, True), (2, False), (3, False)]
    assert document.title == "Compliance report of deployment consortium"
    facts = dict(next(b for b in document.intro if isinstance(b, Facts)).pairs)
    assert facts["jobs submitted"] == "3"
    assert facts["their states"] == "1 completed, 1 failed, 1 submitted"
    submitted = _table(document, "Jobs submitted").rows
    assert [(r[0], r[2], r[9]) for r in submitted] == [
        ("1", "ops-alice", "completed: 2 rounds"),
        ("2", "ops-bob", "failed: too few silos approved"), ("3", "ops-alice", "submitted")]
    assert _table(document, "Jobs by operator").rows == (
        ("ops-alice", "2", "1", "0", "0", "1"), ("ops-bob", "1", "0", "1", "0", "0"))
    assert _table(document, "Approvals and refusals by site").rows == (
        ("hospital-a", "3", "1", "1", "1"), ("hospital-b", "3", "1", "0", "2"),
        ("hospital-c", "0", "0", "0", "0"))
    refused = _table(document, "Refused callers").rows
    assert len(refused) == 1 and "subject mallory, service Admin" in refused[0][3]
    titles = [s.title for s in document.sections]
    assert "Job 1: Rounds" in titles and "Job 1: Verification of this log" in titles
    job1 = next(s for s in document.sections if s.title == "Job 1")
    assert next(b for b in job1.blocks if isinstance(b, Verdict)).ok
    never = next(s for s in document.sections if s.title == "Job 2")
    assert "its federation never ran" in never.blocks[0].text  # type: ignore[union-attr]
    markdown = to_markdown(document)
    assert "policy: dataset graphs is not offered" in markdown


def test_a_federation_that_admitted_a_silo_without_its_approval_is_flagged(tmp_path: Path,
                                                                           ca: Path) -> None:
    root = _deployment(tmp_path / "state", ca, admitted_by_job=SILOS)
    document, _, _ = _report(root, ca)
    job1 = next(s for s in document.sections if s.title == "Job 1")
    verdict = next(b for b in job1.blocks if isinstance(b, Verdict))
    assert not verdict.ok
    assert verdict.details == ("its federation admitted hospital-c, which did not approve the "
                               "job",)


def test_audit_report_writes_it_and_fails_on_a_job_log_that_does_not_verify(
        tmp_path: Path, ca: Path) -> None:
    root = _deployment(tmp_path / "state", ca)
    runner = CliRunner()
    out = tmp_path / "report.md"
    done = runner.invoke(app, ["audit", "report", "--state-dir", str(root), "--ca", str(ca),
                               "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert done.output.startswith(f"wrote {out}: the deployment's audit log and 1 job log "
                                  "verify (")
    assert "# Compliance report of deployment consortium" in out.read_text()
    log = root / "jobs" / "1" / "audit.jsonl"
    log.write_text(log.read_text().replace('"seconds":1.0', '"seconds":9.0', 1))
    done = runner.invoke(app, ["audit", "report", "--state-dir", str(root), "--ca", str(ca),
                               "--out", str(out)])
    assert done.exit_code == 1, done.output
    assert f"1 of 2 audit logs do NOT verify: {log}: " in done.output
