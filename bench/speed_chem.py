"""Benchmark: seconds per round and peak memory of local training on CHEM, one torch thread.

One round = one local epoch on each of the 7 CHEM silos plus their validation and test
evaluation, all silos in one process -- the work the reference repositories do per round
(their figures on this machine: FedStar 2.55 s, GCFL 1.37 s, peak 0.9 GB). Each algorithm runs
in its own process so that its peak RSS is its own. Secure aggregation is not included here
(bench/fedstar_chem.py measures whole rounds). Each algorithm runs on the dense-layer path the
probe of silo/dense.py chooses for this processor; FedStar also runs on both paths forced
(TRELLIS_ONEDNN=1 and 0) to show what oneDNN costs or buys here.
Writes bench/results/speed_chem.json.

    python bench/speed_chem.py [--rounds 5] [--algorithms fedstar gcfl ...]
    python bench/speed_chem.py --profile fedstar [--rounds 3]     # where the time goes
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TU = ROOT.parent / "shared" / "data" / "tu"
CHEM = ("MUTAG", "BZR", "COX2", "DHFR", "PTC_MR", "AIDS", "NCI1")
REFERENCE_S = {"fedstar": 2.55, "gcfl": 1.37}
ALGORITHMS = ("fedstar", "feddense", "gcfl", "fedavg", "local")


def measure(algorithm: str, rounds: int) -> dict[str, float]:
    """In this process: build the 7 trainers, time `rounds` rounds after one warm-up round."""
    from one_thread import one_thread_public_plan

    from trellis.silo.datasets import load_graph_folder
    from trellis.silo.dense import dense_path, onednn_enabled
    from trellis.silo.trainer import LocalTrainer

    public = one_thread_public_plan(algorithm)
    start = time.perf_counter()
    trainers = [LocalTrainer(load_graph_folder(TU / d), public, d) for d in CHEM]
    setup = time.perf_counter() - start
    times = []
    for i in range(rounds + 1):
        start = time.perf_counter()
        for trainer in trainers:
            trainer.train()
            trainer.metrics(("val_acc", "val_loss", "test_acc", "test_loss"))
        if i:                                  # round 0 warms caches and allocators up
            times.append(time.perf_counter() - start)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"s_per_round": sum(times) / len(times), "min_s": min(times), "setup_s": setup,
            "peak_rss_mb": peak_mb, "onednn": onednn_enabled(), "path": dense_path().reason}


def profile(algorithm: str, rounds: int) -> None:
    """Print the functions that take the most own time over `rounds` rounds after a warm-up
    round (set-up excluded), one thread, in this process."""
    import cProfile
    import pstats

    import torch
    from one_thread import one_thread_public_plan

    from trellis.silo.datasets import load_graph_folder
    from trellis.silo.dense import dense_path
    from trellis.silo.trainer import LocalTrainer

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


def main() -> None:
    """Run every algorithm in a child process; print and record the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--profile", metavar="ALGORITHM",
                        help="instead: profile this algorithm's rounds (one thread, this "
                             "process) and print where the time goes")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.rounds)))
        return
    if args.profile:
        profile(args.profile, args.rounds)
        return
    if not TU.exists():
        sys.exit(f"needs the shared datasets at {TU}")
    figures = {}
    runs = [(a, a, "auto") for a in args.algorithms]
    if "fedstar" in args.algorithms:
        runs += [("fedstar, TRELLIS_ONEDNN=1", "fedstar", "1"),
                 ("fedstar, TRELLIS_ONEDNN=0", "fedstar", "0")]
    for label, algorithm, onednn in runs:
        out = subprocess.run([sys.executable, __file__, "--child", algorithm, "--rounds",
                              str(args.rounds)], capture_output=True, text=True, check=True,
                             env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                  "TRELLIS_ONEDNN": onednn})
        figures[label] = f = json.loads(out.stdout.strip().splitlines()[-1])
        ref = REFERENCE_S.get(label)
        versus = (f" ({f['s_per_round'] / ref:.2f}x the reference code's {ref:.2f} s)"
                  if ref else "")
        print(f"{label:26s} {f['s_per_round']:.3f} s/round (min {f['min_s']:.3f}), "
              f"peak RSS {f['peak_rss_mb']:.0f} MB{versus}; dense layers: {f['path']}",
              flush=True)
    record = {"date": datetime.date.today().isoformat(), "machine": platform.machine(),
              "threads": 1, "rounds": args.rounds, "reference_s": REFERENCE_S,
              "figures": figures}
    path = ROOT / "bench" / "results" / "speed_chem.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
