"""`silo status`: what this silo has done, read from its own state folder."""

from __future__ import annotations

from pathlib import Path

import typer

from trellis.silo.cli.exits import fail


def status(state_dir: Path = typer.Option(..., "--state-dir", help="the silo's state folder "
                                                                   "(as given to silo join)"),
           identity: Path = typer.Option(None, "--identity",
                                         help="identity folder: also check the audit log's "
                                              "signatures with this silo's certificate"),
           as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """What this silo has done, from its own files: rounds, its own metrics, what it sent."""
    import json

    from trellis.silo.operations.status import format_status, silo_status

    try:
        found = silo_status(state_dir, identity)
    except ValueError as exc:
        fail(str(exc))
    typer.echo(json.dumps(found, indent=2) if as_json else format_status(found))
