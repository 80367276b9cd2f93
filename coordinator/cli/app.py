"""The root ``coordinator`` application: ``--version``, every command and group, and ``main``.

Commands: serve, simulate, health, status, report, and the groups pki and audit; each lives in
its own module. The exit codes are documented in ``trellis.coordinator.cli.common``.
"""

from __future__ import annotations

import typer

from trellis.coordinator.cli.audit import audit_app
from trellis.coordinator.cli.pki import pki_app
from trellis.coordinator.cli.report import report
from trellis.coordinator.cli.serve import health, serve
from trellis.coordinator.cli.simulate import simulate
from trellis.coordinator.cli.status import status

app = typer.Typer(help="Trellis coordinator: runs federated rounds for admitted silos.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
app.add_typer(pki_app, name="pki")
app.add_typer(audit_app, name="audit")
# Registration order is the order `coordinator --help` lists them in.
app.command()(serve)
app.command()(simulate)
app.command()(health)
app.command()(status)
app.command()(report)


def _show_version(value: bool) -> None:
    if value:
        from trellis.protos.version import version_line

        typer.echo(version_line("coordinator"))
        raise typer.Exit(0)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_show_version,
                                       is_eager=True, help="show the version and exit")
          ) -> None:
    """Trellis coordinator."""


def main() -> None:
    """Entry point of the `coordinator` command and of `python -m trellis.coordinator.cli`."""
    from trellis.protos.cli_edge import run_cli

    run_cli(app)


if __name__ == "__main__":
    main()
