"""The scheduler's rules on hand-made jobs: offering, approval (all answers in, or the deadline),
FIFO starts under max_concurrent, one job per silo at a time, and nothing for running or ended
jobs."""

from __future__ import annotations

from dataclasses import replace

from trellis.coordinator.jobs import records
from trellis.coordinator.jobs.scheduler import (
    ALLOWED,
    Transition,
    participants,
    plan_transitions,
)
from trellis.coordinator.jobs.store import Answer, Job

DEADLINE = 100.0


def _job(job_id: int, state: str, silos: tuple[str, ...] = ("a", "b", "c"),
         min_silos: int = 2, submitted_at: float = 0.0) -> Job:
    return Job(id=job_id, federation=f"f{job_id}", algorithm="fedavg", dataset="d",
               operator="alice", submitted_at=submitted_at, state=state, reason="",
               updated_at=submitted_at, silos=silos, min_silos=min_silos, plan_toml=b"",
               public_plan_json="{}", submission_json="{}", submission_sha256=f"{job_id}",
               signature=b"", operator_certificate_pem=b"", started_at=None, ended_at=None)


def _answers(*approved: str, refused: dict[str, str] | None = None) -> dict[str, Answer]:
    said = {silo: Answer(silo, True, "", 1.0) for silo in approved}
    said.update({silo: Answer(silo, False, why, 1.0) for silo, why in (refused or {}).items()})
    return said


def _plan(jobs: list[Job], answers: dict[int, dict[str, Answer]] | None = None,
          now: float = 10.0, max_concurrent: int = 1) -> list[Transition]:
    return plan_transitions(jobs, answers or {}, now, max_concurrent=max_concurrent,
                            approval_deadline_s=DEADLINE)


def test_allowed_is_the_records_table() -> None:
    assert ALLOWED is records.ALLOWED
    assert ALLOWED["submitted"] == {"awaiting_approval", "failed", "stopped"}
    assert ALLOWED["running"] == {"completed", "failed", "stopped"}
    assert all(not ALLOWED[state] for state in records.TERMINAL)


def test_participants_are_the_approvers_in_plan_order() -> None:
    job = _job(1, "queued", silos=("c", "a", "b"))
    said = _answers("b", "c", refused={"a": "no"})
    assert participants(job, said) == ("c", "b")
    assert participants(job, {}) == ()


def test_a_submitted_job_is_offered_to_its_silos() -> None:
    assert _plan([_job(1, "submitted"), _job(2, "submitted", silos=("a",), min_silos=1)]) == [
        Transition(1, "awaiting_approval", "offered to 3 silos"),
        Transition(2, "awaiting_approval", "offered to 1 silo")]


def test_an_offer_waits_for_every_answer_before_the_deadline() -> None:
    job = _job(1, "awaiting_approval")
    assert _plan([job], {1: _answers("a", "b")}) == []
    assert _plan([job], {}, now=DEADLINE - 0.001) == []


def test_every_answer_in_with_enough_approvals_queues_the_job() -> None:
    job = _job(1, "awaiting_approval")
    assert _plan([job], {1: _answers("a", "b", "c")}) == [
        Transition(1, "queued", "approved by a, b, c")]
    assert _plan([job], {1: _answers("c", "a", refused={"b": "policy: no fedavg"})}) == [
        Transition(1, "queued", "approved by a, c; refused by b (policy: no fedavg)")]


def test_every_answer_in_with_too_few_approvals_fails_the_job() -> None:
    job = _job(1, "awaiting_approval")
    assert _plan([job], {1: _answers("a", refused={"b": "busy", "c": ""})}) == [
        Transition(1, "failed", "approved by a; refused by b (busy), c (no reason given): "
                                "fewer than min_silos=2")]
    assert _plan([job], {1: _answers(refused={"a": "x", "b": "y", "c": "z"})}) == [
        Transition(1, "failed", "approved by no silo; refused by a (x), b (y), c (z): "
                                "fewer than min_silos=2")]


def test_refusals_that_leave_too_few_silos_fail_the_job_at_once() -> None:
    """No need to wait for the last answers, or the deadline, when they cannot save the job."""
    job = _job(1, "awaiting_approval", min_silos=3)
    assert _plan([job], {1: _answers("a", refused={"b": "policy"})}) == [
        Transition(1, "failed", "approved by a; refused by b (policy): fewer than "
                                "min_silos=3")]
    assert _plan([job], {1: _answers("a", "b")}) == []


def test_at_the_deadline_the_silent_are_left_out() -> None:
    job = _job(1, "awaiting_approval", submitted_at=5.0)
    assert _plan([job], {1: _answers("a", "c")}, now=5.0 + DEADLINE) == [
        Transition(1, "queued", "approved by a, c; no answer from b within 100 s")]
    assert _plan([job], {1: _answers("a", refused={"c": "too big"})}, now=500.0) == [
        Transition(1, "failed", "approved by a; refused by c (too big); no answer from b "
                                "within 100 s: fewer than min_silos=2")]
    assert _plan([job], {}, now=500.0) == [
        Transition(1, "failed", "approved by no silo; no answer from a, b, c within 100 s: "
                                "fewer than min_silos=2")]


def test_a_refusal_reason_is_repeated_on_one_short_line() -> None:
    job = _job(1, "awaiting_approval", silos=("a", "b"), min_silos=1)
    [queued] = _plan([job], {1: _answers("a", refused={"b": "line one\nline two  " + "x" * 500})})
    assert queued.reason.startswith("approved by a; refused by b (line one line two xxx")
    assert "\n" not in queued.reason and queued.reason.endswith("…)")
    assert len(queued.reason) < 250


def test_queued_jobs_start_in_id_order_up_to_max_concurrent() -> None:
    jobs = [_job(3, "queued", silos=("e", "f")), _job(1, "queued", silos=("a", "b")),
            _job(2, "queued", silos=("c", "d"))]
    said = {1: _answers("a", "b"), 2: _answers("c", "d"), 3: _answers("e", "f")}
    assert _plan(jobs, said) == [Transition(1, "running", "running with a, b")]
    assert _plan(jobs, said, max_concurrent=2) == [
        Transition(1, "running", "running with a, b"),
        Transition(2, "running", "running with c, d")]


def test_running_jobs_count_towards_max_concurrent() -> None:
    jobs = [_job(1, "running", silos=("a", "b")), _job(2, "queued", silos=("c", "d"))]
    said = {1: _answers("a", "b"), 2: _answers("c", "d")}
    assert _plan(jobs, said, max_concurrent=1) == []
    assert _plan(jobs, said, max_concurrent=2) == [
        Transition(2, "running", "running with c, d")]


def test_a_silo_takes_part_in_one_job_at_a_time() -> None:
    jobs = [_job(1, "queued", silos=("a", "b")), _job(2, "queued", silos=("b", "c"))]
    said = {1: _answers("a", "b"), 2: _answers("b", "c")}
    assert _plan(jobs, said, max_concurrent=2) == [
        Transition(1, "running", "running with a, b")]
    running = [replace(jobs[0], state="running"), jobs[1]]
    assert _plan(running, said, max_concurrent=2) == []
    ended = [replace(jobs[0], state="completed"), jobs[1]]
    assert _plan(ended, said, max_concurrent=2) == [
        Transition(2, "running", "running with b, c")]


def test_only_participants_are_busy() -> None:
    # Job 1 runs without b (b refused it), so job 2 may have b meanwhile.
    jobs = [_job(1, "running"), _job(2, "queued", silos=("b", "d"))]
    said = {1: _answers("a", "c", refused={"b": "no"}), 2: _answers("b", "d")}
    assert _plan(jobs, said, max_concurrent=2) == [
        Transition(2, "running", "running with b, d")]
    # A running job whose answers the host did not pass occupies all of its silos.
    assert _plan(jobs, {2: said[2]}, max_concurrent=2) == []


def test_a_blocked_job_does_not_block_later_ones_on_free_silos() -> None:
    jobs = [_job(1, "running", silos=("a", "b")), _job(2, "queued", silos=("b", "c")),
            _job(3, "queued", silos=("d", "e")), _job(4, "queued", silos=("c", "f"))]
    said = {1: _answers("a", "b"), 2: _answers("b", "c"), 3: _answers("d", "e"),
            4: _answers("c", "f")}
    assert _plan(jobs, said, max_concurrent=4) == [
        Transition(3, "running", "running with d, e"),
        Transition(4, "running", "running with c, f")]
    assert _plan(jobs, said, max_concurrent=2) == [
        Transition(3, "running", "running with d, e")]


def test_one_step_per_job_per_call() -> None:
    jobs = [_job(1, "awaiting_approval", silos=("a", "b"))]
    assert _plan(jobs, {1: _answers("a", "b")}, max_concurrent=2) == [
        Transition(1, "queued", "approved by a, b")]


def test_nothing_for_running_or_ended_jobs() -> None:
    said = {1: _answers("a", "b")}
    for state in ("running", "completed", "failed", "stopped"):
        assert _plan([_job(1, state)], said, now=1e9, max_concurrent=64) == []


def test_every_state_is_handled_in_one_call() -> None:
    jobs = [_job(1, "submitted"), _job(2, "awaiting_approval", silos=("x", "y")),
            _job(3, "queued", silos=("a", "b")), _job(4, "running", silos=("c", "d")),
            _job(5, "failed")]
    said = {2: _answers("x", "y"), 3: _answers("a", "b"), 4: _answers("c", "d")}
    assert _plan(jobs, said, max_concurrent=2) == [
        Transition(1, "awaiting_approval", "offered to 3 silos"),
        Transition(2, "queued", "approved by x, y"),
        Transition(3, "running", "running with a, b")]
