"""The train/validation/test split of the labelled target entities: stratified and seeded.

Per class, a seeded shuffle puts 20 % (rounded half up) in test and 20 % of the rest in
validation, the rest in training: the proportions of the FedHGN paper's AIFB (112/28/36, where
validation is 20 % of DGL's training nodes, docs/algorithms.md §5.1). A class of one or two
entities stays in training.
"""

from __future__ import annotations

import numpy as np

SEED = 12345            # the FedHGN preparation's seed (docs/algorithms.md §5.1)
TEST_SHARE = 0.2
VAL_SHARE = 0.2         # of what test leaves
DESCRIPTION = ("stratified per class: 20% test, then 20% of the rest validation, seed "
               f"{SEED}")


def stratified_node_split(labels: np.ndarray, seed: int = SEED
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, val, test) indices of the labelled entries (label >= 0), each sorted int64."""
    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": []}
    for label in np.unique(labels[labels >= 0]):
        members = np.flatnonzero(labels == label)
        members = members[rng.permutation(members.size)]
        n_test = _round_half_up(TEST_SHARE * members.size)
        n_val = _round_half_up(VAL_SHARE * (members.size - n_test))
        parts["test"].append(members[:n_test])
        parts["val"].append(members[n_test:n_test + n_val])
        parts["train"].append(members[n_test + n_val:])
    train, val, test = (np.sort(np.concatenate(parts[k] or [np.zeros(0, np.int64)]))
                        .astype(np.int64) for k in ("train", "val", "test"))
    return train, val, test


def _round_half_up(value: float) -> int:
    return int(np.floor(value + 0.5))
