"""``coordinator status``: where a federation stands, from its state folder or over mTLS."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from trellis.coordinator.cli.common import EXIT_FAILED, fail


def status(state_dir: Path = typer.Option(None, "--state-dir", help="the coordinator's "
                                          "server.state_dir (works while it runs and after)"),
           coordinator: str = typer.Option(None, "--coordinator", help="host:port of a running "
                                           "coordinator, asked over mTLS (needs --identity)"),
           identity: Path = typer.Option(None, "--identity", help="an operator's identity "
                                         "folder from `coordinator pki operator`"),
           timeout: float = typer.Option(10.0, help="seconds to wait for --coordinator"),
           as_json: bool = typer.Option(False, "--json", help="machine-readable status")
           ) -> None:
    """Where a federation stands: round and stage, silos, last metrics, time left."""
    from trellis.coordinator.operations import status as view

    if (state_dir is None) == (coordinator is None):
        fail("give --state-dir DIR (the coordinator's state folder) or --coordinator "
             "HOST:PORT with --identity (an operator's identity), exactly one of them")
    if state_dir is not None:
        try:
            found, state, elapsed = view.local_view(state_dir)
        except ValueError as exc:
            fail(str(exc))
    else:
        found, state, elapsed = _remote_status(coordinator, identity, timeout)
    if as_json:
        typer.echo(json.dumps(view.to_json(found, state, elapsed)))
    else:
        typer.echo(view.format_status(found, state, elapsed))


def _remote_status(target: str, identity: Path | None, timeout: float
                   ) -> tuple[Any, str, float]:
    """The status of a running coordinator over the Admin service (exit 2 if refused)."""
    from trellis.coordinator.operations.admin_client import (
        AdminRefused,
        AdminUnreachable,
        check_target,
        fetch_status,
    )
    from trellis.coordinator.operations.status import liveness
    from trellis.crypto.errors import CryptoError
    from trellis.crypto.pki import load_identity

    if identity is None:
        fail("--coordinator needs --identity DIR: an operator's identity from `coordinator "
             "pki operator` (a silo's certificate is refused)")
    try:
        check_target(target)
        ident = load_identity(identity)
    except (ValueError, CryptoError) as exc:
        fail(str(exc))
    try:
        found = fetch_status(target, ident, timeout)
    except AdminRefused as exc:
        fail(str(exc))
    except AdminUnreachable as exc:
        fail(str(exc), EXIT_FAILED)
    # It answered, so it runs (it may be finishing).
    return found, liveness(found, found.pid), found.elapsed_s

