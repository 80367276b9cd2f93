"""Benchmark: a local Ray run on a machine that is busy with other work, with Ray's workers at
Ray's own niceness (15) and at the run's (0, what `coordinator simulate --engine ray` now sets
for a local Ray unless RAY_worker_niceness is set).

Six silos of synthetic graphs (no shared datasets needed), FedStar, a few rounds, each run a
fresh `coordinator simulate --engine ray` process with ``--busy`` busy-looping processes beside
it (at niceness 0, as other tests or jobs on a CI runner are). The two settings take turns
``--repeat`` times. Prints and writes each run's wall seconds, their medians and the ratio to
bench/results/ray_niceness.json.

    python bench/ray_niceness.py [--busy 6] [--rounds 2] [--repeat 1]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ray_engine import simulation_plan  # noqa: E402
from trellis.silo.data.synthetic import write_tu_folder  # noqa: E402

SILOS = ("hospital-a", "pharma-b", "social-c", "lab-d", "clinic-e", "insurer-f")
DOMAINS = ("molecules", "bio", "social")
SETTINGS = {"niceness 15 (Ray's)": "15", "niceness 0 (the run's)": "0"}


def write_plan(run: Path, rounds: int, graphs: int) -> Path:
    """Six silos' synthetic folders and a FedStar plan that simulates them."""
    data = {}
    for i, silo in enumerate(SILOS):
        domain = DOMAINS[i % len(DOMAINS)]
        write_tu_folder(run / "data" / silo, domain.upper(), domain, graphs, seed=i + 1)
        data[silo] = run / "data" / silo
    # The workers' start is what is measured: no join wait may end a slow one.
    return simulation_plan(run, "bench-ray-niceness", "fedstar", rounds, data,
                           extra="\n[timeouts]\njoin_s = 3600\n")


def timed_run(command: list[str], niceness: str, busy: int) -> float:
    """Wall seconds of ``command`` with Ray's workers at ``niceness`` and ``busy`` busy loops
    running beside it."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        start = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True,
                              env={**os.environ, "RAY_worker_niceness": niceness})
        seconds = time.monotonic() - start
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=6, help="busy-looping processes beside it")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--graphs", type=int, default=30, help="graphs per silo")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--work", type=Path, default=ROOT / "bench-run" / "ray_niceness")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    plan = write_plan(args.work.resolve(), args.rounds, args.graphs)
    cores = os.cpu_count() or 1
    share = int(cores / len(SILOS) * 100) / 100
    command = [str(Path(sys.executable).with_name("coordinator")), "simulate", "--plan",
               str(plan), "--engine", "ray", "--ray-cpus", str(cores), "--cpus-per-silo",
               str(share), "--quiet", "--out", str(args.work / "results.json")]
    wall: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for _ in range(args.repeat):
        for name, niceness in SETTINGS.items():
            wall[name].append(round(timed_run(command, niceness, args.busy), 1))
            print(f"{name}: {wall[name][-1]:.1f} s", flush=True)
    median = {name: statistics.median(runs) for name, runs in wall.items()}
    niced, plain = median.values()
    figures = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "bench/ray_niceness.py", *sys.argv[1:]]),
        "machine": f"{platform.machine()}, {cores} cores",
        "silos": len(SILOS), "rounds": args.rounds, "graphs_per_silo": args.graphs,
        "busy_processes": args.busy, "repeat": args.repeat,
        "wall_s": wall, "median_wall_s": median,
        "ratio_niced_to_plain": round(niced / plain, 2),
    }
    out = ROOT / "bench" / "results" / "ray_niceness.json"
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"{len(SILOS)} silo actors, {args.busy} busy processes, {cores} cores: median "
          f"{niced:.1f} s at Ray's niceness, {plain:.1f} s at the run's "
          f"({figures['ratio_niced_to_plain']}x); written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
