"""Accuracy against epsilon: FedStar on NCI1 split over 5 silos, with and without privacy.

Each run is `coordinator simulate` (the silos' own driver, real secure aggregation in one
process) of a plan whose [privacy] table targets one epsilon; the noise multiplier is
calibrated to it by the plan. Arms: "ddg" (distributed discrete Gaussian: FedStar with noise
shares through secure aggregation), "local-gaussian" (each silo adds the full noise: no trust in
peers), "none" (FedStar without privacy), "local-dp" and "local" (each silo alone, with and
without DP-SGD). After each run, a loss-threshold membership-inference attack
(silo/privacy/membership_audit.py) scores every silo's final model: its AUC at telling the silo's
training graphs from its validation and test graphs, averaged over silos. Prints one line per
run and a table of mean and spread per arm and epsilon, writes bench/results/dp_accuracy.json
(docs/privacy.md quotes it) and plots both against epsilon in docs/results/dp-accuracy.png.

    python bench/dp_accuracy.py --epsilons 1 4 8 --seeds 1 2 --rounds 200
    python bench/dp_accuracy.py --plot-only
    python bench/dp_accuracy.py --merge a.json b.json     # grids run apart, one per core
    python bench/dp_accuracy.py --arms ddg --epsilons 8 --init-model init.pt \
        --frozen graph_convs --recipe pretrained-frozen   # a recipe: its runs carry its label

`--init-model` gives every arm's plan `[model] init_sha256` (the file's hash) and
`[simulation] init_model` (the file): every silo starts from it after checking the hash, as real
silos do. `--frozen` names the groups no step changes ([model] frozen), in every arm, so the
non-private arms are the same model's ceilings. `--paired-noise` seeds the silos' noise and
samples from each run's seed (not private: for a search, where one setting's spread over fresh
draws hides most differences). `--noise-scale SHARED LOCAL` multiplies the noise the silos add to
the shared slice and to their local slice (a diagnostic, not private: 0 0 is the same run with no
noise at all, to tell the noise's cost from the clipped steps'). Every run records its mean test
accuracy at each tenth of its rounds. `--eval-average DECAY` has every silo evaluate, report and
be audited with its model averaged over the rounds: the plan's `[training] average = DECAY`
(exponential, DECAY per round; post-processing of the private outputs, so still private).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TU = ROOT.parent / "shared" / "data" / "tu"
RESULTS = ROOT / "bench" / "results" / "dp_accuracy.json"
PLOT = ROOT / "docs" / "results" / "dp-accuracy.png"
SILOS = 5
ARMS = ("ddg", "local-gaussian", "none", "local-dp", "local")


def split(work: Path) -> list[Path]:
    """NCI1 cut into 5 silos as GCFL's oneDS experiments do (silo/data/tu_split.py)."""
    from trellis.silo.data.tu_split import write_oneds_split

    out = work / "nci1-5"
    if not out.exists():
        write_oneds_split(TU / "NCI1", SILOS, out)
    return sorted(p for p in out.iterdir() if p.is_dir())


def plan_text(arm: str, epsilon: float | None, seed: int, rounds: int, folders: list[Path],
              state: Path, args: argparse.Namespace) -> str:
    """One run's plan."""
    names = [f"silo{i}" for i in range(len(folders))]
    data = ", ".join(f'{n} = "{f}"' for n, f in zip(names, folders, strict=True))
    algorithm = "local" if arm.startswith("local") and arm != "local-gaussian" else "fedstar"
    private = arm in ("ddg", "local-gaussian", "local-dp")
    mechanism = "ddg" if arm == "ddg" else "local-gaussian"
    privacy = f"""
[privacy]
mechanism = "{mechanism}"
epsilon = {epsilon}
delta = 1e-5
clip = {args.clip}
batch = {args.batch}
design_graphs = {args.design_graphs}
server_lr = {args.server_lr}
server_momentum = {args.server_momentum}
accountant = "{args.accountant}"
""" if private else ""
    lr = args.dp_lr if private else 0.001
    return f"""
[federation]
id = "dp-{arm}-{epsilon}-{seed}"
algorithm = "{algorithm}"
rounds = {rounds}
seed = {seed}
silos = [{", ".join(f'"{n}"' for n in names)}]

[training]
lr = {lr}
{f"average = {args.eval_average}" if args.eval_average else ""}

[model]
hidden = {args.hidden}
dropout = {args.dropout}
{starting_point(args)}

[server]
state_dir = "{state}"

[simulation]
data = {{ {data} }}
{f'init_model = "{args.init_model.resolve()}"' if args.init_model else ""}
{privacy}"""


def starting_point(args: argparse.Namespace) -> str:
    """The plan's [model] lines for the public initial model and the frozen groups."""
    from trellis.silo.training.initial_model import file_sha256

    lines = []
    if args.init_model:
        lines.append(f'init_sha256 = "{file_sha256(args.init_model)}"')
    if args.frozen:
        lines.append(f"frozen = [{', '.join(repr(g) for g in args.frozen)}]")
    return "\n".join(lines)


@contextlib.contextmanager
def scaled_noise(shared: float, local: float) -> Iterator[None]:
    """The silos' noise on the shared and the local slice times these factors (NOT private)."""
    from trellis.silo.federation import session
    from trellis.silo.training import trainer

    originals = session.add_noise, trainer.add_noise

    def scaled(add: Callable[..., Any], factor: float) -> Callable[..., Any]:
        return lambda integers, sigma, source: add(integers, sigma * factor, source)

    session.add_noise = scaled(originals[0], shared)
    trainer.add_noise = scaled(originals[1], local)
    try:
        yield
    finally:
        session.add_noise, trainer.add_noise = originals


def run_one(arm: str, epsilon: float | None, seed: int, args: argparse.Namespace,
            folders: list[Path], work: Path) -> dict:
    """One simulation; its final mean test accuracy and seconds per round."""
    from trellis.coordinator.operations.report import best_validation_accuracy
    from trellis.coordinator.simulation.sequential import load_simulation_data, run_simulation
    from trellis.protos.plan import load_plan
    from trellis.silo.privacy.private_step import INSECURE_SEED_VARIABLE

    rounds = args.rounds if arm not in ("none", "local") else args.plain_rounds
    tag = f"{args.recipe}-{arm}-{epsilon}-{seed}"
    path = work / f"{tag}.toml"
    path.write_text(plan_text(arm, epsilon, seed, rounds, folders, work / tag, args))
    plan = load_plan(path)
    aucs: list[float] = []
    if args.paired_noise:
        # Seeded noise and samples: NOT private, for comparing settings on the same draws.
        os.environ[INSECURE_SEED_VARIABLE] = f"dp-accuracy|{seed}"
    start = time.perf_counter()
    try:
        with scaled_noise(*args.noise_scale):
            results = run_simulation(plan, load_simulation_data(plan), progress=False,
                                     inspect=lambda _machine, sessions: aucs.extend(
                                         membership_aucs(sessions)))
    finally:
        os.environ.pop(INSECURE_SEED_VARIABLE, None)
    seconds = time.perf_counter() - start
    accuracy = float(results["final_mean"]["test_acc"])
    # For reading only: the round the silos' plain validation figures would pick (under privacy
    # those figures are outside the guarantee unless [metrics] aggregate carries them).
    best = best_validation_accuracy(results)
    best_val = statistics.fmean(best.values()) if best else None
    # The mean test accuracy every tenth of the run, to see whether it still climbs at its end.
    every = max(rounds // 10, 1)
    trace = [round(statistics.fmean(float(m["test_acc"]) for m in r["metrics"].values()), 4)
             for r in results["rounds"]
             if r["round"] % every == 0 and r["metrics"]
             and all("test_acc" in m for m in r["metrics"].values())]
    return {"recipe": args.recipe, "arm": arm, "epsilon": epsilon, "seed": seed,
            "rounds": rounds,
            "init_sha256": plan.public.model.init_sha256, "frozen": list(plan.public.model.frozen),
            "batch": args.batch, "dp_lr": args.dp_lr, "server_lr": args.server_lr,
            "server_momentum": args.server_momentum, "clip": args.clip,
            "dropout": plan.public.model.dropout,
            "paired_noise": args.paired_noise, "noise_scale": list(args.noise_scale),
            "eval_average": args.eval_average,
            "noise_multiplier": plan.public.privacy.noise_multiplier,
            "accountant": args.accountant if arm in ("ddg", "local-gaussian", "local-dp") else "",
            "test_acc": accuracy, "test_acc_best_val": best_val, "test_acc_trace": trace,
            "membership_auc": statistics.fmean(aucs),
            "seconds_per_round": seconds / rounds, "status": results["status"]}


def membership_aucs(sessions: dict) -> list[float]:
    """Per silo: the loss-threshold attack's AUC, training graphs against held-out ones."""
    import numpy as np

    from trellis.silo.privacy.membership_audit import loss_threshold_auc

    aucs = []
    for session in sessions.values():
        trainer = session.trainer
        held_out = np.concatenate([trainer.per_graph_losses("val"),
                                   trainer.per_graph_losses("test")])
        aucs.append(loss_threshold_auc(trainer.per_graph_losses("train"), held_out))
    return aucs


def summarise(runs: list[dict]) -> list[dict]:
    """Mean and spread of accuracy and membership AUC per (arm, epsilon)."""
    table = []
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r.get("recipe", ""), r["arm"], r["epsilon"], r["rounds"]), []).append(r)
    for recipe, arm, epsilon, rounds in sorted(
            groups, key=lambda k: (k[0], ARMS.index(k[1]), k[2] or 1e9, k[3])):
        rows = groups[(recipe, arm, epsilon, rounds)]
        accs = [r["test_acc"] for r in rows]
        aucs = [r["membership_auc"] for r in rows if "membership_auc" in r]
        table.append({"recipe": recipe, "arm": arm, "epsilon": epsilon, "rounds": rounds,
                      "seeds": len(accs),
                      "mean": statistics.fmean(accs),
                      "std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                      "auc_mean": statistics.fmean(aucs) if aucs else None,
                      "auc_std": statistics.stdev(aucs) if len(aucs) > 1 else 0.0})
    return table


def print_table(table: list[dict]) -> None:
    """One line per recipe, arm, epsilon and length."""
    for row in table:
        print(f"{row['recipe'] or '-':12} {row['arm']:15} eps {row['epsilon']!s:5} "
              f"{row['rounds']:4} rounds: {row['mean']:.4f} +- {row['std']:.4f}  "
              f"AUC {row['auc_mean']:.3f} ({row['seeds']} seeds)")


def plot(table: list[dict], out: Path) -> None:
    """Accuracy and membership AUC against epsilon, one line per arm; plain runs as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, spread, label in ((axes[0], "mean", "std", "test accuracy"),
                                   (axes[1], "auc_mean", "auc_std", "membership-inference AUC")):
        recipes = sorted({r.get("recipe", "") for r in table})
        for recipe, arm in ((recipe, arm) for recipe in recipes for arm in ARMS):
            rows = [r for r in table if r["arm"] == arm and r.get("recipe", "") == recipe
                    and r[key] is not None]
            if not rows:
                continue
            arm_label = f"{recipe}: {arm}" if len(recipes) > 1 else arm
            if rows[0]["epsilon"] is None:         # no privacy: a horizontal line per length
                for r, style in zip(rows, ("--", ":", "-."), strict=False):
                    ax.axhline(r[key], linestyle=style, color="grey" if arm == "none" else "tan",
                               label=f"{arm_label}, no DP, {r['rounds']} rounds")
                continue
            for rounds in sorted({r["rounds"] for r in rows}):
                line = [r for r in rows if r["rounds"] == rounds]
                ax.errorbar([r["epsilon"] for r in line], [r[key] for r in line],
                            yerr=[r[spread] for r in line], marker="o", capsize=3,
                            label=f"{arm_label}, {rounds} rounds")
        ax.set_xscale("log")
        epsilons = sorted({r["epsilon"] for r in table if r["epsilon"] is not None})
        ax.set_xticks(epsilons, [f"{e:g}" for e in epsilons])
        ax.minorticks_off()
        ax.set_xlabel("epsilon (delta 1e-5)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].axhline(0.5, color="black", linewidth=0.5)
    axes[0].legend(fontsize=8)
    fig.suptitle("FedStar on NCI1 over 5 silos, record-level DP (mean and std over seeds)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def argument_parser() -> argparse.ArgumentParser:
    """The bench's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1, 2, 4, 8])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--rounds", type=int, default=200, help="private runs (DP-FedSGD)")
    parser.add_argument("--plain-rounds", type=int, default=100, help="non-private runs")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--design-graphs", type=int, default=650,
                        help="training graphs per silo the calibration assumes (NCI1/5: ~650)")
    parser.add_argument("--dp-lr", type=float, default=0.003, help="local Adam step, private")
    parser.add_argument("--server-lr", type=float, default=0.3)
    parser.add_argument("--server-momentum", type=float, default=0.9)
    parser.add_argument("--hidden", type=int, default=64, help="model width, every arm")
    parser.add_argument("--noise-scale", type=float, nargs=2, default=[1.0, 1.0],
                        metavar=("SHARED", "LOCAL"),
                        help="multiply the silos' noise on the shared and the local slice "
                             "(a diagnostic, NOT private; give the runs a --recipe label)")
    parser.add_argument("--eval-average", type=float, default=0.0, metavar="DECAY",
                        help="evaluate and audit each silo's model averaged over the rounds "
                             "([training] average: exponential, DECAY per round; "
                             "post-processing, still private); 0: the model itself")
    # Named in every plan, so the recorded commands keep their figures: the plan's recipe
    # under record-level privacy is 0 since stop 48 (give --dropout 0 for it).
    parser.add_argument("--dropout", type=float, default=0.5,
                        help="the model's dropout rate ([model] dropout), every arm")
    parser.add_argument("--accountant", choices=("rdp", "pld"), default="rdp",
                        help="the plan's privacy.accountant: the noise each epsilon asks for")
    parser.add_argument("--init-model", type=Path, default=None,
                        help="a public initial model (bench/pretrain_public.py) every silo "
                             "starts from, named in each plan by its SHA-256")
    parser.add_argument("--frozen", nargs="*", default=[],
                        help="parameter groups no step changes ([model] frozen), every arm")
    parser.add_argument("--recipe", default="",
                        help="a label the runs carry: the summary keeps recipes apart")
    parser.add_argument("--paired-noise", action="store_true",
                        help="seed every silo's noise and samples from the run's seed "
                             "(TRELLIS_INSECURE_DP_SEED: not private), so that two settings "
                             "at one seed draw alike: a search then compares settings, not "
                             "draws")
    parser.add_argument("--work", type=Path, default=ROOT / "bench-run" / "dp_accuracy")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--plot", type=Path, default=PLOT)
    parser.add_argument("--append", action="store_true",
                        help="keep the runs already in --out (other arms or seeds)")
    parser.add_argument("--plot-only", action="store_true", help="redraw from --out")
    parser.add_argument("--merge", type=Path, nargs="+", default=[],
                        help="results files of grids run apart (e.g. one per core): merged "
                             "into --out, summarised and plotted")
    return parser


def main() -> None:
    parser = argument_parser()
    args = parser.parse_args()
    if args.noise_scale != [1.0, 1.0] and not args.recipe:
        parser.error("--noise-scale runs are not private: label them with --recipe")
    if args.merge:
        parts = [json.loads(path.read_text()) for path in args.merge]
        write(args.out, [c for part in parts for c in part.get("commands", [])],
              [run for part in parts for run in part["runs"]])
    if args.merge or args.plot_only:
        table = summarise(json.loads(args.out.read_text())["runs"])
        print_table(table)
        plot(table, args.plot)
        return
    if not (TU / "NCI1").exists():
        sys.exit(f"needs the shared NCI1 dataset at {TU / 'NCI1'}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    args.work = args.work.resolve()          # the plans name their data folders absolutely
    args.work.mkdir(parents=True, exist_ok=True)
    folders = split(args.work)
    settings = {k: v for k, v in vars(args).items()
                if k not in ("work", "out", "plot", "append", "plot_only")}
    before = json.loads(args.out.read_text()) if args.append and args.out.exists() else {}
    runs = before.get("runs", [])
    commands = before.get("commands", [])
    commands.append({"command": " ".join(sys.argv), "settings": settings})
    for arm in args.arms:
        for epsilon in (args.epsilons if arm in ("ddg", "local-gaussian", "local-dp")
                        else [None]):
            for seed in args.seeds:
                row = run_one(arm, epsilon, seed, args, folders, args.work)
                runs.append(row)
                print(f"{arm:15} eps {epsilon!s:5} seed {seed}: test_acc {row['test_acc']:.4f} "
                      f"(best val round {row['test_acc_best_val'] or float('nan'):.4f}) "
                      f"AUC {row['membership_auc']:.3f} z {row['noise_multiplier']:.3f} "
                      f"{row['seconds_per_round']:.2f} s/round; by tenths "
                      f"{' '.join(f'{a:.3f}' for a in row['test_acc_trace'])}", flush=True)
                write(args.out, commands, runs)      # a long grid keeps what it has done
    table = summarise(runs)
    print_table(table)
    write(args.out, commands, runs)
    plot(table, args.plot)


def write(out: Path, commands: list[dict], runs: list[dict]) -> None:
    """The results file: the commands that made it, every run, and the summary table."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"commands": commands, "dataset": "NCI1 / 5 silos", "delta": 1e-5,
                               "runs": runs, "table": summarise(runs)}, indent=1, default=str))


if __name__ == "__main__":
    main()
