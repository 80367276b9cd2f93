"""`silo jobs`: the jobs offered to this standing silo, read and answered from its own store.

`silo serve` records every offer in <state root>/jobs.sqlite with what the policy made of it;
these commands list and show them, and approve or refuse one the policy held for the operator.
They never touch the network: `silo serve` sends the answer to the coordinator.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from trellis.silo.cli.exits import fail

if TYPE_CHECKING:
    from trellis.silo.jobs.store import SiteJob, SiteJobStore

app = typer.Typer(help="The jobs offered to this standing silo: list, show, approve, refuse "
                       "(from its own job store; no network).", no_args_is_help=True)

_STATE_ROOT_HELP = ("the silo's state root, as given to `silo serve` (its job store is "
                    "jobs.sqlite there)")
_SENDS = "`silo serve` sends the answer to the coordinator"
# What `list --json` gives of each job: everything but the plan, statement and certificate.
_SUMMARY = ("job_id", "federation", "algorithm", "dataset", "operator", "public_sha256",
            "submission_sha256", "received_at", "decision", "answer", "reason", "answered_at",
            "answered_by", "sent", "state")


# Shared by the four commands (typer reads them; none is changed).
_STATE_ROOT = typer.Option(..., "--state-root", help=_STATE_ROOT_HELP)
_JOB_ID = typer.Argument(..., help="the job's number (`silo jobs list` shows them)")
_AS_JSON = typer.Option(False, "--json", help="print JSON")


@app.command("list")
def list_jobs(state_root: Path = _STATE_ROOT, as_json: bool = _AS_JSON) -> None:
    """Every job offered to this silo: its plan, operator, this silo's answer and the
    coordinator's last known state."""
    from trellis.silo.jobs.store import store_path

    with _open(state_root) as store:
        jobs = store.jobs()
    if as_json:
        typer.echo(json.dumps([{key: getattr(job, key) for key in _SUMMARY} for job in jobs],
                              indent=2))
    elif not jobs:
        typer.echo(f"no job offered yet ({store_path(state_root)})")
    else:
        typer.echo(_table(jobs))


@app.command("show")
def show_job(job_id: int = _JOB_ID, state_root: Path = _STATE_ROOT,
             as_json: bool = _AS_JSON) -> None:
    """One job in full: this silo's answer and why, the operator and when they signed, the
    hashes, and the public plan."""
    with _open(state_root) as store:
        job = _get(store, job_id)
    typer.echo(json.dumps(_document(job), indent=2) if as_json else _details(job))


@app.command("approve")
def approve_job(job_id: int = _JOB_ID, state_root: Path = _STATE_ROOT) -> None:
    """Approve a job the policy held for this silo's operator."""
    from trellis.silo.jobs.store import SiteJobError

    with _open(state_root) as store:
        try:
            store.approve(job_id, now=time.time())
        except SiteJobError as exc:
            fail(str(exc))
    typer.echo(f"job {job_id} approved; {_SENDS}")


@app.command("refuse")
def refuse_job(job_id: int = _JOB_ID,
               reason: str = typer.Option(..., "--reason",
                                          help="why, in one line: the coordinator and the "
                                               "job's operator are told it"),
               state_root: Path = _STATE_ROOT) -> None:
    """Refuse a job the policy held for this silo's operator."""
    from trellis.silo.jobs.store import SiteJobError

    with _open(state_root) as store:
        try:
            refused = store.refuse(job_id, reason, now=time.time())
        except SiteJobError as exc:
            fail(str(exc))
    typer.echo(f"job {job_id} refused ({refused.reason}); {_SENDS}")


def _open(state_root: Path) -> SiteJobStore:
    """The silo's store, or one line and exit 2 if there is none (never creating one)."""
    from trellis.silo.jobs.store import SiteJobError, SiteJobStore, store_path

    if not state_root.is_dir():
        fail(f"--state-root {state_root}: no such folder; give the state root `silo serve` "
             "uses")
    path = store_path(state_root)
    if not path.is_file():
        fail(f"no job store {path}: `silo serve --state-root {state_root}` keeps one there "
             "once it runs")
    try:
        return SiteJobStore.open(path)
    except SiteJobError as exc:
        fail(str(exc))


def _get(store: SiteJobStore, job_id: int) -> SiteJob:
    from trellis.silo.jobs.store import SiteJobError

    try:
        return store.get(job_id)
    except SiteJobError as exc:
        fail(str(exc))


def answer_text(job: SiteJob) -> str:
    """This silo's answer as the list shows it: pending, or approved/refused and by whom."""
    from trellis.silo.jobs.store import BY_POLICY

    if job.answer is None:
        return "pending"
    text = f"{job.answer} by {'policy' if job.answered_by == BY_POLICY else 'operator'}"
    return text if job.sent else f"{text}, unsent"


def _table(jobs: list[SiteJob]) -> str:
    header = ("JOB", "FEDERATION", "ALGORITHM", "DATASET", "OPERATOR", "ANSWER", "COORDINATOR")
    rows = [header] + [(str(job.job_id), job.federation, job.algorithm or "-",
                        job.dataset or "-", job.operator or "-", answer_text(job),
                        job.state or "-") for job in jobs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
                     .rstrip() for row in rows)


def _details(job: SiteJob) -> str:
    from trellis.silo.jobs.store import when

    lines = [f"job {job.job_id} of federation {job.federation}",
             f"answer:       {_answer_line(job)}",
             f"policy said:  {job.decision}",
             f"coordinator:  {job.state or 'no state known yet'}",
             f"received:     {when(job.received_at)}",
             f"algorithm:    {job.algorithm or '-'}",
             f"dataset:      {job.dataset or '-'}",
             f"operator:     {_operator_line(job)}",
             f"public plan:  sha256 {job.public_sha256 or '- (it does not parse)'}",
             f"plan file:    sha256 {_statement(job).get('plan_sha256', '-')}",
             f"statement:    sha256 {job.submission_sha256 or '- (not verified)'}",
             f"certificate:  {_fingerprint(job.operator_certificate_pem)}",
             "", "public plan:", _pretty(job.public_plan_json)]
    return "\n".join(lines)


def _answer_line(job: SiteJob) -> str:
    from trellis.silo.jobs.store import BY_POLICY, when

    if job.answer is None:
        return f"pending ({job.reason})"
    by = "automatically" if job.answered_by == BY_POLICY else "by this silo's operator"
    at = when(job.answered_at) if job.answered_at is not None else "?"
    sent = "sent to the coordinator" if job.sent else "not yet sent to the coordinator"
    return f"{job.answer} {by} on {at} ({sent}): {job.reason}"


def _operator_line(job: SiteJob) -> str:
    from trellis.protos.fields import shown
    from trellis.silo.jobs.store import when

    statement = _statement(job)
    signed_at = statement.get("submitted_at")
    signed = (f" (signed {when(signed_at)})"
              if isinstance(signed_at, (int, float)) and not isinstance(signed_at, bool) else "")
    if job.operator:
        return job.operator + signed
    claimed = statement.get("operator")
    return (f"- (the signature did not verify; the statement claims {shown(claimed)})"
            if isinstance(claimed, str) else "- (the statement does not parse)")


def _statement(job: SiteJob) -> dict[str, Any]:
    """The signed statement's fields as recorded (empty if it does not parse)."""
    try:
        raw = json.loads(job.submission_json)
    except (ValueError, RecursionError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _fingerprint(cert_pem: bytes) -> str:
    from trellis.crypto.certificates import certificate_fingerprint
    from trellis.crypto.errors import CryptoError

    try:
        return certificate_fingerprint(cert_pem)
    except CryptoError:
        return "- (not a certificate)"


def _pretty(plan_json: str) -> str:
    try:
        return json.dumps(json.loads(plan_json), indent=2, sort_keys=True)
    except (ValueError, RecursionError):
        return plan_json


def _document(job: SiteJob) -> dict[str, Any]:
    document: dict[str, Any] = {key: getattr(job, key) for key in _SUMMARY}
    try:
        document["public_plan"] = json.loads(job.public_plan_json)
    except (ValueError, RecursionError):
        document["public_plan"] = job.public_plan_json
    document["statement"] = _statement(job) or job.submission_json
    document["signature"] = job.signature.hex()
    document["operator_certificate_pem"] = job.operator_certificate_pem.decode(
        "ascii", errors="replace")
    return document
