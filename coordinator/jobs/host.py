"""The standing coordinator's jobs: submissions checked and recorded, silos' answers taken, the
scheduler's moves carried out, each running job's federation started, ended and resumed.

The job table (coordinator/jobs/store.py) is the truth that survives a restart: a job recorded
as running is resumed from its folder's checkpoint when the coordinator comes back. Every
submission, answer and change of state is also written to the deployment's audit log.

Over 400 lines because it is the one door to the jobs for both services (operators' Admin,
silos' Site) and for the clock: each entry checks, records, audits and wakes the watchers
under the same lock, so a job's state and its federation never disagree.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trellis.coordinator.jobs.deployment import DeploymentConfig
from trellis.coordinator.jobs.job_plan import admit_job_plan, parse_job_plan
from trellis.coordinator.jobs.records import job_view
from trellis.coordinator.jobs.runtime import JOB_LOG, JobRuntime, SharedServing, start_job
from trellis.coordinator.jobs.scheduler import participants, plan_transitions
from trellis.coordinator.jobs.store import Job, JobStore, JobStoreError
from trellis.coordinator.operations.status import read_status
from trellis.crypto.audit import AuditLog
from trellis.crypto.errors import CryptoError
from trellis.protos.jobs import TERMINAL, JobOfferView, JobView
from trellis.protos.plan import PlanError
from trellis.protos.status import FederationStatus
from trellis.protos.submission import Submission, SubmissionInvalid, verify_submission

STEP_S = 0.5                 # how often the host looks at the clock and its running jobs
RECENT_ENDED = 20            # ended jobs a silo still sees (so it learns how they ended)
RESULT_FILES = ("results.json", "status.json", "audit.jsonl", JOB_LOG, "checkpoint.json")


class JobRejected(ValueError):
    """A submission, answer or stop the host refuses; the message says why, in one line."""


class JobHost:
    """Every job of one deployment, and the federations of those running."""

    def __init__(self, deployment: DeploymentConfig, store: JobStore, audit: AuditLog,
                 shared: SharedServing, *, wall: Callable[[], float] = time.time,
                 log: logging.Logger | None = None) -> None:
        self.deployment = deployment
        self.store = store
        self.audit = audit
        self.shared = shared
        self.wall = wall
        self.log = log or logging.getLogger("trellis.log.coordinator")
        self.runtimes: dict[int, JobRuntime] = {}
        self._ending: set[int] = set()
        self._stops: dict[int, str] = {}
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._listeners: list[Callable[[], None]] = []
        self._closing = False
        self._stepper: threading.Thread | None = None

    # -- lifetime -----------------------------------------------------------------------------
    def start(self) -> None:
        """Resume the jobs recorded as running, then keep stepping until closed."""
        with self._lock:
            for job in self.store.jobs(["running"]):
                self._start_runtime(job, resumed=True)
        self.step()
        self._stepper = threading.Thread(target=self._keep_stepping, name="jobs", daemon=True)
        self._stepper.start()

    def close(self) -> None:
        """Stop stepping; running jobs stay recorded as running, to resume on restart."""
        with self._lock:
            self._closing = True
            self._notify()
            runtimes = list(self.runtimes.values())
        if self._stepper is not None:
            self._stepper.join(timeout=5)
        for runtime in runtimes:
            if runtime.ended is None:
                runtime.finish(self.shared.clock, status="interrupted")

    def _keep_stepping(self) -> None:
        while True:
            with self._lock:
                if self._closing:
                    return
                self._changed.wait(STEP_S)
                if self._closing:
                    return
            try:
                self.step()
            except Exception as exc:      # noqa: BLE001 - the host must outlive one bad step
                self.log.error(f"job scheduling step failed: {type(exc).__name__}: {exc}")

    # -- watching -----------------------------------------------------------------------------
    def on_change(self, listener: Callable[[], None]) -> None:
        """Call listener (it must not block) whenever a job may have changed."""
        with self._lock:
            self._listeners.append(listener)

    def _notify(self) -> None:
        self._changed.notify_all()
        for listener in self._listeners:
            listener()

    # -- operators ----------------------------------------------------------------------------
    def submit(self, operator: str, certificate_pem: bytes, plan_toml: bytes,
               submission_json: str, signature: bytes) -> JobView:
        """Check a signed submission and record it as a new job."""
        allowed = self.deployment.operators
        if allowed and operator not in allowed:
            raise JobRejected(f"operator {operator!r} may not submit jobs to deployment "
                              f"{self.deployment.name} (deployment.operators: "
                              f"{', '.join(allowed)})")
        try:
            submission = Submission.from_json(submission_json)
        except SubmissionInvalid as exc:
            raise JobRejected(str(exc)) from None
        if submission.operator != operator:
            raise JobRejected(f"the submission is signed as {submission.operator!r}, but the "
                              f"caller's certificate is {operator!r}'s")
        try:
            verify_submission(certificate_pem, submission, signature)
        except CryptoError:
            raise JobRejected("the submission's signature does not verify with the caller's "
                              "certificate") from None
        if hashlib.sha256(plan_toml).hexdigest() != submission.plan_sha256:
            raise JobRejected("the plan received is not the plan file the operator signed")
        try:
            plan = parse_job_plan(plan_toml, source="submitted plan")
            admit_job_plan(plan, self.deployment, 0)
        except (PlanError, ValueError) as exc:
            raise JobRejected(str(exc)) from None
        if plan.public.sha256() != submission.public_sha256:
            raise JobRejected("the public plan signed is not the one this coordinator reads "
                              "from the plan file (a different Trellis version?)")
        with self._lock:
            try:
                job = self.store.submit(
                    federation=plan.federation, algorithm=plan.public.algorithm,
                    dataset=plan.public.dataset, operator=operator, plan_toml=plan_toml,
                    public_plan_json=plan.public.to_json(), submission_json=submission_json,
                    submission_sha256=submission.sha256, signature=signature,
                    operator_certificate_pem=certificate_pem, silos=plan.silos,
                    min_silos=plan.min_silos, now=self.wall())
            except JobStoreError as exc:
                raise JobRejected(str(exc)) from None
            self._record("job_submitted", job=job.id, operator=operator,
                              federation=job.federation, algorithm=job.algorithm,
                              dataset=job.dataset, silos=list(job.silos),
                              public_sha256=plan.public.sha256(),
                              submission_sha256=submission.sha256)
            self.log.info(f"job {job.id} submitted by {operator}: {job.algorithm} on "
                          f"{job.dataset}, silos {', '.join(job.silos)}")
            self._notify()
        self.step()
        return self.view(job.id)

    def stop(self, job_id: int, operator: str, reason: str = "") -> JobView:
        """Stop a job: a running one's federation ends now, keeping what it wrote."""
        why = f"stopped by {operator}" + (f": {reason}" if reason else "")
        with self._lock:
            job = self._job(job_id)
            if job.state in TERMINAL:
                raise JobRejected(f"job {job_id} has already ended ({job.state}"
                                  + (f": {job.reason}" if job.reason else "") + ")")
            self._record("job_stop", job=job_id, operator=operator, reason=reason)
            runtime = self.runtimes.get(job_id)
            if runtime is not None:
                self._stops[job_id] = why
                runtime.core.end(why)
            else:
                self._transition(job_id, "stopped", why)
        self.step()
        return self.view(job_id)

    def view(self, job_id: int) -> JobView:
        """A job as an operator sees it, with its federation's status once it has run."""
        with self._lock:
            job = self._job(job_id)
            answers = self.store.answers(job_id)
            events = self.store.events(job_id)
            runtime = self.runtimes.get(job_id)
            status = runtime.core.status() if runtime is not None else self._stored_status(job)
        return job_view(job, answers, events, status)

    def views(self) -> list[JobView]:
        """Every job, oldest first."""
        with self._lock:
            ids = [job.id for job in self.store.jobs()]
        return [self.view(i) for i in ids]

    def folder(self, job_id: int) -> Path:
        """A job's state folder (JobRejected for an unknown job)."""
        self._job(job_id)
        return self.deployment.job_folder(job_id)

    def log_lines(self, job_id: int, offset: int) -> tuple[list[str], int, bool]:
        """The job's log lines from byte offset: (lines, next offset, whether it has ended)."""
        path = self.folder(job_id) / JOB_LOG
        with self._lock:
            ended = self._job(job_id).state in TERMINAL and job_id not in self.runtimes
        try:
            with path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read(1 << 20)
        except FileNotFoundError:
            return [], offset, ended
        whole = data[:data.rfind(b"\n") + 1]      # whole lines only: the rest comes next time
        lines = whole.decode("utf-8", "replace").splitlines()
        return lines, offset + len(whole), ended and len(whole) == len(data)

    def result_files(self, job_id: int) -> Iterator[tuple[str, bytes]]:
        """The files of a job's results that exist so far."""
        folder = self.folder(job_id)
        for name in RESULT_FILES:
            path = folder / name
            if path.is_file():
                yield name, path.read_bytes()

    # -- silos --------------------------------------------------------------------------------
    def answer(self, silo: str, job_id: int, approve: bool, reason: str) -> None:
        """A silo's answer to a job it is named in."""
        with self._lock:
            job = self._job(job_id)
            if silo not in job.silos:
                raise JobRejected(f"job {job_id} does not name {silo}")
            try:
                self.store.answer(job_id, silo, approve, reason, now=self.wall())
            except JobStoreError as exc:
                raise JobRejected(str(exc)) from None
            self._record("job_answer", job=job_id, silo=silo,
                              answer="approved" if approve else "refused", reason=reason)
            self.log.info(f"job {job_id}: {silo} " + ("approved" if approve else
                                                      f"refused ({reason})"))
            self._notify()
        self.step()

    def offers_for(self, silo: str) -> list[JobOfferView]:
        """Every job that names silo and has not ended, and the last few that ended."""
        with self._lock:
            jobs = [j for j in self.store.jobs() if silo in j.silos]
            ended = [j for j in jobs if j.state in TERMINAL][-RECENT_ENDED:]
            shown = [j for j in jobs if j.state not in TERMINAL or j in ended]
            offers = []
            for job in shown:
                answers = self.store.answers(job.id)
                mine = answers.get(silo)
                taking = participants(job, answers) if job.state in (
                    "queued", "running", "completed", "stopped", "failed") else ()
                offers.append(JobOfferView(
                    job_id=job.id, state=job.state, federation=job.federation,
                    public_plan_json=job.public_plan_json,
                    submission_json=job.submission_json, signature=job.signature,
                    operator_certificate_pem=job.operator_certificate_pem,
                    participants=taking, reason=job.reason,
                    answer="" if mine is None else ("approved" if mine.approved
                                                    else "refused")))
            return offers

    def runtime(self, job_id: int) -> JobRuntime | None:
        """The running federation of a job, for the router (None: not running here)."""
        with self._lock:
            return self.runtimes.get(job_id)

    def state_of(self, job_id: int) -> str:
        """A job's state ("" if there is no such job)."""
        with self._lock:
            try:
                return self.store.get(job_id).state
            except JobStoreError:
                return ""

    # -- the clock ----------------------------------------------------------------------------
    def step(self) -> None:
        """End the federations that finished; apply the scheduler's moves; start jobs."""
        with self._lock:
            if self._closing:
                return
            for job_id, runtime in list(self.runtimes.items()):
                if runtime.finished and job_id not in self._ending:
                    self._ending.add(job_id)
                    threading.Thread(target=self._end, args=(job_id, runtime),
                                     name=f"job-{job_id}-end", daemon=True).start()
            jobs = self.store.jobs()
            answers = {j.id: self.store.answers(j.id) for j in jobs
                       if j.state not in TERMINAL}
            moves = plan_transitions(jobs, answers, self.wall(),
                                     max_concurrent=self.deployment.max_concurrent_jobs,
                                     approval_deadline_s=self.deployment.approval_deadline_s)
            for move in moves:
                job = self._transition(move.job_id, move.to, move.reason)
                if move.to == "running":
                    self._start_runtime(job, resumed=False)

    def _end(self, job_id: int, runtime: JobRuntime) -> None:
        """Write a finished job's results (outside the lock: the silos hear the end first)."""
        stopped = self._stops.get(job_id)
        try:
            results = runtime.finish(self.shared.clock,
                                     status="stopped" if stopped else None)
            status, failure = results["status"], results.get("failure") or ""
        except Exception as exc:           # noqa: BLE001 - the job fails, the host goes on
            status, failure = "failed", f"writing its results failed: {exc}"
        with self._lock:
            self.runtimes.pop(job_id, None)
            self._ending.discard(job_id)
            if stopped:
                self._transition(job_id, "stopped", stopped)
            elif status == "completed":
                rounds = len(runtime.core.machine.history)
                self._transition(job_id, "completed", f"{rounds} rounds")
            else:
                self._transition(job_id, "failed", failure or status)

    def _start_runtime(self, job: Job, *, resumed: bool) -> None:
        """Start (or resume) a running job's federation; a job that cannot start fails."""
        taking = participants(job, self.store.answers(job.id))
        try:
            plan = admit_job_plan(parse_job_plan(job.plan_toml, source=f"job {job.id}"),
                                  self.deployment, job.id)
            runtime = start_job(job.id, plan, taking, self.shared)
        except (PlanError, ValueError, OSError) as exc:
            self._transition(job.id, "failed", f"could not start: {exc}")
            return
        self.runtimes[job.id] = runtime
        self._record("job_federation", job=job.id, resumed=resumed,
                          participants=list(taking), run_id=runtime.core.machine.run_id)
        self.log.info(f"job {job.id} " + ("resumed" if resumed else "started") +
                      f": federation {job.federation} with {', '.join(taking)}")

    def _record(self, event: str, **fields: Any) -> None:
        """Append to the deployment's audit log and sign its head: a job's record is rare
        and each one matters to a reviewer (a log cut after it would show)."""
        self.audit.append(event, **fields)
        self.audit.checkpoint()

    def _transition(self, job_id: int, to: str, reason: str) -> Job:
        job = self.store.transition(job_id, to, reason, now=self.wall())
        self._record("job_state", job=job_id, state=to, reason=reason)
        if to not in ("running",):
            self.log.info(f"job {job_id} {to.replace('_', ' ')}" +
                          (f": {reason}" if reason else ""))
        self._notify()
        return job

    def _job(self, job_id: int) -> Job:
        try:
            return self.store.get(job_id)
        except JobStoreError:
            raise JobRejected(f"no job {job_id} in deployment {self.deployment.name}") from None

    def _stored_status(self, job: Job) -> FederationStatus | None:
        """The status.json a job's federation left, if it ran."""
        try:
            return read_status(self.deployment.job_folder(job.id))
        except (OSError, ValueError):
            return None

