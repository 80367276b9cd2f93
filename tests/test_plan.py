"""Plans: valid ones parse with defaults; bad ones report every field with its path."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.plan import PlanError, PublicPlan, load_plan

GOOD = """
[federation]
id = "chem"
algorithm = "fedstar"
rounds = 5
silos = ["a", "b", "c"]

[server]
state_dir = "st"

[simulation]
data = { a = "data/a", b = "data/b", c = "data/c" }
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return path


def test_good_plan_parses_with_defaults_and_resolves_paths(tmp_path: Path) -> None:
    plan = load_plan(_write(tmp_path, GOOD))
    assert plan.public.algorithm == "fedstar" and plan.public.rounds == 5
    assert plan.min_silos == 3 and plan.silos == ("a", "b", "c")
    assert plan.public.training.lr == 0.001 and plan.public.model.hidden == 64
    assert plan.server.state_dir == (tmp_path / "st").resolve()
    assert plan.simulation_data["b"] == (tmp_path / "data" / "b").resolve()
    assert PublicPlan.from_json(plan.public.to_json()) == plan.public


def test_every_bad_field_is_reported_with_its_path(tmp_path: Path) -> None:
    text = """
[federation]
algorithm = "fedstarr"
rounds = -3
silos = ["a", "b b", "a"]
min_silos = 7
colour = "blue"

[training]
lr = "fast"
batch_size = 0

[aggregation]
ring_bits = 48

[server]
listen = "nowhere"
"""
    with pytest.raises(PlanError) as info:
        load_plan(_write(tmp_path, text))
    problems = "\n".join(info.value.problems)
    for expected in (
        "federation.id: required",
        "federation.algorithm: 'fedstarr' is not an algorithm; valid choices: local, fedavg, "
        "fedprox, fedstar",
        "federation.rounds: must be >= 1, got -3",
        "federation.silos[1]: 'b b' is not a valid silo name",
        "federation.silos: names must be unique",
        "federation.min_silos: 7 exceeds the 3 admitted silos",
        "federation.colour: unknown field",
        "training.lr: must be a number, got 'fast'",
        "training.batch_size: must be >= 1, got 0",
        "aggregation.ring_bits: must be 32 or 64, got 48",
        "server.listen: expected 'host:port', got 'nowhere'",
    ):
        assert expected in problems, expected


def test_overflowing_aggregation_is_refused_at_load(tmp_path: Path) -> None:
    text = GOOD + "\n[aggregation]\nring_bits = 32\n"
    with pytest.raises(PlanError, match="aggregation: .*ring"):
        load_plan(_write(tmp_path, text))


def test_unreadable_and_non_toml_plans(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="cannot read"):
        load_plan(tmp_path / "missing.toml")
    with pytest.raises(PlanError, match="not valid TOML"):
        load_plan(_write(tmp_path, "[federation\n"))


def test_simulation_data_must_name_admitted_silos(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="simulation.data.z: not one of federation.silos"):
        load_plan(_write(tmp_path, GOOD.replace('c = "data/c"', 'z = "data/z"')))


def test_public_plan_from_bad_json() -> None:
    with pytest.raises(PlanError, match="JSON"):
        PublicPlan.from_json("{")
    with pytest.raises(PlanError, match="algorithm"):
        PublicPlan.from_json('{"federation": "x", "algorithm": "nope", "rounds": 1}')
