"""The plan's [privacy] table: every bad field named, the cross-checks against the algorithm,
and the noise multiplier calibrated to the target epsilon."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trellis.crypto.dp_accountant import RoundEvent, projected_epsilon
from trellis.protos.plan import PlanError, PublicPlan, parse_plan

SILOS = ["a", "b", "c", "d", "e"]


def _plan(privacy: dict, algorithm: str = "fedstar", **extra: dict):
    return parse_plan({"federation": {"id": "f", "algorithm": algorithm, "rounds": 50,
                                      "silos": SILOS},
                       "privacy": privacy, **extra}, base_dir=Path("."))


def test_without_the_table_nothing_is_private() -> None:
    plan = parse_plan({"federation": {"id": "f", "algorithm": "fedstar", "rounds": 2,
                                      "silos": SILOS}}, base_dir=Path("."))
    assert not plan.public.privacy.enabled


def test_the_noise_multiplier_is_calibrated_to_the_target_epsilon() -> None:
    plan = _plan({"mechanism": "ddg", "epsilon": 4.0, "delta": 1e-5, "batch": 32,
                  "design_graphs": 640, "accountant": "rdp"})
    privacy = plan.public.privacy
    assert privacy.noise_multiplier > 0
    z, unit = privacy.noise_multiplier, 2.0 ** 16
    event = RoundEvent("ddg", 32 / 640, 50, local_sigma2=(z * unit) ** 2, honest_shares=1,
                       l2_sensitivity=unit, l1_sensitivity=unit, dim=1)
    assert 3.9 < projected_epsilon([event], 1e-5) <= 4.0
    # Near the continuous Gaussian's calibration: the subsampling bound costs a little more.
    gaussian = RoundEvent("local-gaussian", 32 / 640, 50, noise_multiplier=z)
    assert projected_epsilon([gaussian], 1e-5) < 4.0
    # The public plan carries the calibrated value: every silo sees the same z.
    assert PublicPlan.from_json(plan.public.to_json()).privacy == privacy


def test_a_private_plan_file_gets_the_recipe_for_what_it_leaves_out() -> None:
    plan = _plan({"mechanism": "ddg", "epsilon": 8.0, "design_graphs": 650},
                 model={"hidden": 32})
    privacy, training = plan.public.privacy, plan.public.training
    assert (privacy.accountant, privacy.batch, privacy.server_lr, privacy.server_momentum,
            training.lr, plan.public.model.dropout) == ("pld", 128, 0.3, 0.9, 0.01, 0.0)
    assert plan.public.model.hidden == 32
    # What it names wins; a plan without privacy keeps the plain defaults.
    named = _plan({"mechanism": "ddg", "epsilon": 8.0, "batch": 32, "accountant": "rdp",
                   "server_momentum": 0.0, "design_graphs": 650}, training={"lr": 0.003},
                  model={"dropout": 0.25})
    assert (named.public.privacy.accountant, named.public.privacy.batch,
            named.public.privacy.server_momentum, named.public.training.lr,
            named.public.model.dropout) == ("rdp", 32, 0.0, 0.003, 0.25)
    plain = parse_plan({"federation": {"id": "f", "algorithm": "fedstar", "rounds": 2,
                                       "silos": SILOS}}, base_dir=Path("."))
    assert (plain.public.training.lr, plain.public.model.dropout) == (0.001, 0.5)
    # Silo level takes only the accountant: the rest was searched for record level.
    silo = _plan({"mechanism": "ddg", "epsilon": 8.0, "unit": "silo"})
    assert (silo.public.privacy.accountant, silo.public.privacy.batch,
            silo.public.privacy.server_lr, silo.public.training.lr,
            silo.public.model.dropout) == ("pld", 32, 1.0, 0.001, 0.5)
    # The wire names the accountant the recipe chose; absent from the wire still means "rdp".
    assert PublicPlan.from_json(plan.public.to_json()).privacy == privacy
    wire = json.loads(named.public.to_json())
    assert "accountant" not in wire["privacy"]
    assert PublicPlan.from_json(json.dumps(wire)).privacy.accountant == "rdp"


def test_every_bad_field_is_named_at_once() -> None:
    with pytest.raises(PlanError) as caught:
        _plan({"mechanism": "laplace", "unit": "node", "delta": 0.5, "bits": 30, "clip": -1,
               "sparkle": 1})
    text = str(caught.value)
    for field in ("privacy.mechanism", "privacy.unit", "privacy.delta", "privacy.bits",
                  "privacy.clip", "privacy.sparkle"):
        assert field in text, field


@pytest.mark.parametrize(("privacy", "algorithm", "extra", "says"), [
    ({"mechanism": "ddg", "noise_multiplier": 1.0, "design_graphs": 100}, "gcfl", {},
     "clusters silos"),
    ({"mechanism": "ddg", "noise_multiplier": 1.0, "design_graphs": 100}, "local", {},
     "no secure sum"),
    ({"mechanism": "ddg", "noise_multiplier": 1.0, "unit": "silo"}, "fedhgn",
     {"fedhgn": {"classes": 3}}, "align_weight = 0"),
    ({"mechanism": "ddg", "noise_multiplier": 1.0}, "fedhgn", {"fedhgn": {"classes": 3}},
     "unit = \"silo\""),
    ({"mechanism": "ddg", "noise_multiplier": 1.0, "design_graphs": 100}, "feddense", {},
     "norm = \"layer\""),
    ({"mechanism": "ddg", "noise_multiplier": 1.0, "design_graphs": 100, "colluders": 3},
     "fedstar", {}, "below the secure-aggregation threshold 3"),
    ({"mechanism": "ddg", "noise_multiplier": 1.0}, "fedstar", {}, "design_graphs"),
    ({"mechanism": "ddg"}, "fedstar", {}, "set epsilon"),
    ({"mechanism": "ddg", "noise_multiplier": 1.0, "design_graphs": 100}, "fedstar",
     {"aggregation": {"ring_bits": 32}}, "needs the 64-bit ring"),
])
def test_plans_that_no_guarantee_covers_are_refused_with_the_reason(privacy, algorithm, extra,
                                                                     says) -> None:
    with pytest.raises(PlanError, match=says):
        _plan(privacy, algorithm, **extra)


def test_feddense_with_layer_norm_and_local_dp_are_accepted() -> None:
    dense = _plan({"mechanism": "ddg", "noise_multiplier": 1.0, "design_graphs": 100},
                  "feddense", model={"norm": "layer"})
    assert dense.public.privacy.mechanism == "ddg"
    alone = _plan({"mechanism": "local-gaussian", "noise_multiplier": 1.0,
                   "design_graphs": 100}, "local")
    assert alone.public.privacy.honest_shares(3) == 1


@pytest.mark.parametrize("z", [0.5, 1.5, 5.0])
def test_bits_are_chosen_so_the_noise_stays_on_the_samplers_fast_path(z: float) -> None:
    from trellis.crypto.discrete_gaussian import VECTOR_MAX_SIGMA2

    privacy = _plan({"mechanism": "ddg", "noise_multiplier": z,
                     "design_graphs": 100}).public.privacy
    assert 8 <= privacy.bits <= 16
    full_sigma = z * (privacy.clip * privacy.scale + 300)       # d = 90k: sqrt(d) = 300
    assert full_sigma ** 2 <= VECTOR_MAX_SIGMA2
    chosen = _plan({"mechanism": "ddg", "noise_multiplier": z, "design_graphs": 100,
                    "bits": 10}).public.privacy
    assert chosen.bits == 10                                    # a plan's own choice stands


def test_a_private_plan_resolves_the_automatic_ring_to_64_bits() -> None:
    # Settings under which a plain plan's "auto" takes the 32-bit ring.
    small = {"ring_bits": "auto", "clip": 1.0, "fraction_bits": 8, "max_sample_count": 1000}
    plain = parse_plan({"federation": {"id": "f", "algorithm": "fedstar", "rounds": 2,
                                       "silos": SILOS}, "aggregation": small},
                       base_dir=Path("."))
    assert plain.public.aggregation.ring_bits == 32
    plan = _plan({"mechanism": "ddg", "noise_multiplier": 1.0, "design_graphs": 100},
                 aggregation=small)
    assert plan.public.aggregation.ring_bits == 64


def test_the_rdp_accountant_leaves_the_wire_form_and_the_noise_as_they_were() -> None:
    table = {"mechanism": "ddg", "epsilon": 4.0, "batch": 32, "design_graphs": 640,
             "server_lr": 1.0, "server_momentum": 0.0}
    plain = _plan({**table, "accountant": "rdp"}, training={"lr": 0.001}).public
    assert plain.privacy.accountant == "rdp"
    # The wire form holds exactly the fields it held before the accountant existed.
    assert set(json.loads(plain.to_json())["privacy"]) == {
        "mechanism", "unit", "epsilon", "delta", "noise_multiplier", "clip", "bits", "batch",
        "design_graphs", "colluders", "server_lr", "server_momentum"}
    assert PublicPlan.from_json(plain.to_json()) == plain


def test_the_tight_accountant_calibrates_less_noise_for_the_same_target() -> None:
    table = {"mechanism": "ddg", "epsilon": 4.0, "batch": 32, "design_graphs": 640}
    old = _plan({**table, "accountant": "rdp"}).public.privacy
    tight = _plan({**table, "accountant": "pld"}).public
    z, unit = tight.privacy.noise_multiplier, 2.0 ** 16
    assert z < old.noise_multiplier
    event = RoundEvent("ddg", 32 / 640, 50, local_sigma2=(z * unit) ** 2, honest_shares=1,
                       l2_sensitivity=unit, l1_sensitivity=unit, dim=1)
    assert 3.9 < projected_epsilon([event], 1e-5, accountant="pld") <= 4.0
    assert json.loads(tight.to_json())["privacy"]["accountant"] == "pld"
    assert PublicPlan.from_json(tight.to_json()) == tight
    with pytest.raises(PlanError, match="privacy.accountant"):
        _plan({**table, "accountant": "moments"})
