"""Benchmark: seconds per round and peak memory of local training on CHEM, one torch thread.

One round = one local epoch on each of the 7 CHEM silos plus their validation and test
evaluation, all silos in one process -- the work the authors' code does per round. Each
algorithm runs in its own process so that its peak RSS is its own. Secure aggregation is not
included here (bench/fedstar_chem.py measures whole rounds). Each algorithm runs on the
dense-layer path the probe of silo/models/dense.py chooses for this processor; FedStar also runs on
both paths forced (TRELLIS_ONEDNN=1 and 0) to show what oneDNN costs or buys here.

With ``--authors PATH`` (a checkout of yuetan031/FedStar at da01eac, bench/fedstar_authors.py)
the authors' FedStar runs beside ours in the same invocation: ours and theirs alternate, each
in a fresh process at one thread, and ours/theirs is reported for each dense-layer path.
Writes bench/results/speed_chem.json.

    python bench/speed_chem.py [--rounds 5] [--algorithms fedstar gcfl ...]
    python bench/speed_chem.py --algorithms fedstar --authors ../authors-fedstar [--repeats 2]
    python bench/speed_chem.py --profile fedstar [--rounds 3]     # where the time goes
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The shared datasets beside the checkout (or inside it, where a copy of the tree carries them).
TU = next((p for p in (ROOT.parent / "shared" / "data" / "tu", ROOT / "shared" / "data" / "tu")
           if p.is_dir()), ROOT.parent / "shared" / "data" / "tu")
CHEM = ("MUTAG", "BZR", "COX2", "DHFR", "PTC_MR", "AIDS", "NCI1")
# Old figures of the reference code, measured on another machine in 2026-11 (not this run's):
# shown for orientation only when --authors is not given. Compare with --authors instead.
OLD_REFERENCE_S = {"fedstar": 2.55, "gcfl": 1.37}
FEDSTAR_PATHS = (("fedstar", "auto"), ("fedstar, TRELLIS_ONEDNN=0", "0"),
                 ("fedstar, TRELLIS_ONEDNN=1", "1"))
ALGORITHMS = ("fedstar", "feddense", "gcfl", "fedavg", "local")


def measure(algorithm: str, rounds: int, device: str = "cpu", threads: int = 1,
            datasets: tuple[str, ...] = CHEM) -> dict[str, float | str | bool]:
    """In this process: build the 7 trainers (one per dataset of ``datasets``) on ``device``
    with ``threads`` torch threads, time
    `rounds` rounds after one warm-up round; the silos' mean test accuracy after the last one
    (local training only: a sanity check that the device changes no result, bench/gpu.py)."""
    import torch
    from one_thread import one_thread_public_plan

    from trellis.silo.data.datasets import load_graph_folder
    from trellis.silo.models.dense import dense_path, onednn_enabled
    from trellis.silo.training.trainer import LocalTrainer

    public = one_thread_public_plan(algorithm)
    torch.set_num_threads(threads)
    start = time.perf_counter()
    trainers = [LocalTrainer(load_graph_folder(TU / d), public, d, device) for d in datasets]
    setup = time.perf_counter() - start
    times = []
    for i in range(rounds + 1):
        start = time.perf_counter()
        figures = []
        for trainer in trainers:
            trainer.train()
            # Read as Python floats: the round ends when the device's work has.
            figures.append(trainer.metrics(("val_acc", "val_loss", "test_acc", "test_loss")))
        if i:                                  # round 0 warms caches and allocators up
            times.append(time.perf_counter() - start)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"s_per_round": sum(times) / len(times), "min_s": min(times),
            "median_s": statistics.median(times), "setup_s": setup,
            "peak_rss_mb": peak_mb, "onednn": onednn_enabled(), "path": dense_path().reason,
            "device": device, "threads": threads,
            "mean_test_acc": sum(f["test_acc"] for f in figures) / len(figures)}


def profile(algorithm: str, rounds: int) -> None:
    """Print the functions that take the most own time over `rounds` rounds after a warm-up
    round (set-up excluded), one thread, in this process."""
    import cProfile
    import pstats

    import torch
    from one_thread import one_thread_public_plan

    from trellis.silo.data.datasets import load_graph_folder
    from trellis.silo.models.dense import dense_path
    from trellis.silo.training.trainer import LocalTrainer

    torch.set_num_threads(1)
    public = one_thread_public_plan(algorithm)
    trainers = [LocalTrainer(load_graph_folder(TU / d), public, d) for d in CHEM]

    def one_round() -> None:
        for trainer in trainers:
            trainer.train()
            trainer.metrics(("val_acc", "val_loss", "test_acc", "test_loss"))

    one_round()                                # warms caches and allocators up
    profiler = cProfile.Profile()
    began = time.perf_counter()
    profiler.enable()
    for _ in range(rounds):
        one_round()
    profiler.disable()
    print(f"{algorithm}: {(time.perf_counter() - began) / rounds:.3f} s/round under the "
          f"profiler; dense layers: {dense_path().reason}")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(20)


def _child(args: list[str], onednn: str = "auto") -> dict[str, float]:
    """Run this script with ``args`` in a fresh one-thread process; its last line, parsed."""
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                         check=True, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                          "TRELLIS_ONEDNN": onednn})
    return json.loads(out.stdout.strip().splitlines()[-1])


def _show(label: str, f: dict[str, float], versus: str = "") -> None:
    path = f"; dense layers: {f['path']}" if "path" in f else ""
    print(f"{label:26s} {f['s_per_round']:.3f} s/round (min {f['min_s']:.3f}), "
          f"peak RSS {f.get('peak_rss_mb', 0):.0f} MB{versus}{path}", flush=True)


def _mean_of(runs: list[dict[str, float]]) -> dict[str, float]:
    """Several runs of one configuration as one figure: mean of their means, overall min."""
    merged = dict(runs[-1])
    merged["s_per_round"] = sum(r["s_per_round"] for r in runs) / len(runs)
    merged["min_s"] = min(r["min_s"] for r in runs)
    merged["runs_s_per_round"] = [r["s_per_round"] for r in runs]
    return merged


def side_by_side(authors: Path, rounds: int, repeats: int) -> dict[str, dict[str, float]]:
    """Ours on each dense-layer path and the authors' FedStar, alternating, fresh processes."""
    from fedstar_authors import ensure_dependencies, prepare_data

    prepare_data(authors, TU)
    ensure_dependencies(authors, sys.executable)
    ours: dict[str, list[dict[str, float]]] = {label: [] for label, _ in FEDSTAR_PATHS}
    theirs: list[dict[str, float]] = []
    for repeat in range(repeats):
        for label, onednn in FEDSTAR_PATHS:
            ours[label].append(f := _child(["--child", "fedstar", "--rounds", str(rounds)],
                                           onednn))
            _show(f"{label} [{repeat + 1}]", f)
            theirs.append(f := _child(["--authors-child", str(authors), "--rounds",
                                       str(rounds)]))
            _show(f"authors' fedstar [{len(theirs)}]", f,
                  f", their mean val acc {f['mean_val_acc']:.3f}")
    figures = {"authors' fedstar": (their := _mean_of(theirs))}
    reference = their["s_per_round"]
    print(f"\nauthors' FedStar (da01eac): {reference:.3f} s/round (fastest round "
          f"{their['min_s']:.3f}), mean of {len(theirs)} runs "
          f"interleaved with ours")
    for label, runs in ours.items():
        figures[label] = f = _mean_of(runs)
        f["ours_over_authors"] = f["s_per_round"] / reference
        # Best rounds against best rounds: less of the other core's load in it.
        f["ours_over_authors_min"] = f["min_s"] / their["min_s"]
        print(f"{label:26s} {f['s_per_round']:.3f} s/round = {f['ours_over_authors']:.2f}x "
              f"the authors' time (fastest rounds: {f['ours_over_authors_min']:.2f}x); "
              f"dense layers: {f['path']}")
    return figures


def main() -> None:
    """Run every algorithm in a child process; print and record the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    parser.add_argument("--authors", type=Path, metavar="PATH",
                        help="a checkout of the authors' FedStar (yuetan031/FedStar at "
                             "da01eac): time it beside ours, alternating")
    parser.add_argument("--repeats", type=int, default=2,
                        help="with --authors: how many times each of our FedStar paths and "
                             "theirs run (alternating)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--authors-child", type=Path, help=argparse.SUPPRESS)
    # For a child (bench/gpu.py): where it trains and with how many torch threads.
    parser.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--datasets", nargs="+", default=list(CHEM), help=argparse.SUPPRESS)
    parser.add_argument("--profile", metavar="ALGORITHM",
                        help="instead: profile this algorithm's rounds (one thread, this "
                             "process) and print where the time goes")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.rounds, args.device, args.threads,
                                 tuple(args.datasets))))
        return
    if args.authors_child:
        from fedstar_authors import measure as measure_authors
        print(json.dumps(measure_authors(args.authors_child.resolve(), args.rounds,
                                         args.device, args.threads)))
        return
    if args.profile:
        profile(args.profile, args.rounds)
        return
    if not TU.exists():
        sys.exit(f"needs the shared datasets at {TU}")
    if args.authors and not (args.authors / "lib" / "setupGC.py").is_file():
        sys.exit(f"{args.authors} is not a checkout of yuetan031/FedStar (no lib/setupGC.py)")
    figures: dict[str, dict[str, float]] = {}
    runs = [(a, a, "auto") for a in args.algorithms]
    if "fedstar" in args.algorithms:
        if args.authors:
            figures |= side_by_side(args.authors.resolve(), args.rounds, args.repeats)
            runs = [r for r in runs if r[1] != "fedstar"]
        else:
            runs += [("fedstar, TRELLIS_ONEDNN=1", "fedstar", "1"),
                     ("fedstar, TRELLIS_ONEDNN=0", "fedstar", "0")]
    for label, algorithm, onednn in runs:
        figures[label] = f = _child(["--child", algorithm, "--rounds", str(args.rounds)],
                                    onednn)
        old = OLD_REFERENCE_S.get(label)
        _show(label, f, f" ({f['s_per_round'] / old:.2f}x an old figure of the reference "
                        f"code from another machine, {old:.2f} s)" if old else "")
    import one_thread  # noqa: F401  (puts the project on the path)

    from trellis.silo.models.dense import processor_name

    record = {"date": datetime.date.today().isoformat(), "machine": platform.machine(),
              "processor": processor_name(), "threads": 1, "rounds": args.rounds,
              "figures": figures}
    if args.authors:
        record |= {"authors": "yuetan031/FedStar@da01eac", "repeats": args.repeats}
    else:
        record["old_reference_s_other_machine"] = OLD_REFERENCE_S
    path = ROOT / "bench" / "results" / "speed_chem.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
