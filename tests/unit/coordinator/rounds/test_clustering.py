"""Tests for GCFL / GCFL+ clustering: Stoer-Wagner, DTW, the split rule and cluster state."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trellis.coordinator.rounds.clustering import (
    ClusterState,
    dtw_distance,
    dtw_matrix,
    sequence_split,
    similarity_split,
    split_due,
    split_reasons,
    standardize,
    stoer_wagner,
)
from trellis.protos.algorithms import GCFL_PRESETS, MIN_SPLIT_ROUND, MIN_SPLIT_SIZE, GcflPreset

# --- helpers ----------------------------------------------------------------------------------


def _graph(n: int, edges: Mapping[tuple[int, int], float], one_based: bool = False) -> np.ndarray:
    w = np.zeros((n, n))
    for (i, j), weight in edges.items():
        i, j = (i - 1, j - 1) if one_based else (i, j)
        w[i, j] = w[j, i] = weight
    return w


def _cut_value(w: np.ndarray, side: tuple[int, ...]) -> float:
    other = [i for i in range(len(w)) if i not in side]
    return float(w[np.ix_(list(side), other)].sum())


def _brute_force_min_cut(w: np.ndarray) -> float:
    n = len(w)
    # vertex 0 stays on side A: every bipartition is enumerated exactly once
    return min(
        _cut_value(w, (0, *rest))
        for k in range(n - 1)
        for rest in itertools.combinations(range(1, n), k)
    )


def _check_sides(n: int, side_a: tuple[int, ...], side_b: tuple[int, ...]) -> None:
    assert side_a and side_b
    assert side_a == tuple(sorted(side_a)) and side_b == tuple(sorted(side_b))
    assert sorted(side_a + side_b) == list(range(n))
    assert 0 in side_a


def _random_symmetric(rng: np.random.Generator, n: int, integer: bool) -> np.ndarray:
    raw = rng.integers(0, 4, size=(n, n)) if integer else rng.random((n, n)) * 2
    w = np.triu(raw, 1).astype(np.float64)
    w = w + w.T
    # the diagonal is ignored, so garbage there must not matter
    np.fill_diagonal(w, rng.random(n) * 10)
    return w


# --- Stoer-Wagner -----------------------------------------------------------------------------


def test_two_triangles_joined_by_a_light_edge() -> None:
    edges = {(0, 1): 5, (0, 2): 5, (1, 2): 5, (3, 4): 5, (3, 5): 5, (4, 5): 5, (2, 3): 1}
    assert stoer_wagner(_graph(6, edges)) == (1.0, (0, 1, 2), (3, 4, 5))


def test_stoer_wagner_paper_example() -> None:
    # Stoer & Wagner (J. ACM 1997), Fig. 1; the minimum cut crosses 2-3 (3) and 6-7 (1).
    edges = {
        (1, 2): 2, (1, 5): 3, (2, 3): 3, (2, 5): 2, (2, 6): 2, (3, 4): 4,
        (3, 7): 2, (4, 7): 2, (4, 8): 2, (5, 6): 3, (6, 7): 1, (7, 8): 3,
    }  # fmt: skip
    value, side_a, side_b = stoer_wagner(_graph(8, edges, one_based=True))
    assert value == 4.0
    assert side_a == (0, 1, 4, 5)  # {1, 2, 5, 6}
    assert side_b == (2, 3, 6, 7)  # {3, 4, 7, 8}


def test_two_vertices() -> None:
    assert stoer_wagner(np.array([[9.0, 2.5], [2.5, 7.0]])) == (2.5, (0,), (1,))


def test_disconnected_graph_has_a_zero_cut() -> None:
    w = _graph(4, {(0, 2): 3, (1, 3): 3})
    assert stoer_wagner(w) == (0.0, (0, 2), (1, 3))


def test_side_a_holds_vertex_zero() -> None:
    # vertex 0 is strongly tied to everything; the lightest vertex (3) is cut off alone
    w = _graph(4, {(0, 1): 5, (0, 2): 5, (1, 2): 5, (0, 3): 1, (1, 3): 0.5})
    assert stoer_wagner(w) == (1.5, (0, 1, 2), (3,))


def test_all_zero_weights() -> None:
    value, side_a, side_b = stoer_wagner(np.zeros((5, 5)))
    assert value == 0.0
    _check_sides(5, side_a, side_b)


@pytest.mark.parametrize("integer", [True, False], ids=["integer", "float"])
def test_matches_brute_force_on_random_graphs(integer: bool) -> None:
    rng = np.random.default_rng(20210607)
    for _ in range(150):
        n = int(rng.integers(2, 9))
        w = _random_symmetric(rng, n, integer)
        value, side_a, side_b = stoer_wagner(w)
        _check_sides(n, side_a, side_b)
        assert value == pytest.approx(_brute_force_min_cut(w), abs=1e-12)
        assert value == pytest.approx(_cut_value(w, side_a), abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=2, max_value=7).flatmap(
        lambda n: st.lists(
            st.integers(min_value=0, max_value=3), min_size=n * n, max_size=n * n
        ).map(lambda flat: np.array(flat, dtype=np.float64).reshape(n, n))
    )
)
def test_property_min_cut_is_optimal(raw: np.ndarray) -> None:
    w = np.triu(raw, 1) + np.triu(raw, 1).T
    value, side_a, side_b = stoer_wagner(w)
    _check_sides(len(w), side_a, side_b)
    assert value == _brute_force_min_cut(w) == _cut_value(w, side_a)


def test_is_deterministic_and_permutation_consistent() -> None:
    rng = np.random.default_rng(7)
    w = _random_symmetric(rng, 12, integer=False)
    assert stoer_wagner(w) == stoer_wagner(w.copy())
    perm = rng.permutation(12)
    value, _, _ = stoer_wagner(w[np.ix_(perm, perm)])
    assert value == pytest.approx(stoer_wagner(w)[0], abs=1e-12)


def test_agrees_with_networkx_on_larger_graphs() -> None:
    nx = pytest.importorskip("networkx")
    rng = np.random.default_rng(3)
    for n in (10, 25, 40):
        w = _random_symmetric(rng, n, integer=False)
        g = nx.Graph()
        g.add_weighted_edges_from((i, j, w[i, j]) for i in range(n) for j in range(i + 1, n))
        expected, _ = nx.stoer_wagner(g)
        value, side_a, side_b = stoer_wagner(w)
        _check_sides(n, side_a, side_b)
        assert value == pytest.approx(expected, rel=1e-9)


def test_tiny_negative_rounding_noise_is_tolerated() -> None:
    # cosine + 1 of opposed vectors may land a few ulps below zero: clipped to 0, not rejected
    w = np.array([[0.0, -1e-16, 1.0], [-1e-16, 0.0, 3.0], [1.0, 3.0, 0.0]])
    assert stoer_wagner(w) == (1.0, (0,), (1, 2))


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (np.zeros((2, 3)), "square"),
        (np.zeros(4), "square"),
        (np.zeros((1, 1)), "at least 2 vertices"),
        (np.array([[0.0, 1.0], [2.0, 0.0]]), "symmetric"),
        (np.array([[0.0, np.nan], [np.nan, 0.0]]), "finite"),
        (np.array([[0.0, np.inf], [np.inf, 0.0]]), "finite"),
        (np.array([[0.0, -1.0], [-1.0, 0.0]]), "non-negative"),
    ],
)
def test_stoer_wagner_rejects_invalid_weights(weights: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        stoer_wagner(weights)


def test_stoer_wagner_does_not_modify_its_input() -> None:
    w = _graph(3, {(0, 1): 1, (1, 2): 2})
    np.fill_diagonal(w, 4.0)
    before = w.copy()
    stoer_wagner(w)
    np.testing.assert_array_equal(w, before)


# --- DTW --------------------------------------------------------------------------------------


def test_dtw_identical_sequences() -> None:
    assert dtw_distance(np.array([0.0, 1.0, 2.0]), np.array([0.0, 1.0, 2.0])) == 0.0


def test_dtw_absorbs_a_shift() -> None:
    # path (0,0) (1,0) (2,1) (2,2) pairs 0-0, 0-0, 1-1, 1-1: every step costs 0
    assert dtw_distance(np.array([0.0, 0.0, 1.0]), np.array([0.0, 1.0, 1.0])) == 0.0


def test_dtw_hand_computed() -> None:
    # a = [1, 2, 3], b = [2, 2, 2]; squared differences: row a=1: 1 1 1, a=2: 0 0 0, a=3: 1 1 1
    # accumulated cost c[i, j] = d[i, j] + min(c[i-1, j], c[i, j-1], c[i-1, j-1]):
    #   row 0: 1, 2, 3
    #   row 1: 0 + 1 = 1, 0 + min(2, 1, 1) = 1, 0 + min(3, 1, 2) = 1
    #   row 2: 1 + 1 = 2, 1 + min(1, 2, 1) = 2, 1 + min(1, 2, 1) = 2
    # distance = sqrt(c[2, 2]) = sqrt(2)
    assert dtw_distance(np.array([1.0, 2.0, 3.0]), np.array([2.0, 2.0, 2.0])) == math.sqrt(2)


def test_dtw_different_lengths() -> None:
    # one element in a: every b_j must be matched to it: sqrt(1 + 4 + 9)
    assert dtw_distance(np.array([0.0]), np.array([1.0, 2.0, 3.0])) == math.sqrt(14)
    # [0, 2] vs [0, 1, 2]: 1 goes to 0 or 2 at cost 1
    assert dtw_distance(np.array([0.0, 2.0]), np.array([0.0, 1.0, 2.0])) == 1.0
    assert dtw_distance(np.array([0.0, 1.0, 2.0]), np.array([0.0, 2.0])) == 1.0


def test_dtw_is_at_most_euclidean_for_equal_lengths() -> None:
    rng = np.random.default_rng(11)
    for _ in range(50):
        a, b = rng.normal(size=6), rng.normal(size=6)
        assert dtw_distance(a, b) <= np.linalg.norm(a - b) + 1e-12
        assert dtw_distance(a, b) == pytest.approx(dtw_distance(b, a))


def test_dtw_matrix_is_symmetric_with_zero_diagonal() -> None:
    seqs = [np.array([1.0, 2.0, 3.0]), np.array([2.0, 2.0, 2.0]), np.array([0.0])]
    d = dtw_matrix(seqs)
    assert d.shape == (3, 3)
    np.testing.assert_array_equal(d, d.T)
    np.testing.assert_array_equal(np.diag(d), 0.0)
    assert d[0, 1] == math.sqrt(2)
    assert d[0, 2] == math.sqrt(1 + 4 + 9)
    assert d[1, 2] == math.sqrt(12)


@pytest.mark.parametrize(
    ("a", "message"),
    [([], "non-empty 1-D"), ([[1.0, 2.0]], "non-empty 1-D"), ([1.0, np.nan], "finite")],
)
def test_dtw_rejects_invalid_sequences(a: list[object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dtw_distance(np.array(a), np.array([1.0]))
    with pytest.raises(ValueError, match=message):
        dtw_distance(np.array([1.0]), np.array(a))


def test_standardize_divides_by_population_std_without_centring() -> None:
    np.testing.assert_allclose(standardize(np.array([1.0, 3.0])), [1.0, 3.0])  # std 1
    np.testing.assert_allclose(standardize(np.array([2.0, 6.0])), [1.0, 3.0])  # std 2
    np.testing.assert_array_equal(standardize(np.array([5.0, 5.0])), [5.0, 5.0])  # std 0


# --- Split rule -------------------------------------------------------------------------------

EPS1, EPS2 = 0.07, 0.28
DUE: dict[str, Any] = {
    "mean_norm": 0.05,
    "max_norm": 0.3,
    "size": 4,
    "round": 30,
    "eps1": EPS1,
    "eps2": EPS2,
}


def test_presets() -> None:
    assert GCFL_PRESETS["MOLECULES"] == GcflPreset(eps1=0.07, eps2=0.28, seq_length=5)
    assert GCFL_PRESETS["oneDS-PROTEINS"] == GcflPreset(0.03, 0.06, 10)
    assert set(GCFL_PRESETS) == {
        "oneDS-PROTEINS", "oneDS-IMDB-BINARY", "oneDS-NCI1", "MOLECULES", "BIOCHEM", "MIX",
    }  # fmt: skip
    assert all(p.eps1 < p.eps2 for p in GCFL_PRESETS.values())
    assert (MIN_SPLIT_ROUND, MIN_SPLIT_SIZE) == (21, 3)


def test_all_conditions_met_splits() -> None:
    assert split_reasons(**DUE) == []
    assert split_due(**DUE)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"mean_norm": 0.081}, "mean update norm 0.081 >= eps1 0.07"),
        ({"max_norm": 0.2}, "max update norm 0.2 <= eps2 0.28"),
        ({"size": 2}, "cluster size 2 < 3"),
        ({"round": 5}, "round 5 < 21"),
        # boundaries: the inequalities are strict for the norms
        ({"mean_norm": EPS1}, "mean update norm 0.07 >= eps1 0.07"),
        ({"max_norm": EPS2}, "max update norm 0.28 <= eps2 0.28"),
        ({"round": 20}, "round 20 < 21"),
    ],
)
def test_each_failing_condition_alone_blocks_the_split(change: dict[str, Any], reason: str) -> None:
    args = {**DUE, **change}
    assert split_reasons(**args) == [reason]
    assert not split_due(**args)


@pytest.mark.parametrize("change", [{"round": 21}, {"size": 3}, {"mean_norm": 0.0699}])
def test_boundaries_that_allow_the_split(change: dict[str, Any]) -> None:
    assert split_due(**{**DUE, **change})


def test_all_conditions_failing_lists_all_reasons() -> None:
    reasons = split_reasons(mean_norm=1.0, max_norm=0.0, size=1, round=0, eps1=EPS1, eps2=EPS2)
    assert len(reasons) == 4


@pytest.mark.parametrize("change", [{"mean_norm": math.nan}, {"max_norm": math.inf}])
def test_split_rule_rejects_non_finite_norms(change: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="update norms must be finite"):
        split_reasons(**{**DUE, **change})


# --- ClusterState -----------------------------------------------------------------------------


def test_cluster_state_split_keeps_creation_order() -> None:
    state = ClusterState(clusters=[("a", "b", "c", "d"), ("e", "f")])
    state.split(0, ("d", "b"), ("c", "a"))
    assert state.clusters == [("b", "d"), ("e", "f"), ("a", "c")]
    assert [state.cluster_of(s) for s in "abcdef"] == [2, 0, 2, 0, 1, 1]
    state.split(1, ("e",), ("f",))
    assert state.clusters == [("b", "d"), ("e",), ("a", "c"), ("f",)]


def test_cluster_state_json_round_trip() -> None:
    state = ClusterState(
        clusters=[("a", "c"), ("b",)], sequences={"a": [0.1, 0.25], "b": [], "c": [1e-9]}
    )
    restored = ClusterState.from_json(json.loads(json.dumps(state.to_json())))
    assert restored == state
    assert restored.clusters == [("a", "c"), ("b",)]


def test_cluster_state_sequences_default_empty() -> None:
    assert ClusterState(clusters=[("a",)]).sequences == {}


@pytest.mark.parametrize(
    ("index", "side_a", "side_b", "message"),
    [
        (0, ("a",), ("b",), "do not partition"),  # c is lost
        (0, ("a", "b"), ("b", "c"), "overlap"),
        (0, ("a", "b", "c"), (), "non-empty"),
        (0, ("a", "x"), ("b", "c"), "do not partition"),
        (0, ("a", "a"), ("b", "c"), "do not partition"),  # duplicate member
        (2, ("a",), ("b", "c"), "no cluster 2"),
        (-1, ("d",), ("e",), "no cluster -1"),
    ],
)
def test_cluster_state_split_validation(
    index: int, side_a: tuple[str, ...], side_b: tuple[str, ...], message: str
) -> None:
    state = ClusterState(clusters=[("a", "b", "c"), ("d", "e")])
    with pytest.raises(ValueError, match=message):
        state.split(index, side_a, side_b)
    assert state.clusters == [("a", "b", "c"), ("d", "e")]


@pytest.mark.parametrize(
    ("clusters", "message"),
    [
        ([("b", "a")], "sorted"),
        ([("a", "a")], "sorted without duplicates"),
        ([("a", "b"), ("b", "c")], "more than one cluster"),
        ([()], "empty"),
    ],
)
def test_cluster_state_rejects_invalid_clusters(
    clusters: list[tuple[str, ...]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ClusterState(clusters=clusters)


def test_cluster_of_unknown_silo() -> None:
    with pytest.raises(ValueError, match="'z' is in no cluster"):
        ClusterState(clusters=[("a",)]).cluster_of("z")


@pytest.mark.parametrize("data", [{}, {"clusters": 3}, {"clusters": [["a"]], "sequences": [1.0]}])
def test_from_json_rejects_malformed_state(data: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="malformed cluster state"):
        ClusterState.from_json(data)


# --- Named cuts -------------------------------------------------------------------------------


def _cosine_plus_one(vectors: np.ndarray) -> np.ndarray:
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return unit @ unit.T + 1.0


def test_similarity_split_separates_opposed_updates() -> None:
    rng = np.random.default_rng(0)
    direction = rng.normal(size=50)
    updates = np.stack(
        [direction + 0.1 * rng.normal(size=50) for _ in range(3)]
        + [-direction + 0.1 * rng.normal(size=50) for _ in range(4)]
    )
    members = ["s6", "s1", "s4", "s0", "s3", "s5", "s2"]  # first three share a direction
    assert similarity_split(members, _cosine_plus_one(updates)) == (
        ("s0", "s2", "s3", "s5"),
        ("s1", "s4", "s6"),
    )


def test_similarity_split_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least 2 members"):
        similarity_split(["a"], np.zeros((1, 1)))
    with pytest.raises(ValueError, match="distinct"):
        similarity_split(["a", "a"], np.ones((2, 2)))
    with pytest.raises(ValueError, match="must be 3x3"):
        similarity_split(["a", "b", "c"], np.ones((2, 2)))
    with pytest.raises(ValueError, match="non-negative"):
        similarity_split(["a", "b"], np.array([[2.0, -0.5], [-0.5, 2.0]]))


def test_sequence_split_separates_two_trends() -> None:
    falling = [1.0, 0.8, 0.6, 0.4, 0.2]
    rising = [0.2, 0.4, 0.6, 0.8, 1.0]
    sequences = {
        # older values beyond seq_length are ignored, however wild
        "a": [99.0, *falling],
        "b": [-50.0, *[v + 0.01 for v in falling]],
        "c": [v - 0.02 for v in falling],
        "d": rising,
        "e": [v + 0.03 for v in rising],
    }
    expected = (("a", "b", "c"), ("d", "e"))
    assert sequence_split(list("abcde"), sequences, seq_length=5) == expected
    # the side holding the smallest name comes first, whatever order the members are listed in
    assert sequence_split(["e", "a", "d", "c", "b"], sequences, seq_length=5) == expected


def test_sequence_split_standardize_compares_shapes_not_scales() -> None:
    shape_1 = np.array([1.0, 2.0, 1.0, 2.0, 1.0])
    shape_2 = np.array([2.0, 1.0, 1.0, 1.0, 2.0])
    sequences = {
        "a": list(shape_1),
        "b": list(10 * shape_1),
        "c": list(10.5 * shape_2),
        "d": list(shape_2),
    }
    # raw values group by scale, standardized ones by shape
    assert sequence_split(list("abcd"), sequences, 5) == (("a", "d"), ("b", "c"))
    assert sequence_split(list("abcd"), sequences, 5, standardize=True) == (
        ("a", "b"),
        ("c", "d"),
    )


def test_sequence_split_rejects_bad_input() -> None:
    sequences = {"a": [1.0, 2.0], "b": [2.0, 1.0], "c": []}
    with pytest.raises(ValueError, match=r"no update-norm sequence for \['z'\]"):
        sequence_split(["a", "z"], sequences, 2)
    with pytest.raises(ValueError, match="seq_length must be positive"):
        sequence_split(["a", "b"], sequences, 0)
    with pytest.raises(ValueError, match="update-norm sequence of 'c' must be a non-empty"):
        sequence_split(["a", "c"], sequences, 2)
    with pytest.raises(ValueError, match="at least 2 members"):
        sequence_split(["a"], sequences, 2)
