"""Benchmark: samples per second of the exact discrete Gaussian sampler (discrete_gaussian.py).

sigma = 4000 (sigma^2 = 16,000,000, the order of a DDG noise share at 16 bits of scale), with the
operating-system source (os.urandom, the private one) and the seeded AES-CTR source (tests), on
the vectorised int64 path; and the exact pure-Python path on fewer samples, for comparison.
Also the time of one call of --slice-count samples (4,400: a slice of the privacy recipe's
FedStar model, one silo's noise for one round) at the sigma the recipe's plans resolve to
(--slice-sigma), where a call's fixed cost, not its throughput, sets a private round's time.
Best of --repeats runs, one process, one thread. Writes bench/results/discrete_gaussian_speed.json.

    python bench/discrete_gaussian_speed.py [--sigma 4000] [--count 1000000] [--out F]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trellis.crypto import discrete_gaussian as dg  # noqa: E402
from trellis.crypto.randomness import OsRandomSource, RandomSource, SeededRandomSource  # noqa: E402


def rate(sample: object, count: int, repeats: int) -> float:
    """Best samples per second over `repeats` calls of sample(count)."""
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        sample(count)  # type: ignore[operator]
        best = min(best, time.perf_counter() - began)
    return count / best


def main() -> None:
    """Time each source, print a line each, write the results file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sigma", type=int, default=4000)
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--python-count", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--slice-count", type=int, default=4400)
    parser.add_argument("--slice-sigma", type=int, default=30600,
                        help="the recipe's noise at epsilon 8: z 1.86 times 2^14 + sqrt(d)")
    parser.add_argument("--slice-repeats", type=int, default=50)
    parser.add_argument("--out", type=Path,
                        default=ROOT / "bench" / "results" / "discrete_gaussian_speed.json")
    args = parser.parse_args()
    sigma2 = Fraction(args.sigma**2)
    sampler = dg.DiscreteGaussian(sigma2)
    sources: dict[str, RandomSource] = {"os": OsRandomSource(),
                                        "seeded": SeededRandomSource(b"bench")}
    rows = []
    for name, source in sources.items():
        per_s = rate(lambda n, s=source: sampler.sample(n, s), args.count, args.repeats)
        rows.append({"source": name, "path": "vectorised", "count": args.count,
                     "samples_per_s": round(per_s)})
    os_source = sources["os"]
    per_s = rate(lambda n: np.array([dg._dg_py(os_source, sigma2) for _ in range(n)]),
                 args.python_count, 1)
    rows.append({"source": "os", "path": "python", "count": args.python_count,
                 "samples_per_s": round(per_s)})
    for row in rows:
        print(f"sigma={args.sigma} {row['source']:>6} {row['path']:>10}: "
              f"{row['samples_per_s']:>10,} samples/s ({row['count']:,} per call)")
    slice_sampler = dg.DiscreteGaussian(Fraction(args.slice_sigma**2))
    calls = []
    for _ in range(args.slice_repeats):
        began = time.perf_counter()
        slice_sampler.sample(args.slice_count, os_source)
        calls.append(time.perf_counter() - began)
    slice_ms = 1000 * float(np.median(calls))
    print(f"sigma={args.slice_sigma}     os  one slice: {slice_ms:.1f} ms a call "
          f"({args.slice_count:,} samples, median of {args.slice_repeats})")
    record = {"date": datetime.date.today().isoformat(), "machine": platform.processor()
              or platform.machine(), "sigma": args.sigma, "threads": 1,
              "vector_max_sigma2": dg.VECTOR_MAX_SIGMA2, "rows": rows,
              "slice": {"sigma": args.slice_sigma, "count": args.slice_count,
                        "median_ms_per_call": round(slice_ms, 2),
                        "calls": args.slice_repeats}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
