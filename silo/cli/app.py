"""The root ``silo`` application: its --version, its command groups and its top-level commands.

``silo`` joins a federation, serves a standing coordinator's jobs, makes an identity request,
makes demo data, cuts a dataset or a heterogeneous graph into silo datasets, shows a silo's
status, predicts with its final model, reports on its audit log, answers the jobs offered to
a standing silo (``silo jobs``) and prepares a site's own data (``silo data``). Each command
lives in the module of its group; this one only assembles them. Exit codes:
`trellis.silo.cli.exits`.
"""

from __future__ import annotations

import typer

from trellis.protos.cli_edge import add_version_option, run_cli
from trellis.silo.cli import audit, data, data_prep, jobs, join, pki, predict, serve, status

app = typer.Typer(help="Trellis silo agent: trains on local graphs, shares only what the "
                       "algorithm declares, masked.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
add_version_option(app, "silo")
app.add_typer(pki.app, name="pki")
app.add_typer(audit.app, name="audit")
app.add_typer(jobs.app, name="jobs")
app.add_typer(data_prep.app, name="data")
# Listed in `silo --help` in this order, before the groups.
app.command("join")(join.join)
app.command("serve")(serve.serve)
app.command("make-demo-data")(data.make_demo_data)
app.command("split-hetero")(data.split_hetero)
app.command("split-tu")(data.split_tu)
app.command("status")(status.status)
app.command("predict")(predict.predict)


def main() -> None:
    """Entry point of the `silo` command and of `python -m trellis.silo.cli`."""
    run_cli(app)


if __name__ == "__main__":
    main()
