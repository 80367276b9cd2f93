"""``coordinator serve --deployment``: a standing coordinator that runs operators' jobs."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import typer

from trellis.coordinator.cli.common import fail


def load_deployment_or_exit(path: Path):  # type: ignore[no-untyped-def]
    """The deployment at path, or every problem with it on stderr and exit 2."""
    from trellis.coordinator.cli.common import EXIT_BAD_INPUT
    from trellis.coordinator.jobs.deployment import DeploymentError, load_deployment

    try:
        return load_deployment(path)
    except DeploymentError as exc:
        typer.echo(f"error: invalid deployment {path}:", err=True)
        for problem in exc.problems:
            typer.echo(f"  - {problem}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None


def serve_deployment(path: Path, *, listen: str | None, quiet: bool, health_listen: str | None,
                     metrics_listen: str | None, log_format: str) -> None:
    """Serve a deployment until stopped (Ctrl-C, SIGTERM); running jobs resume on restart."""
    from trellis.coordinator.jobs.standing import start_standing
    from trellis.coordinator.serving.allocator import return_large_buffers
    from trellis.coordinator.serving.observability import open_endpoints
    from trellis.protos.exposition import EndpointError
    from trellis.protos.logs import event, make_logger
    from trellis.protos.stop import EXIT_GRACE_S, describe, exit_code, exit_within, stop_on_sigterm

    return_large_buffers()
    deployment = load_deployment_or_exit(path)
    if listen is not None:
        deployment = dataclasses.replace(deployment, listen=listen)
    log = make_logger("coordinator", log_format)
    try:
        endpoints = open_endpoints(health_listen or deployment.health_listen,
                                   metrics_listen or deployment.metrics_listen, per_job=True)
    except EndpointError as exc:
        fail(str(exc))
    stop_on_sigterm()
    try:
        running = start_standing(deployment, health=endpoints.health,
                                 metrics=endpoints.metrics, log_format=log_format,
                                 echo=not quiet)
    except (OSError, ValueError) as exc:
        endpoints.close()
        fail(str(exc))
    except KeyboardInterrupt as exc:
        endpoints.close()
        raise typer.Exit(exit_code(exc)) from None
    try:
        # Told inside: a stop request right after "listening" is handled like any later one.
        event(log, logging.INFO, f"coordinator of deployment {deployment.name} listening on "
              f"port {running.port}: silos {', '.join(deployment.silos)}; at most "
              f"{deployment.max_concurrent_jobs} job(s) at a time; state in "
              f"{deployment.state_root}", event="listening", port=running.port,
              deployment=deployment.name)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt as exc:
        event(log, logging.WARNING, f"{describe(exc)}; running jobs resume when the "
              f"coordinator starts again with --deployment {path}", event="interrupted")
        try:
            running.stop()
        finally:
            endpoints.close()
        exit_within(EXIT_GRACE_S, exit_code(exc))
        raise typer.Exit(exit_code(exc)) from None
