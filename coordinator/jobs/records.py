"""What a job is: its states, the transitions between them, and the records the job table holds
(a job, a silo's answer to its offer, an event of its history).

Shared by the store (coordinator/jobs/store.py), which keeps them and refuses a transition not
in ``ALLOWED``, and the scheduler (coordinator/jobs/scheduler.py), which decides the next ones;
both re-export what their callers need, so neither imports the other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from trellis.protos.jobs import (
    STATES,
    TERMINAL,
    JobEventView,
    JobView,
    SiloAnswerView,
)
from trellis.protos.plan import PlanError, PublicPlan
from trellis.protos.status import FederationStatus

__all__ = ["ALLOWED", "STATES", "TERMINAL", "Answer", "Job", "JobEvent", "job_view"]

# submitted: stored, not yet offered; awaiting_approval: offered to its silos, waiting for their
# answers; queued: approved by enough silos, waiting for them to be free; running: its rounds
# are served. Any job not yet ended may fail or be stopped by an operator.
ALLOWED: dict[str, frozenset[str]] = {
    "submitted": frozenset({"awaiting_approval", "failed", "stopped"}),
    "awaiting_approval": frozenset({"queued", "failed", "stopped"}),
    "queued": frozenset({"running", "failed", "stopped"}),
    "running": frozenset({"completed", "failed", "stopped"}),
    **{state: frozenset() for state in sorted(TERMINAL)},
}


@dataclass(frozen=True)
class Answer:
    """A silo's answer to a job's offer: approved or refused (with its reason), and when."""

    silo: str
    approved: bool
    reason: str
    at: float


@dataclass(frozen=True)
class JobEvent:
    """One step of a job's history: the state it entered, when and why."""

    job_id: int
    at: float
    state: str
    reason: str


@dataclass(frozen=True)
class Job:
    """One submitted job as the job table holds it: its plan, its signed submission, its
    state."""

    id: int
    federation: str
    algorithm: str
    dataset: str
    operator: str               # the submitting operator certificate's subject
    submitted_at: float
    state: str
    reason: str                 # why it entered its state (the last event's reason)
    updated_at: float
    silos: tuple[str, ...]      # the plan's silos, in its order
    min_silos: int
    plan_toml: bytes            # the plan file as submitted (its hash is signed)
    public_plan_json: str       # what every silo is offered
    submission_json: str        # the signed statement (protos/submission.py)
    submission_sha256: str
    signature: bytes
    operator_certificate_pem: bytes
    started_at: float | None
    ended_at: float | None

    @property
    def terminal(self) -> bool:
        """Whether the job has ended (completed, failed or stopped)."""
        return self.state in TERMINAL


def job_view(job: Job, answers: Mapping[str, Answer], events: Iterable[JobEvent],
             status: FederationStatus | None) -> JobView:
    """A job as an operator sees it (ShowJob, `coordinator status`): its record, each named
    silo's answer ("" for none yet), its history and its federation's status."""
    try:
        rounds = PublicPlan.from_json(job.public_plan_json).rounds
    except (PlanError, ValueError):
        rounds = 0
    return JobView(
        job_id=job.id, federation=job.federation, algorithm=job.algorithm,
        dataset=job.dataset, operator=job.operator, state=job.state, reason=job.reason,
        submitted_at=job.submitted_at, updated_at=job.updated_at, silos=job.silos,
        min_silos=job.min_silos, rounds=rounds,
        public_sha256=hashlib.sha256(job.public_plan_json.encode()).hexdigest(),
        answers=tuple(SiloAnswerView(s, "approved" if a.approved else "refused", a.reason, a.at)
                      if a is not None else SiloAnswerView(s, "")
                      for s in job.silos for a in [answers.get(s)]),
        events=tuple(JobEventView(e.at, e.state, e.reason) for e in events),
        status=status)
