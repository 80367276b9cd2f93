"""Summed evaluation counts under privacy ([metrics] aggregate with [privacy]): their own noise
share, sized to their sensitivity, and their release composed with the model's in the silo's one
ledger, every round, and alone in the attempt that trains nothing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trellis.crypto.dp_accountant import PrivacyLedger
from trellis.protos.counts_privacy import counts_event, counts_share_sigma
from trellis.protos.metrics_plan import counts_sensitivity, metric_slots
from trellis.protos.plan import PublicPlan, parse_plan
from trellis.silo.privacy.budget import SiloBudget

SILOS = ["a", "b", "c", "d", "e"]


def _plan(mechanism: str = "ddg", metrics: dict | None = None, rounds: int = 20) -> PublicPlan:
    raw = {"federation": {"id": "f", "algorithm": "fedstar", "rounds": rounds, "silos": SILOS},
           "privacy": {"mechanism": mechanism, "noise_multiplier": 1.0, "batch": 16,
                       "design_graphs": 200, "colluders": 1}}
    if metrics is not None:
        raw["metrics"] = metrics
    return parse_plan(raw, base_dir=Path(".")).public


def _budget(plan: PublicPlan) -> SiloBudget:
    return SiloBudget(plan, None, graphs=200, dimension=5000, shared_values=3000)


SUMMED = {"aggregate": True, "noise_multiplier": 20.0, "classes": 2}


def test_without_summed_metrics_nothing_changes() -> None:
    plan = _plan()
    assert counts_share_sigma(plan) == 0 and counts_event(plan, 3) is None
    budget = _budget(plan)
    record = budget.record_round(1, 5)
    assert len(budget.ledger.events) == 1 and "counts_share_sigma" not in record


def test_the_counts_share_is_sized_to_their_sensitivity_and_the_honest_floor() -> None:
    plan = _plan(metrics=SUMMED)
    l2, l1 = counts_sensitivity(plan.metrics)
    honest = plan.privacy.honest_shares(plan.aggregation.threshold)      # 3 of 5, 1 colluder
    assert honest == 2
    assert counts_share_sigma(plan) == pytest.approx(20.0 * l2 / math.sqrt(honest))
    event = counts_event(plan, 4)
    assert event is not None and (event.q, event.honest_shares) == (1.0, 4)
    assert event.local_sigma2 == math.ceil(counts_share_sigma(plan) ** 2)
    assert (event.l2_sensitivity, event.l1_sensitivity) == (l2, l1)
    assert event.dim == len(metric_slots(plan.metrics)) == 14
    local = counts_event(_plan("local-gaussian", SUMMED), 4)
    assert local is not None and (local.mechanism, local.noise_multiplier) == (
        "local-gaussian", 20.0)
    assert counts_share_sigma(_plan("local-gaussian", SUMMED)) == pytest.approx(20.0 * l2)


def test_each_round_composes_both_releases_and_the_evaluation_attempt_only_the_counts() -> None:
    plan = _plan(metrics=SUMMED, rounds=3)
    alone, summed = _budget(_plan(rounds=3)), _budget(plan)
    projected = summed.projected_epsilon()
    for round_no in (1, 2, 3):
        alone.record_round(round_no, 3)         # 3 inputs, 1 colluder: the floor's 2 shares
        record = summed.record_round(round_no, 3)
        assert record["model_released"] and record["counts_share_sigma"] > 0
    last = summed.record_round(4, 3, model=False)
    assert not last["model_released"]
    kinds = [(e.q, e.dim) for e in summed.ledger.events]
    assert len(kinds) == 7 and kinds.count((1.0, 14)) == 4     # 3 model + 4 counts releases
    # Composed: more than the model's alone, and what the whole plan was projected to cost.
    assert summed.epsilon() > alone.epsilon()
    assert summed.epsilon() == pytest.approx(projected, rel=1e-9)
    counts_only = PrivacyLedger([e for e in summed.ledger.events if e.q == 1.0])
    assert summed.epsilon() > counts_only.epsilon(plan.privacy.delta)
