"""Plot bench/results/secagg_scale.json: round time and coordinator peak memory against N.

One line per protocol and vector length. Writes docs/results/secagg-scale.png (or --out).

    python bench/plot_scale.py [--results bench/results/secagg_scale.json] [--out PNG]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    """Draw the two panels and save them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path,
                        default=ROOT / "bench" / "results" / "secagg_scale.json")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" /
                        "secagg-scale.png")
    args = parser.parse_args()
    record = json.loads(args.results.read_text())
    series: dict[tuple[str, int], list[dict]] = {}
    for row in record["rows"]:
        series.setdefault((row["protocol"], row["length"]), []).append(row)
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for (protocol, length), rows in sorted(series.items()):
        rows.sort(key=lambda r: r["silos"])
        n = [r["silos"] for r in rows]
        label = f"{protocol}, d = {length:,}"
        style = "-o" if protocol == "secagg+" else "--s"
        left.plot(n, [r["stage_s"]["round"] for r in rows], style, label=label)
        right.plot(n, [r["coordinator_peak_mb"] for r in rows], style, label=label)
    left.set(xlabel="silos N", ylabel="round 1, seconds (opened to completed)",
             title="Secure-aggregation round time")
    right.set(xlabel="silos N", ylabel="coordinator peak resident MB",
              title="Coordinator memory")
    right.axhline(1000, color="grey", linewidth=0.8, linestyle=":")
    right.text(right.get_xlim()[0], 1010, " 1 GB target", color="grey", fontsize=8)
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(f"bench/secagg_scale.py, {record['date']}, {record['cpus']} cores, "
                    f"10 % dropping after their shares", fontsize=10)
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
