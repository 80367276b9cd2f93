"""The results file written at the end of a federation (or a simulation), and its table."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from trellis.coordinator.rounds.machine import RoundRecord, per_silo_final_metrics
from trellis.protos.algorithms import algorithm
from trellis.protos.metrics import mean_over_silos
from trellis.protos.plan import Plan


def build_results(plan: Plan, history: list[RoundRecord], *, mode: str, status: str,
                  failure: str = "", elapsed_s: float = 0.0,
                  strategy: Any = None) -> dict[str, Any]:
    """A JSON-ready summary: plan essentials, per-round metrics, final per-silo metrics."""
    final = per_silo_final_metrics(history)
    rounds = [{"round": r.round, "attempts": r.attempts, "participants": list(r.participants),
               "dropped": list(r.dropped), "seconds": round(r.finished - r.started, 3),
               "metrics": dict(sorted(r.metrics.items()))}    # not in arrival order
              for r in history]
    means = dict(sorted(mean_over_silos(final.values()).items()))
    extra: dict[str, Any] = {}
    if strategy is not None and getattr(strategy, "stops_early", False):
        extra["early_stopping"] = strategy.selection(history)
    if strategy is not None and getattr(strategy, "clustered", False):
        extra["clustering"] = {"clusters": [list(c) for c in strategy.state.clusters],
                               "splits": strategy.splits,
                               "norms": strategy.norms,
                               "config": asdict(plan.clustering)}
    return {**extra, **_metric_field(plan), "federation": plan.federation,
            "algorithm": plan.public.algorithm,
            "mode": mode, "personalised": algorithm(plan.public.algorithm).personalises,
            "status": status, "failure": failure, "rounds_planned": plan.public.rounds,
            "rounds_completed": len(history), "seed": plan.public.seed,
            "elapsed_s": round(elapsed_s, 3), "final_metrics": final,
            "final_mean": means, "rounds": rounds}


def build_alone_results(plan: Plan, per_silo: dict[str, dict[str, Any]], *,
                        elapsed_s: float = 0.0) -> dict[str, Any]:
    """Results of silos that each trained alone with early stopping (FedHGN's Local/Central)."""
    from trellis.protos.metrics import weighted_accuracy, weighted_metric

    metric = plan.public.training.validation_metric
    chosen = () if metric == "acc" else (f"val_{metric}", f"test_{metric}")
    final = {silo: {k: float(r[k]) for k in ("val_acc", "test_acc", *chosen, "val_count",
                                             "test_count", "best_epoch", "epochs")}
             for silo, r in per_silo.items()}
    means = {k: sum(m[k] for m in final.values()) / len(final)
             for k in ("val_acc", "test_acc")}
    # NaN (ROC-AUC of a split with one class) is left out of these means.
    means |= mean_over_silos({k: m[k] for k in chosen} for m in final.values())
    selected = {} if metric == "acc" else {
        "validation_metric": metric, f"val_{metric}": weighted_metric(final, "val", metric),
        f"test_{metric}": weighted_metric(final, "test", metric)}
    return {**_metric_field(plan), "federation": plan.federation,
            "algorithm": plan.public.algorithm,
            "personalised": algorithm(plan.public.algorithm).personalises,
            "mode": "simulation", "status": "completed", "failure": "",
            "rounds_planned": plan.public.hetero.max_epochs,
            "rounds_completed": max(int(r["epochs"]) for r in per_silo.values()),
            "seed": plan.public.seed, "elapsed_s": round(elapsed_s, 3),
            "final_metrics": final, "final_mean": means, "rounds": [],
            "early_stopping": {"best_round": None,
                               "val_acc": weighted_accuracy(final, "val"),
                               "test_acc": weighted_accuracy(final, "test"),
                               **selected, "per_silo_epochs": True,
                               "patience": plan.public.hetero.patience,
                               "min_delta": plan.public.hetero.min_delta},
            "curves": {silo: r["curve"] for silo, r in per_silo.items()}}


def _metric_field(plan: Plan) -> dict[str, str]:
    """The plan's validation metric, named only when it is not accuracy (the default), so the
    results of a plan without one read as they always did."""
    metric = plan.public.training.validation_metric
    return {} if metric == "acc" else {"validation_metric": metric}


def accuracy_table(results: dict[str, Any]) -> str:
    """A per-silo table of the final reported metrics, as printed by the demo and the CLI."""
    final: dict[str, dict[str, float]] = results["final_metrics"]
    names = sorted({k for m in final.values() for k in m})
    header = ["silo", *names]
    rows = [[silo, *(_fmt(final[silo].get(n)) for n in names)] for silo in sorted(final)]
    if final:
        rows.append(["mean", *(_fmt(results["final_mean"].get(n)) for n in names)])
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True))
              for row in rows]
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.4f}"
