"""A dataset's own split (a prepared scaffold split): checked against its graphs, preferred to
the stratified split, and refused, like it, when a part is empty or a class has no training
graph."""

from __future__ import annotations

import numpy as np
import pytest

from trellis.silo.data.split import (
    DatasetTooSmall,
    InvalidSplit,
    given_split,
    silo_split,
    stratified_split,
)

LABELS = np.array([0, 1] * 10)


def _parts(train: list[int], val: list[int], test: list[int]) -> dict[str, np.ndarray]:
    return {"train": np.array(train, np.int64), "val": np.array(val, np.int64),
            "test": np.array(test, np.int64)}


def test_a_given_split_is_used_as_it_is_and_the_seed_is_ignored() -> None:
    parts = _parts(list(range(2, 18)), [18, 0], [19, 1])
    for seed in (123, 7):
        split = silo_split(LABELS, parts, "silo 'a'", seed=seed)
        assert split.train.tolist() == list(range(2, 18))
        assert split.val.tolist() == [0, 18] and split.test.tolist() == [1, 19]
        assert split.train.dtype == np.int64 and not split.train.flags.writeable


def test_without_a_given_split_the_stratified_split_is_used() -> None:
    split = silo_split(LABELS, None, "silo 'a'", seed=5)
    expected = stratified_split(LABELS, seed=5)
    for part in ("train", "val", "test"):
        assert np.array_equal(getattr(split, part), getattr(expected, part))


def test_a_class_may_be_absent_from_validation_and_test() -> None:
    # A scaffold split can put a whole class's scaffolds in training: still trainable.
    split = silo_split(LABELS, _parts(list(range(16)), [16, 18], [17, 19]), "silo 'a'")
    assert set(LABELS[split.val].tolist()) == {0}


def test_a_class_absent_from_training_is_refused_with_the_prepared_advice() -> None:
    odd = [i for i in range(20) if i % 2]
    with pytest.raises(DatasetTooSmall, match=r"classes \[0\] would have no training graph; "
                       r"its prepared split .* without the scaffold split"):
        silo_split(LABELS, _parts(odd, [0, 2], [4, 6, 8, 10, 12, 14, 16, 18]), "silo 'a'")


def test_an_empty_part_is_refused() -> None:
    with pytest.raises(DatasetTooSmall, match="the validation split would be empty"):
        silo_split(LABELS, _parts(list(range(18)), [], [18, 19]), "data/x")


@pytest.mark.parametrize(("parts", "message"), [
    ({"train": np.arange(10), "test": np.arange(10, 20)},
     r"has the parts \['test', 'train'\]; expected train, val and test"),
    (_parts([0, 1, 20], [2], [3]), r"the train part .* names graph 20, but it has 20 graphs "
                                   r"\(0\.\.19\)"),
    (_parts([0, 1, -1], [2], [3]), "names graph -1"),
    (_parts([0, 1, 2], [2], [3]), "graph 2 is named twice"),
    ({"train": np.array([0.0, 1.0]), "val": np.array([2]), "test": np.array([3])},
     "the train part .* is not a list of graph numbers"),
])
def test_a_split_that_does_not_fit_the_graphs_is_refused(parts: dict[str, np.ndarray],
                                                         message: str) -> None:
    with pytest.raises(InvalidSplit, match=f"^silo 'a': .*{message}"):
        given_split(parts, 20, "silo 'a'")
