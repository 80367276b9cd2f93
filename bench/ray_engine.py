"""Benchmark: one 6-silo plan on both simulation engines, side by side, on this machine.

FedStar on six CHEM datasets (MUTAG, BZR, COX2, DHFR, PTC_MR, AIDS; NCI1 left out for six
silos), each run in a fresh `coordinator simulate` process: ``sequential`` with one torch thread
and with one per core, ``ray`` with a local Ray of all cores, each silo's actor holding an equal
share (one thread each). For each: the command's wall time (imports, Ray's start and stop, data
loading, every round), the mean seconds per round after the first, and whether the results
documents agree (they must: the engines compute the same thing). ``--repeat N`` runs the three
N times, taking turns, and keeps each one's fastest (on a machine shared with other work).
Writes bench/results/ray_engine.json. Needs ../shared/data/tu and the ray extra.

    python bench/ray_engine.py [--rounds 10] [--algorithm fedstar] [--repeat 1]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TU = ROOT.parent / "shared" / "data" / "tu"
SIX = ("MUTAG", "BZR", "COX2", "DHFR", "PTC_MR", "AIDS")


def silo_name(dataset: str) -> str:
    return dataset.lower().replace("_", "-")


def simulation_plan(run: Path, plan_id: str, algorithm: str, rounds: int,
                    data: dict[str, Path], extra: str = "") -> Path:
    """``run``/plan.toml: a plan that simulates the silos of ``data`` (name -> folder), seed 1,
    with ``extra`` TOML tables."""
    silos = ", ".join(f'"{silo}"' for silo in data)
    folders = ", ".join(f'"{silo}" = "{folder}"' for silo, folder in data.items())
    plan = run / "plan.toml"
    plan.write_text(f"""
[federation]
id = "{plan_id}"
algorithm = "{algorithm}"
rounds = {rounds}
seed = 1
silos = [{silos}]

[server]
state_dir = "state"
{extra}
[simulation]
data = {{ {folders} }}
""")
    return plan


def write_plan(run: Path, algorithm: str, rounds: int) -> Path:
    return simulation_plan(run, "bench-ray-engine", algorithm, rounds,
                           {silo_name(d): TU / d for d in SIX})


def timed(args: list[str]) -> float:
    """Run a command; its wall seconds (it must succeed)."""
    start = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return time.monotonic() - start


def without_timings(results: dict[str, Any]) -> dict[str, Any]:
    doc = {k: v for k, v in results.items() if k not in ("elapsed_s", "engine")}
    doc["rounds"] = [{k: v for k, v in r.items() if k != "seconds"} for r in results["rounds"]]
    return doc


def per_round(results: dict[str, Any]) -> float:
    # Round 1 includes first allocations; steady state from round 2.
    secs = [r["seconds"] for r in results["rounds"][1:]] or [results["rounds"][0]["seconds"]]
    return sum(secs) / len(secs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--algorithm", default="fedstar")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--work", type=Path, default=ROOT / "bench-run" / "ray_engine")
    args = parser.parse_args()
    if not TU.exists():
        sys.exit(f"needs the shared datasets at {TU}")
    args.work.mkdir(parents=True, exist_ok=True)
    plan = write_plan(args.work, args.algorithm, args.rounds)
    cores = os.cpu_count() or 1
    share = math.floor(cores / len(SIX) * 100) / 100
    coordinator = str(Path(sys.executable).with_name("coordinator"))
    base = [coordinator, "simulate", "--plan", str(plan), "--quiet"]
    load_before = os.getloadavg()[0]
    runs = {"sequential-1": ["--threads", "1"], f"sequential-{cores}": ["--threads", str(cores)],
            "ray": ["--engine", "ray", "--ray-cpus", str(cores), "--cpus-per-silo", str(share)]}
    if cores == 1:
        del runs["sequential-1"]
    wall: dict[str, float] = {}
    docs: dict[str, dict[str, Any]] = {}
    step: dict[str, float] = {}
    for _ in range(args.repeat):
        for name, options in runs.items():
            out = args.work / f"{name}.json"
            seconds = timed([*base, *options, "--out", str(out)])
            doc = json.loads(out.read_text())
            wall[name] = min(wall.get(name, seconds), seconds)
            step[name] = min(step.get(name, per_round(doc)), per_round(doc))
            docs[name] = doc
    seq = docs[f"sequential-{cores}"]
    figures = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "bench/ray_engine.py", *sys.argv[1:]]),
        "machine": f"{platform.machine()}, {cores} cores",
        "load_average_before": round(load_before, 2),
        "load_average_after": round(os.getloadavg()[0], 2),
        "algorithm": args.algorithm, "rounds": args.rounds, "silos": len(SIX),
        "repeat": args.repeat,
        "runs": {name: {"options": " ".join(runs[name]), "wall_s": round(wall[name], 2),
                        "s_per_round": round(step[name], 3)} for name in runs},
        "results_equal": all(without_timings(doc) == without_timings(seq)
                             for doc in docs.values()),
        "mean_test_acc": round(seq["final_mean"].get("test_acc", float("nan")), 4),
    }
    out = ROOT / "bench" / "results" / "ray_engine.json"
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"{args.algorithm}, {len(SIX)} silos, {args.rounds} rounds, {cores} cores, best of "
          f"{args.repeat} (load average before {load_before:.1f}, after "
          f"{figures['load_average_after']:.1f})")
    print(f"{'run':<14}{'wall s':>8}{'s/round':>9}  options")
    for name, run in figures["runs"].items():
        print(f"{name:<14}{run['wall_s']:>8.1f}{run['s_per_round']:>9.3f}  {run['options']}")
    print(f"results equal: {figures['results_equal']}; written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
