"""Accuracy, balanced accuracy and ROC-AUC of one split, from labels and model outputs (numpy).

Accuracy misleads on imbalanced data: a model that always predicts the majority class of a
split with 90 % negatives scores 0.9. Balanced accuracy (the mean recall over the classes present
in the split) scores it 1/2 per present class, and ROC-AUC (binary tasks) measures how well
the model ranks positives above negatives whatever the threshold. Both are defined as
scikit-learn's `balanced_accuracy_score` and `roc_auc_score` define them, written here with numpy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np


def balanced_accuracy(labels: np.ndarray, predicted: np.ndarray) -> float:
    """Mean over the classes present in `labels` of the share of their graphs (or nodes)
    predicted as that class; NaN for an empty split."""
    labels, predicted = np.asarray(labels), np.asarray(predicted)
    if labels.shape != predicted.shape:
        raise ValueError(f"labels {labels.shape} and predictions {predicted.shape} differ")
    if labels.size == 0:
        return float("nan")
    present = np.unique(labels)
    recalls = [float(np.mean(predicted[labels == c] == c)) for c in present]
    return float(np.mean(recalls))


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve of binary `labels` (1 positive, 0 negative) ranked by `scores`
    (higher: more likely positive): the Mann-Whitney U of the positives over n_pos * n_neg,
    a tie between a positive and a negative counting one half. NaN when the split holds one
    class only (or none), or a score is not finite: the area is then undefined."""
    labels, scores = np.asarray(labels), np.asarray(scores, dtype=np.float64)
    if labels.shape != scores.shape or labels.ndim != 1:
        raise ValueError(f"labels {labels.shape} and scores {scores.shape} must be equal 1-D")
    if not np.isin(labels, (0, 1)).all():
        raise ValueError("ROC-AUC needs binary labels 0 and 1")
    positives = int(labels.sum())
    negatives = labels.size - positives
    if positives == 0 or negatives == 0 or not np.isfinite(scores).all():
        return float("nan")
    ranks = average_ranks(scores)
    u = float(ranks[labels == 1].sum()) - positives * (positives + 1) / 2.0
    return u / (positives * negatives)


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of `values`, tied values sharing the mean of the ranks they span."""
    values = np.asarray(values)
    order = np.argsort(values, kind="mergesort")
    _, first, counts = np.unique(values[order], return_index=True, return_counts=True)
    ranks = np.empty(values.size, dtype=np.float64)
    ranks[order] = np.repeat(first + (counts + 1) / 2.0, counts)
    return ranks


def split_figures(labels: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
    """acc, balanced_acc and, for two classes, roc_auc of one split from its labels and the
    model's per-class log-probabilities or logits [n, classes] (NaN for an empty split).

    ROC-AUC ranks by the positive class's (index 1's) log-odds, output 1 minus output 0: the
    same order as its probability, without the ties that rounding probabilities to 0 or 1
    would make.
    """
    labels, outputs = np.asarray(labels), np.asarray(outputs, dtype=np.float64)
    if outputs.ndim != 2 or outputs.shape[0] != labels.shape[0]:
        raise ValueError(f"outputs {outputs.shape} do not match {labels.shape[0]} labels")
    predicted = outputs.argmax(axis=1) if labels.size else labels
    figures = {"acc": float(np.mean(predicted == labels)) if labels.size else float("nan"),
               "balanced_acc": balanced_accuracy(labels, predicted)}
    if outputs.shape[1] == 2:
        figures["roc_auc"] = roc_auc(labels, outputs[:, 1] - outputs[:, 0])
    return figures


def split_metrics(evaluate: Callable[[str], Mapping[str, float]], names: Iterable[str],
                  figures: Iterable[str]) -> dict[str, float]:
    """The requested `<split>_<figure>` of 'val' and 'test' for the `figures` offered,
    evaluating only the splits they name (a figure `evaluate` does not give is left out)."""
    offered = set(figures)
    wanted = {name for name in names
              if any(name == f"{split}_{f}" for split in ("val", "test") for f in offered)}
    values: dict[str, float] = {}
    for split in ("val", "test"):
        if any(name.startswith(f"{split}_") for name in wanted):
            values |= {f"{split}_{k}": v for k, v in evaluate(split).items()}
    return {k: v for k, v in values.items() if k in wanted}
