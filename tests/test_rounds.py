"""The coordinator's round machine: phases, refusals of misplaced messages, aborts and retries."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from coordinator.errors import Duplicate, InvalidPayload, NotParticipant, OutOfPhase
from coordinator.plan import parse_plan
from coordinator.rounds import RoundMachine, Stage
from coordinator.strategies import make_strategy
from crypto.fixedpoint import FixedPointSpec
from protos.messages import Envelope, KeyAdvertisement, MetricsReport, Phase

SILOS = ["a", "b", "c"]


def _machine(rounds: int = 2, min_silos: int = 2, max_attempts: int = 3) -> RoundMachine:
    plan = parse_plan({
        "federation": {"id": "f", "algorithm": "fedavg", "rounds": rounds, "silos": SILOS,
                       "min_silos": min_silos},
        "timeouts": {"join_s": 10, "round_s": 5, "report_s": 3, "max_attempts": max_attempts},
    }, base_dir=Path("."))
    return RoundMachine(plan, make_strategy("fedavg"), now=0.0)


def _env(m: RoundMachine, phase: Phase) -> Envelope:
    return Envelope("f", m.round, m.attempt, phase)


def _advertise_all(m: RoundMachine, length: int = 3) -> None:
    for s in m.participants:
        m.advertise(s, KeyAdvertisement(_env(m, Phase.ADVERTISE_KEY), bytes(32), b"sig", length),
                    1.0)


def _inputs(m: RoundMachine, values: dict[str, float], length: int = 3) -> None:
    spec = FixedPointSpec(64.0, 24)
    for s in list(m.participants):
        m.masked_input(s, _env(m, Phase.MASKED_INPUT),
                       spec.encode(np.full(length, values[s]), 10), 2.0)


def test_full_run_aggregates_weighted_mean_and_finishes() -> None:
    m = _machine()
    for s in SILOS:
        m.join(s, b"cert", 0.0)
    assert m.stage is Stage.KEYS and m.participants == tuple(SILOS)
    assert m.instruction("a").envelope.phase is Phase.ROUND_OPEN
    _advertise_all(m)
    assert m.stage is Stage.INPUTS
    assert [k.silo for k in m.key_bundle("a", _env(m, Phase.KEYS_READY)).keys] == SILOS
    _inputs(m, {"a": 1.0, "b": 2.0, "c": 3.0})
    assert m.round == 2 and m.stage is Stage.KEYS
    assert np.allclose(m.global_state, 2.0)
    _advertise_all(m)
    _inputs(m, {"a": 0.0, "b": 0.0, "c": 3.0})
    assert m.stage is Stage.FINISHING
    assert m.instruction("b").envelope.phase is Phase.FINISHED
    for s in SILOS:
        m.report(s, MetricsReport(Envelope("f", 2, 0, Phase.REPORT), {"test_acc": 0.5}), 3.0)
    assert m.stage is Stage.DONE


def test_misplaced_messages_are_refused_without_changing_state() -> None:
    m = _machine()
    for s in SILOS:
        m.join(s, b"cert", 0.0)
    good = KeyAdvertisement(_env(m, Phase.ADVERTISE_KEY), bytes(32), b"sig", 3)
    with pytest.raises(OutOfPhase, match="expected phase ADVERTISE_KEY"):
        m.advertise("a", replace(good, envelope=_env(m, Phase.MASKED_INPUT)), 0.0)
    with pytest.raises(OutOfPhase, match="round 7"):
        m.advertise("a", replace(good, envelope=replace(good.envelope, round=7)), 0.0)
    with pytest.raises(OutOfPhase, match="federation"):
        m.advertise("a", replace(good, envelope=replace(good.envelope, federation="g")), 0.0)
    with pytest.raises(NotParticipant):
        m.advertise("zed", good, 0.0)
    with pytest.raises(InvalidPayload, match="32-byte"):
        m.advertise("a", replace(good, public_key=b"short"), 0.0)
    m.advertise("a", good, 0.0)
    with pytest.raises(Duplicate, match="already received"):
        m.advertise("a", good, 0.0)
    with pytest.raises(InvalidPayload, match="shared vector of 4"):
        m.advertise("b", replace(good, shared_length=4), 0.0)
    with pytest.raises(OutOfPhase):       # masked input before KEYS_READY
        m.masked_input("a", _env(m, Phase.MASKED_INPUT), np.zeros(4, np.uint64), 0.0)
    assert m.stage is Stage.KEYS and set(m.adverts) == {"a"}


def test_wrong_shape_or_dtype_and_replayed_input_refused() -> None:
    m = _machine()
    for s in SILOS:
        m.join(s, b"cert", 0.0)
    _advertise_all(m)
    env = _env(m, Phase.MASKED_INPUT)
    with pytest.raises(InvalidPayload, match="shape"):
        m.masked_input("a", env, np.zeros(9, np.uint64), 1.0)
    with pytest.raises(InvalidPayload, match="uint64"):
        m.masked_input("a", env, np.zeros(4, np.float32), 1.0)
    m.masked_input("a", env, np.zeros(4, np.uint64), 1.0)
    with pytest.raises(Duplicate):
        m.masked_input("a", env, np.zeros(4, np.uint64), 1.0)


def test_silo_leaving_mid_round_aborts_and_retries_with_the_rest() -> None:
    m = _machine()
    for s in SILOS:
        m.join(s, b"cert", 0.0)
    _advertise_all(m)
    events = m.leave("b", 1.5)
    kinds = [e.kind for e in events]
    assert kinds == ["silo_left", "round_aborted", "round_opened"]
    assert "silo b left" in events[1].fields["reason"]
    assert m.round == 1 and m.attempt == 2 and m.participants == ("a", "c")
    _advertise_all(m)
    _inputs(m, {"a": 1.0, "c": 3.0})
    assert m.history[0].attempts == 2 and m.history[0].participants == ("a", "c")
    assert np.allclose(m.global_state, 2.0)


def test_deadline_drops_laggards_and_too_few_silos_fail_after_waiting() -> None:
    m = _machine(min_silos=2)
    for s in SILOS:
        m.join(s, b"cert", 0.0)
    m.advertise("a", KeyAdvertisement(_env(m, Phase.ADVERTISE_KEY), bytes(32), b"s", 3), 1.0)
    events = m.tick(10.0)
    assert events[0].kind == "round_aborted" and "b, c" in events[0].fields["reason"]
    assert m.stage is Stage.WAITING         # only 'a' answered: fewer than min_silos
    events = m.tick(100.0)
    assert m.stage is Stage.KEYS            # all three are still connected: retry with them
    m2 = _machine(min_silos=3)
    m2.join("a", b"cert", 0.0)
    assert m2.tick(11.0)[-1].kind == "federation_failed"
    assert "only 1 of the 3" in m2.failure


def test_attempt_limit_fails_the_federation() -> None:
    m = _machine(max_attempts=1)
    for s in SILOS:
        m.join(s, b"cert", 0.0)
    m.leave("a", 1.0)
    assert m.stage is Stage.FAILED and "failed 1 attempts" in m.failure
    assert m.instruction("b").envelope.phase is Phase.ROUND_ABORTED


def test_unadmitted_silo_and_early_reports_refused() -> None:
    m = _machine()
    with pytest.raises(NotParticipant):
        m.join("mallory", b"cert", 0.0)
    for s in SILOS:
        m.join(s, b"cert", 0.0)
    with pytest.raises(OutOfPhase, match="has not completed"):
        m.report("a", MetricsReport(Envelope("f", 1, 0, Phase.REPORT), {"x": 1.0}), 0.0)
