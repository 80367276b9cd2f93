"""The plan's [data] reference_sha256: validated, carried to the silo, left off the wire unset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trellis.protos.plan import PlanError, PublicPlan, load_plan

PLAN = """
[federation]
id = "chem"
algorithm = "fedavg"
rounds = 2
silos = ["a", "b"]
"""
HASH = "0123456789abcdef" * 4


def _load(tmp_path: Path, extra: str = "") -> PublicPlan:
    path = tmp_path / "plan.toml"
    path.write_text(PLAN + extra)
    return load_plan(path).public


def test_reference_sha256_round_trips_through_the_wire_form(tmp_path: Path) -> None:
    plan = _load(tmp_path, f'\n[data]\nreference_sha256 = "{HASH}"\n')
    assert plan.reference_sha256 == HASH
    assert json.loads(plan.to_json())["reference_sha256"] == HASH
    assert PublicPlan.from_json(plan.to_json()) == plan


def test_unset_it_is_left_off_the_wire_so_old_plans_keep_their_hash(tmp_path: Path) -> None:
    plan = _load(tmp_path)
    assert plan.reference_sha256 == ""
    assert "reference_sha256" not in json.loads(plan.to_json())
    assert _load(tmp_path, "\n[data]\n").sha256() == plan.sha256()


@pytest.mark.parametrize("value", ['"abc"', f'"{HASH.upper()}"', "12", f'"{HASH}0"'])
def test_a_malformed_reference_sha256_is_named_with_its_path(tmp_path: Path,
                                                             value: str) -> None:
    with pytest.raises(PlanError, match=r"data\.reference_sha256: a SHA-256 in 64 lowercase"):
        _load(tmp_path, f"\n[data]\nreference_sha256 = {value}\n")


def test_an_unknown_key_of_data_is_reported(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"data\.fingerprint"):
        _load(tmp_path, f'\n[data]\nfingerprint = "{HASH}"\n')


def test_the_wire_form_is_checked_too(tmp_path: Path) -> None:
    doc = json.loads(_load(tmp_path).to_json())
    doc["reference_sha256"] = "nothex"
    with pytest.raises(PlanError, match="reference_sha256"):
        PublicPlan.from_json(json.dumps(doc))
