"""Benchmark: FedHGN on AIFB with K = 5 silos -- seconds per round and peak memory, one thread.

Runs whole rounds with `coordinator simulate`'s machinery (group key, sealed coefficient
envelopes, masked secure aggregation, evaluation of every silo), and separately times the
local training alone (3 full-batch epochs on each silo), so the secure-aggregation overhead
can be read off. Patience is raised so that exactly `--rounds` rounds run. Writes
bench/results/fedhgn_aifb.json.

    python bench/fedhgn_aifb.py [--rounds 30] [--split random-edges_5]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HETERO = ROOT.parent / "shared" / "data" / "hetero" / "aifb"


def main() -> None:
    """Run the benchmark and write its results file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--split", default="random-edges_5")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" /
                        "fedhgn_aifb.json")
    args = parser.parse_args()
    folder = HETERO / args.split
    if not folder.is_dir():
        sys.exit(f"needs the AIFB splits at {folder}")
    import torch

    sys.path.insert(0, str(ROOT))
    from trellis.coordinator.simulation.sequential import run_simulation
    from trellis.protos.plan import parse_plan
    from trellis.silo.data.hetero import load_hetero_folder
    from trellis.silo.training.trainers import make_hetero_trainer

    torch.set_num_threads(1)
    clients = sorted(p.name for p in folder.iterdir() if p.name.startswith("client-"))
    silos = [f"c{i}" for i in range(len(clients))]
    plan = parse_plan({"federation": {"id": "bench-fedhgn", "algorithm": "fedhgn",
                                      "rounds": args.rounds, "seed": 1000, "silos": silos},
                       "fedhgn": {"classes": 4, "patience": args.rounds + 1}},
                      base_dir=ROOT)
    graphs = {s: load_hetero_folder(folder / c) for s, c in zip(silos, clients, strict=True)}

    trainers = [make_hetero_trainer(g, plan.public, s) for s, g in graphs.items()]
    for t in trainers:
        t.train()                                   # warm-up
    start = time.perf_counter()
    for _ in range(args.rounds):
        for t in trainers:
            t.train()
    train_s = (time.perf_counter() - start) / args.rounds

    start = time.perf_counter()
    results = run_simulation(plan, graphs, progress=False)
    total = time.perf_counter() - start
    assert results["status"] == "completed", results["failure"]
    per_round = [r["seconds"] for r in results["rounds"]]
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    round_s = sorted(per_round)[len(per_round) // 2]
    document = {
        "benchmark": "fedhgn_aifb", "split": args.split, "silos": len(silos),
        "rounds": args.rounds, "threads": 1,
        "seconds_per_round_median": round(round_s, 4),
        "seconds_per_round_mean": round(sum(per_round) / len(per_round), 4),
        "local_training_seconds_per_round": round(train_s, 4),
        "whole_run_seconds": round(total, 2),
        "peak_rss_mb": round(peak_mb, 1),
        "machine": platform.platform(), "python": platform.python_version(),
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"FedHGN AIFB {args.split}: {round_s:.3f} s per round (median of {args.rounds}; "
          f"local training {train_s:.3f} s of it), peak memory {peak_mb:.0f} MB "
          f"-> {args.out}")


if __name__ == "__main__":
    main()
