"""The plan's tables for particular algorithms: [clustering] (GCFL, GCFL+) and [fedhgn].

Read by protos/plan.py like every other table, each field with its path, every problem at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trellis.protos.algorithms import GCFL_PRESETS
from trellis.protos.fields import check_keys, read_float, read_int, shown
from trellis.protos.plan_limits import limit


@dataclass(frozen=True)
class ClusteringConfig:
    """GCFL / GCFL+ split rule (docs/algorithms.md §3.3-§3.5); known only to the coordinator.

    `sequence` chooses what GCFL+ tracks per silo: "gradient" (the reference code's norm of the
    last mini-batch gradient) or "update" (the paper's update norm, the code's GCFL+dWs).
    `mean_norm` chooses the split test's mean update: "unweighted" (the reference code) or
    "weighted" by training-set size (the paper's Eq. 4).
    """

    preset: str = ""
    eps1: float = 0.07
    eps2: float = 0.28
    seq_length: int = 5
    sequence: str = "gradient"
    standardize: bool = False
    mean_norm: str = "unweighted"


@dataclass(frozen=True)
class HeteroConfig:
    """FedHGN and its baselines (docs/algorithms.md §5.2-§5.6; defaults are the reference's).

    `classes` must be given: every silo's decoder has that many outputs. `coefficient_slots` is
    the fixed number of rows of every sealed coefficient envelope; a silo with more relations
    than slots cannot join. `mu` is used by hgn-fedprox only; `max_epochs` by hgn-local and
    hgn-central, which stop early per silo. `rounds` in [federation] is the round limit; the
    federation stops earlier after `patience` rounds without a better validation accuracy.
    """

    classes: int = 0
    hidden: int = 64
    bases: int = 20
    lr: float = 0.1
    local_epochs: int = 3
    align_weight: float = 0.5
    mu: float = 1.0
    coefficient_slots: int = 256
    patience: int = 10
    min_delta: float = 1e-5
    max_epochs: int = 6000


def read_hetero(raw: dict[str, Any], needed: bool, problems: list[str]) -> HeteroConfig:
    """The [fedhgn] table; `classes` is required for the heterogeneous-graph algorithms."""
    check_keys(raw, "fedhgn", set(HeteroConfig.__dataclass_fields__), problems)
    d = HeteroConfig()
    classes = read_int(raw, "classes", "fedhgn.classes", problems, d.classes, low=0,
                       high=limit("fedhgn.classes"))
    if needed and not classes:
        problems.append("fedhgn.classes: required for FedHGN and its baselines (the number of "
                        "target-node classes every silo's decoder predicts)")
    return HeteroConfig(
        classes=classes,
        hidden=read_int(raw, "hidden", "fedhgn.hidden", problems, d.hidden, low=1,
                        high=limit("fedhgn.hidden")),
        bases=read_int(raw, "bases", "fedhgn.bases", problems, d.bases, low=1,
                       high=limit("fedhgn.bases")),
        lr=read_float(raw, "lr", "fedhgn.lr", problems, d.lr, low=1e-12),
        local_epochs=read_int(raw, "local_epochs", "fedhgn.local_epochs", problems,
                              d.local_epochs, low=1, high=limit("fedhgn.local_epochs")),
        align_weight=read_float(raw, "align_weight", "fedhgn.align_weight", problems,
                            d.align_weight, low=0.0),
        mu=read_float(raw, "mu", "fedhgn.mu", problems, d.mu, low=0.0),
        coefficient_slots=read_int(raw, "coefficient_slots", "fedhgn.coefficient_slots", problems,
                               d.coefficient_slots, low=1, high=1 << 16),
        patience=read_int(raw, "patience", "fedhgn.patience", problems, d.patience, low=1,
                          high=limit("fedhgn.patience")),
        min_delta=read_float(raw, "min_delta", "fedhgn.min_delta", problems, d.min_delta, low=0.0),
        max_epochs=read_int(raw, "max_epochs", "fedhgn.max_epochs", problems, d.max_epochs, low=1,
                            high=limit("fedhgn.max_epochs")),
    )


def read_clustering(raw: dict[str, Any], problems: list[str]) -> ClusteringConfig:
    """The [clustering] table: a named preset of §3.5, optionally overridden field by field."""
    check_keys(raw, "clustering", set(ClusteringConfig.__dataclass_fields__), problems)
    base = ClusteringConfig()
    preset = raw.get("preset", "")
    if preset:
        if preset not in GCFL_PRESETS:
            problems.append(f"clustering.preset: {shown(preset)} is not a preset; valid: "
                            + ", ".join(GCFL_PRESETS))
        else:
            p = GCFL_PRESETS[preset]
            base = ClusteringConfig(str(preset), p.eps1, p.eps2, p.seq_length)
    sequence = raw.get("sequence", base.sequence)
    if sequence not in ("gradient", "update"):
        problems.append("clustering.sequence: must be 'gradient' or 'update', got "
                        f"{shown(sequence)}")
    mean_norm = raw.get("mean_norm", base.mean_norm)
    if mean_norm not in ("unweighted", "weighted"):
        problems.append("clustering.mean_norm: must be 'unweighted' or 'weighted', "
                        f"got {shown(mean_norm)}")
    standardize = raw.get("standardize", False)
    if not isinstance(standardize, bool):
        problems.append(f"clustering.standardize: must be true or false, got {shown(standardize)}")
    return ClusteringConfig(
        preset=base.preset,
        eps1=read_float(raw, "eps1", "clustering.eps1", problems, base.eps1, low=0.0),
        eps2=read_float(raw, "eps2", "clustering.eps2", problems, base.eps2, low=0.0),
        seq_length=read_int(raw, "seq_length", "clustering.seq_length", problems,
                            base.seq_length, low=1, high=limit("clustering.seq_length")),
        sequence=str(sequence), standardize=bool(standardize), mean_norm=str(mean_norm))
