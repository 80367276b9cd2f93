"""A job submission: what an operator signs when submitting a plan, and how anyone checks it.

The operator's client parses the plan, then signs a statement naming two hashes: of the public
plan (what every silo receives and trains by) and of the whole plan file (what the coordinator
runs, including what only it may know, such as GCFL's split rule). The coordinator checks both
against the file it receives; a silo checks the public one against the plan it is offered, and
the signature against the operator's certificate. A fresh nonce and the time make every
submission unique, so a silo can refuse a signed submission replayed under another job.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import asdict, dataclass

from trellis.crypto.certificates import sign_bytes, verify_bytes

# Domain separation: this signature can never be taken for an advert, a survivor list or a
# log head signed with the same key, nor those for it.
DOMAIN = b"trellis/job-submission/1\x00"


class SubmissionInvalid(ValueError):
    """A statement that does not parse, or whose hashes do not match what it came with."""


@dataclass(frozen=True)
class Submission:
    """The statement an operator signs: which plan, by whom, when."""

    public_sha256: str      # PublicPlan.sha256() of the plan
    plan_sha256: str        # SHA-256 of the plan file's bytes
    operator: str           # the operator certificate's subject
    submitted_at: float     # Unix time, from the operator's clock
    nonce: str              # 32 hex digits

    def to_json(self) -> str:
        """The canonical form, the one that is signed and sent."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    def signed_bytes(self) -> bytes:
        """What the signature covers: the domain, then the canonical form."""
        return DOMAIN + self.to_json().encode()

    @property
    def sha256(self) -> str:
        """Names this submission in audit logs (a replay has the same one)."""
        return hashlib.sha256(self.signed_bytes()).hexdigest()

    @classmethod
    def from_json(cls, text: str) -> Submission:
        """Parse a statement from the wire (SubmissionInvalid if it is not one)."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SubmissionInvalid(f"job statement is not JSON: {exc}") from None
        fields = set(cls.__dataclass_fields__)
        if not isinstance(raw, dict) or set(raw) != fields:
            raise SubmissionInvalid("job statement: expected the fields "
                                    + ", ".join(sorted(fields)))
        texts = ("public_sha256", "plan_sha256", "operator", "nonce")
        if not all(isinstance(raw[k], str) for k in texts) or not isinstance(
                raw["submitted_at"], (int, float)):
            raise SubmissionInvalid("job statement: a field has the wrong type")
        made = cls(**raw)
        if made.to_json() != text:
            raise SubmissionInvalid("job statement is not in canonical form")
        return made


def new_submission(public_sha256: str, plan_bytes: bytes, operator: str,
                   now: float | None = None) -> Submission:
    """A statement for a plan about to be submitted."""
    return Submission(public_sha256=public_sha256,
                      plan_sha256=hashlib.sha256(plan_bytes).hexdigest(), operator=operator,
                      submitted_at=time.time() if now is None else now,
                      nonce=secrets.token_hex(16))


def sign_submission(key_pem: bytes, submission: Submission) -> bytes:
    """The operator's signature over a statement."""
    return sign_bytes(key_pem, submission.signed_bytes())


def verify_submission(certificate_pem: bytes, submission: Submission, signature: bytes) -> None:
    """Check the signature with the operator's certificate (VerificationFailed if it fails).

    The certificate's own checks (the CA, operator usage, revocation, the subject equal to
    `submission.operator`) are the caller's: they depend on whose policy is asked.
    """
    verify_bytes(certificate_pem, submission.signed_bytes(), signature)
