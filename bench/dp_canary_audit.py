"""One-run canary audit of the distributed mechanism (Steinke, Nasr, Jagielski, NeurIPS'23).

m canary records, each a random vector of L2 norm `clip`, each included with probability 1/2,
go through what a silo's round does to its clipped sum (scale, nearest rounding, a discrete
Gaussian share; the other silos add only their shares; the ring sum decoded). The auditor scores
each canary by its inner product with the released sum, guesses the top k "in" and the bottom k
"out", and turns the number of correct guesses into a lower bound on epsilon that holds with
confidence 1 - beta (their Theorem 1, the pure-DP form: with delta = 1e-5 and m canaries the
delta term adds at most m * delta to the failure probability). The bound must stay at or below
the accountant's epsilon for one release, by either accountant ("rdp" and the tight "pld");
with no noise (the positive control) it must rise.

    python bench/dp_canary_audit.py --canaries 1000 --dimension 20000
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "dp_canary_audit.json"


def empirical_epsilon(correct: int, guesses: int, beta: float = 0.05) -> float:
    """The largest epsilon the binomial test rejects: P[Bin(r, e^e/(1+e^e)) >= v] <= beta."""
    if guesses == 0:
        return 0.0
    low, high = 0.0, 50.0
    for _ in range(60):
        mid = (low + high) / 2
        p = math.exp(mid) / (1 + math.exp(mid))
        # An epsilon-DP mechanism makes v or more correct this unlikely: reject it if below beta.
        if stats.binom.sf(correct - 1, guesses, p) <= beta:
            low = mid
        else:
            high = mid
    return low


def audit(noise_multiplier: float, *, canaries: int, dimension: int, silos: int = 5,
          threshold: int = 3, guesses: int = 100, bits: int = 14, seed: int = 1
          ) -> dict[str, float]:
    """One release with `canaries` candidate records; the empirical epsilon lower bound."""
    from trellis.crypto.dp_accountant import ddg_event, projected_epsilon
    from trellis.crypto.dp_encoding import to_ring
    from trellis.crypto.randomness import SeededRandomSource
    from trellis.protos.privacy_plan import PrivacyConfig
    from trellis.silo.privacy.private_step import add_noise, private_step, to_integers

    rng = np.random.default_rng(seed)
    privacy = PrivacyConfig(mechanism="ddg", noise_multiplier=noise_multiplier, clip=1.0,
                            bits=bits, batch=canaries, design_graphs=canaries)
    step = private_step(privacy, threshold=threshold, dimension=dimension, graphs=canaries)
    vectors = rng.standard_normal((canaries, dimension))
    vectors *= privacy.clip / np.linalg.norm(vectors, axis=1, keepdims=True)
    included = rng.random(canaries) < 0.5
    clipped_sum = vectors[included].sum(axis=0)
    total = np.zeros(dimension, np.uint64)
    for silo in range(silos):
        signal = to_integers(clipped_sum, step.scale) if silo == 0 else np.zeros(dimension,
                                                                                np.int64)
        source = SeededRandomSource(f"audit|{seed}|{silo}".encode())
        total += to_ring(add_noise(signal, step.share_sigma, source), 64)
    released = total.view(np.int64).astype(np.float64) / step.scale
    scores = vectors @ released
    order = np.argsort(scores)
    guessed_in, guessed_out = order[-guesses // 2:], order[:guesses // 2]
    correct = int(included[guessed_in].sum() + (~included[guessed_out]).sum())
    event = [ddg_event(step.encoding, silos, 1.0)]
    accountant = projected_epsilon(event, 1e-5) if noise_multiplier > 0 else math.inf
    tight = (projected_epsilon(event, 1e-5, accountant="pld") if noise_multiplier > 0
             else math.inf)
    return {"noise_multiplier": noise_multiplier, "canaries": canaries,
            "dimension": dimension, "guesses": guesses, "correct": correct,
            "empirical_epsilon": empirical_epsilon(correct, guesses),
            "accountant_epsilon": accountant, "pld_accountant_epsilon": tight}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--canaries", type=int, default=1000)
    parser.add_argument("--dimension", type=int, default=20_000)
    parser.add_argument("--guesses", type=int, default=200)
    parser.add_argument("--multipliers", type=float, nargs="+", default=[0.0, 0.5, 1.0, 2.0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows = []
    for z in args.multipliers:
        row = audit(z, canaries=args.canaries, dimension=args.dimension, guesses=args.guesses)
        rows.append(row)
        print(f"z {z:4}: {row['correct']}/{row['guesses']} guesses right, empirical epsilon >= "
              f"{row['empirical_epsilon']:.2f}, accountant {row['accountant_epsilon']:.2f} "
              f"(rdp), {row['pld_accountant_epsilon']:.2f} (pld)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1,
                                   default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
