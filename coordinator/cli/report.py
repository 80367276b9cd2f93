"""``coordinator report``: the papers' tables, accuracy curves and summary.json from results."""

from __future__ import annotations

from pathlib import Path

import typer

from trellis.coordinator.cli.common import fail


def report(results: Path = typer.Option(..., "--results", help="folder of "
                                        "<setting>/<algorithm>/seed-N.json result files, or "
                                        "one results.json (also of a running federation)"),
           out: Path = typer.Option(Path("docs/results"), help="folder for the tables, "
                                    "summary.json and curves")) -> None:
    """Turn result files into the papers' tables (last and best-validation round), accuracy
    curves and summary.json."""
    from trellis.coordinator.operations.report import write_report

    if not results.exists():
        fail(f"no such results folder or file: {results}")
    try:
        written = write_report(results, out)
    except (ValueError, KeyError) as exc:
        fail(f"cannot build the report: {exc}")
    for path in written:
        typer.echo(f"wrote {path}")

