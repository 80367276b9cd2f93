"""Which jobs move next, decided from the jobs and their silos' answers alone: pure, no I/O, no
clock of its own (the host passes `now` and applies the transitions through the store).

A submitted job is offered to its silos. Once every silo has answered, or the approval deadline
has passed, it is queued if at least `min_silos` approved, and fails otherwise; the reason names
who approved, who refused (and why) and who stayed silent. Queued jobs start in id order while
fewer than `max_concurrent` run, each only when none of its participants (the silos that
approved it) takes part in a running job: a silo serves one job at a time. A job that waits for
busy silos does not hold back a later one whose silos are free. Running and ended jobs are the
host's: it alone knows when their rounds end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trellis.coordinator.jobs.records import ALLOWED, Answer, Job

__all__ = ["ALLOWED", "Transition", "participants", "plan_transitions"]

MAX_REASON = 200      # characters of a silo's refusal reason a job's reason repeats


@dataclass(frozen=True)
class Transition:
    """Move job `job_id` to state `to`, for `reason`."""

    job_id: int
    to: str
    reason: str = ""


def participants(job: Job, answers: Mapping[str, Answer]) -> tuple[str, ...]:
    """The silos that approved `job`, in its plan's silo order."""
    return tuple(silo for silo in job.silos if silo in answers and answers[silo].approved)


def plan_transitions(jobs: Sequence[Job], answers: Mapping[int, Mapping[str, Answer]],
                     now: float, *, max_concurrent: int,
                     approval_deadline_s: float) -> list[Transition]:
    """The transitions due at `now`, in job id order, at most one per job (a job queued by
    this call starts at a later one). `answers` maps a job id to its silos' answers; a running
    job given none is taken to occupy all of its silos."""
    ordered = sorted(jobs, key=lambda job: job.id)
    running = [job for job in ordered if job.state == "running"]
    busy = {silo for job in running for silo in _occupied(job, answers.get(job.id, {}))}
    started = len(running)
    due: list[Transition] = []
    for job in ordered:
        said = answers.get(job.id, {})
        if job.state == "submitted":
            due.append(Transition(job.id, "awaiting_approval",
                                  f"offered to {_count(len(job.silos), 'silo')}"))
        elif job.state == "awaiting_approval":
            decided = _decide(job, said, now, approval_deadline_s)
            if decided is not None:
                due.append(decided)
        elif job.state == "queued" and started < max_concurrent:
            joining = participants(job, said)
            if joining and busy.isdisjoint(joining):
                due.append(Transition(job.id, "running", f"running with {', '.join(joining)}"))
                busy.update(joining)
                started += 1
    return due


def _occupied(job: Job, said: Mapping[str, Answer]) -> tuple[str, ...]:
    """The silos a running job takes: its participants, or all its silos if no answers came
    with it (never start a job on a silo that might be busy)."""
    return participants(job, said) if said else job.silos


def _decide(job: Job, said: Mapping[str, Answer], now: float,
            deadline_s: float) -> Transition | None:
    """Queue or fail a job awaiting approval, once every silo answered or the deadline passed,
    or fail it as soon as its refusals leave too few silos to reach min_silos (None: keep
    waiting)."""
    silent = [silo for silo in job.silos if silo not in said]
    approvers = participants(job, said)
    hopeless = len(approvers) + len(silent) < job.min_silos
    if silent and not hopeless and now < job.submitted_at + deadline_s:
        return None
    refusals = [f"{silo} ({_reason(said[silo].reason)})" for silo in job.silos
                if silo in said and not said[silo].approved]
    parts = [f"approved by {', '.join(approvers) or 'no silo'}"]
    if refusals:
        parts.append(f"refused by {', '.join(refusals)}")
    if silent and not hopeless:
        parts.append(f"no answer from {', '.join(silent)} within {deadline_s:g} s")
    reason = "; ".join(parts)
    if len(approvers) >= job.min_silos:
        return Transition(job.id, "queued", reason)
    return Transition(job.id, "failed", f"{reason}: fewer than min_silos={job.min_silos}")


def _reason(text: str) -> str:
    """A silo's refusal reason as a job's one-line reason repeats it."""
    flat = " ".join(text.split())
    if not flat:
        return "no reason given"
    return flat if len(flat) <= MAX_REASON else flat[:MAX_REASON - 1] + "…"


def _count(n: int, noun: str) -> str:
    """'1 silo', '3 silos'."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
