"""`local` aggregates nothing, so its rounds run no secure aggregation: silos train and their
metrics report for the round is their answer (coordinator/rounds/stages/training.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trellis.coordinator.rounds.errors import Duplicate, NotParticipant, OutOfPhase
from trellis.coordinator.rounds.machine import RoundMachine, Stage
from trellis.coordinator.rounds.strategies import make_strategy
from trellis.protos.messages import Envelope, KeyAdvertisement, MetricsReport, Phase
from trellis.protos.plan import parse_plan

SILOS = ["a", "b", "c"]


def _machine(rounds: int = 2, max_attempts: int = 3, min_silos: int = 3) -> RoundMachine:
    plan = parse_plan({
        "federation": {"id": "f", "algorithm": "local", "rounds": rounds, "silos": SILOS,
                       "min_silos": min_silos},
        "timeouts": {"join_s": 10, "round_s": 5, "stage_s": 4, "report_s": 3,
                     "max_attempts": max_attempts},
    }, base_dir=Path("."))
    machine = RoundMachine(plan, make_strategy("local"), now=0.0)
    for silo in SILOS:
        machine.join(silo, b"", 0.0)
    return machine


def _report(machine: RoundMachine, silo: str, acc: float, now: float = 1.0) -> list:
    """The report that answers the attempt in progress (silo: SiloSession.trained_report)."""
    env = Envelope("f", machine.round, machine.attempt, Phase.REPORT)
    return machine.report(silo, MetricsReport(env, {"test_acc": acc}), now)


def test_a_local_round_asks_silos_to_train_and_holds_no_secure_aggregation() -> None:
    machine = _machine()
    assert machine.stage is Stage.TRAIN and machine.secagg is None
    ins = machine.instruction("a")
    assert ins.envelope.phase is Phase.ROUND_OPEN and ins.participants == tuple(SILOS)
    assert machine.waiting_for() == set(SILOS)
    assert machine.state_for("a", ins.envelope) is None       # nothing is shared
    advert = KeyAdvertisement(Envelope("f", 1, 1, Phase.ADVERTISE_KEY), b"k" * 32, b"m" * 32,
                              b"s", 0)
    with pytest.raises(OutOfPhase):
        machine.advertise("a", advert, 1.0)
    with pytest.raises(OutOfPhase):
        machine.key_bundle("a", Envelope("f", 1, 1, Phase.KEYS_READY))


def test_the_round_completes_once_every_silo_reported_and_the_last_round_ends_it() -> None:
    machine = _machine(rounds=2)
    _report(machine, "a", 0.5)
    assert machine.instruction("a").envelope.phase is Phase.WAITING     # done for this round
    with pytest.raises(Duplicate):
        _report(machine, "a", 0.5)
    _report(machine, "b", 0.6)
    events = _report(machine, "c", 0.7)
    kinds = [e.kind for e in events]
    assert kinds[:2] == ["metrics", "round_completed"] and "round_opened" in kinds
    record = machine.history[0]
    assert record.metrics == {"a": {"test_acc": 0.5}, "b": {"test_acc": 0.6},
                              "c": {"test_acc": 0.7}}
    assert record.total_weight == 0          # the coordinator learns no dataset size at all
    assert (machine.round, machine.stage) == (2, Stage.TRAIN)
    for silo in SILOS:
        _report(machine, silo, 0.8)
    assert machine.stage is Stage.DONE and len(machine.history) == 2
    assert machine.instruction("a").envelope.phase is Phase.FINISHED


def test_a_silo_that_leaves_or_stays_silent_is_dropped_from_the_round() -> None:
    machine = _machine(rounds=3, min_silos=2)
    _report(machine, "a", 0.5)
    machine.leave("b", 2.0)
    _report(machine, "c", 0.7)
    assert machine.history[0].participants == ("a", "c")
    assert machine.history[0].dropped == ("b",)
    assert machine.round == 2 and machine.participants == ("a", "c")
    with pytest.raises(NotParticipant):
        _report(machine, "b", 0.1)                   # gone: it has to attend again
    _report(machine, "a", 0.5, now=3.0)
    events = machine.tick(machine.deadline)          # c never answers round 2
    assert [e.kind for e in events][:2] == ["deadline_passed", "round_completed"]
    assert machine.history[1].participants == ("a",) and machine.history[1].dropped == ("c",)


def test_a_report_of_another_attempt_is_refused_and_a_silo_back_from_a_blip_may_report(
        ) -> None:
    machine = _machine(rounds=2, min_silos=2)
    stale = Envelope("f", 1, 0, Phase.REPORT)          # not bound to the attempt in progress
    with pytest.raises(OutOfPhase, match="answers attempt 0"):
        machine.report("a", MetricsReport(stale, {"test_acc": 0.5}), 1.0)
    machine.leave("b", 1.0)                 # its stream broke mid-round ...
    machine.join("b", b"", 1.5)             # ... and it attended again before the round closed
    _report(machine, "b", 0.6)
    _report(machine, "a", 0.5)
    _report(machine, "c", 0.7)
    assert machine.history[0].participants == ("a", "b", "c") and not machine.history[0].dropped


def test_a_round_nobody_finishes_is_retried_then_fails() -> None:
    machine = _machine(rounds=1, max_attempts=2)
    events = machine.tick(machine.deadline)
    assert "round_aborted" in [e.kind for e in events]
    # Silos that missed the deadline sit out the retry: too few are left, so it waits.
    assert machine.stage is Stage.WAITING
