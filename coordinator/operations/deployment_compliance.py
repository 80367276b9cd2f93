"""The compliance report of a standing coordinator's deployment, then of each of its jobs.

`coordinator audit report --state-dir STATE_ROOT` builds it when the folder is a state root
(it holds jobs.sqlite). The deployment's own audit log (state_root/audit.jsonl) says who
submitted which job (`job_submitted`: the operator and the hashes they signed), how each site
answered (`job_answer`), how each job went (`job_state`, `job_stop`, `job_federation`), which
callers were refused and how the revocation list changed; it is verified like a federation's
log. Each job's folder (state_root/jobs/<id>/) is a one-plan state folder: its federation's log
is verified and reported exactly as `coordinator audit report` reports a one-plan federation
(coordinator/operations/compliance.py), and checked against what the deployment log says of
the job: the plan the operator signed, and the silos that approved it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from trellis.coordinator.operations.compliance import (
    AUDIT_LOG,
    report_state_dir,
)
from trellis.coordinator.operations.compliance import (
    record_int as _int,
)
from trellis.coordinator.operations.compliance import (
    record_names as _names,
)
from trellis.coordinator.operations.compliance import (
    record_text as _s,
)
from trellis.crypto.audit import AuditReport, verify_audit_log
from trellis.crypto.audit_crosscheck import Record, read_records
from trellis.crypto.certificates import certificate_fingerprint
from trellis.crypto.pki import SERVER_CERT
from trellis.protos.audit_blocks import verification_section
from trellis.protos.document import Block, Document, Facts, Paragraph, Section, Table, Verdict

JOBS_FOLDER = "jobs"


@dataclass
class _Job:
    """What the deployment's log says of one job."""

    job_id: int
    submitted: dict[str, Any]
    line: int
    state: str = "submitted"
    reason: str = ""
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class JobLog:
    """A job's own federation log, verified (None: the job never ran a federation)."""

    job_id: int
    folder: Path
    document: Document | None
    verification: AuditReport | None


def report_state_root(state_root: Path, ca: Path | None, *, generated: str, now: datetime
                      ) -> tuple[Document, AuditReport, list[JobLog]]:
    """Verify the deployment's audit log and every job's (with the CA folder's server.crt),
    and report them all in one document."""
    log = state_root / AUDIT_LOG
    cert = ca / SERVER_CERT if ca is not None else None
    cert_pem = cert.read_bytes() if cert is not None else None
    verification = verify_audit_log(log, cert_pem=cert_pem)
    signer = None if cert is None or cert_pem is None else (
        f"{cert} ({certificate_fingerprint(cert_pem)})")
    records = read_records(log)
    jobs = _jobs(records)
    logs = []
    for job_id in sorted(set(jobs) | _folders(state_root)):
        folder = state_root / JOBS_FOLDER / str(job_id)
        if (folder / AUDIT_LOG).is_file():
            document, checked = report_state_dir(folder, ca, generated=generated, now=now)
            logs.append(JobLog(job_id, folder, document, checked))
        else:
            logs.append(JobLog(job_id, folder, None, None))
    document = deployment_report(records, verification, jobs, logs, signer=signer,
                                 generated=generated)
    return document, verification, logs


def _folders(state_root: Path) -> set[int]:
    """The jobs that have a folder (a job the log does not name is reported too)."""
    root = state_root / JOBS_FOLDER
    return {int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit()
            } if root.is_dir() else set()


def _jobs(records: list[Record]) -> dict[int, _Job]:
    jobs: dict[int, _Job] = {}
    for line, r in records:
        event, job_id = r.get("event"), _int(r.get("job"))
        if event == "job_submitted":
            jobs[job_id] = _Job(job_id, r, line)
        elif job_id in jobs and event == "job_state":
            jobs[job_id].state, jobs[job_id].reason = _s(r.get("state")), _s(r.get("reason"))
        elif job_id in jobs and event == "job_answer":
            jobs[job_id].answers[_s(r.get("silo"))] = r
    return jobs


def deployment_report(records: list[Record], verification: AuditReport, jobs: dict[int, _Job],
                      logs: list[JobLog], *, signer: str | None, generated: str) -> Document:
    """The report of the deployment's log `records` (verified as `verification`), then each
    job's (`logs`)."""
    serves = [r for _, r in records if r.get("event") == "serve_deployment"]
    last = serves[-1] if serves else {}
    name = _s(last.get("deployment")) or "unknown"
    outcomes = Counter(job.state for job in jobs.values())
    intro: tuple[Block, ...] = (
        Facts((("deployment", name),
               ("admitted silos", _names(last.get("admitted"))),
               ("operators", _names(last.get("operators")) if last.get("operators")
                else "any operator certificate of the CA"),
               ("jobs submitted", str(len(jobs))),
               ("their states", ", ".join(f"{n} {s.replace('_', ' ')}"
                                          for s, n in sorted(outcomes.items())) or "none"))),
        Paragraph("Read from the standing coordinator's own audit log (who submitted which job, "
                  "how each site answered, how each job went), then from each job's federation "
                  "log, verified and reported as a one-plan federation's."))
    sections = [verification_section(verification, signer),
                _submitted(jobs), _by_operator(jobs), _by_site(jobs, last), _answers(records),
                _table(records, "Job history", {"job_state": ("job", "state", "reason"),
                                                "job_stop": ("job", "operator", "reason")},
                       "no job changed state"),
                _table(records, "Federations started", {
                    "job_federation": ("job", "resumed", "participants", "run_id")},
                       "no job's federation started"),
                _table(records, "Refused callers",
                       {"refused": ("subject", "service", "reason", "serial")},
                       "no caller was refused"),
                _table(records, "Revocation-list changes", {"revocation_list": ("change",)},
                       "the revocation list did not change while the coordinator ran"),
                _table(records, "Coordinator runs", {
                    "serve_deployment": ("deployment", "admitted", "operators",
                                         "max_concurrent_jobs"), "stopped": ()},
                       "none recorded")]
    for log in logs:
        sections += _job_sections(log, jobs.get(log.job_id))
    return Document(f"Compliance report of deployment {name}", tuple(sections),
                    footer=f"generated {generated} from {verification.path}", intro=intro)


def _submitted(jobs: dict[int, _Job]) -> Section:
    rows = tuple((str(j.job_id), _s(j.submitted.get("ts")), _s(j.submitted.get("operator")),
                  _s(j.submitted.get("federation")), _s(j.submitted.get("algorithm")),
                  _s(j.submitted.get("dataset")), _names(j.submitted.get("silos")),
                  _s(j.submitted.get("public_sha256")),
                  _s(j.submitted.get("submission_sha256")),
                  j.state.replace("_", " ") + (f": {j.reason}" if j.reason else ""),
                  str(j.line)) for j in sorted(jobs.values(), key=lambda j: j.job_id))
    return Section("Jobs submitted", (
        Paragraph("Each job as its operator signed it: the SHA-256 of the public plan every "
                  "silo was offered, and of the signed submission statement."),
        Table(("job", "submitted", "operator", "federation", "algorithm", "dataset", "silos",
               "public plan SHA-256", "submission SHA-256", "state", "log line"), rows,
              empty="no job was submitted")))


def _by_operator(jobs: dict[int, _Job]) -> Section:
    counts: dict[str, Counter[str]] = {}
    for job in jobs.values():
        counts.setdefault(_s(job.submitted.get("operator")), Counter())[job.state] += 1
    rows = tuple((operator, str(sum(c.values())), str(c["completed"]), str(c["failed"]),
                  str(c["stopped"]), str(sum(c.values()) - c["completed"] - c["failed"]
                                         - c["stopped"]))
                 for operator, c in sorted(counts.items()))
    return Section("Jobs by operator", (
        Table(("operator", "submitted", "completed", "failed", "stopped", "not ended"), rows,
              empty="no job was submitted"),))


def _by_site(jobs: dict[int, _Job], serve: dict[str, Any]) -> Section:
    sites = [_s(s) for s in serve.get("admitted") or []]
    for job in jobs.values():
        sites += [_s(s) for s in job.submitted.get("silos") or [] if _s(s) not in sites]
    rows = []
    for site in sites:
        named = [j for j in jobs.values() if site in (j.submitted.get("silos") or [])]
        said = Counter(_s(j.answers[site].get("answer")) for j in named if site in j.answers)
        rows.append((site, str(len(named)), str(said["approved"]), str(said["refused"]),
                     str(len(named) - said["approved"] - said["refused"])))
    return Section("Approvals and refusals by site", (
        Paragraph("Each site decides every job that names it by its own policy (or by hand); "
                  "a job none of whose answers came before it ended shows as no answer."),
        Table(("site", "jobs naming it", "approved", "refused", "no answer"), tuple(rows),
              empty="no site is admitted")))


def _answers(records: list[Record]) -> Section:
    rows = tuple((_s(r.get("ts")), _s(r.get("job")), _s(r.get("silo")), _s(r.get("answer")),
                  _s(r.get("reason")), str(line))
                 for line, r in records if r.get("event") == "job_answer")
    return Section("Answers", (Table(("time", "job", "site", "answer", "reason", "log line"),
                                     rows, empty="no site answered"),))


def _table(records: list[Record], title: str, events: dict[str, tuple[str, ...]],
           empty: str) -> Section:
    """The records of these events, one row each (event, its named fields)."""
    rows = []
    for line, r in records:
        keys = events.get(_s(r.get("event")))
        if keys is not None:
            details = ", ".join(f"{k} {_plain(r.get(k))}" for k in keys if k != "job"
                                and r.get(k) not in (None, "", []))
            rows.append((_s(r.get("ts")), _s(r.get("job")), _s(r.get("event")), details,
                         str(line)))
    return Section(title, (Table(("time", "job", "event", "details", "log line"), tuple(rows),
                                 empty=empty),))


def _job_sections(log: JobLog, job: _Job | None) -> list[Section]:
    """A job's part of the report: what the deployment says of it, checked against its own
    federation log, then that log's report."""
    title = f"Job {log.job_id}"
    if log.document is None:
        said = "its federation never ran" if job is not None else "not in the deployment log"
        return [Section(title, (Paragraph(f"{said}: no federation audit log in "
                                          f"{log.folder}."),))]
    head: list[Block] = [Paragraph(f"{log.document.title}, from {log.folder / AUDIT_LOG}.")]
    head += list(log.document.intro)
    head.append(_agreement(log, job))
    return [Section(title, tuple(head)),
            *(Section(f"Job {log.job_id}: {s.title}", s.blocks) for s in log.document.sections)]


def _agreement(log: JobLog, job: _Job | None) -> Verdict:
    """Whether the job's federation served the plan its operator signed, and admitted only
    silos that approved it."""
    if job is None:
        return Verdict(False, "the deployment's audit log has no job_submitted record of "
                              "this job")
    serves = [r for _, r in read_records(log.folder / AUDIT_LOG) if r.get("event") == "serve"]
    signed = _s(job.submitted.get("public_sha256"))
    approved = {s for s, a in job.answers.items() if a.get("answer") == "approved"}
    problems = []
    for serve in serves:
        if _s(serve.get("plan_sha256")) != signed:
            problems.append(f"its federation served public plan {serve.get('plan_sha256')}, "
                            f"the operator signed {signed}")
        stray = sorted({_s(s) for s in serve.get("admitted") or []} - approved)
        if stray:
            problems.append(f"its federation admitted {', '.join(stray)}, which did not "
                            "approve the job")
    if not serves:
        problems.append("its federation log has no serve record")
    if problems:
        return Verdict(False, "the job's federation log and the deployment's disagree",
                       tuple(problems))
    return Verdict(True, "its federation served the public plan the operator signed and "
                         "admitted only silos that approved the job")


def _plain(value: Any) -> str:
    if isinstance(value, list):
        return _names(value)
    return _s(value)
