"""How much noise a target epsilon costs: the noise multiplier z that the distributed discrete
Gaussian's accountant (Kairouz et al. Prop. 14, Poisson-subsampled by Zhu & Wang's general
bound) asks for, against the continuous Gaussian's tight RDP accountant, at the bench's settings
(NCI1 over 5 silos: ~650 training graphs per silo, 200 rounds, delta 1e-5). The gap is the cost
of the general subsampling bound. Writes bench/results/dp_noise_needed.json.

    python bench/dp_noise_needed.py [--batches 32 128] [--rounds 200]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trellis.crypto.dp_accountant import AccountingError, noise_multiplier_for  # noqa: E402

UNIT = 2.0 ** 16          # the plan's reference sensitivity in integer units (protos/privacy_plan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1, 2, 4, 8])
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--graphs", type=int, default=650)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--silos", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" /
                        "dp_noise_needed.json")
    args = parser.parse_args()
    rows = []
    print("batch  q      epsilon  z Gaussian  z DDG   ratio")
    for batch in args.batches:
        q = batch / args.graphs
        for epsilon in args.epsilons:
            gaussian = noise_multiplier_for(epsilon, 1e-5, q, args.rounds)
            try:
                ddg = noise_multiplier_for(epsilon, 1e-5, q, args.rounds, "ddg",
                                           l2_sensitivity=UNIT, l1_sensitivity=UNIT,
                                           dim=1, honest_shares=args.silos)
            except AccountingError:
                ddg = float("inf")
            rows.append({"batch": batch, "q": q, "epsilon": epsilon,
                         "z_gaussian": gaussian, "z_ddg": ddg})
            print(f"{batch:5}  {q:.3f}  {epsilon:7}  {gaussian:10.3f}  {ddg:6.3f}  "
                  f"{ddg / gaussian:5.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "delta": 1e-5,
                                    "rounds": args.rounds, "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
