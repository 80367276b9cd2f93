"""The operator's edge of both command lines: help that fits its output, bad bytes as one line.

`coordinator` and `silo` start through `run_cli`. Help is as wide as the terminal; through a
pipe or in a container's log there is no terminal to ask, and rich would wrap to 80 columns and
cut a long flag or URL with an ellipsis, so it gets a width where nothing is cut. A file that is
not UTF-8 or a path with a NUL byte, wherever a command meets it, ends as one `error:` line and
the bad-input exit code (2) both commands document, never a traceback; the readers of the plan
and the policy name the file and field themselves (protos/plan.py, silo/privacy/policy.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn, TextIO

import typer

from trellis.protos.stop import run_command
from trellis.protos.user_text import where_not_utf8

EXIT_BAD_INPUT = 2
# Through a pipe: wide enough that the longest flag and help word of either command fit their
# column (tests/integration/test_cli_input.py reads every command's help to check it).
PIPED_HELP_WIDTH = 120


def fit_help_width(stream: TextIO | None = None) -> None:
    """Help as wide as the terminal; without one, PIPED_HELP_WIDTH (COLUMNS or TERMINAL_WIDTH,
    when set, win)."""
    stream = stream if stream is not None else sys.stdout
    if os.environ.get("TERMINAL_WIDTH") or os.environ.get("COLUMNS") or stream.isatty():
        return
    try:
        import typer.rich_utils
    except ImportError:         # typer without rich formats help itself, at click's width
        return
    typer.rich_utils.MAX_WIDTH = PIPED_HELP_WIDTH


def guard_bad_input(app: Callable[[], object]) -> Callable[[], object]:
    """`app`, with bytes no reader expected (not UTF-8, a NUL in a path) reported as one line
    and exit 2 instead of a traceback."""

    def run() -> object:
        try:
            return app()
        except UnicodeDecodeError as exc:
            _refuse(f"a file this command read is {where_not_utf8(exc)}")
        except ValueError as exc:
            if "null byte" not in str(exc):
                raise
            _refuse("a path contains a NUL byte, which no file name can hold")

    return run


def _refuse(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_BAD_INPUT)


def run_cli(app: Callable[[], object]) -> None:
    """Run `coordinator` or `silo`: help fitted to its output, bad bytes as one line, and the
    process ended with its exit code (protos/stop.py `run_command`)."""
    fit_help_width()
    run_command(guard_bad_input(app))


def add_version_option(app: typer.Typer, program: str) -> None:
    """Give `app` the eager ``--version`` both commands have: one line from protos/version.py."""

    def show_version(value: bool) -> None:
        if value:
            from trellis.protos.version import version_line

            typer.echo(version_line(program))
            raise typer.Exit(0)

    def root(version: bool = typer.Option(False, "--version", callback=show_version,
                                          is_eager=True, help="show the version and exit")
             ) -> None:
        pass

    root.__doc__ = f"Trellis {program}."
    app.callback()(root)
