"""Benchmark: what one silo's graphs cost in memory and set-up time, on a large TU dataset.

A silo loads its folder, computes the structure embeddings, splits and packs its graphs once
(silo/models/batching.py), then trains. On COLLAB (5,000 dense graphs, 24.6 million directed edges)
that set-up dominates a silo's memory. Each algorithm runs in its own process with one torch
thread, so its peak RSS is its own. Writes bench/results/silo_memory.json.

    python bench/silo_memory.py [--data ../shared/data/tu/COLLAB] [--algorithms fedstar ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "tu" / "COLLAB"
ALGORITHMS = ("fedstar", "feddense", "gcfl")


def _rss_gb() -> tuple[float, float]:
    """(current, peak) resident set size of this process in GB, from /proc."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines()
                  if ":" in line)
    return (int(fields["VmRSS"].split()[0]) / 1e6, int(fields["VmHWM"].split()[0]) / 1e6)


def measure(algorithm: str, data: Path) -> dict[str, float]:
    """In this process: load, build the trainer, train one epoch, evaluate; time and RSS."""
    from one_thread import one_thread_public_plan

    from trellis.silo.data.datasets import load_graph_folder
    from trellis.silo.training.memory import return_freed_memory
    from trellis.silo.training.trainer import LocalTrainer

    public = one_thread_public_plan(algorithm)
    figures: dict[str, float] = {}
    start = time.perf_counter()
    dataset = load_graph_folder(data)
    figures["load_s"] = time.perf_counter() - start
    figures["loaded_rss_gb"], figures["load_peak_gb"] = _rss_gb()
    figures["directed_edges"] = float(sum(int(g.edge_index.size(1)) for g in dataset.graphs))
    start = time.perf_counter()
    trainer = LocalTrainer(dataset, public, "a")
    figures["setup_s"] = time.perf_counter() - start
    figures["setup_rss_gb"], figures["setup_peak_gb"] = _rss_gb()
    # `silo join` keeps only the trainer's packed splits; the loaded graph list goes, and the
    # freed heap pages go back to the OS.
    del dataset
    return_freed_memory()
    figures["released_rss_gb"] = _rss_gb()[0]
    start = time.perf_counter()
    trainer.train()
    figures["epoch_s"] = time.perf_counter() - start
    start = time.perf_counter()
    trainer.metrics(("val_acc", "val_loss", "test_acc", "test_loss"))
    figures["evaluation_s"] = time.perf_counter() - start
    figures["rss_gb"], figures["peak_gb"] = _rss_gb()
    return figures


def main() -> None:
    """Run every algorithm in a child process; print and record the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="one TU dataset folder")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "silo_memory.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.data)))
        return
    if not args.data.is_dir():
        sys.exit(f"no dataset folder at {args.data} (pass --data)")
    figures = {}
    for algorithm in args.algorithms:
        out = subprocess.run([sys.executable, __file__, "--child", algorithm, "--data",
                              str(args.data)], capture_output=True, text=True, check=True,
                             env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
        figures[algorithm] = f = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{algorithm:9s} load {f['load_s']:.1f} s ({f['loaded_rss_gb']:.2f} GB), "
              f"set-up {f['setup_s']:.1f} s ({f['setup_rss_gb']:.2f} GB, "
              f"{f['released_rss_gb']:.2f} GB without the loaded graphs), "
              f"peak {f['peak_gb']:.2f} GB, "
              f"{f['rss_gb']:.2f} GB after one epoch ({f['epoch_s']:.1f} s) and an evaluation "
              f"({f['evaluation_s']:.1f} s)", flush=True)
    record = {"date": datetime.date.today().isoformat(), "machine": platform.machine(),
              "threads": 1, "data": args.data.name, "commit": _commit(), "figures": figures}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


def _commit() -> str:
    """The checkout's commit, so a results file says which code it measured."""
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown"


if __name__ == "__main__":
    main()
