"""Benchmark: the coordinator's memory for one secure aggregation as the number of silos grows.

The coordinator sums masked inputs as they arrive (crypto/secagg_server.py), so one attempt
holds one vector of the model's size whatever the number of silos; before, it kept every silo's
masked vector until unmasking. One process plays every party (crypto/secagg_local.py: the real
client and server objects, real key agreement, Shamir shares and AES-CTR masks), SecAgg+ with
about 2 log2 N neighbours, 10 % of the silos dropping after sending their shares. Every silo
encodes the same vector (one array, so the inputs add no memory of their own); tracemalloc
measures the peak of everything the run allocates, in units of one masked vector. With the
inputs summed as they arrive that peak stays a few vectors as N grows; a server that kept the
inputs would need at least N. The unmasked sum is checked exactly.
Writes bench/results/secagg_server_memory.json.

    python bench/secagg_server_memory.py [--silos 10 25 50 100] [--length 1000000] [--out F]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trellis.crypto.keyagreement import RoundContext  # noqa: E402
from trellis.crypto.pki import throwaway_identities  # noqa: E402
from trellis.crypto.secagg import SecAggConfig  # noqa: E402
from trellis.crypto.secagg_local import run_local_aggregation  # noqa: E402


def neighbours_for(n: int) -> int:
    """An even k of the order of 2 log2 N, below N."""
    k = 2 * math.ceil(math.log2(n))
    return min(k, n - 1 - (n - 1) % 2)


def measure(n: int, length: int, identities: dict) -> dict[str, float | int | bool]:
    """One aggregation of n silos: peak memory in vectors, seconds, and whether the sum is exact."""
    names = sorted(identities)[:n]
    k = neighbours_for(n)
    config = SecAggConfig(threshold=k // 2 + 1, neighbours=k, graph_seed=1)
    vector = np.arange(length, dtype=np.uint64)
    encoded = {name: vector for name in names}         # one array: the inputs cost nothing
    dropped = {name: "input" for name in names[:: 10]}  # 10 %: gone after sending shares
    tracemalloc.start()
    began = time.perf_counter()
    outcome = run_local_aggregation(encoded, {s: identities[s] for s in names}, config,
                                    RoundContext("bench", 1, 1, run="bench"), dropped)
    seconds = time.perf_counter() - began
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    survivors = n - len(dropped)
    exact = outcome.total is not None and np.array_equal(
        outcome.total, vector * np.uint64(survivors))
    return {"silos": n, "neighbours": k, "dropped": len(dropped), "length": length,
            "peak_vectors": peak / vector.nbytes, "peak_mb": peak / 1e6,
            "coordinator_s": outcome.coordinator_seconds, "total_s": seconds, "exact": exact}


def main() -> None:
    """Run each N, print a line each, write the results file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--silos", type=int, nargs="+", default=[10, 25, 50, 100])
    parser.add_argument("--length", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path,
                        default=ROOT / "bench" / "results" / "secagg_server_memory.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        identities = throwaway_identities([f"silo-{i:03d}" for i in range(max(args.silos))],
                                          Path(folder))
        rows = []
        for n in args.silos:
            row = measure(n, args.length, identities)
            rows.append(row)
            print(f"N={n:4d} k={row['neighbours']:2d} d={args.length}: peak "
                  f"{row['peak_vectors']:.1f} vectors ({row['peak_mb']:.0f} MB), coordinator "
                  f"{row['coordinator_s']:.2f} s, all parties {row['total_s']:.1f} s, exact sum: "
                  f"{row['exact']}", flush=True)
    record = {"date": datetime.date.today().isoformat(), "rows": rows}
    path = args.out
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")
    if not all(row["exact"] for row in rows):
        sys.exit("an aggregation was not exact")


if __name__ == "__main__":
    main()
