"""A plan from a careless or hostile hand: missing fields, huge values, bad bytes (issue 34, 6).

Each is refused with its field's path, in a message of bounded length, before anything runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trellis.protos.fields import MAX_SHOWN, shown
from trellis.protos.plan import PlanError, load_plan, parse_plan
from trellis.protos.plan_limits import LIMITS


def _raw(**federation: object) -> dict:
    fed = {"id": "chem", "algorithm": "fedstar", "rounds": 5, "silos": ["a", "b", "c"]}
    fed.update(federation)
    return {"federation": {k: v for k, v in fed.items() if v is not None}}


def _problems(raw: dict) -> list[str]:
    with pytest.raises(PlanError) as caught:
        parse_plan(raw, base_dir=Path("/tmp"))
    return caught.value.problems


def test_a_missing_field_is_said_to_be_missing_not_none() -> None:
    raw = _raw()
    del raw["federation"]["rounds"]
    problems = _problems(raw)
    assert "federation.rounds: required" in problems
    assert not any("None" in p for p in problems), problems


def test_a_huge_federation_id_is_refused_without_being_echoed() -> None:
    problems = _problems(_raw(id="x" * 10_000_000))
    [line] = [p for p in problems if p.startswith("federation.id")]
    assert "at most 64" in line and len(line) < 300 and "…" in line


def test_unknown_keys_and_bad_values_are_shown_truncated() -> None:
    raw = _raw(rounds="9" * 100_000)
    raw["model"] = {"k" * 100_000: 1}
    problems = _problems(raw)
    assert all(len(p) < 400 for p in problems), [len(p) for p in problems]
    assert any(p.startswith("federation.rounds: must be an integer") for p in problems)


def test_shown_bounds_any_value() -> None:
    assert shown("abc") == "'abc'"
    assert len(shown("y" * 10**6)) <= MAX_SHOWN + 1 and shown("y" * 10**6).endswith("…")


@pytest.mark.parametrize(("table", "key", "value"), [
    ("model", "hidden", 10**8), ("model", "layers", 10**5), ("model", "width", 10**8),
    ("model", "n_rw", 10**6), ("model", "n_dg", 10**6),
    ("training", "local_epochs", 10**9), ("training", "batch_size", 10**12),
    ("federation", "rounds", 10**20), ("fedhgn", "hidden", 10**8),
    ("fedhgn", "bases", 10**6), ("fedhgn", "local_epochs", 10**9),
    ("fedhgn", "max_epochs", 10**12), ("fedhgn", "classes", 10**9),
])
def test_sizes_above_their_documented_maximum_are_refused(table: str, key: str,
                                                          value: int) -> None:
    raw = _raw()
    raw.setdefault(table, {})[key] = value
    if table == "fedhgn":
        raw["federation"]["algorithm"] = "fedhgn"
        raw["fedhgn"].setdefault("classes", 3)
    high = LIMITS[f"{table}.{key}"]
    assert value > high
    assert f"{table}.{key}: must be <= {high}, got {value}" in _problems(raw)


def test_sizes_at_their_maximum_are_accepted() -> None:
    raw = _raw(rounds=LIMITS["federation.rounds"])
    raw["model"] = {"hidden": LIMITS["model.hidden"], "layers": LIMITS["model.layers"]}
    raw["training"] = {"local_epochs": LIMITS["training.local_epochs"]}
    plan = parse_plan(raw, base_dir=Path("/tmp"))
    assert plan.public.model.hidden == LIMITS["model.hidden"]


@pytest.mark.parametrize("where", ["server", "simulation"])
def test_a_nul_byte_in_a_path_is_a_problem_of_its_field(where: str) -> None:
    raw = _raw()
    if where == "server":
        raw["server"] = {"state_dir": "st\x00ate"}
        field = "server.state_dir"
    else:
        raw["simulation"] = {"data": {"a": "da\x00ta"}}
        field = "simulation.data.a"
    [line] = [p for p in _problems(raw) if p.startswith(field)]
    assert "NUL" in line


def test_a_plan_that_is_not_utf8_is_one_problem_naming_the_byte(tmp_path: Path) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_bytes(b'[federation]\nid = "\xff"\n')
    with pytest.raises(PlanError) as caught:
        load_plan(plan)
    [line] = caught.value.problems
    assert "not UTF-8 text" in line and "0xff" in line and "line 2" in line
