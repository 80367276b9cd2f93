"""A silo's policy (silo/privacy/policy.py): the file's clauses, and which plans break them."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from trellis.crypto.pki import init_ca, load_identity, request_identity, sign_request
from trellis.protos.plan import AggregationConfig, ModelConfig, PublicPlan, TrainingConfig
from trellis.silo.federation.session import SiloSession
from trellis.silo.privacy.policy import (
    PlanRefused,
    Policy,
    PolicyError,
    check_plan,
    load_policy,
    parse_policy,
)

FULL = """
[accept]
algorithms = ["fedstar", "feddense"]
max_rounds = 200
shared_tensors = ["embedding_s", "graph_convs_s_gcn"]
min_aggregate_silos = 3
min_threshold = 2
ring_bits = [64]
reveal_unweighted_sum = false
reveal_update_norms = false
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return path


def test_every_clause_is_read_and_the_file_is_hashed(tmp_path: Path) -> None:
    path = _write(tmp_path, FULL)
    policy = load_policy(path)
    assert policy == Policy(algorithms=("fedstar", "feddense"), max_rounds=200,
                            shared_tensors=("embedding_s", "graph_convs_s_gcn"),
                            min_aggregate_silos=3, min_threshold=2, ring_bits=(64,),
                            reveal_unweighted_sum=False, reveal_update_norms=False,
                            source=str(path), sha256=hashlib.sha256(FULL.encode()).hexdigest())


def test_an_empty_policy_sets_no_clause(tmp_path: Path) -> None:
    policy = load_policy(_write(tmp_path, ""))
    assert policy == Policy(source=str(tmp_path / "policy.toml"), sha256=policy.sha256)
    assert check_plan(policy, _plan("gcfl", rounds=10_000, threshold=1)) == []


@pytest.mark.parametrize(("text", "problem"), [
    ('[accept]\nmax_rounds = "10"', "accept.max_rounds: must be an integer, got '10'"),
    ("[accept]\nmax_rounds = 0", "accept.max_rounds: must be >= 1, got 0"),
    ("[accept]\nmin_threshold = -1", "accept.min_threshold: must be >= 1, got -1"),
    ("[accept]\nmin_aggregate_silos = 2.5",
     "accept.min_aggregate_silos: must be an integer, got 2.5"),
    ('[accept]\nalgorithms = ["fedstar", "fedsatr"]',
     "accept.algorithms: fedsatr unknown; valid: local, fedavg, fedprox, fedstar"),
    ('[accept]\nalgorithms = "fedstar"',
     "accept.algorithms: must be a list of names, got 'fedstar'"),
    ("[accept]\nalgorithms = []", "accept.algorithms: an empty list accepts no plan at all"),
    ('[accept]\nshared_tensors = ["structure_encoder"]',
     "accept.shared_tensors: structure_encoder unknown; valid: GCNConv_s, Lin_s, decoder, "
     "embedding_s, graph_convs, graph_convs_s_gcn, layer1, layer2"),
    ("[accept]\nring_bits = [48]", "accept.ring_bits: must be a non-empty list of ring sizes "
                                   "out of 32, 64, got [48]"),
    ("[accept]\nring_bits = 64", "accept.ring_bits: must be a non-empty list"),
    ("[accept]\nring_bits = []", "accept.ring_bits: must be a non-empty list"),
    ('[accept]\nreveal_update_norms = "no"',
     "accept.reveal_update_norms: must be true or false, got 'no'"),
    ("[accept]\nreveal_metrics = false",
     "accept.reveal_metrics: not a clause; the plan does not choose what a silo reports; this "
     "silo's --report option does"),
    ("[accept]\nmin_silos = 3", "accept.min_silos: not a clause; the public plan does not "
                                "carry federation.min_silos"),
    ("[accept]\nmaxrounds = 3", "accept.maxrounds: unknown field; expected one of algorithms,"),
    ("max_rounds = 3", "max_rounds: a clause belongs in the [accept] table"),
    ("[policy]\nmax_rounds = 3", "policy: unknown field; expected one of accept"),
    ("accept = 3", "accept: must be a table ([accept])"),
    ("[accept\nmax_rounds = 3", "not valid TOML"),
])
def test_a_bad_clause_is_refused_naming_the_file_and_the_clause(tmp_path: Path, text: str,
                                                                problem: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and problem in message, message
    assert "\n" not in message


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy({"accept": {"max_rounds": 0, "ring_bits": [16], "colour": "red"}},
                     source="p.toml")
    assert [p.split(":")[0] for p in info.value.problems] == [
        "accept.colour", "accept.max_rounds", "accept.ring_bits"]
    assert str(info.value).startswith("p.toml: accept.colour: unknown field")


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"nope\.toml: cannot read policy file"):
        load_policy(tmp_path / "nope.toml")


def _plan(algorithm: str = "fedstar", *, rounds: int = 10, threshold: int = 2,
          ring_bits: int = 64, unweighted_sum: bool = False) -> PublicPlan:
    return PublicPlan("fed", algorithm, rounds, 1, ModelConfig(), TrainingConfig(),
                      AggregationConfig(threshold=threshold, ring_bits=ring_bits,
                                        unweighted_sum=unweighted_sum))


GCFL_CLUSTERS = "2 (gcfl aggregates clusters, which can shrink to 2 silos)"


@pytest.mark.parametrize(("clauses", "plan", "lines"), [
    ({}, _plan("gcfl", rounds=10_000, threshold=1), []),
    ({"algorithms": ("fedstar", "feddense")}, _plan("feddense"), []),
    ({"algorithms": ("fedstar",)}, _plan("gcfl"),
     ["accept.algorithms allows fedstar; the plan asks gcfl"]),
    ({"max_rounds": 100}, _plan(rounds=100), []),
    ({"max_rounds": 50}, _plan(rounds=100), ["accept.max_rounds allows at most 50; the plan "
                                             "asks 100 rounds"]),
    ({"shared_tensors": ("embedding_s", "graph_convs_s_gcn")}, _plan("fedstar"), []),
    ({"shared_tensors": ("embedding_s",)}, _plan("fedstar"),
     ["accept.shared_tensors allows embedding_s; the plan asks embedding_s, "
      "graph_convs_s_gcn (fedstar)"]),
    ({"shared_tensors": ()}, _plan("local"), []),
    ({"shared_tensors": ()}, _plan("fedavg"),
     ["accept.shared_tensors allows nothing; the plan asks graph_convs (fedavg)"]),
    ({"min_aggregate_silos": 3}, _plan(threshold=3), []),
    ({"min_aggregate_silos": 3}, _plan(threshold=2),
     ["accept.min_aggregate_silos allows at least 3; the plan asks 2 (the secure-aggregation "
      "threshold)"]),
    # GCFL ignores the plan's threshold: a cluster of two silos aggregates under threshold 2.
    ({"min_aggregate_silos": 3}, _plan("gcfl", threshold=5),
     [f"accept.min_aggregate_silos allows at least 3; the plan asks {GCFL_CLUSTERS}"]),
    ({"min_aggregate_silos": 2, "min_threshold": 2}, _plan("gcfl+", threshold=5), []),
    ({"min_threshold": 4}, _plan(threshold=3),
     ["accept.min_threshold allows at least 4; the plan asks 3 (the secure-aggregation "
      "threshold)"]),
    ({"min_threshold": 3}, _plan("gcfl+", threshold=3),
     [f"accept.min_threshold allows at least 3; the plan asks {GCFL_CLUSTERS}".replace(
         "gcfl", "gcfl+")]),
    ({"ring_bits": (32, 64)}, _plan(ring_bits=32), []),
    ({"ring_bits": (64,)}, _plan(ring_bits=32),
     ["accept.ring_bits allows 64; the plan asks 32 bits"]),
    # Nothing leaves a `local` silo: the aggregation clauses have nothing to hold.
    ({"min_aggregate_silos": 9, "min_threshold": 9, "ring_bits": (32,)},
     _plan("local", threshold=1), []),
    ({"reveal_unweighted_sum": False}, _plan("gcfl", unweighted_sum=True),
     ["accept.reveal_unweighted_sum allows false; the plan asks true (the unweighted sum of "
      "updates is unmasked too)"]),
    ({"reveal_unweighted_sum": False}, _plan("gcfl", unweighted_sum=False), []),
    ({"reveal_unweighted_sum": True}, _plan("gcfl", unweighted_sum=True), []),
    ({"reveal_update_norms": False}, _plan("gcfl+"),
     ["accept.reveal_update_norms allows false; the plan asks true (gcfl+ sends each silo's "
      "update and gradient norms in plain)"]),
    ({"reveal_update_norms": False}, _plan("fedstar"), []),
    ({"reveal_update_norms": True}, _plan("gcfl"), []),
    ({"algorithms": ("fedstar",), "max_rounds": 5, "ring_bits": (32,)},
     _plan("fedavg", rounds=6),
     ["accept.algorithms allows fedstar; the plan asks fedavg",
      "accept.max_rounds allows at most 5; the plan asks 6 rounds",
      "accept.ring_bits allows 32; the plan asks 64 bits"]),
])
def test_check_plan_lists_each_broken_clause_with_the_limit_and_the_plan_value(
        clauses: dict, plan: PublicPlan, lines: list[str]) -> None:
    violations = check_plan(Policy(**clauses), plan)
    assert [v.line() for v in violations] == [f"policy: {line}" for line in lines]


def test_a_violation_is_recorded_as_plain_fields() -> None:
    [violation] = check_plan(Policy(max_rounds=1), _plan(rounds=2))
    assert violation.record() == {"clause": "accept.max_rounds", "allows": "at most 1",
                                  "plan": "2 rounds"}


@pytest.fixture(scope="module")
def identity(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("policy-id")
    init_ca(root / "ca", ["localhost"])
    sign_request(request_identity("hospital-a", root / "id"), root / "ca")
    return load_identity(root / "id")


def test_a_refused_plan_builds_no_trainer_and_an_accepted_one_does(identity) -> None:
    built: list[str] = []

    def make_trainer(plan: PublicPlan):  # type: ignore[no-untyped-def]
        built.append(plan.algorithm)
        return object()

    plan = _plan(rounds=3)
    refusing = SiloSession(identity, make_trainer, policy=Policy(max_rounds=2, source="p.toml"))
    with pytest.raises(PlanRefused) as info:
        refusing.accept_plan(plan.to_json())
    assert built == [] and refusing.plan is None and refusing.trainer is None
    assert [v.clause for v in info.value.violations] == ["accept.max_rounds"]
    assert info.value.plan == plan
    accepting = SiloSession(identity, make_trainer, policy=Policy(max_rounds=3))
    assert accepting.accept_plan(plan.to_json()) == plan and built == ["fedstar"]


def test_the_plan_hash_is_of_its_canonical_wire_form() -> None:
    plan = _plan()
    assert plan.sha256() == hashlib.sha256(plan.to_json().encode()).hexdigest()
    assert PublicPlan.from_json(plan.to_json()).sha256() == plan.sha256()
    assert replace(plan, rounds=11).sha256() != plan.sha256()
