"""The plan's [metrics] table: evaluation figures that reach the coordinator only as sums.

With `aggregate = true` a silo sends no metrics report. It appends its evaluation COUNTS (graphs
or nodes correct and evaluated, the sum of their losses, per class when balanced accuracy needs
them) to the masked vector of secure aggregation, so the coordinator unmasks only their sum over
the round's survivors and derives federation-wide figures from it (docs/privacy.md). This module
is the layout both sides agree on: which slots, in which order, in which integer units, and how
the sums become figures. Off by default, and then left out of the plan's wire form, so a plan
without it keeps its hash.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trellis.protos.algorithms import algorithm
from trellis.protos.fields import check_keys, read_float, read_int, shown
from trellis.protos.privacy_plan import PrivacyConfig

SPLITS = ("val", "test")
# Integer units one example moves a slot by at most: a count moves by COUNT_UNITS, a loss
# (clipped to loss_clip) by at most COUNT_UNITS, so a silo's loss sum is rounded to
# loss_clip / COUNT_UNITS and differential privacy's noise is sized once for every slot.
COUNT_UNITS = 2 ** 16
# The key under which a round's record holds the federation-wide figures: no silo can be called
# so (silo names are letters, digits, '.', '_', '-'), and every reader of per-silo metrics then
# reads one entry that is the whole federation.
FEDERATION = "(federation)"
MAX_CLASSES = 1000


@dataclass(frozen=True)
class MetricsConfig:
    """How silos' evaluation figures reach the coordinator (all public)."""

    aggregate: bool = False          # counts inside the masked vector; no per-silo report
    classes: int = 0                 # per-class slots (balanced accuracy needs them); 0: none
    # With [privacy]: the noise multiplier of the counts' own release (std / its sensitivity).
    noise_multiplier: float = 0.0
    loss_clip: float = 10.0          # one example's loss is clipped to this before summing


FIELDS = set(MetricsConfig.__dataclass_fields__)


def read_metrics(raw: Any, problems: list[str], path: str = "metrics") -> MetricsConfig:
    """The [metrics] table's fields, each checked on its own (cross-checks: check_metrics)."""
    if not isinstance(raw, dict):
        problems.append(f"{path}: must be a table")
        return MetricsConfig()
    check_keys(raw, path, FIELDS, problems)
    d = MetricsConfig()
    aggregate = raw.get("aggregate", d.aggregate)
    if not isinstance(aggregate, bool):
        problems.append(f"{path}.aggregate: must be true or false, got {shown(aggregate)}")
    return MetricsConfig(
        aggregate=aggregate is True,
        classes=read_int(raw, "classes", f"{path}.classes", problems, d.classes, low=0,
                         high=MAX_CLASSES),
        noise_multiplier=read_float(raw, "noise_multiplier", f"{path}.noise_multiplier",
                                    problems, d.noise_multiplier, low=0.0, high=1e4),
        loss_clip=read_float(raw, "loss_clip", f"{path}.loss_clip", problems, d.loss_clip,
                             low=1e-3, high=1e3))


def check_metrics(metrics: MetricsConfig, algorithm_name: str, validation_metric: str,
                  privacy: PrivacyConfig, problems: list[str]) -> None:
    """What the table asks must fit the algorithm, the validation metric and the privacy."""
    if not metrics.aggregate:
        if metrics != MetricsConfig():
            problems.append("metrics: its fields apply only with metrics.aggregate = true")
        return
    row = algorithm(algorithm_name)
    if not row.aggregates:
        problems.append(f"metrics.aggregate: {algorithm_name} aggregates nothing, so no masked "
                        "vector carries the counts; silos report per silo (or use --report "
                        "none)")
    if row.clustered:
        problems.append(f"metrics.aggregate: {algorithm_name} sums per cluster, and a "
                        "cluster's sum is its members' figures (one member: its own); it is "
                        "refused rather than half-hidden")
    if validation_metric == "roc_auc":
        problems.append("metrics.aggregate: ROC-AUC ranks every silo's scores together, so no "
                        "sum of counts gives it; select rounds by \"balanced_acc\" or \"acc\"")
    if validation_metric == "balanced_acc" and metrics.classes < 2:
        problems.append("metrics.classes: balanced accuracy is summed per class; give the "
                        "number of classes (at least 2)")
    if privacy.enabled:
        if privacy.unit != "record":
            problems.append("metrics.aggregate: with silo-level privacy one silo moves its "
                            "counts by its whole validation set, which no noise of a useful "
                            "size covers; use record-level privacy or leave metrics out")
        if metrics.noise_multiplier <= 0:
            problems.append("metrics.noise_multiplier: required with [privacy]: the counts' "
                            "own noise (std over their sensitivity), accounted on top of the "
                            "model's epsilon")
    elif metrics.noise_multiplier > 0:
        problems.append("metrics.noise_multiplier: applies only with [privacy]")


def capacity_problem(metrics: MetricsConfig, ring_bits: int, silos: int,
                     max_sample_count: int) -> str:
    """Why the slots' sums could overflow the ring ("" if they cannot): a split of a silo holds
    at most aggregation.max_sample_count examples."""
    if not metrics.aggregate:
        return ""
    largest = silos * max_sample_count * COUNT_UNITS
    if largest < 2 ** (ring_bits - 1):
        return ""
    return (f"the summed evaluation counts ([metrics] aggregate) of {silos} silos x "
            f"max_sample_count {max_sample_count} examples x {COUNT_UNITS} units can overflow "
            f"the {ring_bits}-bit ring; use ring_bits = 64 (or \"auto\") or a smaller "
            "max_sample_count")


def metric_slots(metrics: MetricsConfig) -> tuple[str, ...]:
    """The names of the slots appended to every masked vector, in order (none when off)."""
    if not metrics.aggregate:
        return ()
    names: list[str] = []
    for split in SPLITS:
        names += [f"{split}_correct", f"{split}_count", f"{split}_loss_sum"]
        names += [f"{split}_correct_{c}" for c in range(metrics.classes)]
        names += [f"{split}_count_{c}" for c in range(metrics.classes)]
    return tuple(names)


def _units(slots: Sequence[str], loss_clip: float) -> np.ndarray:
    """Integer units per graph (counts) or per nat (loss sums) of each slot."""
    return np.array([COUNT_UNITS / loss_clip if name.endswith("_loss_sum") else COUNT_UNITS
                     for name in slots], dtype=np.float64)


def encode_counts(counts: Mapping[str, float], metrics: MetricsConfig) -> np.ndarray:
    """One silo's counts as the integers of its slots (int64), nearest rounding."""
    slots = metric_slots(metrics)
    values = np.array([float(counts.get(name, 0.0)) for name in slots], dtype=np.float64)
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        raise ValueError("evaluation counts must be finite and non-negative")
    return np.rint(values * _units(slots, metrics.loss_clip)).astype(np.int64)


def decode_sums(integers: np.ndarray, metrics: MetricsConfig) -> dict[str, float]:
    """The summed slots (signed integers) back in examples and nats."""
    slots = metric_slots(metrics)
    ints = np.asarray(integers, dtype=np.float64)
    if ints.shape != (len(slots),):
        raise ValueError(f"expected {len(slots)} summed slots, got shape {ints.shape}")
    return dict(zip(slots, (ints / _units(slots, metrics.loss_clip)).tolist(), strict=True))


def federation_figures(sums: Mapping[str, float], metrics: MetricsConfig) -> dict[str, float]:
    """Federation-wide `<split>_acc`, `_loss`, `_count` (and `_balanced_acc` with classes) from
    summed counts. Noisy sums may leave a ratio outside [0, 1]: it is clamped; a split (or a
    class) with less than half an example counted has no figure."""
    figures: dict[str, float] = {}
    for split in SPLITS:
        count = sums[f"{split}_count"]
        if count < 0.5:
            continue
        figures[f"{split}_count"] = float(count)
        figures[f"{split}_acc"] = _ratio(sums[f"{split}_correct"], count)
        figures[f"{split}_loss"] = max(sums[f"{split}_loss_sum"], 0.0) / count
        recalls = [_ratio(sums[f"{split}_correct_{c}"], sums[f"{split}_count_{c}"])
                   for c in range(metrics.classes) if sums[f"{split}_count_{c}"] >= 0.5]
        if recalls:
            figures[f"{split}_balanced_acc"] = sum(recalls) / len(recalls)
    return figures


def _ratio(part: float, whole: float) -> float:
    return float(min(max(part / whole, 0.0), 1.0))


def counts_sensitivity(metrics: MetricsConfig) -> tuple[float, float]:
    """(L2, L1) in integer units of what one example moves the slots by: added or removed, it
    moves its split's correct, count and loss (and its class's correct and count); changed, two
    classes' correct and count. The loss sum is rounded once per silo, so it moves by up to one
    unit more."""
    touched = 6 if metrics.classes else 3    # slots moved by a full unit, the loss included
    l2 = math.sqrt((touched - 1) * COUNT_UNITS ** 2 + (COUNT_UNITS + 1) ** 2)
    return l2, float(touched * COUNT_UNITS + 1)
