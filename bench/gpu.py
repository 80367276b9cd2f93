"""Benchmark: Trellis on one GPU, in one command (`make bench-gpu`, issue 37).

Within a total time budget (default 330 s: under 6 minutes on one H100 or H200 with 16 cores,
with room for Python's and CUDA's start), it runs and records in bench/results/gpu.json:

1. ``chem``: the CHEM table, seconds per round of the 7 CHEM silos in one process for FedStar,
   FedDense and GCFL on the device, on the CPU at one thread and at every core's thread, with each
   figure's test accuracy (bench/gpu_chem.py); the authors' FedStar too with ``--authors PATH``.
   ``graphs``: training steps replayed as CUDA graphs against plain steps, on the CHEM silos in
   one process, over 3 seeds: seconds per round and test accuracy (bench/gpu_graphs.py).
2. ``many_silos``: the 7-silo CHEM plan under `coordinator simulate`, the sequential engine (the
   silos in turn) against the Ray engine with a share of the GPU per silo, s/round.
   ``profile``: where a FedStar CHEM round's time goes on the device: kernel launches, copies,
   synchronisations, GPU-busy seconds (bench/gpu_profile.py).
3. ``sweep``: every algorithm, plain and private, as a real 3-silo federation with
   `silo join --device`, checked completed and trained on the device (bench/gpu_sweep.py).
4. ``cuda_tests``: pytest on every test that needs a GPU (bench/gpu_tests.py).

The timed parts (1, 2 and the profile) run alone, one after another; 3 and 4 then run
together. Each phase gets its share of what is left of the budget, each child process the time
left to its phase; a part that fails or runs out of time is recorded with its error (and what
it measured before) and the next one still runs. The record names the device (its name,
torch's and CUDA's versions, the cores) and is rewritten after each part, so an interrupted run
leaves what it measured.

    python bench/gpu.py [--authors PATH] [--parts chem sweep ...] [--budget 330]
    python bench/gpu.py --device cpu --quick       # the whole pipeline on CPU, tiny settings
                                                   # (recorded in bench-run/gpu-quick.json)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpu_common import CHEM, ROOT, Deadline, PartFailed

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OUT = ROOT / "bench" / "results" / "gpu.json"
# A --quick run's record: its figures say nothing of a GPU, so it never replaces OUT.
QUICK_OUT = ROOT / "bench-run" / "gpu-quick.json"
# Phases in order, each a group of parts run together, with its weight in the budget; what a
# phase leaves unused goes to the next. Sized on an H200 with 16 cores: on 2026-11-28, at 400 s
# with the authors' rows, the table took 144 s (its authors' one-thread figure ran out of time),
# the graphs' comparison 43 s (two seeds of 8 rounds, FedDense one), the engines 14 s (no Ray in
# the image), the profile 27 s, the sweep and tests together 86 s. FedDense now has two seeds
# here and a GPU figure of the table 10 rounds (`python bench/gpu_graphs.py` alone: 3 seeds).
PHASES: tuple[tuple[tuple[str, ...], float], ...] = (
    (("chem",), 0.36), (("graphs",), 0.17), (("many_silos",), 0.06), (("profile",), 0.10),
    (("sweep", "cuda_tests"), 0.31))
PARTS = tuple(part for parts, _ in PHASES for part in parts)
QUICK_CHEM = ("MUTAG", "PTC_MR")         # --quick: two small CHEM silos


@dataclass(frozen=True)
class Settings:
    """What one run does: where, how much, and in how long."""

    device: str
    quick: bool
    cpus: int
    budget_s: float
    chem_datasets: tuple[str, ...]  # the CHEM silos of the table and the many-silos plan
    chem_rounds: int          # timed rounds per CHEM figure, after one warm-up round
    graphs_rounds: int        # rounds of each seed of the graphs' comparison, after the first
    graphs_seeds: tuple[int, ...]
    simulate_rounds: int      # rounds of the many-silos plan
    sweep_rounds: int         # rounds of each federation of the sweep
    sweep_graphs: int         # synthetic graphs per silo in the sweep
    sweep_parallel: int       # federations at once
    parts: tuple[str, ...]
    authors: str | None = None


def make_settings(device: str, quick: bool, cpus: int, budget_s: float | None = None,
                  parts: tuple[str, ...] = PARTS, authors: str | None = None) -> Settings:
    """The run's settings: tiny ones with ``quick``; several federations at once on many cores
    (each is four processes, mostly waiting on each other and the device)."""
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f"unknown parts {', '.join(unknown)}: expected some of "
                         f"{', '.join(PARTS)}")
    return Settings(device=device, quick=quick, cpus=cpus,
                    budget_s=budget_s if budget_s is not None else (1500 if quick else 330),
                    chem_datasets=QUICK_CHEM if quick else CHEM,
                    chem_rounds=1 if quick else 3, graphs_rounds=1 if quick else 8,
                    graphs_seeds=(1,) if quick else (1, 2), simulate_rounds=2 if quick else 4,
                    sweep_rounds=1 if quick else 2, sweep_graphs=20 if quick else 40,
                    sweep_parallel=max(1, cpus // 4), parts=tuple(parts), authors=authors)


def phases(parts: tuple[str, ...]) -> list[tuple[tuple[str, ...], float]]:
    """The phases that have a chosen part, each with only its chosen parts."""
    chosen = []
    for group, weight in PHASES:
        kept = tuple(p for p in group if p in parts)
        if kept:
            chosen.append((kept, weight))
    return chosen


def phase_seconds(left_s: float, weights: list[float]) -> float:
    """The first of the remaining phases' share of the time left: its weight's part of it."""
    return left_s * weights[0] / sum(weights)


class Record:
    """The results document, written whole after every change (thread-safe)."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        self.doc: dict[str, Any] = {**header, "parts": {}}
        self.lock = threading.Lock()

    def part(self, name: str, outcome: dict[str, Any]) -> None:
        """Record one part's outcome and write the document."""
        with self.lock:
            self.doc["parts"][name] = outcome
            self.write()

    def write(self) -> None:
        """Write the document atomically (a reader never sees half of it)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temp = self.path.with_suffix(".json.tmp")
        temp.write_text(json.dumps(self.doc, indent=2) + "\n")
        temp.replace(self.path)


def run_part(work: Callable[[Deadline], dict[str, Any]], seconds: float,
             clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """One part within ``seconds``: its figures with status ok, or failed with its error."""
    began = clock()
    deadline = Deadline(seconds, clock)
    try:
        outcome = {"status": "ok", **work(deadline)}
    except PartFailed as exc:
        outcome = {"status": "failed", "error": str(exc), **exc.partial}
    except Exception as exc:             # the next part still runs
        outcome = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    return {**outcome, "timeout_s": round(seconds, 1), "seconds": round(clock() - began, 1)}


def part_work(name: str, settings: Settings, work: Path) -> Callable[[Deadline], dict[str, Any]]:
    """What a part does, given its deadline."""
    import gpu_chem
    import gpu_graphs
    import gpu_profile
    import gpu_sweep
    import gpu_tests

    s = settings
    if name == "chem":
        authors = Path(s.authors).resolve() if s.authors else None
        return lambda d: gpu_chem.chem_table(s.device, s.cpus, s.chem_rounds, d, authors,
                                             s.chem_datasets)
    if name == "graphs":
        return lambda d: gpu_graphs.graphs_part(s.device, s.graphs_rounds, list(s.graphs_seeds),
                                                work, d, s.chem_datasets)
    if name == "many_silos":
        return lambda d: gpu_chem.many_silos(s.device, s.cpus, s.simulate_rounds,
                                             work / "many_silos", d, s.chem_datasets)
    if name == "profile":
        return lambda d: gpu_profile.profile_part(s.device, work, d, s.chem_datasets)
    if name == "sweep":
        return lambda d: gpu_sweep.sweep(s.device, s.sweep_rounds, s.sweep_graphs,
                                         s.sweep_parallel, work / "sweep", d)
    return lambda d: gpu_tests.cuda_tests(s.device, s.cpus, work / "cuda_tests", d)


def run_all(settings: Settings, record: Record, work: Path,
            make_work: Callable[[str, Settings, Path], Callable[[Deadline], dict[str, Any]]]
            = part_work, clock: Callable[[], float] = time.monotonic) -> None:
    """Every chosen phase in order, its parts together, within the budget; each part's outcome
    recorded as it ends."""
    end = clock() + settings.budget_s
    chosen = phases(settings.parts)
    for i, (group, _) in enumerate(chosen):
        seconds = phase_seconds(max(0.0, end - clock()), [w for _, w in chosen[i:]])
        with ThreadPoolExecutor(max_workers=len(group)) as pool:
            # The part's work is made inside run_part too: a part that cannot even start
            # (an import that fails) is recorded like any other failure.
            futures = {name: pool.submit(
                run_part, lambda d, n=name: make_work(n, settings, work)(d), seconds, clock)
                for name in group}
            for name, future in futures.items():
                outcome = future.result()
                record.part(name, outcome)
                print(f"{name}: {outcome['status']} in {outcome['seconds']} s"
                      + (f" ({outcome['error'][:300]})" if "error" in outcome else ""),
                      flush=True)


def device_info(device: str) -> dict[str, Any]:
    """The machine the figures come from: the GPU's name, torch's and CUDA's versions, cores."""
    import torch
    from gpu_chem import cpu_count

    info: dict[str, Any] = {"requested": device, "torch": torch.__version__,
                            "cuda": torch.version.cuda, "cpus": cpu_count(),
                            "machine": platform.machine(), "python": platform.python_version()}
    if torch.cuda.is_available():
        info |= {"name": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count()}
    else:
        from trellis.silo.models.dense import processor_name

        info |= {"name": processor_name(), "gpus": 0}
    return info


def _commit() -> str:
    """TRELLIS_BENCH_COMMIT where set (a lent GPU machine's copy of the tree may carry stale git
    metadata: give it the commit from where the call is made), else git's HEAD."""
    given = os.environ.get("TRELLIS_BENCH_COMMIT", "").strip()
    if given:
        return given
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=ROOT)
    return done.stdout.strip() or "unknown"


def summary(doc: dict[str, Any]) -> list[str]:
    """The record in a few lines."""
    lines = [f"device: {doc['device'].get('name')} (torch {doc['device']['torch']}, CUDA "
             f"{doc['device']['cuda']}, {doc['device']['cpus']} cores); {doc['elapsed_s']} s "
             f"of {doc['settings']['budget_s']:g}"]
    chem = doc["parts"].get("chem", {})
    for row, figures in chem.get("table", {}).items():
        cells = ", ".join(f"{c} {f['s_per_round']:.3f}"
                          + (f" (median {f['median_s']:.3f})" if "median_s" in f else "")
                          for c, f in figures.items()
                          if isinstance(f, dict) and "s_per_round" in f)
        accs = chem.get("accuracy", {}).get("rows", {}).get(row, {}).get("test_acc", {})
        lines.append(f"  {row:18s} s/round: {cells or 'none'}; test acc "
                     + ", ".join(f"{c} {a:.3f}" for c, a in accs.items()))
    many = doc["parts"].get("many_silos", {})
    for engine, run in many.get("runs", {}).items():
        figure = f"{run['s_per_round']:.3f} s/round" if "s_per_round" in run else "failed"
        lines.append(f"  {many.get('silos')} silos, {engine:10s} {figure}")
    for algorithm, row in doc["parts"].get("graphs", {}).get("summary", {}).items():
        lines.append(f"  {algorithm:10s} plain {row['plain_s_per_round']:.3f} s/round, graphs "
                     f"{row['graphs_s_per_round']:.3f} ({row['speedup']:.2f}x); test acc "
                     f"{row['plain_test_acc']:.3f} / {row['graphs_test_acc']:.3f} over seeds "
                     f"{row['seeds']}")
    prof = doc["parts"].get("profile", {})
    for path in ("plain", "graphs"):
        if "mean_s" in prof.get(path, {}):
            figures = prof[path]
            launches = sum(n for call, n in figures.get("runtime_calls", {}).items()
                           if "Launch" in call)
            lines.append(f"  profile, {path}: fedstar {figures['mean_s']:.3f} s/round, GPU busy "
                         f"{figures.get('gpu_busy_s')} s, {launches} kernel launches a round")
    for name, part in doc["parts"].items():
        lines.append(f"{name}: {part['status']}"
                     + (f" -- {part['error'][:200]}" if "error" in part else ""))
    return lines


def main() -> None:
    """Parse the options, run every chosen part, write and print the record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true",
                        help="tiny settings: one round each, two CHEM silos, small "
                             "synthetic silos")
    parser.add_argument("--authors", metavar="PATH",
                        help="a checkout of the authors' FedStar (yuetan031/FedStar at "
                             "da01eac): a row of the CHEM table")
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--budget", type=float, help="total seconds (default 330; 1500 "
                                                     "with --quick)")
    parser.add_argument("--out", type=Path,
                        help=f"default {OUT.relative_to(ROOT)} ({QUICK_OUT.relative_to(ROOT)} "
                             "with --quick)")
    parser.add_argument("--work", type=Path, help="keep the runs' folders here (default: a "
                                                  "temporary folder)")
    args = parser.parse_args()
    out = args.out or (QUICK_OUT if args.quick else OUT)
    started = time.monotonic()
    info = device_info(args.device)
    if args.device == "cuda" and not info["gpus"]:
        sys.exit(f"bench/gpu.py: --device cuda, but torch {info['torch']} sees no CUDA device "
                 "here; `python bench/gpu.py --device cpu --quick` runs the pipeline on CPU")
    settings = make_settings(args.device, args.quick, info["cpus"], args.budget,
                             tuple(args.parts), args.authors)
    record = Record(out, {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "bench/gpu.py", *sys.argv[1:]]), "commit": _commit(),
        "device": info, "settings": asdict(settings)})
    record.write()
    with tempfile.TemporaryDirectory(prefix="trellis-bench-gpu-") as tmp:
        work = (args.work or Path(tmp)).resolve()   # children run elsewhere: absolute
        work.mkdir(parents=True, exist_ok=True)
        run_all(settings, record, work)
    record.doc["elapsed_s"] = round(time.monotonic() - started, 1)
    record.doc["all_ok"] = all(p["status"] == "ok" for p in record.doc["parts"].values())
    record.write()
    print("\n".join(summary(record.doc)))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
