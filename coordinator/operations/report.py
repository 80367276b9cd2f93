"""Reproduction report: result files of many runs -> the papers' tables, curves and a summary.

One results file (a single run) is reported by coordinator/operations/run_report.py instead.

Layout read: ``<results>/<setting>/<algorithm>/seed-<n>.json`` (written by bench/reproduce.py
through ``coordinator simulate``), or one results file, such as a federation's results.json
while it runs (its federation id is the setting). Aggregation follows the reference code
(docs/algorithms.md §2.4, §3.6): per silo the mean and sample std over seeds; the reported number
is the plain mean over silos of the per-silo means, and "±" the plain mean over silos of the
per-silo stds. Each
algorithm is scored with its own paper's protocol: the final-round test accuracy, and for the
GCFL family also the reference code's maximum over split-time snapshots and the final round.
Beside them stands the test accuracy at the round of best mean validation accuracy over silos,
the model selection the papers' tables report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trellis.protos.metrics import validation_metric

# The papers' numbers (accuracy %, docs/algorithms.md §6), keyed by our setting name.
PAPER: dict[str, dict[str, tuple[str, float]]] = {
    "CHEM": {"local": ("FedStar Tab. 1", 75.38), "fedavg": ("FedStar Tab. 1", 75.26),
             "fedprox": ("FedStar Tab. 1", 75.30), "fedstar": ("FedStar Tab. 1", 79.79),
             "feddense": ("FedDense Tab. 1 Single, r=32", 80.16),
             "gcfl": ("GCFL Tab. 4 MOLECULES", 76.61), "gcfl+": ("GCFL Tab. 4 MOLECULES", 77.45),
             "gcfl+dws": ("GCFL Tab. 4 MOLECULES (GCFL+)", 77.45)},
    "BIO-CHEM": {"local": ("FedStar Tab. 1", 71.09), "fedavg": ("FedStar Tab. 1", 70.65),
                 "fedprox": ("FedStar Tab. 1", 70.75), "fedstar": ("FedStar Tab. 1", 74.54),
                 "gcfl": ("GCFL Tab. 4 BIOCHEM", 71.72),
                 "gcfl+": ("GCFL Tab. 4 BIOCHEM", 73.12),
                 "gcfl+dws": ("GCFL Tab. 4 BIOCHEM (GCFL+)", 73.12)},
    "BIO-CHEM-SN": {"local": ("FedStar Tab. 1", 69.37), "fedavg": ("FedStar Tab. 1", 68.92),
                    "fedprox": ("FedStar Tab. 1", 69.21), "fedstar": ("FedStar Tab. 1", 72.16),
                    "gcfl": ("GCFL Tab. 4 MIX", 70.56), "gcfl+": ("GCFL Tab. 4 MIX", 71.21)},
    "Cross-Sim": {"local": ("FedDense Tab. 1", 72.12), "fedavg": ("FedDense Tab. 1", 71.73),
                  "fedprox": ("FedDense Tab. 1", 72.57), "fedstar": ("FedDense Tab. 1", 74.42),
                  "feddense": ("FedDense Tab. 1, r=32", 75.74)},
    "Cross-Diff": {"local": ("FedDense Tab. 1", 67.06), "fedavg": ("FedDense Tab. 1", 64.80),
                   "fedprox": ("FedDense Tab. 1", 63.94), "gcfl": ("FedDense Tab. 1", 64.54),
                   "fedstar": ("FedDense Tab. 1", 67.48),
                   "feddense": ("FedDense Tab. 1, r=32", 72.44)},
    "Multi": {"local": ("FedDense Tab. 1", 71.12), "fedavg": ("FedDense Tab. 1", 68.67),
              "fedprox": ("FedDense Tab. 1", 69.18), "gcfl": ("FedDense Tab. 1", 70.32),
              "fedstar": ("FedDense Tab. 1", 73.70),
              "feddense": ("FedDense Tab. 1, r=32", 75.31)},
}
# GCFL Tab. 3 (oneDS; "local" is the reference's self-train, 50 local epochs).
for _name, _row in (("PROTEINS", (72.13, 74.90, 75.56, 77.39, 77.76)),
                    ("NCI1", (64.68, 64.74, 64.37, 73.26, 74.22)),
                    ("IMDB-BINARY", (76.54, 75.96, 77.46, 82.56, 82.99))):
    PAPER[f"oneDS-{_name}"] = {
        alg: ("GCFL Tab. 3", value)
        for alg, value in zip(("local", "fedavg", "fedprox", "gcfl", "gcfl+"), _row, strict=True)}
# FedHGN Tab. 3 / App. Tabs. 6-8 (docs/algorithms.md §6.4): AIFB, split RE or RET, K silos.
_HGN_PAPER = {
    "RE": {"local": (74.77, 71.30, 55.08), "fedavg": (74.02, 65.18, 54.95),
           "fedprox": (72.34, 65.29, 53.38), "fedhgn": (81.87, 72.94, 59.32)},
    "RET": {"local": (76.11, 65.89, 59.71), "fedavg": (80.00, 66.56, 59.59),
            "fedprox": (80.93, 66.00, 60.99), "fedhgn": (86.55, 70.67, 66.76)},
}
for _split, _rows in _HGN_PAPER.items():
    for _i, _k in enumerate((3, 5, 10)):
        PAPER[f"AIFB-{_split}-{_k}"] = {
            alg: (f"FedHGN Tab. 3/6 AIFB {_split} K={_k}", values[_i])
            for alg, values in _rows.items()}
PAPER["AIFB-central"] = {"central": ("FedHGN Tab. 3 Central", 87.78)}
CLUSTERED = ("gcfl", "gcfl+", "gcfl+dws")
ORDER = ("central", "local", "fedavg", "fedprox", "gcfl", "gcfl+", "gcfl+dws", "fedstar",
         "feddense", "fedhgn")


@dataclass(frozen=True)
class Score:
    """One algorithm in one setting, aggregated over seeds (accuracy in percent)."""

    mean: float
    pm: float
    seeds: int
    rounds: int
    best_rounds: tuple[int, ...] = ()     # per seed, the round of best mean validation accuracy


def load_runs(results: Path) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """setting -> algorithm -> result documents of completed runs (of a single results file:
    that run, whatever its status, so a running federation can be looked at)."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    if results.is_file():
        doc = json.loads(results.read_text())
        if any(_last_metrics(doc)) or doc.get("early_stopping"):
            runs[str(doc["federation"])] = {str(doc["algorithm"]): [doc]}
        return runs
    for path in sorted(results.glob("*/*/seed-*.json")):
        doc = json.loads(path.read_text())
        if doc.get("status") != "completed":
            continue
        setting, algorithm = path.parent.parent.name, path.parent.name
        runs.setdefault(setting, {}).setdefault(algorithm, []).append(doc)
    return runs


def final_accuracy(doc: Mapping[str, Any]) -> dict[str, float]:
    """Per silo: the test accuracy reported for the last round (of a running federation, the
    last round silos have reported on)."""
    return {silo: float(m["test_acc"]) for silo, m in _last_metrics(doc).items()
            if "test_acc" in m}


def _last_metrics(doc: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """The metrics of the last round that has any (all of them once a federation is over)."""
    return next((r["metrics"] for r in reversed(doc["rounds"]) if r["metrics"]), {})


def best_validation_round(doc: Mapping[str, Any]) -> int | None:
    """The round whose mean validation metric (the plan's: accuracy unless it names another)
    over the silos that reported it is highest (the earliest of equals); None when no round
    has one. A silo's NaN (ROC-AUC of a split with one class) is left out."""
    name = f"val_{validation_metric(doc)}"
    best: tuple[float, int] | None = None
    for record in doc["rounds"]:
        values = [float(m[name]) for m in record["metrics"].values()
                  if m.get(name) is not None and not math.isnan(float(m[name]))]
        if values and (best is None or sum(values) / len(values) > best[0]):
            best = (sum(values) / len(values), int(record["round"]))
    return None if best is None else best[1]


def best_validation_accuracy(doc: Mapping[str, Any]) -> dict[str, float]:
    """Per silo: the test accuracy at the best-validation round (chosen by the plan's
    validation metric)."""
    chosen = best_validation_round(doc)
    metrics: dict[str, dict[str, float]] = next(
        (r["metrics"] for r in doc["rounds"] if r["round"] == chosen), {})
    return {silo: float(m["test_acc"]) for silo, m in metrics.items() if "test_acc" in m}


def snapshot_accuracy(doc: Mapping[str, Any]) -> dict[str, float]:
    """GCFL's reference protocol: per silo, max over split-time snapshots and the final round.

    A split in round t snapshots its members' test accuracy from the end of round t - 1
    (``Oxfordblue7/GCFL:training.py::run_gcfl``).
    """
    best = dict(final_accuracy(doc))
    by_round = {r["round"]: r["metrics"] for r in doc["rounds"]}
    for split in doc.get("clustering", {}).get("splits", []):
        before = by_round.get(split["round"] - 1, {})
        for silo in split["members"]:
            if silo in before and "test_acc" in before[silo]:
                best[silo] = max(best.get(silo, 0.0), float(before[silo]["test_acc"]))
    return best


def weighted_best(doc: Mapping[str, Any]) -> float:
    """FedHGN's protocol (§5.5): test accuracy weighted by test nodes at the best validation
    round (for Local/Central: each silo's best epoch)."""
    return float(doc["early_stopping"]["test_acc"])


def weighted_final(doc: Mapping[str, Any]) -> float:
    """Test accuracy weighted by test nodes in the last round (the best epochs without rounds)."""
    from trellis.protos.metrics import weighted_accuracy

    if not doc["rounds"]:
        return weighted_best(doc)
    value = weighted_accuracy(doc["rounds"][-1]["metrics"], "test")
    return float("nan") if value is None else value


def aggregate(per_seed: Sequence[Mapping[str, float]]) -> tuple[float, float]:
    """(mean over silos of per-silo means, mean over silos of per-silo sample stds), percent."""
    silos = sorted(set().union(*per_seed))
    means, stds = [], []
    for silo in silos:
        values = [100.0 * run[silo] for run in per_seed if silo in run]
        mean = sum(values) / len(values)
        means.append(mean)
        if len(values) > 1:
            stds.append(math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)))
    return sum(means) / len(means), (sum(stds) / len(stds) if stds else float("nan"))


def scores(runs: Mapping[str, Mapping[str, list[dict[str, Any]]]],
           protocol: str = "paper") -> dict[str, dict[str, Score]]:
    """setting -> algorithm -> Score; protocol 'paper' uses each paper's own, 'final' the last
    round for every algorithm, 'best-val' the round of best mean validation accuracy."""
    table: dict[str, dict[str, Score]] = {}
    for setting, algorithms in runs.items():
        for algorithm, docs in algorithms.items():
            if protocol == "best-val":
                chosen = [best_validation_round(d) for d in docs]
                if None in chosen or not all(d["rounds"] for d in docs):
                    continue      # no validation accuracy to choose by
                mean, pm = aggregate([best_validation_accuracy(d) for d in docs])
                table.setdefault(setting, {})[algorithm] = Score(
                    round(mean, 2), round(pm, 2), len(docs),
                    min(len(d["rounds"]) for d in docs),
                    tuple(r for r in chosen if r is not None))
                continue
            if all("early_stopping" in d for d in docs):
                # FedHGN reports one weighted number per run; ± is the std over seeds.
                one = weighted_best if protocol == "paper" else weighted_final
                values = [100.0 * one(d) for d in docs]
                mean = sum(values) / len(values)
                pm = (math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
                      if len(values) > 1 else float("nan"))
                rounds = min(int(d["rounds_completed"]) for d in docs)
                table.setdefault(setting, {})[algorithm] = Score(round(mean, 2), round(pm, 2),
                                                                 len(docs), rounds)
                continue
            pick = (snapshot_accuracy if protocol == "paper" and algorithm in CLUSTERED
                    else final_accuracy)
            mean, pm = aggregate([pick(d) for d in docs])
            rounds = min(len(d["rounds"]) for d in docs)
            table.setdefault(setting, {})[algorithm] = Score(round(mean, 2), round(pm, 2),
                                                             len(docs), rounds)
    return table


def markdown(table: Mapping[str, Mapping[str, Score]],
             final: Mapping[str, Mapping[str, Score]],
             best: Mapping[str, Mapping[str, Score]] | None = None) -> str:
    """The papers' format: mean ± (mean per-silo std), gain over Local, the last round, the
    best-validation round, and the paper's value."""
    best = best or {}
    lines = ["# Reproduction results", "",
             "Accuracy in percent: mean over silos of the per-silo mean over seeds; ± is the "
             "mean over silos of the per-silo sample std (the reference code's aggregation). "
             "Gain = difference to Local. GCFL rows use the reference protocol (max over "
             "split-time snapshots and the final round, docs/algorithms.md §3.6); the "
             "'final round' column scores every algorithm by its last round, and 'best val.' "
             "by the round of highest mean validation accuracy over silos (that round in "
             "brackets; a range over seeds). AIFB rows follow "
             "FedHGN (§5.5): test accuracy weighted by test nodes at the round of best weighted "
             "validation accuracy (Local and Central: each silo's best epoch), ± the std over "
             "seeds; 'rounds' is the fewest rounds (epochs for Local/Central) a seed ran "
             "before early stopping. Generated by "
             "`coordinator report`; the runs by `bench/reproduce.py`.", ""]
    for setting in sorted(table):
        rows = table[setting]
        local = rows.get("local")
        lines += [f"## {setting}", "",
                  "| method | ours | gain | final round | best val. (round) | paper | "
                  "Δ to paper | seeds | rounds |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for algorithm in sorted(rows, key=lambda a: ORDER.index(a) if a in ORDER else 99):
            s = rows[algorithm]
            gain = "–" if local is None or algorithm == "local" else f"{s.mean - local.mean:+.2f}"
            paper = PAPER.get(setting, {}).get(algorithm)
            ref = f"{paper[1]:.2f} ({paper[0]})" if paper else "–"
            delta = f"{s.mean - paper[1]:+.2f}" if paper else "–"
            fin = final.get(setting, {}).get(algorithm)
            fin_text = f"{fin.mean:.2f}" if fin else "–"
            top = best.get(setting, {}).get(algorithm)
            top_text = f"{top.mean:.2f} ({_rounds(top.best_rounds)})" if top else "–"
            lines.append(f"| {algorithm} | {s.mean:.2f}±{_pm(s.pm)} | {gain} | {fin_text} | "
                         f"{top_text} | {ref} | {delta} | {s.seeds} | {s.rounds} |")
        lines.append("")
    return "\n".join(lines)


def summary(table: Mapping[str, Mapping[str, Score]]
            ) -> dict[str, dict[str, dict[str, float | None]]]:
    """setting -> algorithm -> {"mean", "pm", "seeds", "rounds"} for programs."""
    return {setting: {alg: {"mean": s.mean, "pm": None if math.isnan(s.pm) else s.pm,
                            "seeds": s.seeds, "rounds": s.rounds}
                      for alg, s in rows.items()} for setting, rows in table.items()}


def curves(runs: Mapping[str, Mapping[str, list[dict[str, Any]]]],
           setting: str) -> dict[str, list[float]]:
    """algorithm -> mean test accuracy (percent) per round, over silos and seeds."""
    out: dict[str, list[float]] = {}
    for algorithm, docs in runs.get(setting, {}).items():
        if not all(d["rounds"] for d in docs):
            continue      # trained alone by epochs: no rounds to plot
        rounds = min(len(d["rounds"]) for d in docs)
        series = []
        for i in range(rounds):
            values = [100.0 * float(m["test_acc"]) for d in docs
                      for m in d["rounds"][i]["metrics"].values() if "test_acc" in m]
            series.append(sum(values) / len(values) if values else float("nan"))
        out[algorithm] = series
    return out


def write_report(results: Path, out: Path) -> list[Path]:
    """Write README.md, summary.json and one PNG of accuracy curves per setting into `out`."""
    runs = load_runs(results)
    if not runs:
        raise ValueError(f"{results}: no reported metrics yet" if results.is_file() else
                         f"{results}: no completed runs in <setting>/<algorithm>/seed-N.json")
    table, final = scores(runs, "paper"), scores(runs, "final")
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "README.md", out / "summary.json"]
    if results.is_file():
        # One run: nothing to hold against a paper's table; its own figures instead.
        from trellis.coordinator.operations.run_report import run_markdown

        doc = next(iter(next(iter(runs.values())).values()))[0]
        written[0].write_text(run_markdown(doc, results, best_validation_round(doc)))
    else:
        written[0].write_text(markdown(table, final, scores(runs, "best-val")))
    written[1].write_text(json.dumps(summary(table), indent=2, sort_keys=True) + "\n")
    for setting in sorted(runs):
        series = curves(runs, setting)
        if series:
            path = out / f"curves-{setting}.png"
            _plot(series, setting, path)
            written.append(path)
    return written


def _plot(series: Mapping[str, list[float]], setting: str, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for algorithm in sorted(series, key=lambda a: ORDER.index(a) if a in ORDER else 99):
        values = series[algorithm]
        ax.plot(range(1, len(values) + 1), values, label=algorithm, linewidth=1.2)
    ax.set_xlabel("round")
    ax.set_ylabel("mean test accuracy over silos and seeds (%)")
    ax.set_title(f"{setting}: test accuracy per round")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    # Fixed metadata so that the same results give the same bytes.
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def _rounds(chosen: tuple[int, ...]) -> str:
    low, high = min(chosen), max(chosen)
    return f"round {low}" if low == high else f"rounds {low}–{high}"


def _pm(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.2f}"
