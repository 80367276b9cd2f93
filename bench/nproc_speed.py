"""Seconds per local round with `silo join --nproc 2` against one process, same global batch.

One process with one thread, one process with two threads (the same cores as two processes),
and two processes with one thread each (tests/support/parallel_run.py: the trainer
`silo join --nproc 2` runs, over gloo on loopback). Also the largest weight difference after the
first round between one process and two, relative to each tensor's largest entry. Usage:

    python bench/nproc_speed.py [--data /work/shared/data/tu/NCI1] [--algorithms fedstar,feddense]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")      # before torch: see silo --threads
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tests.support.parallel_run import one_process  # noqa: E402


def main() -> None:
    """Print one line per algorithm: median seconds per round each way, and the difference."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data/tu/NCI1"))
    parser.add_argument("--algorithms", default="fedstar,feddense")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "two.pt"
        done = subprocess.run([sys.executable, "-m", "tests.support.parallel_run", "--data",
                               str(args.data), "--out", str(out), "--nproc", "2",
                               "--algorithms", args.algorithms, "--batch-size",
                               str(args.batch_size), "--epochs", "1", "--rounds",
                               str(args.rounds)], cwd=ROOT, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(done.stderr[-3000:])
        two = torch.load(out, weights_only=True)
    for algorithm in args.algorithms.split(","):
        one = one_process(args.data, algorithm, args.batch_size, 1, args.rounds, threads=1)
        both = one_process(args.data, algorithm, args.batch_size, 1, args.rounds, threads=2)
        first, reference = two[algorithm][0]["model"], one[0]["model"]
        # Relative to each tensor's largest entry (batch norm's running variances reach 100s).
        diff = max(float((first[k].float() - reference[k].float()).abs().max())
                   / max(1.0, float(reference[k].float().abs().max())) for k in reference)

        def median(runs: list[dict]) -> float:
            return statistics.median(r["seconds"] for r in runs)

        print(f"{algorithm}: s/round 1 process 1 thread {median(one):.2f}, 1 process 2 threads "
              f"{median(both):.2f}, 2 processes {median(two[algorithm]):.2f}; largest weight "
              f"difference after round 1 (relative): {diff:.2g}", flush=True)


if __name__ == "__main__":
    main()
