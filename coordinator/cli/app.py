"""The root ``coordinator`` application: ``--version``, every command and group, and ``main``.

Commands: serve, simulate, health, status, report, and the groups pki, audit and jobs; each lives in
its own module. The exit codes are documented in ``trellis.coordinator.cli.common``.
"""

from __future__ import annotations

import typer

from trellis.coordinator.cli.audit import audit_app
from trellis.coordinator.cli.jobs import jobs_app
from trellis.coordinator.cli.pki import pki_app
from trellis.coordinator.cli.report import report
from trellis.coordinator.cli.serve import health, serve
from trellis.coordinator.cli.simulate import simulate
from trellis.coordinator.cli.status import status
from trellis.protos.cli_edge import add_version_option, run_cli

app = typer.Typer(help="Trellis coordinator: runs federated rounds for admitted silos.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
add_version_option(app, "coordinator")
app.add_typer(pki_app, name="pki")
app.add_typer(audit_app, name="audit")
app.add_typer(jobs_app, name="jobs")
# Registration order is the order `coordinator --help` lists them in.
app.command()(serve)
app.command()(simulate)
app.command()(health)
app.command()(status)
app.command()(report)


def main() -> None:
    """Entry point of the `coordinator` command and of `python -m trellis.coordinator.cli`."""
    run_cli(app)


if __name__ == "__main__":
    main()
