"""Tests for the stratified 80/10/10 split (the very split of scikit-learn's train_test_split)."""

from __future__ import annotations

import gzip
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.paths import TU_ROOT
from trellis.silo.data.split import (
    MIN_GRAPHS,
    DatasetTooSmall,
    Split,
    check_split,
    stratified_split,
)

# Training counts of FedStar App. A.3 (docs/algorithms.md §1.2).
TRAIN_COUNTS = {
    "MUTAG": 150,
    "BZR": 324,
    "COX2": 373,
    "DHFR": 604,
    "PTC_MR": 275,
    "AIDS": 1600,
    "NCI1": 3288,
    "ENZYMES": 480,
    "PROTEINS": 890,
    "IMDB-BINARY": 800,
}


def _graph_labels(name: str) -> np.ndarray:
    path = TU_ROOT / name / f"{name}_graph_labels.txt.gz"
    if not path.is_file():
        pytest.skip(f"shared TU data not available: {path}")
    return np.array(gzip.decompress(path.read_bytes()).split(), dtype=np.int64)


def _check_partition(split: Split, n: int) -> None:
    parts = [split.train, split.val, split.test]
    for part in parts:
        assert part.dtype == np.int64
        assert np.all(np.diff(part) > 0)  # sorted, no repeats
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(n))


@pytest.mark.parametrize(("name", "train"), sorted(TRAIN_COUNTS.items()))
def test_training_counts_match_the_papers(name: str, train: int) -> None:
    labels = _graph_labels(name)
    split = stratified_split(labels)
    n_rest = labels.size - train
    assert split.train.size == train
    assert split.test.size == -(-n_rest // 2) and split.val.size == n_rest // 2
    _check_partition(split, labels.size)


def test_sizes_follow_scikit_learn() -> None:
    # n=10: rest = ceil(2.0) = 2 -> val 1, test 1; n=11: rest = ceil(2.2) = 3 -> val 1, test 2.
    split = stratified_split(np.array([0, 1] * 5))
    assert (split.train.size, split.val.size, split.test.size) == (8, 1, 1)
    split = stratified_split(np.array([0] * 6 + [1] * 5))
    assert (split.train.size, split.val.size, split.test.size) == (8, 1, 2)


@pytest.mark.parametrize(("labels", "seed", "val", "test"), [
    ([0] * 26 + [1] * 14 + [2] * 10, 123, [2, 13, 33, 34, 48], [6, 17, 24, 26, 43]),
    ([0, 1, 1, 0, 2, 2, 1, 0, 1, 1] * 4, 7, [12, 16, 25, 30], [9, 13, 15, 18]),
])
def test_same_graphs_as_scikit_learn(labels: list[int], seed: int, val: list[int],
                                     test: list[int]) -> None:
    """The reference's two train_test_split calls, run with scikit-learn 1.9.1 and pinned here.

    Checked against scikit-learn itself on 221 label arrays (random ones, every TU dataset
    here but COLLAB, the oneDS PROTEINS silos): identical train, val and test sets.
    """
    split = stratified_split(np.array(labels), seed=seed)
    assert split.val.tolist() == val and split.test.tolist() == test


def test_deterministic_for_a_seed_and_seed_matters() -> None:
    labels = np.random.default_rng(0).integers(0, 3, size=500)
    a, b = stratified_split(labels, seed=7), stratified_split(labels, seed=7)
    assert all(
        np.array_equal(x, y)
        for x, y in zip([a.train, a.val, a.test], [b.train, b.val, b.test], strict=True)
    )
    c = stratified_split(labels, seed=8)
    assert not np.array_equal(a.test, c.test)


def test_default_seed_is_123() -> None:
    labels = np.arange(100) % 4
    assert np.array_equal(stratified_split(labels).test, stratified_split(labels, seed=123).test)


def test_arrays_are_read_only() -> None:
    split = stratified_split(np.arange(20) % 2)
    with pytest.raises(ValueError):
        split.train[0] = 5


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(min_value=2, max_value=60), min_size=1, max_size=6),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_stratification_within_one_per_class(counts: list[int], seed: int) -> None:
    labels = np.repeat(np.arange(len(counts)), counts)
    labels = np.random.default_rng(seed).permutation(labels)
    n = labels.size
    split = stratified_split(labels, seed=seed)
    _check_partition(split, n)
    n_rest = math.ceil(0.2 * n)
    assert split.train.size == n - n_rest
    rest_counts = np.bincount(
        labels[np.concatenate([split.val, split.test])], minlength=len(counts)
    )
    for c, count in enumerate(counts):
        assert abs(np.sum(labels[split.train] == c) - count * split.train.size / n) < 1
        share = split.test.size / max(n_rest, 1)
        assert abs(np.sum(labels[split.test] == c) - rest_counts[c] * share) < 1


def test_single_member_classes_stay_in_train() -> None:
    labels = np.array([0] * 10 + [1] * 10 + [2])
    split = stratified_split(labels)
    assert 20 in split.train
    assert split.train.size == 21 - 5
    for labels in (np.array([4]), np.array([0, 1, 2])):
        split = stratified_split(labels)
        assert np.array_equal(split.train, np.arange(labels.size))


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="non-empty 1-D"):
        stratified_split(np.array([], dtype=np.int64))
    with pytest.raises(ValueError, match="non-empty 1-D"):
        stratified_split(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="test_fraction"):
        stratified_split(np.arange(10), test_fraction=1.0)


@pytest.mark.parametrize("n", range(1, 13))
def test_check_split_refuses_exactly_the_datasets_with_an_empty_part(n: int) -> None:
    labels = np.array([i % 2 for i in range(n)])
    split = stratified_split(labels)
    if n < MIN_GRAPHS:
        with pytest.raises(DatasetTooSmall, match=f"{n} graphs .* at least {MIN_GRAPHS} graphs"):
            check_split(labels, split, "silo x")
    else:
        check_split(labels, split, "silo x")      # every part has a graph, training every class
