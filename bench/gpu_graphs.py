"""Benchmark: training steps replayed as CUDA graphs against plain steps, on one GPU.

The 7 CHEM silos in one process (the round of bench/speed_chem.py: every silo's local epoch,
then its test figures), for FedStar, GCFL and FedDense. For each seed, the trainers are built
once per path in the same process: ``plain`` (TRELLIS_CUDA_GRAPHS=0), ``graphs`` (=1: training
steps and each split's evaluation recorded, FedDense's masked batch norm too) and, with
``--steps``, ``steps`` (=1 with evaluation left plain, to tell the two recordings' shares
apart). They train side by side, a round of each in turn, so that the machine's drift hits all:
seconds per round (the median after the first round, which records the graphs, and the first
round on its own), the graphs each silo recorded (steps and evaluations), and the silos' mean
test accuracy after the last round, which the graphs must not change (over 3 seeds).

    python bench/gpu_graphs.py [--rounds 15] [--seeds 1 2 3] [--steps]
    python bench/gpu_graphs.py --device cpu --rounds 1 --seeds 1 --datasets MUTAG  # the pipeline

bench/gpu.py runs it as its ``graphs`` part; its record is written after every measurement, so a
run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from gpu_common import BENCH, CHEM, ROOT, TU, Deadline, PartFailed, python, run_child

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ALGORITHMS = ("fedstar", "gcfl", "feddense")
# Each path's TRELLIS_CUDA_GRAPHS ("1": FedDense's masked batch norm too); "steps" then leaves
# evaluation plain (a bench-only setting, below).
MODES = {"plain": "0", "steps": "1", "graphs": "1"}
DEFAULT_MODES = ("plain", "graphs")


def build(algorithm: str, seed: int, device: str, mode: str, datasets: list[Any],
          names: tuple[str, ...]) -> list[Any]:
    """The silos' trainers for one seed, on ``mode``'s step path (the datasets shared: a
    trainer only sets their structure embeddings, the same ones every time)."""
    from trellis.protos.plan import parse_plan
    from trellis.silo.training.trainer import LocalTrainer

    os.environ["TRELLIS_CUDA_GRAPHS"] = MODES[mode]
    raw = {"federation": {"id": "bench-graphs", "algorithm": algorithm, "rounds": 1,
                          "seed": seed, "silos": ["a", "b"]}}
    plan = parse_plan(raw, base_dir=ROOT).public
    trainers = [LocalTrainer(data, plan, name, device)
                for data, name in zip(datasets, names, strict=True)]
    if mode == "steps":
        for trainer in trainers:
            trainer._graphed_evaluations = None          # evaluation on the plain path
    return trainers


def one_round(trainers: list[Any]) -> tuple[float, float]:
    """Every silo's round; (its seconds, ended when the device's work has; mean test acc)."""
    began = time.perf_counter()
    accs = []
    for trainer in trainers:
        trainer.train()
        accs.append(trainer.metrics(("test_acc",))["test_acc"])
    return time.perf_counter() - began, sum(accs) / len(accs)


def compare(algorithm: str, seed: int, rounds: int, device: str, datasets: list[Any],
            names: tuple[str, ...], modes: tuple[str, ...] = DEFAULT_MODES) -> dict[str, Any]:
    """Every path of ``modes`` for one seed, a round of each in turn."""
    runs = {mode: build(algorithm, seed, device, mode, datasets, names) for mode in modes}
    seconds: dict[str, list[float]] = {mode: [] for mode in modes}
    acc: dict[str, float] = {}
    for _ in range(rounds + 1):
        for mode, trainers in runs.items():
            took, acc[mode] = one_round(trainers)
            seconds[mode].append(took)
    result: dict[str, Any] = {"algorithm": algorithm, "seed": seed}
    for mode, trainers in runs.items():
        graphed = [t._graphed for t in trainers if t._graphed is not None]
        evaluations = [t._graphed_evaluations for t in trainers
                       if t._graphed_evaluations is not None]
        result[mode] = {
            "first_round_s": round(seconds[mode][0], 3),
            "s_per_round": round(statistics.median(seconds[mode][1:]), 4),
            "min_s": round(min(seconds[mode][1:]), 4),
            "test_acc": round(acc[mode], 4),
            "path": trainers[0].graph_path.reason,
            "graphs_recorded": sum(g.recorded for g in graphed),
            "evaluation_graphs_recorded": sum(e.recorded for e in evaluations),
            "given_up": sorted({g.failure for g in [*graphed, *evaluations]
                                if g.failure is not None})}
    result["speedup"] = round(result["plain"]["s_per_round"] / result["graphs"]["s_per_round"], 3)
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every algorithm and seed; the record rewritten after each."""
    import torch

    from trellis.silo.data.datasets import load_graph_folder

    names = tuple(args.datasets)
    datasets = [load_graph_folder(TU / d) for d in names]
    doc: dict[str, Any] = {"device": args.device, "rounds": args.rounds, "datasets": list(names),
                           "name": torch.cuda.get_device_name(0) if torch.cuda.is_available()
                           else "cpu", "torch": torch.__version__, "runs": []}
    for algorithm in args.algorithms:
        for seed in args.seeds:
            figures = compare(algorithm, seed, args.rounds, args.device, datasets, names,
                              ("plain", "steps", "graphs") if args.steps else DEFAULT_MODES)
            doc["runs"].append(figures)
            doc["summary"] = summarise(doc["runs"])
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(doc, indent=2) + "\n")
            print(json.dumps(figures), flush=True)
    return doc


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per algorithm: mean s/round and test accuracy of each path over its seeds."""
    out: dict[str, Any] = {}
    for algorithm in dict.fromkeys(r["algorithm"] for r in runs):
        mine = [r for r in runs if r["algorithm"] == algorithm]
        row: dict[str, Any] = {"seeds": [r["seed"] for r in mine]}
        for mode in (m for m in MODES if m in mine[0]):
            row[f"{mode}_s_per_round"] = round(statistics.mean(r[mode]["s_per_round"]
                                                               for r in mine), 4)
            row[f"{mode}_test_acc"] = round(statistics.mean(r[mode]["test_acc"]
                                                            for r in mine), 4)
        row["speedup"] = round(row["plain_s_per_round"] / row["graphs_s_per_round"], 3)
        out[algorithm] = row
    return out


def graphs_part(device: str, rounds: int, seeds: list[int], work: Path, deadline: Deadline,
                datasets: tuple[str, ...] = CHEM) -> dict[str, Any]:
    """bench/gpu.py's ``graphs`` part: this script in a child; what it measured, even when it
    ran out of time."""
    if not TU.is_dir():
        raise PartFailed(f"needs the shared datasets at {TU}")
    out = work / "gpu_graphs.json"
    try:
        run_child([python(), str(BENCH / "gpu_graphs.py"), "--device", device, "--rounds",
                   str(rounds), "--seeds", *map(str, seeds), "--datasets", *datasets,
                   "--out", str(out)], deadline, f"graphs against plain steps on {device}")
    except PartFailed as exc:
        exc.partial = json.loads(out.read_text()) if out.is_file() else {}
        raise
    return json.loads(out.read_text())


def main() -> None:
    """Measure and write the record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS),
                        choices=ALGORITHMS)
    parser.add_argument("--datasets", nargs="+", default=list(CHEM))
    parser.add_argument("--steps", action="store_true",
                        help="a third path: training steps recorded, evaluation plain")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" /
                        "gpu_graphs.json")
    args = parser.parse_args()
    doc = run(args)
    print(json.dumps(doc["summary"], indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
