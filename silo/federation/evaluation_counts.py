"""A silo's evaluation counts, as [metrics] aggregate = true sums them (protos/metrics_plan.py).

Instead of its figures, the silo sends, inside its masked vector, what they are made of: per split
the examples predicted correctly, the examples evaluated and the sum of their losses (each
clipped to the plan's loss_clip, so that one example moves the sum by a known bound), and per
class the same two counts when the plan names its classes. Accuracy is correct over evaluated,
so the sum over silos gives exactly the federation's accuracy; balanced accuracy is the mean over
classes of the summed per-class ratios. Numpy only: the trainer gives labels and outputs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trellis.protos.metrics_plan import SPLITS, MetricsConfig

# A trainer's labels and per-class outputs (log-probabilities or logits) of 'val' or 'test'.
SplitOutputs = Callable[[str], tuple[np.ndarray, np.ndarray]]


def split_counts(labels: np.ndarray, outputs: np.ndarray, split: str,
                 metrics: MetricsConfig) -> dict[str, float]:
    """The counts of one split: `<split>_correct`, `_count`, `_loss_sum` (losses clipped to
    loss_clip) and, with classes, `<split>_correct_<c>` and `<split>_count_<c>`."""
    labels = np.asarray(labels, dtype=np.int64)
    outputs = np.asarray(outputs, dtype=np.float64)
    if outputs.ndim != 2 or outputs.shape[0] != labels.shape[0]:
        raise ValueError(f"outputs {outputs.shape} do not match {labels.shape[0]} labels")
    if metrics.classes and labels.size and int(labels.max()) >= metrics.classes:
        raise ValueError(f"a label {int(labels.max())} lies outside the plan's "
                         f"{metrics.classes} classes (metrics.classes)")
    correct = outputs.argmax(axis=1) == labels if labels.size else np.zeros(0, bool)
    # Cross-entropy from log-probabilities or logits alike: log-softmax leaves the first as
    # they are.
    shifted = outputs - outputs.max(axis=1, keepdims=True) if labels.size else outputs
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    losses = -log_probs[np.arange(labels.size), labels] if labels.size else np.zeros(0)
    counts = {f"{split}_correct": float(correct.sum()), f"{split}_count": float(labels.size),
              f"{split}_loss_sum": float(np.minimum(losses, metrics.loss_clip).sum())}
    for c in range(metrics.classes):
        members = labels == c
        counts[f"{split}_correct_{c}"] = float((correct & members).sum())
        counts[f"{split}_count_{c}"] = float(members.sum())
    return counts


def evaluation_counts(outputs_of: SplitOutputs, metrics: MetricsConfig) -> dict[str, float]:
    """The counts of every split the layout holds, from a trainer's `split_outputs`."""
    counts: dict[str, float] = {}
    for split in SPLITS:
        counts |= split_counts(*outputs_of(split), split, metrics)
    return counts
