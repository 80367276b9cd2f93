"""Exit codes of the ``silo`` command and the one-line failure every command reports with.

0 success; 1 the federation failed (or the coordinator was never reached); 2 bad input (data
folder, identity, options, policy file, a state root without a job store), a coordinator that
refuses this silo as configured (its certificate, name or version), a plan this silo's --policy
refuses or whose [data] reference_sha256 its dataset does not match, a public initial model
the plan names by another hash than the silo's file ([model] init_sha256), or a job `silo jobs`
cannot answer (never offered, or answered already): mistakes that retrying cannot fix; 130 and
143 `join` stopped by Ctrl-C or SIGTERM (resumable).
"""

from __future__ import annotations

from typing import NoReturn

import typer

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """End the command with one readable line on stderr and the given exit code."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)
