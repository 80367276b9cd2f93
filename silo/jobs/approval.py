"""Deciding a job offer: approve it, refuse it, or hold it for the silo's operator.

An offer is what the coordinator sends a standing silo: a public plan, the statement its
operator signed (protos/submission.py) with the signature, and the operator's certificate. The
coordinator is not trusted to have checked any of it: the silo checks that the plan is the one
signed, by an operator of its own federation CA that is not revoked, that the statement has not
already been used for another job, that the dataset it names is served here (and, when the plan
requires a reference-set fingerprint, that the dataset's manifest records it), and then its own
policy. Every check that fails ends in a "refuse" Decision whose reason names it; nothing here
raises on bad input or uses the network, and the one file read is that manifest. The [privacy]
budget over the silo's own graphs is not checked here: the session checks it when the approved
job starts, as ``silo join`` does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from trellis.crypto.certificates import explain_certificate, verify_certificate
from trellis.crypto.errors import CryptoError, VerificationFailed
from trellis.crypto.pki import is_operator_certificate
from trellis.protos.fields import shown
from trellis.protos.plan import PublicPlan
from trellis.protos.submission import Submission, SubmissionInvalid, verify_submission
from trellis.silo.data.molecules.dataset_check import dataset_fingerprint, reference_problem
from trellis.silo.privacy.policy import Policy, check_plan

APPROVE = "approve"
REFUSE = "refuse"
HOLD = "hold"
VERDICTS = (APPROVE, REFUSE, HOLD)
# A hash in a reason: enough to tell two apart at a glance, short enough for one line.
_SHORT_HASH = 12
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Offer:
    """A job as the coordinator offers it to this silo."""

    job_id: int
    federation: str
    public_plan_json: str
    submission_json: str
    signature: bytes
    operator_certificate_pem: bytes


@dataclass(frozen=True)
class Decision:
    """What this silo answers an offer, and why.

    `plan` is set once the public plan parsed; `submission` once the operator's signature over
    it verified, so a statement that does not verify never counts as seen (a forged copy of a
    genuine statement cannot make the genuine job look like a replay).
    """

    verdict: str              # "approve" | "refuse" | "hold"
    reason: str               # one line an operator can act on
    plan: PublicPlan | None = None
    submission: Submission | None = None


def evaluate_offer(offer: Offer, *, policy: Policy | None, ca_pem: bytes,
                   datasets: Mapping[str, Path],
                   revoked: Callable[[bytes], bool] | None = None,
                   seen: Callable[[str], int | None] = lambda sha: None,
                   now: datetime | None = None,
                   init_models: Mapping[str, Path] | None = None) -> Decision:
    """Decide an offer: the statement, the plan, the operator and the policy, in that order.

    `init_models` maps the SHA-256 of each public initial model this silo holds to its file: a
    plan naming another ([model] init_sha256) is refused.

    `revoked(certificate_pem)` says whether the federation's CRL revokes the operator's
    certificate; `seen(submission_sha256)` names the job a statement was already offered as
    (None: never). `now` checks the certificate's validity (default: the clock).
    """
    policy = policy if policy is not None else Policy()
    try:
        submission = Submission.from_json(offer.submission_json)
    except (SubmissionInvalid, RecursionError) as exc:
        return _refuse(f"the operator's statement does not parse: {_line(exc)}")
    plan, problem = _parse_plan(offer.public_plan_json)
    if plan is None:
        return _refuse(f"the public plan does not parse: {problem}")
    offered = plan.sha256()
    if offered != submission.public_sha256:
        return _refuse("the plan offered is not the plan the operator signed (its SHA-256 is "
                       f"{_short(offered)}, the statement names "
                       f"{_short(submission.public_sha256)})", plan)
    problem = _operator_problem(offer.operator_certificate_pem, submission.operator, ca_pem,
                                revoked, now)
    if problem:
        return _refuse(problem, plan)
    try:
        verify_submission(offer.operator_certificate_pem, submission, offer.signature)
    except VerificationFailed:
        return _refuse(f"the signature of operator {submission.operator!r} does not verify "
                       "over the statement offered", plan)
    jobs = policy.jobs
    if jobs.operators is not None and submission.operator not in jobs.operators:
        return _refuse(f"{policy.source} does not take jobs from operator "
                       f"{submission.operator!r} (jobs.operators: {', '.join(jobs.operators)})",
                       plan, submission)
    first = seen(submission.sha256)
    if first is not None and first != offer.job_id:
        return _refuse(f"the signed submission of job {first}, offered again as job "
                       f"{offer.job_id}", plan, submission)
    if jobs.plan_hashes is not None and offered not in jobs.plan_hashes:
        return _refuse(f"{policy.source} does not list this plan (SHA-256 {offered}) in "
                       "jobs.plan_hashes", plan, submission)
    problem = _dataset_problem(plan, datasets) or _initial_problem(plan, init_models or {})
    if problem:
        return _refuse(problem, plan, submission)
    broken = check_plan(policy, plan)
    if broken:
        return _refuse(f"{policy.source} refuses the plan: "
                       + "; ".join(f"{v.clause} allows {v.limit}, the plan asks {v.value}"
                                   for v in broken), plan, submission)
    if jobs.approve == "auto":
        return Decision(APPROVE, f'{policy.source} approves it (jobs.approve = "auto")', plan,
                        submission)
    return Decision(HOLD, f"awaiting `silo jobs approve {offer.job_id}`", plan, submission)


def _refuse(reason: str, plan: PublicPlan | None = None,
            submission: Submission | None = None) -> Decision:
    return Decision(REFUSE, reason, plan, submission)


def _parse_plan(text: str) -> tuple[PublicPlan | None, str]:
    """The plan, or None and why not (every problem the parser found, on one line)."""
    try:
        return PublicPlan.from_json(text), ""
    except RecursionError:
        return None, "it is nested too deeply"
    except ValueError as exc:          # PlanError, with every problem it found
        problems = getattr(exc, "problems", None)
        return None, "; ".join(_line(p) for p in problems) if problems else _line(exc)
    except (TypeError, KeyError, AttributeError) as exc:   # a shape the parser did not expect
        return None, f"it is not a public plan ({type(exc).__name__})"


def _operator_problem(cert_pem: bytes, operator: str, ca_pem: bytes,
                      revoked: Callable[[bytes], bool] | None, now: datetime | None) -> str:
    """Why the certificate cannot vouch for `operator`'s statement ("" if it can)."""
    try:
        subject = verify_certificate(cert_pem, ca_pem, now=now)
    except CryptoError:
        why = _explain(cert_pem, ca_pem, now) or "it is not valid for this federation"
        return f"the certificate offered for operator {shown(operator)}: {why}"
    if not is_operator_certificate(cert_pem):
        return (f"the certificate offered for operator {shown(operator)} is that of "
                f"{subject!r}, not an operator certificate (`coordinator pki operator` issues "
                "those)")
    if subject != operator:
        return (f"the statement names operator {shown(operator)} but comes with the "
                f"certificate of {subject!r}")
    if revoked is not None and revoked(cert_pem):
        return f"the certificate of operator {subject!r} is revoked by the federation's CRL"
    return ""


def _explain(cert_pem: bytes, ca_pem: bytes, now: datetime | None) -> str:
    if cert_pem.strip() == ca_pem.strip():
        return "it is the federation CA's own certificate, not an operator's"
    try:
        return explain_certificate(cert_pem, ca_pem, what="it", now=now)
    except (CryptoError, ValueError, TypeError):
        return ""


def _dataset_problem(plan: PublicPlan, datasets: Mapping[str, Path]) -> str:
    served = f"it serves: {', '.join(sorted(datasets))}" if datasets else "it serves none"
    if not plan.dataset:
        return (f"the plan names no dataset (federation.dataset); a standing silo trains only "
                f"on a dataset it serves ({served})")
    if plan.dataset not in datasets:
        return f"this silo holds no dataset named {shown(plan.dataset)} ({served})"
    folder = datasets[plan.dataset]
    return reference_problem(plan.reference_sha256, dataset_fingerprint(folder),
                             f"dataset {plan.dataset!r} ({folder})")


def _initial_problem(plan: PublicPlan, init_models: Mapping[str, Path]) -> str:
    """Why this silo cannot start the plan's public initial model ("" when it can)."""
    wanted = plan.model.init_sha256
    if not wanted or wanted in init_models:
        return ""
    return (f"the plan starts from the initial model {wanted} ([model] init_sha256), and this "
            f"silo holds none with that SHA-256 ({len(init_models)} in its --init-models "
            "folder)")


def _short(digest: str) -> str:
    """A SHA-256 cut to a prefix; anything else as an error message repeats it."""
    return digest[:_SHORT_HASH] + "…" if _SHA256.fullmatch(digest) else shown(digest)


def _line(error: object) -> str:
    """An error's text on one line."""
    return " ".join(str(error).split())
