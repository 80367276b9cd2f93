"""A silo's own privacy budget and the [privacy] clauses of its policy: refused before anything
is sent, stopped before the round that would exceed the limit (never after it), accounted with
the inputs that actually survived, recorded with public numbers only, kept across a restart."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from trellis.crypto.dp_accountant import PLD_ACCOUNTANT_VERSION
from trellis.crypto.dp_encoding import to_ring
from trellis.crypto.pki import Identity, throwaway_identities
from trellis.crypto.randomness import SeededRandomSource
from trellis.protos.messages import Envelope, Instruction, Phase
from trellis.protos.plan import PublicPlan, parse_plan
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.data.tu import load_tu_folder
from trellis.silo.federation.session import SiloSession
from trellis.silo.privacy.budget import BudgetExhausted, SiloBudget
from trellis.silo.privacy.policy import PlanRefused, Policy, PolicyError, check_plan, parse_policy
from trellis.silo.privacy.private_step import add_noise, poisson_ids, private_step, to_integers
from trellis.silo.training.trainers import make_silo_trainer

SILOS = ["a", "b", "c", "d", "e"]
# What a round record may hold: public parameters and counts, nothing data-dependent.
PUBLIC_FIELDS = {"round", "mechanism", "unit", "clip", "scale", "dimension", "sensitivity",
                 "noise_multiplier", "full_sigma", "share_sigma", "threshold", "colluders",
                 "sampling_rate", "inputs", "honest_shares", "noise_floor_held", "delta",
                 "epsilon", "accountant"}


def _plan(rounds: int = 40, **privacy: object) -> PublicPlan:
    # "rdp" unless named: these tests were written against it (a plan file's recipe is "pld").
    table = {"mechanism": "ddg", "noise_multiplier": 1.0, "batch": 16, "design_graphs": 200,
             "accountant": "rdp", **privacy}
    return parse_plan({"federation": {"id": "f", "algorithm": "fedstar", "rounds": rounds,
                                      "silos": SILOS}, "privacy": table},
                      base_dir=Path(".")).public


def _policy(**clauses: object) -> Policy:
    return parse_policy({"privacy": clauses}, source="policy.toml")


def _budget(plan: PublicPlan, policy: Policy | None, graphs: int = 200) -> SiloBudget:
    return SiloBudget(plan, policy, graphs=graphs, dimension=5000, shared_values=3000)


def test_policy_clauses_are_checked_each_with_its_reason() -> None:
    plan = _plan(clip=2.0, colluders=0)
    policy = _policy(required=True, unit="silo", max_delta=1e-6, min_noise_multiplier=1.5,
                     min_colluders=1, min_threshold=4, max_clip=1.0, max_rounds=10,
                     mechanisms=["local-gaussian"])
    clauses = [v.clause for v in check_plan(policy, plan)]
    assert clauses == ["privacy.mechanisms", "privacy.unit", "privacy.max_delta",
                       "privacy.min_noise_multiplier", "privacy.min_colluders",
                       "privacy.min_threshold", "privacy.max_clip", "privacy.max_rounds"]
    plain = parse_plan({"federation": {"id": "f", "algorithm": "fedstar", "rounds": 2,
                                       "silos": SILOS}}, base_dir=Path(".")).public
    [required] = check_plan(_policy(required=True), plain)
    assert required.line() == ("policy: privacy.required allows plans with differential "
                               "privacy only; the plan asks none")
    assert check_plan(_policy(max_epsilon=4.0), plan) == []


def test_a_bad_privacy_clause_is_named() -> None:
    with pytest.raises(PolicyError) as caught:
        _policy(max_epsilon="lots", mechanisms=["laplace"], on_exhausted="shrug", sparkle=1)
    text = str(caught.value)
    for what in ("privacy.max_epsilon", "privacy.mechanisms", "privacy.on_exhausted",
                 "privacy.sparkle"):
        assert what in text, what


def test_a_plan_whose_run_would_exceed_the_limit_is_refused_on_joining() -> None:
    budget = _budget(_plan(), _policy(max_epsilon=1.0))
    projected = budget.projected_epsilon()
    assert projected > 1.0
    with pytest.raises(PlanRefused) as caught:
        budget.check_plan()
    [violation] = caught.value.violations
    assert violation.clause == "privacy.max_epsilon" and f"{projected:.3g}" in violation.value
    _budget(_plan(), _policy(max_epsilon=projected + 0.01)).check_plan()     # fits: accepted


def test_delta_must_be_below_one_over_the_silos_graphs() -> None:
    with pytest.raises(PlanRefused, match="below 1/200"):
        _budget(_plan(delta=0.01), None).check_plan()


def test_the_silo_stops_before_the_round_that_would_exceed_its_budget() -> None:
    plan = _plan()
    limit = 3.0
    budget = _budget(plan, _policy(max_epsilon=limit, on_exhausted="stop"))
    budget.check_plan()                            # "stop": joins although the run would exceed
    last = budget.last_affordable_round(limit)
    assert 0 < last < plan.rounds
    for round_no in range(1, plan.rounds + 1):
        try:
            budget.check_round(round_no)
        except BudgetExhausted as stop:
            assert round_no == last + 1
            assert stop.epsilon_now <= limit < stop.epsilon_after
            assert "stops before training" in str(stop)
            break
        budget.record_round(round_no, inputs=plan.aggregation.threshold)
    else:
        pytest.fail("the budget never stopped the silo")
    assert budget.epsilon() <= limit


def test_survivors_beyond_the_floor_lower_epsilon_only_without_a_local_slice() -> None:
    plan = _plan(unit="silo")
    floor, many = _budget(plan, None), _budget(plan, None)
    for budget in (floor, many):
        budget.has_local_slice = False
    floor.record_round(1, inputs=plan.aggregation.threshold)
    many.record_round(1, inputs=len(SILOS))
    assert many.epsilon() < floor.epsilon()
    record = _budget(_plan(), None)
    entry = record.record_round(1, inputs=len(SILOS))
    assert entry["honest_shares"] == len(SILOS) and entry["noise_floor_held"] is True
    assert set(entry) <= PUBLIC_FIELDS


def test_the_budget_survives_a_restart() -> None:
    plan = _plan()
    budget = _budget(plan, None)
    for r in (1, 2, 3):
        budget.record_round(r, inputs=4)
    again = _budget(plan, None)
    again.restore(budget.to_json())
    assert again.epsilon() == pytest.approx(budget.epsilon()) and again.rounds == budget.rounds


def test_a_plan_naming_the_tight_accountant_is_accounted_by_it() -> None:
    rdp, pld = _budget(_plan(), None), _budget(_plan(accountant="pld"), None)
    for budget in (rdp, pld):
        for r in (1, 2, 3):
            entry = budget.record_round(r, inputs=4)
    assert pld.ledger.accountant == "pld" and entry["accountant"] == PLD_ACCOUNTANT_VERSION
    assert pld.epsilon() < rdp.epsilon()
    again = _budget(_plan(accountant="pld"), None)
    again.restore(pld.to_json())
    assert again.epsilon() == pld.epsilon()
    # A ledger an older silo saved (no accountant in it) is taken on by the plan's.
    older = _budget(_plan(accountant="pld"), None)
    saved = json.loads(rdp.to_json())
    ledger = json.loads(saved["ledger"])
    del ledger["accountant"]
    older.restore(json.dumps({**saved, "ledger": json.dumps(ledger)}))
    assert older.ledger.accountant == "pld" and len(older.ledger.events) == 3


def test_every_coordinate_is_accounted_at_its_smallest_noise() -> None:
    # Record level, the local slice holds one draw of variance ceil(full_sigma^2); the shared
    # slice's shares, rounded up, can sum to more. The event takes the smaller of the two.
    budget = _budget(_plan(noise_multiplier=0.7), None)
    step = budget.step
    assert budget.floor_shares * step.encoding.local_sigma2 > math.ceil(step.full_sigma ** 2)
    event = budget._event(len(SILOS))
    assert event.honest_shares == budget.floor_shares
    assert event.honest_shares * event.local_sigma2 <= math.ceil(step.full_sigma ** 2)
    assert event.honest_shares * event.local_sigma2 >= step.full_sigma ** 2
    # local-gaussian under "pld": its discrete noise is one share of at least (z Delta2)^2.
    alone = _budget(_plan(mechanism="local-gaussian", accountant="pld"), None)._event(1)
    assert (alone.mechanism, alone.honest_shares) == ("ddg", 1)
    assert alone.local_sigma2 == pytest.approx((1.0 * alone.l2_sensitivity) ** 2, rel=1e-12)


def test_noise_share_sampling_and_ring_encoding() -> None:
    step = private_step(_plan().privacy, threshold=3, dimension=4000, graphs=200)
    assert step.share_sigma == pytest.approx(step.full_sigma / np.sqrt(3))
    source = SeededRandomSource(b"t")
    ids = poisson_ids(20_000, 0.08, source)
    assert abs(ids.size - 1600) < 5 * np.sqrt(20_000 * 0.08 * 0.92)
    assert np.all(np.diff(ids) > 0)
    values = to_integers(np.full(4000, 0.25), step.scale)
    noisy = add_noise(values, step.share_sigma, source)
    assert abs(float((noisy - values).std()) / step.share_sigma - 1) < 0.05
    ring = to_ring(noisy - values, 64)
    assert ring.dtype == np.uint64 and np.array_equal(ring.view(np.int64), noisy - values)
    with pytest.raises(ValueError, match="NaN"):
        to_integers(np.array([np.nan]), step.scale)


@pytest.fixture(scope="module")
def identity(tmp_path_factory: pytest.TempPathFactory) -> Identity:
    return throwaway_identities(["a"], tmp_path_factory.mktemp("budget-id"))["a"]


def test_the_session_checks_its_budget_when_a_round_opens(identity, tmp_path) -> None:
    data = load_tu_folder(write_tu_folder(tmp_path, "MOL", "molecules", 60, seed=1))
    plan = _plan(rounds=30, design_graphs=40)
    session = SiloSession(identity, lambda p: make_silo_trainer(data, p, "a"),
                          policy=_policy(max_epsilon=8.0, on_exhausted="stop"),
                          noise_source=SeededRandomSource(b"s"))
    session.accept_plan(plan.to_json())
    assert session.budget is not None
    round_no = 1
    with pytest.raises(BudgetExhausted):
        while round_no <= plan.rounds:
            session.open_round(Instruction(Envelope("f", round_no, 1, Phase.ROUND_OPEN),
                                           tuple(SILOS)))
            session.budget.record_round(round_no, inputs=3)     # as signing the survivors does
            session.abort()
            round_no += 1
    assert 1 < round_no <= plan.rounds and session.budget.epsilon() <= 8.0
