"""``coordinator audit``: verify a log, cross-check a silo's against the coordinator's, report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from trellis.coordinator.cli.common import EXIT_FAILED, fail

if TYPE_CHECKING:
    from trellis.crypto.audit import AuditReport

audit_app = typer.Typer(help="Audit-log tools for compliance review.", no_args_is_help=True)

_HEAD_HELP = ("Each log has a signed head beside it, <log>.head: the writer replaces it with "
              "every signed record (each round, and at close), so a log cut at its end no "
              "longer matches it. Archive the .head with the log. A log without its closing "
              "record fails, unless its writer still holds it open: then it is reported "
              "'open' (the writer is still running).")


def _verify(file: Path, cert: Path | None, head: Path | None = None) -> AuditReport:
    """Verify one log for the CLI: a missing or unreadable input is exit 2."""
    from trellis.crypto.audit import verify_audit_log
    from trellis.crypto.errors import CryptoError

    for given in (file, cert, head):
        if given is not None and not given.is_file():
            fail(f"no such file: {given}")
    try:
        cert_pem = cert.read_bytes() if cert else None
        return verify_audit_log(file, cert_pem=cert_pem, head=head)
    except OSError as exc:
        fail(f"cannot read {exc.filename}: {exc.strerror}")
    except CryptoError as exc:
        fail(f"{exc}; give the certificate (.crt) of the log's writer")


def _report_json(report: AuditReport) -> dict[str, Any]:
    head = report.head
    return {"path": str(report.path), "ok": report.ok, "records": report.records,
            "checkpoints": report.checkpoints, "closed": report.closed, "open": report.open,
            "head": None if head is None else {"count": head.count, "ts": head.ts,
                                               "event": head.event,
                                               "path": str(report.head_file)},
            "problems": report.problems}


@audit_app.command("verify", help="Verify an audit log's hash chain, its signatures (given the "
                   "writer's certificate), its signed head and its ending. " + _HEAD_HELP)
def audit_verify(file: Path = typer.Argument(..., help="an audit.jsonl file"),
                 cert: Path = typer.Option(None, help="writer's certificate, to check the "
                                                      "signed checkpoints and head"),
                 head: Path = typer.Option(None, help="the signed head to measure the log "
                                                      "against (default: FILE.head if present)"),
                 as_json: bool = typer.Option(False, "--json", help="machine-readable report")
                 ) -> None:
    """Verify an audit log (see the command's help)."""
    from trellis.crypto.audit import format_report

    report = _verify(file, cert, head)
    if as_json:
        typer.echo(json.dumps(_report_json(report)))
    else:
        typer.echo(format_report(report))
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


@audit_app.command("cross-check", help=(
    "Verify a silo's audit log and the coordinator's, then match every upload the silo says it "
    "sent with what the coordinator says it received, on (silo, round, attempt, kind): masked "
    "inputs, FedHGN sealed envelopes, the group-key seal and GCFL encrypted updates, whose "
    "payload both sides hash. Key adverts, sealed shares, survivor signatures, revealed shares "
    "and metrics are not hashed by the coordinator and are not compared. Every upload whose "
    "sha256 differs, or that one log lacks, is reported. An upload the coordinator refused is "
    "in neither log (it records an upload once accepted; the silo once the call returned). One "
    "legitimate asymmetry: an upload only in the coordinator's log, when the silo (or its "
    "connection) died after the coordinator accepted it and before the answer arrived; look "
    "for the silo's 'resumed' record. Only the silo's records of the coordinator log's "
    "federation are compared; logs of two different federations (or, where both record it, "
    "runs) stop at once with one line naming both. Exit 0: consistent; 1: a discrepancy or a "
    "log that does not verify; 2: unreadable input, or logs of different federations or "
    "runs. " + _HEAD_HELP))
def audit_cross_check(silo_log: Path = typer.Argument(..., help="the silo's audit.jsonl"),
                      coordinator_log: Path = typer.Argument(..., help="the coordinator's "
                                                                       "audit.jsonl"),
                      silo_cert: Path = typer.Option(None, help="the silo's certificate"),
                      coordinator_cert: Path = typer.Option(None, help="the coordinator's "
                                                                       "server certificate"),
                      as_json: bool = typer.Option(False, "--json",
                                                   help="machine-readable report")) -> None:
    """Cross-check a silo's audit log against the coordinator's (see the command's help)."""
    from trellis.crypto.audit import format_report
    from trellis.crypto.audit_crosscheck import cross_check, read_records
    from trellis.crypto.errors import AuditError

    reports = [_verify(silo_log, silo_cert), _verify(coordinator_log, coordinator_cert)]
    try:
        result = cross_check(read_records(silo_log), read_records(coordinator_log))
    except AuditError as exc:
        fail(str(exc))
    ok = result.ok and all(r.ok for r in reports)
    if as_json:
        typer.echo(json.dumps({"ok": ok, "silo": result.silo, "matched": result.matched,
                               "silo_log": _report_json(reports[0]),
                               "coordinator_log": _report_json(reports[1]),
                               "problems": result.problems,
                               "discrepancies": [d.to_json() for d in result.discrepancies],
                               "interrupted": [i.to_json() for i in result.interrupted]}))
    else:
        for report in reports:
            typer.echo(format_report(report) + "\n")
        typer.echo(f"silo {result.silo}: {result.matched} uploads match the coordinator's log")
        for problem in result.problems:
            typer.echo(f"FAILED: {problem}")
        for discrepancy in result.discrepancies:
            typer.echo(f"MISMATCH: {discrepancy.describe()}")
        for interrupted in result.interrupted:
            typer.echo(f"INTERRUPTED: {interrupted.describe()}")
        if ok:
            typer.echo("OK: both logs verify and agree on every upload")
        elif result.ok:
            typer.echo("FAILED: the uploads agree, but a log does not verify (see above)")
    if not ok:
        raise typer.Exit(EXIT_FAILED)


@audit_app.command("report")
def audit_report(state_dir: Path = typer.Option(..., "--state-dir",
                                                help="the coordinator's state_dir (audit.jsonl, "
                                                     "its .head, results.json), or a standing "
                                                     "coordinator's state_root (jobs.sqlite)"),
                 ca: Path = typer.Option(None, "--ca", help="the CA folder: server.crt checks "
                                                            "the log's signatures, issued/ "
                                                            "names each silo's certificate"),
                 out: Path = typer.Option(..., "--out", help="report.md or report.html"),
                 fmt: str = typer.Option(None, "--format",
                                         help="md | html (default: from --out's suffix)")
                 ) -> None:
    """Write the compliance report: admitted identities and their certificates, rounds with
    participants, dropouts and aborted attempts, refusals, revocation-list changes, and whether
    the audit log verifies (exit 1 if it does not). Of a standing coordinator's state_root: the
    jobs submitted and by whom, each site's approvals and refusals, refused callers, then each
    job's federation as above (exit 1 if any of the logs does not verify)."""
    from datetime import UTC, datetime

    from trellis.coordinator.jobs.overview import is_state_root
    from trellis.coordinator.operations.compliance import AUDIT_LOG, report_state_dir
    from trellis.crypto.errors import CryptoError
    from trellis.crypto.pki import SERVER_CERT
    from trellis.protos.document import format_for, render
    from trellis.protos.files import write_atomic

    try:
        chosen = format_for(out, fmt)
    except ValueError as exc:
        fail(str(exc))
    if ca is not None and not (ca / SERVER_CERT).is_file():
        fail(f"--ca {ca}: no {SERVER_CERT} there; give the CA folder from `pki init`")
    if is_state_root(state_dir):
        _deployment_report(state_dir, ca, out, chosen)
        return
    if not (state_dir / AUDIT_LOG).is_file():
        fail(f"no audit log {state_dir / AUDIT_LOG}: give the plan's server.state_dir (or a "
             "standing coordinator's state_root)")
    now = datetime.now(UTC)
    try:
        document, verification = report_state_dir(
            state_dir, ca, generated=now.strftime("%Y-%m-%d %H:%M:%S UTC"), now=now)
        text = render(document, chosen).encode()
        write_atomic(out, lambda handle: handle.write(text))
    except CryptoError as exc:
        fail(str(exc))
    except ValueError as exc:          # results.json that is not JSON
        fail(f"{state_dir / 'results.json'}: {exc}")
    except OSError as exc:
        fail(f"cannot read or write {exc.filename}: {exc.strerror}")
    if not verification.ok:
        fail(f"wrote {out}, but the audit log does NOT verify: {verification.problems[0]} "
             f"({len(verification.problems)} problem(s), all listed in the report)",
             EXIT_FAILED)
    typer.echo(f"wrote {out}: the audit log verifies ({verification.records} records)")



def _deployment_report(state_root: Path, ca: Path | None, out: Path, chosen: str) -> None:
    """The compliance report of a standing coordinator's deployment and of each of its jobs."""
    from datetime import UTC, datetime

    from trellis.coordinator.operations.compliance import AUDIT_LOG
    from trellis.coordinator.operations.deployment_compliance import report_state_root
    from trellis.crypto.errors import CryptoError
    from trellis.protos.document import render
    from trellis.protos.files import write_atomic

    if not (state_root / AUDIT_LOG).is_file():
        fail(f"no audit log {state_root / AUDIT_LOG}: has a standing coordinator served this "
             "state_root?")
    now = datetime.now(UTC)
    try:
        document, verification, jobs = report_state_root(
            state_root, ca, generated=now.strftime("%Y-%m-%d %H:%M:%S UTC"), now=now)
        text = render(document, chosen).encode()
        write_atomic(out, lambda handle: handle.write(text))
    except CryptoError as exc:
        fail(str(exc))
    except ValueError as exc:          # a job's results.json that is not JSON
        fail(f"{state_root}: {exc}")
    except OSError as exc:
        fail(f"cannot read or write {exc.filename}: {exc.strerror}")
    checked = [(str(verification.path), verification)] + [
        (str(job.verification.path), job.verification) for job in jobs
        if job.verification is not None]
    failing = [(path, report) for path, report in checked if not report.ok]
    if failing:
        path, report = failing[0]
        fail(f"wrote {out}, but {len(failing)} of {len(checked)} audit logs do NOT verify: "
             f"{path}: {report.problems[0]} (every problem is listed in the report)",
             EXIT_FAILED)
    records = sum(report.records for _, report in checked)
    typer.echo(f"wrote {out}: the deployment's audit log and {len(checked) - 1} job log"
               f"{'s' if len(checked) != 2 else ''} verify ({records} records)")
