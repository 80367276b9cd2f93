"""The silo agent behind ``silo join``: dials the coordinator over mTLS and runs the silo driver.

The agent is the silo's transport and its disk: it holds the connection (reconnecting with
backoff), reads instructions from its control stream and hands each to the driver
(silo/federation/driver.py, the same one a simulation runs) over a gRPC link; it takes the plan on
joining, keeps the silo's resume file and final model, and owns the silo's audit trail.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc

from trellis.crypto.audit import AuditLog
from trellis.crypto.errors import CryptoError, ProtocolError
from trellis.crypto.pki import Identity
from trellis.protos import codec, keepalive
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos.files import write_atomic
from trellis.protos.messages import PROTOCOL_VERSION, Envelope, Instruction, Phase
from trellis.silo.data.molecules.dataset_check import DatasetMismatch
from trellis.silo.federation.diagnose import Diagnosis, diagnose
from trellis.silo.federation.driver import SiloDriver
from trellis.silo.federation.finished import (
    FINISHED_GRACE_S,
    FinishedHere,
    NothingToJoin,
    finished_here,
)
from trellis.silo.federation.grpc_link import GrpcLink
from trellis.silo.federation.job_metadata import for_job
from trellis.silo.federation.session import SiloSession
from trellis.silo.operations.metrics import SiloMetrics
from trellis.silo.operations.metrics_file import METRICS_FILE, MetricsFile
from trellis.silo.privacy.budget import BudgetExhausted
from trellis.silo.privacy.policy import PlanRefused
from trellis.silo.privacy.private_step import INSECURE_SEED_VARIABLE
from trellis.silo.training.failures import FederationFailed
from trellis.silo.training.initial_model import InitialModelMismatch
from trellis.silo.training.model_file import model_metadata, save_final_model
from trellis.silo.training.trainer import snapshot_from_bytes, snapshot_to_bytes

AGENT_VERSION = PROTOCOL_VERSION      # the coordinator refuses an older one
MAX_RUN_ID = 64                       # a coordinator draws 16 hex digits
RESUME_FILE = "resume.pt"      # DESIGN.md §6: the silo's model and round counter, on its disk
__all__ = ["AGENT_VERSION", "RESUME_FILE", "FederationFailed", "NothingToJoin", "SiloAgent",
           "SiloRefused"]


# CANCELLED: a coordinator that stops (SIGTERM, a rescheduled pod) cancels the calls in flight
# as it shuts its server down; it is back when it restarts, as after UNAVAILABLE.
_RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.CANCELLED)

class SiloRefused(FederationFailed):
    """The coordinator will not take this silo as configured (certificate, name, version)."""


class SiloAgent:
    """Connects, follows instructions until FINISHED, and keeps the silo's audit trail."""

    def __init__(self, target: str, identity: Identity, session: SiloSession, state_dir: Path,
                 *, connect_timeout_s: float = 300.0, log: Callable[[str], None] = print,
                 sleep: Callable[[float], None] = time.sleep,
                 metrics: SiloMetrics | None = None, job_id: int | None = None) -> None:
        self.target = target
        self.job_id = job_id        # a standing coordinator's job (None: a one-plan one)
        self.identity = identity
        self.session = session
        self.state_dir = state_dir
        self.connect_timeout_s = connect_timeout_s
        self.log = log
        self.sleep = sleep
        state_dir.mkdir(parents=True, exist_ok=True)
        self.audit = AuditLog(state_dir / "audit.jsonl", writer=identity.name,
                              signing_key_pem=identity.key_pem)
        self.federation = ""
        self.reached = False        # whether the coordinator ever answered (told us the plan)
        # One driver for the agent's life: across reconnections it remembers which group-key
        # and similarity steps it has done (the coordinator re-sends them on reconnecting).
        self.link = GrpcLink(None, log=log)
        if metrics is not None:
            self.audit.observe(metrics.observe)
        # The silo's own figures per round, whatever it reports (never sent).
        self.metrics = MetricsFile(state_dir / METRICS_FILE)
        self.driver = SiloDriver(session, self.link, audit=self.audit, log=log,
                                 before_round=self._save_resume_state,
                                 finished=self._save_final_model, dump_dir=state_dir,
                                 observer=metrics, round_done=self.metrics.record)

    def run(self) -> None:
        """Take part until the federation finishes; reconnects with backoff if the link drops."""
        deadline = time.monotonic() + self.connect_timeout_s
        grace_end = min(deadline, time.monotonic() + FINISHED_GRACE_S)
        backoff = 0.5
        found: Diagnosis | None = None
        # While no coordinator has answered: the finished federation this folder holds, if any.
        done: FinishedHere | None = None
        checked = False
        try:
            while True:
                try:
                    if self._session_over_channel():
                        return
                    backoff = 0.5
                    deadline = time.monotonic() + self.connect_timeout_s
                except grpc.RpcError as exc:
                    code = exc.code()
                    if code in (grpc.StatusCode.PERMISSION_DENIED,
                                grpc.StatusCode.UNAUTHENTICATED,
                                grpc.StatusCode.FAILED_PRECONDITION):
                        self.audit.append("refused_by_coordinator", code=code.name,
                                          reason=exc.details() or "")
                        raise SiloRefused(f"the coordinator refused this silo: {exc.details()}"
                                          ) from None
                    if not self.reached and code is grpc.StatusCode.UNAVAILABLE:
                        # Never connected: find out why before retrying for minutes.
                        found = diagnose(self.target, self.identity) or found
                        if found is not None and found.final:
                            raise SiloRefused(f"cannot join {self.target}: {found.message}"
                                              ) from None
                        if not checked:
                            checked, done = True, finished_here(
                                self.state_dir, RESUME_FILE, self.audit.path)
                        if done is not None and time.monotonic() >= grace_end:
                            self._nothing_to_join(done)
                    elif not self.reached:
                        checked, done = True, None     # one answered: wait for it as before
                    # RESOURCE_EXHAUSTED: attended too often (a restart loop); it passes.
                    if code not in _RETRIED or time.monotonic() > deadline:
                        if not self.reached:
                            why = found.message if found is not None else (
                                f"{exc.details()}; check the address and port, that the "
                                "coordinator is running, and that its certificate names the "
                                "host you dial")
                            raise FederationFailed(
                                f"never reached the coordinator at {self.target} within "
                                f"{self.connect_timeout_s:g} s: {why}") from None
                        raise FederationFailed(f"lost the coordinator at {self.target}: "
                                               f"{code.name} {exc.details()}") from None
                    said = found.message if found is not None and not self.reached else (
                        exc.details())
                    until = grace_end if done is not None else deadline
                    wait = min(backoff, max(0.0, until - time.monotonic()))
                    self.log(f"coordinator unavailable ({said}); retrying in {wait:.1f}s")
                    self.sleep(wait)
                    backoff = min(backoff * 2, 10.0)
        finally:
            self.audit.close()

    def _nothing_to_join(self, done: FinishedHere) -> None:
        """The federation this folder holds finished and no coordinator answers: stop (exit 0)."""
        self.audit.append("nothing_to_join", coordinator=self.target, federation=done.federation,
                          run_id=done.run_id, finished=done.saved_at)
        raise NothingToJoin(done, self.target)

    # -- one connection -----------------------------------------------------------------------
    def _session_over_channel(self) -> bool:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.identity.ca_pem, private_key=self.identity.key_pem,
            certificate_chain=self.identity.cert_pem)
        with grpc.secure_channel(self.target, credentials,
                                 options=keepalive.client_options()) as channel:
            stub = pb_grpc.FederationStub(for_job(channel, self.job_id))
            stream = stub.Attend(codec.attend_request(
                Envelope(self.federation, 0, 0, Phase.JOIN), AGENT_VERSION))
            inbox: queue.Queue[Instruction | grpc.RpcError | None] = queue.Queue()
            reader = threading.Thread(target=_read_stream, args=(stream, inbox), daemon=True)
            reader.start()
            self.link.stub = stub
            try:
                while True:
                    instruction = _latest(inbox)
                    try:
                        if instruction.envelope.phase is Phase.JOIN:
                            self.join(instruction)
                        elif self.driver.handle(instruction):
                            return True
                    except BudgetExhausted as exc:
                        # The silo's own limit: it leaves before the round, never after it.
                        self.audit.append("stopped_privacy_budget", **exc.record())
                        raise FederationFailed(str(exc)) from None
                    except (CryptoError, ValueError) as exc:
                        # A forged key, a NaN in the model, a bad plan: stop, upload nothing.
                        self.audit.append("refused_to_continue", reason=str(exc))
                        raise FederationFailed(f"stopped before uploading: {exc}") from None
            finally:
                stream.cancel()

    def join(self, ins: Instruction) -> None:
        """Take the plan the coordinator sent on joining; resume from this silo's disk once."""
        session = self.session
        first_join, self.reached = not self.reached, True
        try:
            plan = session.accept_plan(ins.public_plan_json)
        except PlanRefused as refused:
            self._record_refusal(refused)
            raise       # out of the connection: closing the stream tells the coordinator
        except (DatasetMismatch, InitialModelMismatch) as exc:
            self.audit.append("refused_to_continue", reason=str(exc))
            raise
        if not ins.run_id or len(ins.run_id) > MAX_RUN_ID:
            # Every signature is bound to the run: without one, a replay from an earlier run of
            # this federation could not be told apart.
            raise ProtocolError(f"the coordinator told {'no' if not ins.run_id else 'an over-long'}"
                                " run id on joining; it must run Trellis speaking protocol "
                                f"{AGENT_VERSION} or later")
        if session.run_id and ins.run_id != session.run_id:
            raise ProtocolError("the coordinator started this federation afresh meanwhile; "
                                "restart this silo to join the new run")
        session.run_id = ins.run_id
        self.federation = plan.federation
        policy = session.policy
        self.audit.append("joined", coordinator=self.target, federation=plan.federation,
                          algorithm=plan.algorithm, rounds=plan.rounds,
                          plan_sha256=plan.sha256(),
                          # The public plan's exact wire text (nothing secret): a reviewer
                          # reads what was accepted and checks it against plan_sha256.
                          plan=plan.to_json(),
                          **({"policy_sha256": policy.sha256} if policy else {}),
                          **self._privacy_projection())
        self.log(f"joined federation {plan.federation} ({plan.algorithm}, "
                 f"{plan.rounds} rounds) as {self.identity.name}")
        if first_join:
            if warning := session.report_warning():
                self.log(f"warning: {warning}")
            self._resume_from_disk()

    def _privacy_projection(self) -> dict[str, object]:
        """With differential privacy: this silo's own projected epsilon, said and recorded."""
        budget = self.session.budget
        if budget is None:
            return {}
        projected = budget.projected_epsilon()
        step = budget.step
        self.log(f"privacy: {step.mechanism}, {step.unit} level, q = {step.sampling_rate:.4g}, "
                 f"z = {step.noise_multiplier:g}: this silo's epsilon after the plan's "
                 f"{budget.plan.rounds} rounds is at most {projected:.3g} "
                 f"(delta {budget.privacy.delta:g})")
        limit = budget.limit
        if limit is not None and projected > limit.epsilon:
            last = budget.last_affordable_round(limit.epsilon)
            self.log(f"privacy: the policy's limit epsilon {limit.epsilon:g} allows "
                     f"{last} of them; this silo stops before round {last + 1}")
        if self.session.noise_seeded:
            self.log("privacy: WARNING: this silo's noise and samples come from "
                     f"{INSECURE_SEED_VARIABLE}: reproducible and NOT private")
        return {"privacy": {**step.record(), "projected_epsilon": round(projected, 6),
                            "delta": budget.privacy.delta,
                            "noise_source": ("seeded: not private" if self.session.noise_seeded
                                             else "operating system")}}

    def _record_refusal(self, refused: PlanRefused) -> None:
        """One log line per broken clause and a `refused_plan` audit record; nothing is sent."""
        plan = refused.plan
        for violation in refused.violations:
            self.log(violation.line())
        self.audit.append("refused_plan", coordinator=self.target, federation=plan.federation,
                          algorithm=plan.algorithm, plan_sha256=plan.sha256(),
                          policy=refused.policy.source, policy_sha256=refused.policy.sha256,
                          violations=[v.record() for v in refused.violations])

    def _save_final_model(self) -> None:
        session, trainer = self.session, self.session.trainer
        if trainer is not None and session.plan is not None:
            plan = session.plan
            last = max(session.reported, default=session.round)
            label = model_metadata(federation=plan.federation, run_id=session.run_id,
                                   plan_json=plan.to_json(), algorithm=plan.algorithm,
                                   round_no=last, silo=self.identity.name,
                                   metrics=session.own_metrics or session.last_metrics,
                                   recipe=trainer.model_recipe())
            path, moved = save_final_model(self.state_dir, trainer.final_snapshot(), label)
            if moved is not None:
                self.log(f"kept the final model of another run as {moved}")
            self.audit.append("saved_model", path=str(path), round=last,
                              **({"moved_aside": str(moved)} if moved else {}))
        # Finished: what stays on disk is the state after the last round, from which this silo
        # goes on only if the coordinator operator extends this same run with more rounds.
        final = self.session.final_state()
        if final is None:
            (self.state_dir / RESUME_FILE).unlink(missing_ok=True)
        else:
            self._write_resume(final)

    # -- the silo's own disk ------------------------------------------------------------------
    def _save_resume_state(self) -> None:
        """Keep the pre-round model, optimiser, random streams and round counter on disk."""
        self._write_resume(self.session.resume_state())

    def _write_resume(self, state: dict) -> None:
        blob = snapshot_to_bytes(state)
        path = self.state_dir / RESUME_FILE
        try:
            write_atomic(path, lambda handle: handle.write(blob))
        except OSError as exc:
            raise ValueError(f"cannot keep this silo's state in {path}: {exc.strerror}; free "
                             "the disk or pass another --state-dir") from None
        # And sign the audit log's head: what the last round sent cannot be cut away unseen.
        self.audit.checkpoint()

    def _resume_from_disk(self) -> None:
        """After a restart, continue from the state an earlier process saved for this plan."""
        path = self.state_dir / RESUME_FILE
        if not path.exists():
            return
        try:
            saved = snapshot_from_bytes(path.read_bytes())
        except Exception as exc:  # torch.load raises several types for a damaged file
            raise ValueError(f"{path} cannot be read ({type(exc).__name__}: {exc}); move it "
                             "away to start this silo afresh") from None
        if saved.get("federation") != self.federation or (
                saved.get("run_id") != self.session.run_id):
            # Another federation, or a run the coordinator has since started afresh.
            self.log(f"{path} is from another run (federation {saved.get('federation')!r}); "
                     "starting afresh")
            path.unlink()
            return
        try:
            self.session.resume(saved)
        except ProtocolError as exc:
            raise ValueError(f"{path}: {exc}; move it away to start this silo afresh") from None
        extended = bool(saved.get("finished"))
        self.audit.append("resumed", round=self.session.round, attempt=self.session.attempt,
                          **({"extended": True} if extended else {}))
        self.log(f"resumed from {path}: " + (
            f"the state after round {self.session.round} (the federation was extended)"
            if extended else f"state from before round {self.session.round}"))


def _read_stream(stream: Iterator, inbox: queue.Queue) -> None:
    try:
        for message in stream:
            inbox.put(codec.instruction_from_pb(message))
        inbox.put(None)
    except grpc.RpcError as exc:
        inbox.put(exc)


def _latest(inbox: queue.Queue) -> Instruction:
    """Next instruction to act on: a JOIN first, else the newest (older ones are superseded).

    The stream's end (None, or its error) is raised only once the instructions queued before it
    are used up: a coordinator that ends the federation sends FINISHED and then closes.
    """
    items = [inbox.get()]
    while True:
        try:
            items.append(inbox.get_nowait())
        except queue.Empty:
            break
    instructions = [i for i in items if isinstance(i, Instruction)]
    ends = [i for i in items if not isinstance(i, Instruction)]     # None or the stream's error
    if not instructions:
        raise ends[0] if isinstance(ends[0], grpc.RpcError) else _StreamClosed()
    joins = [i for i in instructions if i.envelope.phase is Phase.JOIN]
    rest = [i for i in instructions if i.envelope.phase is not Phase.JOIN]
    if joins and rest:
        # Put the newest non-join back for the next call.
        inbox.put(rest[-1])
    if ends:
        inbox.put(ends[0])          # after what came before it
    return joins[0] if joins else rest[-1]


class _StreamClosed(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "control stream closed by the coordinator"

