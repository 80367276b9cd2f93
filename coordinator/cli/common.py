"""What every ``coordinator`` command needs: its exit codes, the one-line failure, plan loading.

Exit codes: 0 success; 1 the federation failed, an audit log does not verify, or two logs
disagree; 2 bad input (plan, files, certificates, a private plan on an install without the
privacy extra) -- always reported as one readable line;
130 and 143 `serve` stopped by Ctrl-C or SIGTERM (resumable).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer

if TYPE_CHECKING:
    from trellis.protos.plan import Plan

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Say what went wrong in one line on stderr and exit with ``code``."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def load_plan_or_exit(path: Path) -> Plan:
    """The plan at ``path``, or every problem with it listed on stderr and exit 2; a private
    plan also needs the privacy accountant installed (the `privacy` extra)."""
    from trellis.protos.plan import PlanError, load_plan

    try:
        loaded = load_plan(path)
    except PlanError as exc:
        typer.echo(f"error: invalid plan {path}:", err=True)
        for problem in exc.problems:
            typer.echo(f"  - {problem}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    _require_accountant_for(loaded)
    return loaded


def _require_accountant_for(plan: Plan) -> None:
    """Refuse a private plan before anything is written, where its epsilon cannot be accounted:
    otherwise the first epsilon (the start-up line, the audit log's `serve` record) would fail
    with the federation already listening."""
    if not plan.public.privacy.enabled:
        return
    from trellis.crypto.dp_accountant import AccountantMissing, require_accountant

    try:
        require_accountant()
    except AccountantMissing as exc:
        fail(f"the plan of federation {plan.federation} is private ([privacy] mechanism = "
             f"{plan.public.privacy.mechanism}), and its {exc}")


def privacy_preamble(plan: Plan) -> list[str]:
    """A private plan's mechanism and projected epsilon, said before round 1."""
    if not plan.public.privacy.enabled:
        return []
    from trellis.coordinator.rounds.privacy_report import privacy_lines  # a second to load

    return privacy_lines(plan)
