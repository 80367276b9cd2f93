"""``coordinator status``: where a federation stands, from its state folder or over mTLS; for a
standing coordinator (a state root holding jobs.sqlite, or one that answers ListJobs), its jobs."""

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
    """Where a federation stands: round and stage, silos, last metrics, time left; for a
    standing coordinator, every job with each running job's round."""
    from trellis.coordinator.jobs.overview import is_state_root
    from trellis.coordinator.operations import status as view

    if (state_dir is None) == (coordinator is None):
        fail("give --state-dir DIR (the coordinator's state folder) or --coordinator "
             "HOST:PORT with --identity (an operator's identity), exactly one of them")
    if state_dir is not None and is_state_root(state_dir):
        _deployment_status(state_dir, as_json)
        return
    if coordinator is not None and _standing_status(coordinator, identity, timeout, as_json):
        return
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



def _deployment_status(state_root: Path, as_json: bool) -> None:
    """A standing coordinator's jobs, read from its state root (exit 2 if unreadable)."""
    from trellis.coordinator.jobs.overview import (
        coordinator_line,
        format_jobs,
        jobs_to_json,
        read_jobs,
    )
    from trellis.coordinator.jobs.store import JobStoreError

    try:
        jobs = read_jobs(state_root)
    except JobStoreError as exc:
        fail(str(exc))
    line, pid = coordinator_line(state_root)
    if as_json:
        typer.echo(json.dumps(jobs_to_json(jobs, state_root=str(state_root),
                                           running=pid is not None, pid=pid)))
        return
    typer.echo(line)
    typer.echo(format_jobs(jobs, serving=pid is not None))


def _standing_status(target: str, identity: Path | None, timeout: float, as_json: bool
                     ) -> bool:
    """Print the jobs of the coordinator at target if it is a standing one (False: it runs no
    jobs, so it is a one-plan coordinator; refused or unreachable: one line and exit)."""
    from trellis.coordinator.jobs.client import (
        CoordinatorUnreachable,
        Deployment,
        JobRefused,
        NotStanding,
    )
    from trellis.coordinator.jobs.overview import format_jobs, jobs_to_json
    from trellis.crypto.errors import CryptoError

    if identity is None:
        fail("--coordinator needs --identity DIR: an operator's identity from `coordinator "
             "pki operator` (a silo's certificate is refused)")
    try:
        deployment = Deployment(target, identity, timeout_s=timeout)
    except (ValueError, CryptoError) as exc:
        fail(str(exc).replace("coordinator address", "--coordinator", 1))
    try:
        with deployment:
            jobs = deployment.jobs()
    except NotStanding:
        return False
    except JobRefused as exc:
        fail(f"the coordinator refused {deployment.identity.name!r}: {exc}")
    except CoordinatorUnreachable as exc:
        fail(str(exc), EXIT_FAILED)
    if as_json:
        typer.echo(json.dumps(jobs_to_json(jobs, coordinator=target)))
    else:
        typer.echo(f"standing coordinator at {target}: {len(jobs)} job"
                   f"{'s' if len(jobs) != 1 else ''}")
        typer.echo(format_jobs(jobs))
    return True
