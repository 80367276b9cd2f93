"""The algorithm table (protos/algorithms.py): every row is coherent and names a registered
coordinator strategy; the plan accepts exactly the table's names."""

from __future__ import annotations

import re

import pytest

from trellis.coordinator.rounds.strategies import STRATEGIES, make_strategy
from trellis.protos.algorithms import ALGORITHMS, GRAPH_TASK, NODE_TASK, Algorithm, algorithm
from trellis.protos.plan import PlanError, parse_plan

ROWS = list(ALGORITHMS.values())


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_every_row_is_coherent(row: Algorithm) -> None:
    assert row.task in (GRAPH_TASK, NODE_TASK)
    assert row.strategy in STRATEGIES
    assert row.uploads in ("values", "update")
    # Something is aggregated exactly when something may leave the silo.
    assert row.aggregates == bool(row.shares)
    assert all(group and "." not in group for group in row.shares)
    if row.needs_ckks or row.exchanges_envelopes:
        assert row.needs_group_key        # both travel under the silo group key
    if row.clustered:
        assert row.uploads == "update" and row.clusters_by in ("similarity", "sequence")
        assert row.needs_ckks == (row.clusters_by == "similarity")
    else:
        assert row.clusters_by == ""
    if row.matches_schemas or not row.rounds or row.one_silo:
        assert row.simulation_only       # they see every silo's schema or whole graph
    assert row.personalises == (not row.one_silo)     # one model for the whole graph only


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_the_strategy_reads_its_traits_from_the_row(row: Algorithm) -> None:
    strategy = make_strategy(row.name, silos=("a", "b", "c"))
    assert strategy.algorithm is row and strategy.name == row.name
    assert (strategy.clustered, strategy.needs_group_key, strategy.needs_ckks,
            strategy.stops_early, strategy.exchanges_envelopes) == (
        row.clustered, row.needs_group_key, row.needs_ckks, row.stops_early,
        row.exchanges_envelopes)


def test_the_plan_accepts_every_row_and_lists_them_for_an_unknown_name(tmp_path) -> None:
    for row in ROWS:
        silos = ["a"] if row.one_silo else ["a", "b", "c"]
        raw = {"federation": {"id": "f", "algorithm": row.name, "rounds": 1, "silos": silos},
               "fedhgn": {"classes": 3} if row.task == NODE_TASK else {}}
        assert parse_plan(raw, base_dir=tmp_path).public.algorithm == row.name
    with pytest.raises(PlanError, match=re.escape(", ".join(ALGORITHMS))):
        parse_plan({"federation": {"id": "f", "algorithm": "fedsgd", "rounds": 1,
                                   "silos": ["a", "b"]}}, base_dir=tmp_path)


def test_shared_groups_match_by_exact_module_prefix() -> None:
    fedstar = algorithm("fedstar")
    assert fedstar.is_shared("embedding_s.weight")
    assert not fedstar.is_shared("embedding_sx.weight")
    assert not fedstar.is_shared("graph_convs.0.nn.0.weight")
    assert algorithm("local").shared_names(["graph_convs.0.bias", "pre.0.weight"]) == []
