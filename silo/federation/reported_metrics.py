"""Which figures a silo reports to the coordinator, and whether the plan's validation metric
fits its data.

A silo reports what its `--report` names; without one, `default_report`: validation and test
accuracy and the training loss, and the plan's `training.validation_metric` per split when it is
not accuracy, since the coordinator selects the best round (and FedHGN stops early) by it. An
explicit `--report` without that metric is kept as given, with one warning line
(`report_warning`). Whatever it reports, the silo keeps every figure of OWN_METRICS at home
(silo/operations/metrics_file.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trellis.protos.metrics import VALIDATION_METRICS
from trellis.protos.plan import PublicPlan
from trellis.silo.training.shared_evaluations import shared_evaluations

if TYPE_CHECKING:
    from trellis.silo.federation.summed_metrics import SummedMetrics

DEFAULT_REPORT = ("val_acc", "test_acc", "train_loss")
# Every figure a silo computes for itself each round (roc_auc only for two classes).
OWN_METRICS = ("val_acc", "val_loss", "test_acc", "test_loss", "val_count", "test_count",
               "val_balanced_acc", "test_balanced_acc", "val_roc_auc", "test_roc_auc")


def default_report(plan: PublicPlan) -> tuple[str, ...]:
    """What a silo reports unless its --report says otherwise: DEFAULT_REPORT, and the plan's
    validation metric per split when it is not accuracy."""
    metric = plan.training.validation_metric
    return DEFAULT_REPORT + (() if metric == "acc" else (f"val_{metric}", f"test_{metric}"))


def with_counts(chosen: Mapping[str, float], values: Mapping[str, float]) -> dict[str, float]:
    """A node task's report: the node counts (from `values`) go with the figures of `chosen`
    they weight, and only then (`--report none` sends nothing)."""
    counts = {f"{which}_count": values[f"{which}_count"] for which in ("val", "test")
              if f"{which}_count" in values
              and any(f"{which}_{metric}" in chosen for metric in VALIDATION_METRICS)}
    return {**chosen, **counts}


def report_warning(plan: PublicPlan, names: Sequence[str]) -> str:
    """A line for the operator when the plan selects rounds by a metric `names` leaves out
    ("" otherwise): the coordinator then selects without this silo's figures."""
    metric = plan.training.validation_metric
    wanted = f"val_{metric}"
    if metric == "acc" or wanted in names:
        return ""
    return (f"the plan selects its best round by {wanted} (training.validation_metric), which "
            f"this silo's --report leaves out ({','.join(names) or 'none'}): the coordinator "
            f"selects without this silo's figures; add {wanted},test_{metric} to --report to "
            "count them")


def metric_problem(plan: PublicPlan, silo: str, num_classes: int) -> str:
    """Why `silo` cannot take part with the plan's validation metric ("" if it can): ROC-AUC
    needs a binary task."""
    if plan.training.validation_metric != "roc_auc" or num_classes == 2:
        return ""
    return ("the plan selects rounds by ROC-AUC (training.validation_metric = \"roc_auc\"), "
            f"which needs a binary task; silo {silo!r} has {num_classes} classes in its data, "
            "so it refuses the plan (nothing was sent); ask the coordinator operator for "
            "balanced_acc or acc")


def evaluate_for_report(trainer: Any, last_train: Mapping[str, float],
                        summed: SummedMetrics | None, round_completed: int
                        ) -> tuple[dict[str, float], dict[str, float]]:
    """Every figure of OWN_METRICS (and the last training figures), and what the silo keeps of
    them at home: those, plus the counts for its next masked vector when the plan sums metrics.
    Each split is evaluated once for both."""
    with shared_evaluations(trainer):
        values = {**trainer.metrics(OWN_METRICS), **last_train}
        own = {k: float(v) for k, v in values.items()}
        if summed is not None:      # for the next masked vector; its own file keeps them
            own |= summed.keep(round_completed, trainer.split_outputs)
    return values, own
