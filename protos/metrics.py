"""Metrics both sides compute the same way from what silos report."""

from __future__ import annotations

import math
from collections.abc import Mapping


def weighted_accuracy(metrics: Mapping[str, Mapping[str, float]], which: str) -> float | None:
    """Accuracy over silos weighted by their `<which>_count` (None without counted nodes)."""
    total = correct = 0.0
    for values in metrics.values():
        count = values.get(f"{which}_count", 0.0)
        acc = values.get(f"{which}_acc", float("nan"))
        if count > 0 and math.isfinite(acc):
            total += count
            correct += acc * count
    return correct / total if total > 0 else None
