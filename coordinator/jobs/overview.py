"""A standing coordinator's jobs as an operator looks them over: read from its state root
without changing anything there, or as its Admin service lists them, and shown as one table.

`coordinator status` uses it for a deployment (`--state-dir STATE_ROOT`, which holds
jobs.sqlite, or `--coordinator`). The job table is opened read-only (SQLite's ``mode=ro``): a
running coordinator keeps writing it, and the reader never takes a lock that could hold it up.
Each job that has run has its federation's status.json in its folder, as a one-plan
coordinator's state folder does.
"""

from __future__ import annotations

import sqlite3
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from trellis.coordinator.jobs.records import job_view
from trellis.coordinator.jobs.store import FILE_NAME, SCHEMA_VERSION, Job, JobStore, JobStoreError
from trellis.coordinator.operations.status import read_status
from trellis.coordinator.state.exclusive import lock_holder
from trellis.protos.jobs import JobView
from trellis.protos.status import FederationStatus

JOBS_FOLDER = "jobs"


def is_state_root(path: Path) -> bool:
    """Whether path is a standing coordinator's state root (it holds the job table)."""
    return (path / FILE_NAME).is_file()


def job_folder(state_root: Path, job_id: int) -> Path:
    """A job's state folder under a state root (DeploymentConfig.job_folder's layout)."""
    return state_root / JOBS_FOLDER / str(job_id)


def open_read_only(state_root: Path) -> JobStore:
    """The job table of a state root, opened read-only (JobStoreError says why not)."""
    path = state_root / FILE_NAME
    try:
        connection = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True,
                                     isolation_level=None, check_same_thread=False,
                                     timeout=30.0)
    except sqlite3.Error as exc:
        raise JobStoreError(f"{path}: cannot read the job table: {exc}") from None
    try:
        version = connection.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.Error as exc:
        connection.close()
        raise JobStoreError(f"{path}: cannot read the job table: {exc}") from None
    if version != SCHEMA_VERSION:
        connection.close()
        raise JobStoreError(f"{path}: a job table of schema version {version}; this "
                            f"coordinator reads version {SCHEMA_VERSION}")
    return JobStore(path, connection)


def read_jobs(state_root: Path) -> list[JobView]:
    """Every job of a state root, oldest first, with each one's last federation status."""
    with open_read_only(state_root) as store:
        return [_view(store, job, job_folder(state_root, job.id)) for job in store.jobs()]


def _view(store: JobStore, job: Job, folder: Path) -> JobView:
    """A job as the Admin service's ShowJob would show it, from the table and its folder."""
    return job_view(job, store.answers(job.id), store.events(job.id), _status(folder))

def _status(folder: Path) -> FederationStatus | None:
    try:
        return read_status(folder)
    except ValueError:
        return None                 # the job has not run (or its folder is gone)


def coordinator_line(state_root: Path) -> tuple[str, int | None]:
    """Whether a coordinator serves the state root now: (a line, its pid or None)."""
    pid = lock_holder(state_root)
    if pid is not None:
        return f"deployment state root {state_root}: coordinator running (pid {pid})", pid
    return (f"deployment state root {state_root}: no coordinator running (`coordinator serve "
            "--deployment FILE` resumes the jobs recorded as running)"), None


def format_jobs(jobs: list[JobView], *, serving: bool = True, running: bool = True) -> str:
    """The jobs as a table, each running job followed by its federation's status line
    (serving: whether a coordinator serves them now; running: False leaves those lines out,
    as `coordinator jobs list` does)."""
    if not jobs:
        return "no jobs yet: submit one with `coordinator jobs submit PLAN`"
    lines = [f"{'job':>4}  {'state':<18} {'algorithm':<9} {'dataset':<12} {'operator':<12} "
             f"{'submitted':<16} round"]
    for job in jobs:
        done = job.status.rounds_completed if job.status is not None else 0
        lines.append(f"{job.job_id:>4}  {job.state:<18} {job.algorithm:<9} {job.dataset:<12} "
                     f"{job.operator:<12} {when(job.submitted_at):<16} {done}/{job.rounds}")
        if running and job.state == "running":
            lines.append("      " + _running_line(job.status, serving))
    return "\n".join(lines)


def _running_line(status: FederationStatus | None, serving: bool) -> str:
    """One running job's federation, as its status.json last said."""
    if status is None:
        return "no status yet (its federation is starting)"
    said = (f"round {status.round} of {status.rounds}, stage {status.stage}; "
            f"connected {len(status.connected)}" +
            (f": {', '.join(status.connected)}" if status.connected else ""))
    accuracies = [f"{name} {value:.4f}" for name, value in sorted(status.metrics.items())
                  if name.endswith("_acc")]
    if status.metrics_round and accuracies:
        said += f"; round {status.metrics_round}: " + ", ".join(accuracies)
    return said if serving else said + " (when the coordinator stopped)"


def jobs_to_json(jobs: list[JobView], **deployment: Any) -> dict[str, Any]:
    """`coordinator status --json` of a deployment: what is known of it, then every job."""
    return {"deployment": deployment, "jobs": [asdict(job) for job in jobs]}


def when(at: float) -> str:
    """A Unix time as the job tables show it (local time, to the minute; "-" for none)."""
    return datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M") if at else "-"
