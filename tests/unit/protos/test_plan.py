"""Plans: valid ones parse with defaults; bad ones report every field with its path."""

from __future__ import annotations

from pathlib import Path

import pytest

from trellis.protos.plan import PlanError, PublicPlan, load_plan

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


def _plan_with(silos: int, min_silos: int, aggregation: str) -> dict:
    from trellis.protos.plan import parse_plan

    names = ", ".join(f'"s{i}"' for i in range(silos))
    import tomllib

    raw = tomllib.loads(f"""
[federation]
id = "f"
algorithm = "fedavg"
rounds = 1
min_silos = {min_silos}
silos = [{names}]

[aggregation]
{aggregation}
""")
    return parse_plan(raw, base_dir=Path(".")).public.aggregation


def test_threshold_defaults_to_a_majority_of_share_holders() -> None:
    assert _plan_with(7, 4, "").threshold == 4
    assert _plan_with(3, 2, "").threshold == 2
    # SecAgg+: holders are a silo and its k neighbours.
    secagg_plus = _plan_with(20, 5, "neighbours = 6")
    assert secagg_plus.threshold == 4 and secagg_plus.neighbours == 6


def test_threshold_and_graph_are_checked_against_the_silos() -> None:
    with pytest.raises(PlanError, match="must exceed half of the 7 silos"):
        _plan_with(7, 4, "threshold = 3")
    with pytest.raises(PlanError, match="exceeds federation.min_silos"):
        _plan_with(7, 3, "threshold = 4")
    with pytest.raises(PlanError, match="aggregation.neighbours: must be 0"):
        _plan_with(20, 5, "neighbours = 5")


def test_ring_auto_picks_32_bits_only_when_the_overflow_check_allows() -> None:
    small = _plan_with(10, 6, 'ring_bits = "auto"\nclip = 8.0\nfraction_bits = 12\n'
                              'max_sample_count = 1000')
    assert small.ring_bits == 32            # 10 x 1000 x 8 x 2^12 < 2^31
    large = _plan_with(10, 6, 'ring_bits = "auto"')
    assert large.ring_bits == 64            # the defaults need 64 bits
    with pytest.raises(PlanError, match="ring"):
        _plan_with(10, 6, "ring_bits = 32")
