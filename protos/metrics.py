"""Metrics both sides compute the same way from what silos report, and the plan's choice of
validation metric (`training.validation_metric`) that selects rounds by them."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

# What a plan may select rounds by: accuracy, balanced accuracy (the mean recall over the
# classes present), ROC-AUC (binary tasks only). A silo reports each per split as
# `val_<name>` / `test_<name>` (silo/training/classification_metrics.py computes them).
VALIDATION_METRICS = ("acc", "balanced_acc", "roc_auc")
DEFAULT_VALIDATION_METRIC = "acc"
# The metric in words, for reports and log lines.
METRIC_WORDS = {"acc": "accuracy", "balanced_acc": "balanced accuracy", "roc_auc": "ROC-AUC"}


def validation_metric(results: Mapping[str, Any]) -> str:
    """The metric a results document's run selects rounds by: its plan's
    training.validation_metric (named in the results only when it is not accuracy)."""
    return str(results.get("validation_metric", DEFAULT_VALIDATION_METRIC))


def weighted_accuracy(metrics: Mapping[str, Mapping[str, float]], which: str) -> float | None:
    """Accuracy over silos weighted by their `<which>_count` (None without counted nodes),
    summed in silo-name order whatever order the reports arrived in."""
    return weighted_metric(metrics, which, "acc")


def weighted_metric(metrics: Mapping[str, Mapping[str, float]], which: str,
                    metric: str) -> float | None:
    """`<which>_<metric>` over silos weighted by their `<which>_count` (None without counted
    nodes), summed in silo-name order; a silo whose value is NaN (ROC-AUC of a split with one
    class) is left out."""
    total = weighted = 0.0
    for _, values in sorted(metrics.items()):
        count = values.get(f"{which}_count", 0.0)
        value = values.get(f"{which}_{metric}", float("nan"))
        if count > 0 and math.isfinite(value):
            total += count
            weighted += value * count
    return weighted / total if total > 0 else None


def mean_over_silos(per_silo: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Mean of each metric over the silos that reported it (NaN reports left out), in the
    order the names first appear."""
    values: dict[str, list[float]] = {}
    for metrics in per_silo:
        for name, value in metrics.items():
            if not math.isnan(value):
                values.setdefault(name, []).append(value)
    return {name: sum(v) / len(v) for name, v in values.items()}
