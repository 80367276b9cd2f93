"""``coordinator serve`` runs a federation; ``coordinator health`` probes a running one."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from trellis.coordinator.cli.common import (
    EXIT_FAILED,
    fail,
    load_plan_or_exit,
    privacy_preamble,
)


def serve(plan: Path = typer.Option(None, "--plan", help="plan.toml of one federation: serve "
                                                      "it until it ends"),
          deployment: Path = typer.Option(None, "--deployment",
                                          help="deployment.toml of a standing coordinator: "
                                               "stay up and run the jobs operators submit "
                                               "(`coordinator jobs`)"),
          listen: str = typer.Option(None, help="override server.listen (host:port)"),
          quiet: bool = typer.Option(False, help="no progress lines"),
          capture: Path = typer.Option(None, help="record every received message to this file "
                                                  "(wire capture for review)"),
          health_listen: str = typer.Option(None, "--health-listen",
                                            help="also serve the gRPC health status in plain "
                                                 "text at host:port, for probes without a "
                                                 "certificate; keep it inside the pod/host "
                                                 "network"),
          metrics_listen: str = typer.Option(None, "--metrics-listen",
                                             help="serve Prometheus metrics at "
                                                  "http://host:port/metrics"),
          linger: float = typer.Option(0.0, "--linger", min=0.0,
                                       help="seconds to keep the health and metrics endpoints "
                                            "up after the federation ends, so the last "
                                            "scrape sees its end"),
          log_format: str = typer.Option("text", "--log-format",
                                         help="text (for people) or json (one object per "
                                              "line, for log shippers)")) -> None:
    """Run a federation (--plan), or a standing coordinator that runs jobs (--deployment):
    listen over mTLS, drive the rounds, write results and audit logs."""
    from trellis.coordinator.serving.allocator import return_large_buffers
    from trellis.coordinator.serving.handshake_watch import CoreLogRoute, handshake_refusals
    from trellis.coordinator.serving.observability import open_endpoints
    from trellis.coordinator.serving.service import serve_until_done, start_server
    from trellis.coordinator.state.checkpoint import RESULTS, finished_run
    from trellis.coordinator.state.results import accuracy_table
    from trellis.protos.exposition import EndpointError
    from trellis.protos.fields import valid_address
    from trellis.protos.logs import FORMATS, event, make_logger
    from trellis.protos.stop import (
        EXIT_GRACE_S,
        describe,
        exit_code,
        exit_within,
        stop_on_sigterm,
    )

    if log_format not in FORMATS:
        fail(f"--log-format {log_format!r}: expected one of {', '.join(FORMATS)}")
    if listen is not None and not valid_address(listen):
        fail(f"--listen {listen!r}: expected host:port, e.g. 0.0.0.0:50051")
    if (plan is None) == (deployment is None):
        fail("give --plan PLAN (one federation) or --deployment DEPLOYMENT (a standing "
             "coordinator that runs jobs), exactly one of them")
    if deployment is not None:
        from trellis.coordinator.cli.standing import serve_deployment

        if capture is not None:
            fail("--capture records one federation's messages: it goes with --plan")
        serve_deployment(deployment, listen=listen, quiet=quiet, health_listen=health_listen,
                         metrics_listen=metrics_listen, log_format=log_format)
        return
    log = make_logger("coordinator", log_format)

    return_large_buffers()     # before gRPC starts its threads (coordinator/serving/allocator.py)
    loaded = load_plan_or_exit(plan)
    state_dir = loaded.server.state_dir
    done = finished_run(state_dir, loaded)
    if done is not None:
        typer.echo(f"federation {loaded.federation} has finished: {done['rounds_completed']} "
                   f"rounds of {loaded.public.algorithm} completed; results: "
                   f"{state_dir / RESULTS}; audit log: {state_dir / 'audit.jsonl'}. Nothing "
                   "to serve: a new federation needs its own id and server.state_dir.",
                   err=True)
        raise typer.Exit(0)
    try:
        # Up before the federation service, so probes see NOT_SERVING while it starts.
        endpoints = open_endpoints(health_listen, metrics_listen)
    except EndpointError as exc:
        fail(str(exc))
    stop_on_sigterm()     # docker stop, kubectl delete, systemctl stop: as Ctrl-C
    core_log = CoreLogRoute()   # gRPC's C-core lines: failed handshakes become refusals
    try:
        running = start_server(loaded, progress=not quiet, listen=listen, capture=capture,
                               health=endpoints.health, metrics=endpoints.metrics,
                               log_format=log_format)
    except (OSError, ValueError) as exc:
        endpoints.close()
        fail(str(exc))
    except KeyboardInterrupt as exc:
        endpoints.close()
        event(log, logging.WARNING, "stopped while starting; nothing was served",
              event="interrupted")
        raise typer.Exit(exit_code(exc)) from None
    core_log.listen(handshake_refusals(running.core, endpoints.metrics))

    def announce() -> None:
        event(log, logging.INFO, f"coordinator listening on port {running.port} for federation "
              f"{loaded.federation} ({loaded.public.algorithm}, {loaded.public.rounds} rounds, "
              f"silos: {', '.join(loaded.silos)})", event="listening", port=running.port,
              federation=loaded.federation)
        for line in privacy_preamble(loaded):
            event(log, logging.INFO, line, event="privacy")

    try:
        # Told inside: a stop request right after "listening" is one like any other (typer
        # would otherwise turn it into a bare exit 130, SIGTERM or not, with nothing said).
        results = serve_until_done(running, announce=announce)
    except KeyboardInterrupt as exc:
        endpoints.close()
        how = describe(exc)
        event(log, logging.WARNING, f"{how}; results so far in "
              f"{loaded.server.state_dir / 'results.json'}. Run `coordinator serve --plan "
              f"{plan}` again to resume at the last completed round.", event="interrupted")
        exit_within(EXIT_GRACE_S, exit_code(exc))
        raise typer.Exit(exit_code(exc)) from None
    except BaseException:
        endpoints.close()
        raise
    try:
        endpoints.linger(linger)
    except KeyboardInterrupt:
        endpoints.close()     # the federation has ended: a stop only cuts the linger short
    typer.echo(accuracy_table(results))
    typer.echo(f"results: {loaded.server.state_dir / 'results.json'}")
    typer.echo(f"audit log: {loaded.server.state_dir / 'audit.jsonl'}")
    if results["status"] != "completed":
        fail(f"federation {results['status']}: {results['failure']}", EXIT_FAILED)


def health(address: str = typer.Option("127.0.0.1:8081", "--address",
                                       help="the coordinator's --health-listen host:port"),
           timeout: float = typer.Option(3.0, help="seconds to wait for the answer")) -> None:
    """Ask a coordinator's plain health port whether it serves its federation: exit 0 when
    SERVING, 1 otherwise (for container health checks)."""
    from trellis.coordinator.serving.health import HealthUnreachable, probe
    from trellis.protos.fields import valid_address

    if not valid_address(address):
        fail(f"--address {address!r}: expected host:port, e.g. 127.0.0.1:8081")
    try:
        status = probe(address, timeout)
    except HealthUnreachable as exc:
        fail(str(exc), EXIT_FAILED)
    typer.echo(status)
    if status != "SERVING":
        raise typer.Exit(EXIT_FAILED)
