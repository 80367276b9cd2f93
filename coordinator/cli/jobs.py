"""``coordinator jobs``: an operator's commands for a standing coordinator's jobs.

submit (sign and submit a plan), list, show, logs, stop, results. Each asks the coordinator
over mTLS with an operator's identity (--coordinator and --identity, or TRELLIS_COORDINATOR
and TRELLIS_IDENTITY).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from trellis.coordinator.cli.common import EXIT_FAILED, fail

if TYPE_CHECKING:
    from trellis.coordinator.jobs.client import Deployment
    from trellis.protos.jobs import JobView

jobs_app = typer.Typer(help="Submit and follow the jobs of a standing coordinator "
                            "(`coordinator serve --deployment`).", no_args_is_help=True)

_COORDINATOR = typer.Option(..., "--coordinator", envvar="TRELLIS_COORDINATOR",
                            help="host:port of the standing coordinator")
_IDENTITY = typer.Option(..., "--identity", envvar="TRELLIS_IDENTITY",
                         help="an operator's identity folder (`coordinator pki operator`)")
_JSON = typer.Option(False, "--json", help="machine-readable output")


def _connect(coordinator: str, identity: Path) -> Deployment:
    from trellis.coordinator.jobs.client import Deployment
    from trellis.crypto.errors import CryptoError

    try:
        return Deployment(coordinator, identity)
    except (ValueError, CryptoError) as exc:
        fail(str(exc))


def _asking(deployment: Deployment, what: Any, *args: Any) -> Any:
    """what(*args), its refusal one line and exit 2, no answer one line and exit 1."""
    from trellis.coordinator.jobs.client import CoordinatorUnreachable, JobRefused
    from trellis.protos.plan import PlanError

    try:
        return what(*args)
    except PlanError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except JobRefused as exc:
        fail(str(exc))
    except CoordinatorUnreachable as exc:
        fail(str(exc), EXIT_FAILED)
    except OSError as exc:
        fail(f"{getattr(exc, 'filename', '') or ''}: {exc.strerror or exc}")


@jobs_app.command()
def submit(plan: Path = typer.Argument(..., help="the job's plan (a plan without \\[server])"),
           coordinator: str = _COORDINATOR, identity: Path = _IDENTITY,
           as_json: bool = _JSON) -> None:
    """Sign a plan with the operator's key and submit it as a new job."""
    with _connect(coordinator, identity) as deployment:
        job = _asking(deployment, deployment.submit, plan)
    if as_json:
        typer.echo(json.dumps(asdict(job)))
        return
    typer.echo(f"job {job.job_id} submitted: {job.algorithm} on dataset {job.dataset}, "
               f"silos {', '.join(job.silos)}; now {_state(job)}")


@jobs_app.command("list")
def list_jobs(coordinator: str = _COORDINATOR, identity: Path = _IDENTITY,
              as_json: bool = _JSON) -> None:
    """Every job of the deployment, oldest first."""
    with _connect(coordinator, identity) as deployment:
        jobs = _asking(deployment, deployment.jobs)
    if as_json:
        typer.echo(json.dumps([asdict(j) for j in jobs]))
        return
    from trellis.coordinator.jobs.overview import format_jobs

    typer.echo(format_jobs(jobs, running=False))


@jobs_app.command()
def show(job_id: int = typer.Argument(..., help="the job's number"),
         coordinator: str = _COORDINATOR, identity: Path = _IDENTITY,
         as_json: bool = _JSON) -> None:
    """One job: its state and why, each silo's answer, its history and its federation."""
    from trellis.coordinator.jobs.overview import when
    from trellis.coordinator.operations.status import format_status

    with _connect(coordinator, identity) as deployment:
        job = _asking(deployment, deployment.job, job_id)
    if as_json:
        typer.echo(json.dumps(asdict(job)))
        return
    typer.echo(f"job {job.job_id}: {_state(job)}")
    typer.echo(f"  federation {job.federation}: {job.algorithm}, {job.rounds} rounds, "
               f"dataset {job.dataset}, at least {job.min_silos} silos")
    typer.echo(f"  submitted by {job.operator} at {when(job.submitted_at)}; public plan "
               f"sha256 {job.public_sha256}")
    for answer in job.answers:
        said = answer.answer or "no answer yet"
        typer.echo(f"  {answer.silo}: {said}" + (f" ({answer.reason})" if answer.reason else "")
                   + (f" at {when(answer.at)}" if answer.at else ""))
    for event in job.events:
        typer.echo(f"  {when(event.at)}  {event.state.replace('_', ' ')}"
                   + (f": {event.reason}" if event.reason else ""))
    if job.status is not None:
        state = "running" if job.state == "running" else "ended"
        typer.echo(format_status(job.status, state, job.status.elapsed_s))


@jobs_app.command()
def logs(job_id: int = typer.Argument(..., help="the job's number"),
         follow: bool = typer.Option(False, "--follow", "-f",
                                     help="keep printing until the job ends"),
         coordinator: str = _COORDINATOR, identity: Path = _IDENTITY) -> None:
    """The job's log: its federation's progress lines."""
    with _connect(coordinator, identity) as deployment:
        def show_all() -> None:
            for line in deployment.logs(job_id, follow):
                typer.echo(line)

        try:
            _asking(deployment, show_all)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None


@jobs_app.command()
def stop(job_id: int = typer.Argument(..., help="the job's number"),
         coordinator: str = _COORDINATOR, identity: Path = _IDENTITY) -> None:
    """Stop a job: a running federation ends now and keeps what it wrote."""
    with _connect(coordinator, identity) as deployment:
        job = _asking(deployment, deployment.stop, job_id)
    typer.echo(f"job {job.job_id}: {_state(job)}")


@jobs_app.command()
def results(job_id: int = typer.Argument(..., help="the job's number"),
            out: Path = typer.Option(..., "--out", help="folder to write the files into"),
            coordinator: str = _COORDINATOR, identity: Path = _IDENTITY) -> None:
    """Download a job's results: results.json (with the curves), status, audit log, log; and
    write its report (tables and curves, as `coordinator report`) into OUT/report."""
    from trellis.coordinator.operations.report import write_report

    with _connect(coordinator, identity) as deployment:
        written = _asking(deployment, deployment.results, job_id, out)
    if not written:
        fail(f"job {job_id} has no results yet")
    names = {p.name for p in written}
    if "results.json" in names:
        from trellis.coordinator.state.results import accuracy_table

        try:
            typer.echo(accuracy_table(json.loads((out / "results.json").read_text())))
        except (ValueError, KeyError) as exc:
            typer.echo(f"warning: results.json is not readable: {exc}", err=True)
        try:
            written += write_report(out / "results.json", out / "report")
        except (OSError, ValueError, KeyError) as exc:
            typer.echo(f"warning: no report written: {exc}", err=True)
    report = out / "report"
    typer.echo(f"job {job_id}: wrote {', '.join(sorted(names))} in {out}"
               + (f"; its report in {report}" if report.is_dir() else ""))


def _state(job: JobView) -> str:
    return job.state.replace("_", " ") + (f" ({job.reason})" if job.reason else "")
