"""`silo audit`: this silo's audit log turned into a report for reviewers."""

from __future__ import annotations

from pathlib import Path

import typer

from trellis.silo.cli.exits import EXIT_FAILED, fail

app = typer.Typer(help="This silo's audit log, for reviewers.", no_args_is_help=True)


@app.command("report")
def audit_report(state_dir: Path = typer.Option(..., "--state-dir",
                                                help="the silo's state folder (audit.jsonl "
                                                     "and audit.jsonl.head)"),
                 identity: Path = typer.Option(None, "--identity",
                                               help="the silo's identity folder: its "
                                                    "certificate checks the log's signatures"),
                 out: Path = typer.Option(..., "--out", help="report.md or report.html"),
                 fmt: str = typer.Option(None, "--format",
                                         help="md | html (default: from --out's suffix)")
                 ) -> None:
    """Write a reviewer's report: what left this silo and what reached it, round by round, the
    plan it accepted and whether its audit log verifies (exit 1 if it does not)."""
    from datetime import UTC, datetime

    from trellis.crypto.errors import CryptoError
    from trellis.protos.document import format_for, render
    from trellis.protos.files import write_atomic
    from trellis.silo.operations.audit_report import AUDIT_LOG, report_state_dir

    try:
        chosen = format_for(out, fmt)
    except ValueError as exc:
        fail(str(exc))
    if not (state_dir / AUDIT_LOG).is_file():
        fail(f"no audit log {state_dir / AUDIT_LOG}: give the --state-dir that `silo join` "
             "used (default ./silo-state/<name>)")
    if identity is not None and not identity.is_dir():
        fail(f"--identity {identity}: no such folder")
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    try:
        document, verification = report_state_dir(state_dir, identity, generated=generated)
        text = render(document, chosen).encode()
        write_atomic(out, lambda handle: handle.write(text))
    except CryptoError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror}")
    if verification.ok:
        typer.echo(f"wrote {out}: the audit log verifies ({verification.records} records)")
    else:
        fail(f"wrote {out}, but the audit log does NOT verify: {verification.problems[0]} "
             f"({len(verification.problems)} problem(s), all listed in the report)",
             EXIT_FAILED)
