"""Metrics both sides compute the same way from what silos report."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping


def weighted_accuracy(metrics: Mapping[str, Mapping[str, float]], which: str) -> float | None:
    """Accuracy over silos weighted by their `<which>_count` (None without counted nodes),
    summed in silo-name order whatever order the reports arrived in."""
    total = correct = 0.0
    for _, values in sorted(metrics.items()):
        count = values.get(f"{which}_count", 0.0)
        acc = values.get(f"{which}_acc", float("nan"))
        if count > 0 and math.isfinite(acc):
            total += count
            correct += acc * count
    return correct / total if total > 0 else None


def mean_over_silos(per_silo: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Mean of each metric over the silos that reported it (NaN reports left out), in the
    order the names first appear."""
    values: dict[str, list[float]] = {}
    for metrics in per_silo:
        for name, value in metrics.items():
            if not math.isnan(value):
                values.setdefault(name, []).append(value)
    return {name: sum(v) / len(v) for name, v in values.items()}
