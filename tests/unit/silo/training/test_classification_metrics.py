"""ROC-AUC and balanced accuracy on hand-made scores whose values are known."""

from __future__ import annotations

import math
from itertools import product

import numpy as np
import pytest

from trellis.silo.training.classification_metrics import (
    average_ranks,
    balanced_accuracy,
    roc_auc,
    split_figures,
    split_metrics,
)


def _pairwise_auc(labels: list[int], scores: list[float]) -> float:
    """The definition: the share of (positive, negative) pairs ranked right, ties one half."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y == 1]
    neg = [s for s, y in zip(scores, labels, strict=True) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_roc_auc_of_perfect_reversed_and_hand_counted_rankings() -> None:
    assert roc_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.2, 0.8, 0.9])) == 1.0
    assert roc_auc(np.array([0, 0, 1, 1]), np.array([0.9, 0.8, 0.2, 0.1])) == 0.0
    # Pairs (pos, neg): (0.35>0.1) (0.35<0.4) (0.8>0.1) (0.8>0.4): 3 of 4 right.
    assert roc_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8])) == 0.75


def test_ties_count_one_half_as_mann_whitney() -> None:
    # Every score equal: each pair is a tie, the area 1/2 whatever the labels.
    assert roc_auc(np.array([1, 0, 0, 1, 0]), np.full(5, 0.3)) == 0.5
    # One tie between a positive and a negative (0.5), the other pairs right: (3 + 0.5) / 4.
    assert roc_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.5, 0.5, 0.9])) == 0.875
    # Ties within a class change nothing.
    assert roc_auc(np.array([0, 0, 1, 1]), np.array([0.2, 0.2, 0.7, 0.7])) == 1.0


def test_roc_auc_matches_the_pairwise_definition_on_random_tied_scores() -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        n = int(rng.integers(2, 30))
        labels = rng.integers(0, 2, n)
        labels[:2] = (0, 1)                     # both classes present
        scores = rng.integers(0, 5, n) / 4.0    # few distinct values: many ties
        assert roc_auc(labels, scores) == pytest.approx(
            _pairwise_auc(labels.tolist(), scores.tolist()), abs=1e-12)


def test_a_split_with_one_class_has_no_roc_auc_and_no_crash() -> None:
    assert math.isnan(roc_auc(np.array([1, 1, 1]), np.array([0.2, 0.9, 0.4])))
    assert math.isnan(roc_auc(np.array([0, 0]), np.array([0.2, 0.9])))
    assert math.isnan(roc_auc(np.array([], np.int64), np.array([])))
    assert math.isnan(roc_auc(np.array([0, 1]), np.array([0.2, np.nan])))
    with pytest.raises(ValueError, match="binary labels"):
        roc_auc(np.array([0, 2]), np.array([0.1, 0.2]))


def test_average_ranks_share_the_mean_of_tied_positions() -> None:
    assert average_ranks(np.array([3.0, 1.0, 3.0, 2.0])).tolist() == [3.5, 1.0, 3.5, 2.0]


def test_balanced_accuracy_sees_through_a_majority_vote_where_accuracy_misleads() -> None:
    # 90 negatives, 10 positives; the model says "negative" for everything.
    labels = np.array([0] * 90 + [1] * 10)
    always_negative = np.zeros(100, np.int64)
    assert float(np.mean(always_negative == labels)) == 0.9       # accuracy: looks good
    assert balanced_accuracy(labels, always_negative) == 0.5      # recall 1 and 0
    # Half the positives found at the cost of 9 false alarms: accuracy drops, balanced rises.
    better = always_negative.copy()
    better[90:95] = 1
    better[:9] = 1
    assert float(np.mean(better == labels)) == pytest.approx(0.86)
    assert balanced_accuracy(labels, better) == pytest.approx((81 / 90 + 5 / 10) / 2)


def test_balanced_accuracy_averages_over_the_classes_present_only() -> None:
    # Class 2 is absent from the split; predicting it is just wrong for the others.
    labels = np.array([0, 0, 1, 1, 1, 1])
    predicted = np.array([0, 2, 1, 1, 1, 0])
    assert balanced_accuracy(labels, predicted) == pytest.approx((1 / 2 + 3 / 4) / 2)
    assert math.isnan(balanced_accuracy(np.array([], np.int64), np.array([], np.int64)))


def test_split_figures_rank_by_the_positive_class_and_skip_roc_auc_beyond_two() -> None:
    log_probs = np.log(np.array([[0.9, 0.1], [0.4, 0.6], [0.7, 0.3], [0.2, 0.8]]))
    figures = split_figures(np.array([0, 0, 1, 1]), log_probs)
    assert figures == {"acc": 0.5, "balanced_acc": 0.5, "roc_auc": 0.75}
    three = split_figures(np.array([0, 1, 2]), np.eye(3))
    assert three == {"acc": 1.0, "balanced_acc": 1.0}


def test_split_metrics_evaluates_only_the_splits_asked_for() -> None:
    asked: list[str] = []

    def evaluate(split: str) -> dict[str, float]:
        asked.append(split)
        return {"acc": 0.5, "loss": 1.0, "balanced_acc": 0.25, "count": 4.0}

    values = split_metrics(evaluate, ["test_balanced_acc", "train_loss", "val_roc_auc"],
                           ("acc", "loss", "balanced_acc", "roc_auc"))
    assert values == {"test_balanced_acc": 0.25} and asked == ["val", "test"]
    asked.clear()
    assert split_metrics(evaluate, ["val_count"], ("acc",)) == {} and asked == []
