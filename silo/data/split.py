"""The train/val/test split of one silo's graphs: the dataset's own split when it carries one (a
prepared scaffold split, docs/data/splits.md), else a stratified 80/10/10 split
(docs/algorithms.md §1.2).

The reference calls scikit-learn twice with ``random_state=123``:
``train_test_split(test_size=0.2, stratify=y)`` and then splits the rest in half. We draw
exactly what scikit-learn's ``StratifiedShuffleSplit`` draws (the same per-class counts from
its largest-remainder rule, the same permutations from NumPy's legacy generator), so a silo
holds the very graphs the reference puts in each part. Where scikit-learn refuses the data (a
class with a single member, fewer graphs in a part than classes), we fall back to a
proportional split with the same sizes that keeps single-member classes in training.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, eq=False)
class Split:
    """Sorted int64 index arrays of the train, validation and test graphs."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray


def stratified_split(labels: np.ndarray, *, seed: int = 123, test_fraction: float = 0.2) -> Split:
    """Split indices 0..n-1 into train/val/test, stratified by label and deterministic per seed."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"labels must be a non-empty 1-D array; got shape {labels.shape}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1); got {test_fraction}")
    n_rest = math.ceil(test_fraction * labels.size)
    first = _shuffle_split(labels, labels.size - n_rest, n_rest, seed)
    if first is not None:
        train, rest = first
        n_test = math.ceil(0.5 * rest.size)
        second = _shuffle_split(labels[rest], rest.size - n_test, n_test, seed)
        if second is not None:
            return Split(train=_frozen(train), val=_frozen(rest[second[0]]),
                         test=_frozen(rest[second[1]]))
    rng = np.random.default_rng(seed)
    everything = np.arange(labels.size)
    train, rest = _stratified_cut(everything, labels, n_rest, rng, keep_singletons=True)
    val, test = _stratified_cut(rest, labels[rest], math.ceil(0.5 * rest.size), rng)
    return Split(train=_frozen(train), val=_frozen(val), test=_frozen(test))


def _shuffle_split(labels: np.ndarray, n_train: int, n_test: int,
                   seed: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Positions (train, test), in the order scikit-learn's StratifiedShuffleSplit returns them.

    None where scikit-learn would refuse: a class with one member, or a part smaller than
    the number of classes.
    """
    _, class_of, counts = np.unique(labels, return_inverse=True, return_counts=True)
    if counts.min() < 2 or min(n_train, n_test) < counts.size:
        return None
    by_class = np.split(np.argsort(class_of, kind="stable"), np.cumsum(counts)[:-1])
    rng = np.random.RandomState(seed)
    n_i = _approximate_mode(counts, n_train, rng)
    t_i = _approximate_mode(counts - n_i, n_test, rng)
    train: list[int] = []
    test: list[int] = []
    for members, n, t in zip(by_class, n_i, t_i, strict=True):
        shuffled = members.take(rng.permutation(members.size), mode="clip")
        train.extend(shuffled[:n])
        test.extend(shuffled[n:n + t])
    return rng.permutation(np.asarray(train, np.int64)), rng.permutation(np.asarray(test, np.int64))


def _approximate_mode(counts: np.ndarray, draws: int, rng: np.random.RandomState) -> np.ndarray:
    """Per-class draws: floors of the proportional shares, the rest by largest remainder.

    Ties among equal remainders are broken by ``rng.choice``, as scikit-learn does; the float
    expression is scikit-learn's too, since it decides which remainders tie.
    """
    continuous = counts / counts.sum() * draws
    floored = np.floor(continuous)
    need = int(draws - floored.sum())
    remainder = continuous - floored
    for value in np.sort(np.unique(remainder))[::-1]:
        if need <= 0:
            break
        (tied,) = np.where(remainder == value)
        now = min(tied.size, need)
        floored[rng.choice(tied, size=now, replace=False)] += 1
        need -= now
    return floored.astype(np.int64)


def _frozen(indices: np.ndarray) -> np.ndarray:
    out = np.sort(indices).astype(np.int64)
    out.setflags(write=False)
    return out


def _stratified_cut(
    indices: np.ndarray,
    labels: np.ndarray,
    n_second: int,
    rng: np.random.Generator,
    *,
    keep_singletons: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Cut ``indices`` into (first, second) with ``len(second) == n_second`` per class share."""
    if indices.size == 0:
        return indices, indices
    classes, class_of = np.unique(labels, return_inverse=True)
    counts = np.bincount(class_of, minlength=classes.size)
    # scikit-learn refuses a class with a single member; we keep such a graph in train.
    capacity = np.where(counts > 1, counts, 0) if keep_singletons else counts
    take = _allocate(n_second, counts, capacity)
    first, second = [], []
    for c in range(classes.size):
        members = rng.permutation(indices[class_of == c])
        second.append(members[: take[c]])
        first.append(members[take[c] :])
    return np.concatenate(first), np.concatenate(second)


def _allocate(total: int, counts: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Share ``total`` among classes proportionally to ``counts`` (largest remainder, capped)."""
    quota = counts * total / counts.sum()
    take = np.minimum(np.floor(quota).astype(np.int64), capacity)
    remainder = quota - np.floor(quota)
    # Largest remainder first; ties go to the larger class, then to the smaller label.
    order = np.lexsort((np.arange(counts.size), -counts, -remainder))
    while take.sum() < total and np.any(take < capacity):
        for c in order:
            if take.sum() == total:
                break
            if take[c] < capacity[c]:
                take[c] += 1
    return take


# With 20 % held out and halved into validation and test (both rounded up), 6 graphs is the
# fewest that leaves each of the three parts at least one graph.
MIN_GRAPHS = 6


class DatasetTooSmall(ValueError):
    """A dataset whose split would leave a part empty or a class out of training."""


def graph_labels(graphs: Sequence[Any]) -> np.ndarray:
    """Each graph's class (its `y`), the labels a split stratifies by."""
    return np.array([int(g.y.view(-1)[0]) for g in graphs])


def check_split(labels: np.ndarray, split: Split, name: str, *, advice: str = "") -> None:
    """Refuse a split that cannot be trained and evaluated: an empty part (its accuracy would be
    undefined) or a class missing from training; say the counts and the minimum (or ``advice``).

    A class may be missing from validation or test: a small class can fall wholly in training
    (stratified), or wholly in one scaffold group (a scaffold split); those parts are still
    evaluated on the classes they hold.
    """
    labels = np.asarray(labels)
    classes, counts = np.unique(labels, return_counts=True)
    parts = {"training": split.train, "validation": split.val, "test": split.test}
    empty = [part for part, index in parts.items() if index.size == 0]
    missing = sorted(set(classes.tolist()) - set(labels[split.train].tolist()))
    if not empty and not missing:
        return
    per_class = ", ".join(f"class {c}: {n}" for c, n in zip(classes, counts, strict=True))
    sizes = ", ".join(f"{index.size} {part}" for part, index in parts.items())
    problem = (f"the {' and '.join(empty)} split would be empty" if empty else
               f"classes {missing} would have no training graph")
    raise DatasetTooSmall(
        f"{name}: {labels.size} graphs ({per_class}) split into {sizes}: {problem}; "
        + (advice or f"a silo needs at least {MIN_GRAPHS} graphs and every class in training. "
           "Add graphs, or leave this silo out of the federation"))


class InvalidSplit(ValueError):
    """A dataset's own split that does not fit its graphs: a part missing, a graph number out of
    range, or a graph in two parts."""


PARTS = ("train", "val", "test")

PREPARED_ADVICE = ("its prepared split must give every part a graph and training every class. "
                   "Prepare it again without the scaffold split (the silo then splits it "
                   "stratified by class), add graphs, or leave this silo out of the federation")


def given_split(parts: Mapping[str, np.ndarray], size: int, name: str) -> Split:
    """A dataset's own split ({"train", "val", "test"} -> graph numbers) as a Split, checked
    against its ``size`` graphs."""
    if sorted(parts) != sorted(PARTS):
        raise InvalidSplit(f"{name}: its prepared split has the parts {sorted(parts)}; expected "
                           "train, val and test. Prepare it again")
    arrays = {part: np.asarray(parts[part]) for part in PARTS}
    for part, index in arrays.items():
        if index.ndim != 1 or (index.size and not np.issubdtype(index.dtype, np.integer)):
            raise InvalidSplit(f"{name}: the {part} part of its prepared split is not a list of "
                               "graph numbers. Prepare it again")
        outside = index[(index < 0) | (index >= size)]
        if outside.size:
            raise InvalidSplit(f"{name}: the {part} part of its prepared split names graph "
                               f"{int(outside[0])}, but it has {size} graphs (0..{size - 1}). "
                               "Prepare it again")
    numbers, counts = np.unique(np.concatenate([a.astype(np.int64) for a in arrays.values()]),
                                return_counts=True)
    if np.any(counts > 1):
        raise InvalidSplit(f"{name}: graph {int(numbers[counts > 1][0])} is named twice in its "
                           "prepared split (a graph belongs to one part). Prepare it again")
    train, val, test = (_frozen(arrays[part].astype(np.int64)) for part in PARTS)
    return Split(train=train, val=val, test=test)


def silo_split(labels: np.ndarray, given: Mapping[str, np.ndarray] | None, name: str, *,
               seed: int = 123) -> Split:
    """The split a silo trains on, checked: the dataset's own (a prepared scaffold split) when
    it carries one, else the stratified split drawn with ``seed``."""
    labels = np.asarray(labels)
    if given is None:
        split = stratified_split(labels, seed=seed)
        check_split(labels, split, name)
    else:
        split = given_split(given, labels.size, name)
        check_split(labels, split, name, advice=PREPARED_ADVICE)
    return split
