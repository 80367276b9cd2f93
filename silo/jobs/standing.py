"""`silo serve`: a standing silo. It stays connected to its coordinator, decides each job offered
to it by its policy (or holds it for its operator), answers, and takes part in the jobs it
approved, each in a `silo join --job` process of its own.

A job's process holds the data and the GPU only while the job runs, and has its own state
folder (audit log, metrics file, resume state, final model) under the state root. The site's
record of offers and answers (silo/jobs/store.py) and its own audit log sit at the state root;
after a restart the coordinator's picture of the jobs is all the silo needs to carry on, and a
job it was taking part in is joined again (resuming from the job's folder).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from trellis.crypto.audit import AuditLog
from trellis.crypto.pki import Identity
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos import jobs_codec, keepalive
from trellis.protos.jobs import JobOfferView
from trellis.protos.messages import PROTOCOL_VERSION
from trellis.protos.plan import PublicPlan
from trellis.silo.jobs.approval import Offer, evaluate_offer
from trellis.silo.jobs.store import SiteJob, SiteJobStore
from trellis.silo.privacy.policy import Policy

TICK_S = 1.0                   # how often answers are sent and job processes looked at
RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)
EXIT_REFUSED = 2               # `silo join` refused the job (its plan, policy, data): final
JOIN_LOG = "join.log"


class SiteRefused(RuntimeError):
    """The coordinator will not take this silo (certificate, name): retrying will not help."""


@dataclass(frozen=True)
class SiteConfig:
    """How a standing silo runs: who it is, what it holds, where it keeps its state."""

    coordinator: str
    identity_dir: Path
    identity: Identity
    datasets: Mapping[str, Path]
    state_root: Path
    policy: Policy | None = None
    policy_file: Path | None = None
    max_jobs: int = 1
    join_options: tuple[str, ...] = ()       # passed on to each `silo join` (device, ...)
    # The public initial models it holds, by the SHA-256 a plan names them with.
    init_models: Mapping[str, Path] = field(default_factory=dict)


@dataclass
class JobProcess:
    """A `silo join --job` process of this silo."""

    job_id: int
    process: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)


class StandingSilo:
    """The standing silo's loop: watch, decide, answer, take part."""

    def __init__(self, config: SiteConfig, store: SiteJobStore, audit: AuditLog,
                 log: Callable[[str], None], *, wall: Callable[[], float] = time.time) -> None:
        self.config = config
        self.store = store
        self.audit = audit
        self.log = log
        self.wall = wall
        self.processes: dict[int, JobProcess] = {}
        self.ended: dict[int, int] = {}        # job -> exit code of its last process
        self.failures: dict[int, list[float]] = {}   # job -> when its processes failed
        self.latest: dict[int, JobOfferView] = {}
        self._stub: Any = None
        self._stop = threading.Event()

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until stopped (KeyboardInterrupt): reconnecting with backoff when the link
        drops, refusing to go on when the coordinator refuses this silo."""
        attempt = 0
        try:
            while not self._stop.is_set():
                try:
                    self._watch_over_channel()
                    attempt = 0
                except grpc.RpcError as exc:
                    code = exc.code()
                    if code in (grpc.StatusCode.PERMISSION_DENIED,
                                grpc.StatusCode.UNAUTHENTICATED,
                                grpc.StatusCode.FAILED_PRECONDITION,
                                grpc.StatusCode.UNIMPLEMENTED):
                        self.audit.append("refused_by_coordinator", code=code.name,
                                          reason=exc.details() or "")
                        raise SiteRefused(f"the coordinator at {self.config.coordinator} "
                                          f"refused this silo: {exc.details()}") from None
                    wait = RETRY_S[min(attempt, len(RETRY_S) - 1)]
                    attempt += 1
                    self.log(f"coordinator {self.config.coordinator} unavailable "
                             f"({code.name}: {exc.details()}); retrying in {wait:g} s")
                    self._tick()
                    self._stop.wait(wait)
        finally:
            self._end_processes()

    def stop(self) -> None:
        """Ask the loop to end."""
        self._stop.set()

    def _watch_over_channel(self) -> None:
        ident = self.config.identity
        credentials = grpc.ssl_channel_credentials(
            root_certificates=ident.ca_pem, private_key=ident.key_pem,
            certificate_chain=ident.cert_pem)
        with grpc.secure_channel(self.config.coordinator, credentials,
                                 options=keepalive.client_options()) as channel:
            self._stub = pb_grpc.SiteStub(channel)
            stream = self._stub.WatchJobs(jobs_codec.watch_request(PROTOCOL_VERSION))
            inbox: queue.Queue[Any] = queue.Queue()
            reader = threading.Thread(target=_read, args=(stream, inbox), daemon=True)
            reader.start()
            first = True
            try:
                while not self._stop.is_set():
                    try:
                        item = inbox.get(timeout=TICK_S)
                    except queue.Empty:
                        self._tick()
                        continue
                    if isinstance(item, grpc.RpcError):
                        raise item
                    if item is None:
                        raise _Ended()
                    if first:
                        self.log(f"connected to the coordinator at {self.config.coordinator} "
                                 f"as {ident.name}; datasets: "
                                 f"{', '.join(sorted(self.config.datasets)) or 'none'}")
                        first = False
                    self._picture(jobs_codec.site_jobs_from_pb(item))
                    self._tick()
            except _Ended:
                raise _unavailable("the coordinator closed the watch") from None
            finally:
                stream.cancel()
                self._stub = None

    # -- what the coordinator says ------------------------------------------------------------
    def _picture(self, offers: list[JobOfferView]) -> None:
        """Take the coordinator's whole picture of this silo's jobs."""
        for offer in offers:
            self.latest[offer.job_id] = offer
            known = self._known(offer.job_id)
            if known is None:
                known = self._decide(offer)
            if known.state != offer.state:
                self.store.note_state(offer.job_id, offer.state)
                if offer.terminal and offer.job_id not in self.processes:
                    self.log(f"job {offer.job_id} {offer.state}"
                             + (f": {offer.reason}" if offer.reason else ""))

    def _known(self, job_id: int) -> SiteJob | None:
        try:
            return self.store.get(job_id)
        except ValueError:
            return None

    def _decide(self, offer: JobOfferView) -> SiteJob:
        """A new offer: decide by the policy, record, audit and say it."""
        offered = Offer(job_id=offer.job_id, federation=offer.federation,
                        public_plan_json=offer.public_plan_json,
                        submission_json=offer.submission_json, signature=offer.signature,
                        operator_certificate_pem=offer.operator_certificate_pem)
        decision = evaluate_offer(offered, policy=self.config.policy,
                                  ca_pem=self.config.identity.ca_pem,
                                  datasets=self.config.datasets, seen=self.store.seen_submission,
                                  init_models=self.config.init_models)
        job = self.store.record_offer(offered, decision, now=self.wall())
        self.audit.append("job_offered", job=offer.job_id, federation=offer.federation,
                          operator=job.operator, plan_sha256=job.public_sha256,
                          submission_sha256=job.submission_sha256,
                          decision=decision.verdict, reason=decision.reason,
                          **({"policy_sha256": self.config.policy.sha256}
                             if self.config.policy else {}))
        said = {"approve": "approved by policy", "refuse": "refused",
                "hold": "held for the operator"}[decision.verdict]
        self.log(f"job {offer.job_id} offered by {job.operator or '?'} ({job.algorithm or '?'} "
                 f"on {job.dataset or '?'}): {said}" +
                 (f": {decision.reason}" if decision.reason else ""))
        return job

    # -- the tick -----------------------------------------------------------------------------
    def _tick(self) -> None:
        """Send answers not yet delivered, reap finished job processes, start approved jobs."""
        self._send_answers()
        self._reap()
        self._start_jobs()

    def _send_answers(self) -> None:
        if self._stub is None:
            return
        for job in self.store.unsent():
            approve = job.answer == "approved"
            try:
                self._stub.AnswerJob(jobs_codec.answer_to_pb(job.job_id, approve, job.reason),
                                     timeout=10)
            except grpc.RpcError as exc:
                if exc.code() is grpc.StatusCode.FAILED_PRECONDITION:
                    # E.g. the job ended or its approval deadline passed: nothing to deliver.
                    self.log(f"job {job.job_id}: the coordinator did not take this silo's "
                             f"answer: {exc.details()}")
                    self.store.mark_sent(job.job_id)
                    continue
                return           # the link is down: the next connection sends it
            self.store.mark_sent(job.job_id)
            self.audit.append("job_answered", job=job.job_id, answer=job.answer,
                              reason=job.reason, by=job.answered_by)

    def _start_jobs(self) -> None:
        for job_id, offer in sorted(self.latest.items()):
            if (offer.state != "running" or job_id in self.processes
                    or self.config.identity.name not in offer.participants
                    or job_id in self.ended or not self._may_retry(job_id)):
                continue
            known = self._known(job_id)
            if known is None or known.answer != "approved":
                continue      # never: nothing leaves this silo for a job it did not approve
            if len(self.processes) >= self.config.max_jobs:
                return
            self._launch(known)

    def _launch(self, job: SiteJob) -> None:
        folder = self.config.state_root / "jobs" / str(job.job_id)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        command = [sys.executable, "-m", "trellis.silo.cli", "join",
                   "--coordinator", self.config.coordinator,
                   "--identity", str(self.config.identity_dir),
                   "--data", str(self.config.datasets[job.dataset]),
                   "--state-dir", str(folder), "--job", str(job.job_id),
                   "--approved-plan", job.public_sha256, *self.config.join_options]
        if self.config.policy_file is not None:
            command += ["--policy", str(self.config.policy_file)]
        initial = self.config.init_models.get(_init_sha256(job.public_plan_json))
        if initial is not None:
            command += ["--init-model", str(initial)]
        fd = os.open(folder / JOIN_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # No preexec_fn: a fork of this gRPC-threaded process is what gRPC warns about;
            # the child asks to die with this process itself (`silo join --job`).
            process = subprocess.Popen(command, stdout=fd, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)
        finally:
            os.close(fd)
        self.processes[job.job_id] = JobProcess(job.job_id, process)
        self.audit.append("job_joined", job=job.job_id, pid=process.pid, folder=str(folder))
        self.log(f"job {job.job_id}: taking part (`silo join --job {job.job_id}`, pid "
                 f"{process.pid}; log: {folder / JOIN_LOG})")

    def _reap(self) -> None:
        for job_id, running in list(self.processes.items()):
            code = running.process.poll()
            if code is None:
                continue
            del self.processes[job_id]
            self.ended[job_id] = code
            self.audit.append("job_left", job=job_id, exit_code=code)
            folder = self.config.state_root / "jobs" / str(job_id)
            self.log(f"job {job_id}: this silo's part ended (exit {code}); log: "
                     f"{folder / JOIN_LOG}")
            if code not in (0, EXIT_REFUSED):
                # E.g. a coordinator restart outlasted the join: while the coordinator says the
                # job runs, join again, a few times, further apart each time.
                self.ended.pop(job_id, None)
                self.failures.setdefault(job_id, []).append(time.monotonic())
            elif code == EXIT_REFUSED:
                self.audit.append("job_abandoned", job=job_id,
                                  reason="its silo join refused it (see its log)")

    def _may_retry(self, job_id: int) -> bool:
        """Whether a job whose process failed may be joined again now."""
        failed = self.failures.get(job_id, [])
        if not failed:
            return True
        if len(failed) > len(RETRY_S):
            return False          # given up: the log of its last process says why
        return time.monotonic() - failed[-1] >= RETRY_S[len(failed) - 1]

    def _end_processes(self) -> None:
        """On the way out: stop this silo's job processes (they resume on the next start)."""
        for running in self.processes.values():
            if running.process.poll() is None:
                running.process.send_signal(signal.SIGTERM)
        for running in self.processes.values():
            try:
                running.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                running.process.kill()


class _Ended(Exception):
    """The coordinator ended the watch stream."""


class _Unavailable(grpc.RpcError):
    def __init__(self, details: str) -> None:
        super().__init__(details)
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details


def _init_sha256(public_plan_json: str) -> str:
    """The initial model an approved job's plan names ("" for none)."""
    return PublicPlan.from_json(public_plan_json).model.init_sha256


def _unavailable(details: str) -> grpc.RpcError:
    return _Unavailable(details)


def _read(stream: Any, inbox: queue.Queue[Any]) -> None:
    """Move the watch stream's messages to inbox: each message, then None or the error."""
    try:
        for item in stream:
            inbox.put(item)
        inbox.put(None)
    except grpc.RpcError as exc:
        inbox.put(exc)
