"""A silo's evaluation counts ([metrics] aggregate), hand-computed: correct, evaluated, clipped
loss sums and per-class counts, the same from log-probabilities as from logits, and never moved
by one example further than the plan's sensitivity says."""

from __future__ import annotations

import math
from itertools import product

import numpy as np
import pytest

from trellis.protos.metrics_plan import MetricsConfig, counts_sensitivity, encode_counts
from trellis.silo.federation.evaluation_counts import evaluation_counts, split_counts

CONFIG = MetricsConfig(aggregate=True, classes=3, loss_clip=2.0)


def test_counts_of_a_small_split_by_hand() -> None:
    labels = np.array([0, 1, 2, 1])
    probs = np.array([[0.7, 0.2, 0.1],     # right, loss -ln 0.7
                      [0.6, 0.3, 0.1],     # wrong, loss -ln 0.3
                      [0.1, 0.1, 0.8],     # right, loss -ln 0.8
                      [0.98, 0.01, 0.01]])  # wrong, loss -ln 0.01 = 4.6: clipped to 2
    counts = split_counts(labels, np.log(probs), "val", CONFIG)
    loss = -math.log(0.7) - math.log(0.3) - math.log(0.8) + 2.0
    assert counts == pytest.approx({
        "val_correct": 2, "val_count": 4, "val_loss_sum": loss,
        "val_correct_0": 1, "val_correct_1": 0, "val_correct_2": 1,
        "val_count_0": 1, "val_count_1": 2, "val_count_2": 1})
    # Logits (FedHGN's outputs) give the same losses as their log-probabilities.
    logits = np.log(probs) + np.array([[3.0], [-1.0], [0.5], [2.0]])
    assert split_counts(labels, logits, "val", CONFIG) == pytest.approx(counts)


def test_an_empty_split_counts_nothing_and_a_label_beyond_the_classes_is_refused() -> None:
    empty = split_counts(np.zeros(0, np.int64), np.zeros((0, 3)), "test", CONFIG)
    assert empty == dict.fromkeys(empty, 0.0) and empty["test_count"] == 0
    with pytest.raises(ValueError, match="outside the plan's 3 classes"):
        split_counts(np.array([3]), np.zeros((1, 4)), "val", CONFIG)
    both = evaluation_counts(lambda split: (np.array([0]), np.array([[0.0, -1.0, -2.0]])),
                             CONFIG)
    assert both["val_correct"] == both["test_correct"] == 1


def test_one_example_moves_the_slots_by_the_stated_sensitivity() -> None:
    """Every neighbouring pair of a small split (one graph added or changed), with per-class
    slots: the encoded counts never move further than counts_sensitivity says."""
    config = MetricsConfig(aggregate=True, classes=2, loss_clip=2.0)

    def encoded(rows: list[tuple[int, int, float]]) -> np.ndarray:
        labels = np.array([r[0] for r in rows], np.int64)
        outputs = np.array([[r[2], 0.0] if r[1] == 0 else [0.0, r[2]] for r in rows])
        return encode_counts(split_counts(labels, outputs.reshape(-1, 2), "val", config), config)

    base = [(0, 0, 1.3), (1, 0, 0.4), (1, 1, 2.2)]
    l2, l1 = counts_sensitivity(config)
    for label, predicted, score in product((0, 1), (0, 1), (0.1, 7.0)):
        extra = (label, predicted, score)
        for other in ([*base, extra], [*base[:2], extra]):
            moved = (encoded(other) - encoded(base)).astype(np.float64)
            assert np.linalg.norm(moved) <= l2 and np.abs(moved).sum() <= l1
