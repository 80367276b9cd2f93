"""The plan's [model] init_sha256 and frozen: validated, carried to the silo, left off the wire
at their defaults (so a plan without them keeps its hash)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trellis.protos.plan import PlanError, PublicPlan, load_plan

PLAN = """
[federation]
id = "chem"
algorithm = "{algorithm}"
rounds = 2
silos = ["a", "b"]
"""
HASH = "0123456789abcdef" * 4
BEFORE_THE_OPTIONS = "c9b82c78133ef4f9f3f91edf5d05ba8c1afbbb6c6b9279841621070d2593a59d"


def _load(tmp_path: Path, extra: str = "", algorithm: str = "fedstar") -> PublicPlan:
    path = tmp_path / "plan.toml"
    path.write_text(PLAN.format(algorithm=algorithm) + extra)
    return load_plan(path).public


def test_init_and_frozen_round_trip_through_the_wire_form(tmp_path: Path) -> None:
    plan = _load(tmp_path, f'\n[model]\ninit_sha256 = "{HASH}"\n'
                           'frozen = ["pre", "embedding_s"]\n')
    assert plan.model.init_sha256 == HASH
    assert plan.model.frozen == ("embedding_s", "pre")          # sorted: one canonical form
    wire = json.loads(plan.to_json())["model"]
    assert wire["init_sha256"] == HASH and wire["frozen"] == ["embedding_s", "pre"]
    assert PublicPlan.from_json(plan.to_json()) == plan


def test_unset_they_are_left_off_the_wire_so_old_plans_keep_their_hash(tmp_path: Path) -> None:
    plan = _load(tmp_path)
    wire = json.loads(plan.to_json())["model"]
    assert "init_sha256" not in wire and "frozen" not in wire
    explicit = _load(tmp_path, '\n[model]\ninit_sha256 = ""\nfrozen = []\n')
    assert explicit.sha256() == plan.sha256()
    # The hash this plan had before the options existed (computed at the commit before them).
    assert plan.sha256() == BEFORE_THE_OPTIONS


def test_the_order_of_frozen_groups_does_not_change_the_hash(tmp_path: Path) -> None:
    one = _load(tmp_path, '\n[model]\nfrozen = ["pre", "Whp"]\n')
    other = _load(tmp_path, '\n[model]\nfrozen = ["Whp", "pre"]\n')
    assert one.sha256() == other.sha256()


@pytest.mark.parametrize("value", ['"abc"', f'"{HASH.upper()}"', "12", f'"{HASH}0"'])
def test_a_malformed_init_sha256_is_named_with_its_path(tmp_path: Path, value: str) -> None:
    with pytest.raises(PlanError, match=r"model\.init_sha256: the SHA-256 of the initial model"):
        _load(tmp_path, f"\n[model]\ninit_sha256 = {value}\n")


@pytest.mark.parametrize(("algorithm", "frozen", "message"), [
    ("fedstar", '["nonsense"]', r"model\.frozen: 'nonsense' may not be frozen with fedstar; "
                                r"its freezable groups: pre, embedding_s"),
    ("fedstar", '"pre"', r"model\.frozen: a list of parameter group names"),
    ("fedstar", '["pre", "pre"]', r"model\.frozen: each group at most once"),
    ("fedstar", '["embedding_s", "graph_convs_s_gcn"]',
     r"every shared group of fedstar \(embedding_s, graph_convs_s_gcn\) is frozen"),
    ("local", '["pre", "graph_convs", "post", "readout"]',
     r"every group of local's model is frozen: nothing would train"),
    ("gcfl", '["pre"]', r"'pre' may not be frozen with gcfl; its freezable groups: none"),
])
def test_a_frozen_list_the_row_does_not_allow_is_refused(tmp_path: Path, algorithm: str,
                                                         frozen: str, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        _load(tmp_path, f"\n[model]\nfrozen = {frozen}\n", algorithm=algorithm)


def test_the_wire_form_is_checked_too(tmp_path: Path) -> None:
    doc = json.loads(_load(tmp_path).to_json())
    doc["model"]["init_sha256"] = "nothex"
    doc["model"]["frozen"] = ["readout", "nonsense"]
    with pytest.raises(PlanError, match=r"init_sha256.*; model\.frozen: 'nonsense'"):
        PublicPlan.from_json(json.dumps(doc))


def test_an_initial_model_is_refused_for_a_node_task(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"model\.init_sha256: fedhgn starts from the plan's "
                       "seed; a public initial model is for the graph-classification"):
        _load(tmp_path, f'\n[model]\ninit_sha256 = "{HASH}"\n[fedhgn]\nclasses = 3\n',
              algorithm="fedhgn")
