"""Job offers as a standing silo receives them: a real federation CA, real operator
certificates (`coordinator pki operator`'s), and statements signed with protos/submission.py."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from trellis.crypto.pki import (
    CA_CERT,
    Identity,
    init_ca,
    issue_operator,
    load_identity,
    request_identity,
    sign_request,
)
from trellis.protos.plan import AggregationConfig, ModelConfig, PublicPlan, TrainingConfig
from trellis.protos.submission import Submission, new_submission, sign_submission
from trellis.silo.jobs.approval import Offer

FEDERATION = "demo"
DATASET = "molecules"
# The plan file an operator submits; only its hash is signed, so any bytes do.
PLAN_FILE = b'[federation]\nname = "demo"\n'


@dataclass(frozen=True)
class JobFederation:
    """A federation CA under `root`, which issues operator and silo identities on demand."""

    root: Path

    @classmethod
    def create(cls, root: Path, *, name: str = FEDERATION) -> JobFederation:
        """A fresh CA in root/ca."""
        init_ca(root / "ca", ["localhost"], federation=name)
        return cls(root)

    @property
    def ca_dir(self) -> Path:
        """The CA's folder (ca.key, ca.crt, issued/)."""
        return self.root / "ca"

    @property
    def ca_pem(self) -> bytes:
        """The federation CA certificate, as a silo holds it."""
        return (self.ca_dir / CA_CERT).read_bytes()

    def operator(self, name: str) -> Identity:
        """An operator identity (certificate marked OPERATOR_USAGE)."""
        issue_operator(self.ca_dir, name, self.root / "operators" / name)
        return load_identity(self.root / "operators" / name)

    def silo(self, name: str) -> Identity:
        """A silo identity (no operator usage)."""
        sign_request(request_identity(name, self.root / "silos" / name), self.ca_dir)
        return load_identity(self.root / "silos" / name)


def public_plan(**changes: object) -> PublicPlan:
    """A small valid FedStar plan on DATASET; `changes` replace its fields."""
    plan = PublicPlan(FEDERATION, "fedstar", 10, 1, ModelConfig(), TrainingConfig(),
                      AggregationConfig(threshold=2), dataset=DATASET)
    return replace(plan, **changes)  # type: ignore[arg-type]


def signed_offer(operator: Identity, plan: PublicPlan | None = None, *, job_id: int = 1,
                 submission: Submission | None = None, now: float = 1_800_000_000.0
                 ) -> Offer:
    """An offer of `plan` as job `job_id`, its statement signed by `operator`."""
    plan = plan if plan is not None else public_plan()
    if submission is None:
        submission = new_submission(plan.sha256(), PLAN_FILE, operator.name, now=now)
    return Offer(job_id=job_id, federation=FEDERATION, public_plan_json=plan.to_json(),
                 submission_json=submission.to_json(),
                 signature=sign_submission(operator.key_pem, submission),
                 operator_certificate_pem=operator.cert_pem)
