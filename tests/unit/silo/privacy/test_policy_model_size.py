"""A silo's bound on the model it will train: `max_hidden` and `max_layers` (issue 34, 6).

Checked against the public plan before joining; a plan asking for a larger model is refused
with the usual one line per clause, before the silo builds a trainer or sends anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trellis.protos.plan import (
    AggregationConfig,
    HeteroConfig,
    ModelConfig,
    PublicPlan,
    TrainingConfig,
)
from trellis.silo.privacy.policy import PolicyError, check_plan, load_policy, parse_policy


def _plan(algorithm: str = "fedstar", **model: int) -> PublicPlan:
    return PublicPlan(federation="f", algorithm=algorithm, rounds=10, seed=1,
                      model=ModelConfig(**model), training=TrainingConfig(),
                      aggregation=AggregationConfig(threshold=2),
                      hetero=HeteroConfig(classes=3, hidden=model.get("hidden", 64)))


def test_the_clauses_are_read(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text("[accept]\nmax_hidden = 128\nmax_layers = 4\n")
    policy = load_policy(path)
    assert (policy.max_hidden, policy.max_layers) == (128, 4)


@pytest.mark.parametrize(("clauses", "plan", "lines"), [
    ({"max_hidden": 64, "max_layers": 3}, _plan(hidden=64, layers=3), []),
    ({"max_hidden": 128}, _plan(hidden=100_000),
     ["policy: accept.max_hidden allows at most 128; the plan asks 100000 (model.hidden)"]),
    ({"max_layers": 4}, _plan(layers=5000),
     ["policy: accept.max_layers allows at most 4; the plan asks 5000 (model.layers)"]),
    # FedDense's layers are `width` wide, not `hidden`.
    ({"max_hidden": 64}, _plan("feddense", hidden=10_000, width=32), []),
    ({"max_hidden": 64}, _plan("feddense", width=512),
     ["policy: accept.max_hidden allows at most 64; the plan asks 512 (model.width)"]),
    # FedHGN's model is sized by [fedhgn] hidden, and has a fixed depth.
    ({"max_hidden": 64, "max_layers": 2}, _plan("fedhgn", hidden=64, layers=50), []),
    ({"max_layers": 1}, _plan("fedhgn"),
     ["policy: accept.max_layers allows at most 1; the plan asks 2 (fedhgn's RGCN, fixed)"]),
    ({"max_hidden": 32}, _plan("fedhgn", hidden=4096),
     ["policy: accept.max_hidden allows at most 32; the plan asks 4096 (fedhgn.hidden)"]),
])
def test_a_plan_asking_for_a_larger_model_is_refused(clauses: dict, plan: PublicPlan,
                                                     lines: list[str]) -> None:
    policy = parse_policy({"accept": clauses})
    assert [v.line() for v in check_plan(policy, plan)] == lines


def test_the_clauses_must_be_positive_integers() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy({"accept": {"max_hidden": 0, "max_layers": "many"}})
    assert "accept.max_hidden: must be >= 1, got 0" in caught.value.problems
    assert "accept.max_layers: must be an integer, got 'many'" in caught.value.problems
