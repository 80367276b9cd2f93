"""What operators and silos are told of a standing coordinator's jobs (the wire's job messages as
plain values; protos/jobs_codec.py converts them).

A job is a plan an operator submitted and signed; its states run submitted -> awaiting_approval
-> queued -> running -> completed | failed | stopped (coordinator/jobs/scheduler.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from trellis.protos.status import FederationStatus

# The gRPC metadata key that routes a federation call to its job (absent: the one-plan
# coordinator's only federation).
JOB_METADATA_KEY = "trellis-job"
STATES = ("submitted", "awaiting_approval", "queued", "running", "completed", "failed",
          "stopped")
TERMINAL = frozenset({"completed", "failed", "stopped"})


@dataclass(frozen=True)
class SiloAnswerView:
    """One silo's answer to a job, as the coordinator holds it."""

    silo: str
    answer: str           # "approved", "refused", or "" (none yet)
    reason: str = ""
    at: float = 0.0


@dataclass(frozen=True)
class JobEventView:
    """One change of a job's state."""

    at: float
    state: str
    reason: str = ""


@dataclass(frozen=True)
class JobView:
    """A job as an operator sees it (`coordinator jobs list/show`)."""

    job_id: int
    federation: str
    algorithm: str
    dataset: str
    operator: str
    state: str
    reason: str
    submitted_at: float
    updated_at: float
    silos: tuple[str, ...]
    min_silos: int
    rounds: int = 0
    public_sha256: str = ""
    answers: tuple[SiloAnswerView, ...] = ()
    events: tuple[JobEventView, ...] = ()
    status: FederationStatus | None = None

    @property
    def terminal(self) -> bool:
        """Whether the job has ended (completed, failed or stopped)."""
        return self.state in TERMINAL


@dataclass(frozen=True)
class JobOfferView:
    """A job as a silo named by it sees it (the Site service's WatchJobs)."""

    job_id: int
    state: str
    federation: str
    public_plan_json: str
    submission_json: str
    signature: bytes
    operator_certificate_pem: bytes
    participants: tuple[str, ...] = ()
    reason: str = ""
    answer: str = ""      # this silo's answer as the coordinator holds it

    @property
    def terminal(self) -> bool:
        """Whether the job has ended."""
        return self.state in TERMINAL
