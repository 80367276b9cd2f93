"""Benchmark (issue 36): FedStar on CHEM molecules prepared from SMILES vs the same molecules from
their TU folders -- is the accuracy the same within noise over 3 seeds?

For every CHEM dataset whose molecules this tree can write as SMILES (MUTAG, PTC_MR, AIDS:
tests/support/tu_molecules.py reads atom and bond types from the README's label tables, or
AIDS_label_readme.txt with each atom's charge), the
bench writes the SMILES table, prepares it with `silo data prepare` (the CLI, as a site would),
and runs two `coordinator simulate` plans of the same silos (one per dataset) with FedStar and
the paper's CHEM settings (docs/algorithms.md §2.2-2.4: width 64, 3 layers, dropout 0.5, lr
0.001, weight decay 5e-4, batch 128, one local epoch a round, split seed 123, and the paper's
200 rounds): one plan reads
the TU folders, the other the prepared folders; each for seeds 1, 2, 3, in this process with one
torch thread (tests/support/federation.simulate_like_silo_processes). Both plans have the same
federation id, so a seed starts both from the same shared structure encoder.

What differs by construction, besides the source:
- the node features. From TU a node is the one-hot of its TU atom label (7 values for MUTAG,
  18 for PTC_MR); prepared, it is OGB's 174-wide atom features (element, degree, charge,
  hydrogens, hybridisation, aromaticity, ring membership, ...: docs/data/molecules.md). So
  FedStar's local feature channel (`pre`, the GIN layers) is not the same model in the two runs.
  The shared structure channel sees the same graphs: its input (RWSE + degree, §2.1) is
  computed from the structure alone, and the SMILES round trip keeps every graph's atoms and
  bonds (docs/data/molecules.md, "The TU round trip");
- the graphs kept. MUTAG loses 2 of its 188 graphs (82 and 187: a carbon with five bonds, which
  RDKit refuses) and AIDS 9 of its 2000 (an atom over its valence), so their stratified splits
  (same split seed) are drawn over fewer graphs and are not the TU splits; PTC_MR keeps all 344
  in order, so its split is the same.
The split seed stays 123 (the paper's protocol), so a dataset's test set is the same for the
three seeds (the seed changes the initialisation and the batches): accuracy moves in steps of one
test graph (MUTAG 19 test graphs, 5.26 points; PTC_MR 35, 2.86 points; AIDS 200, 0.5 points),
and a std of 0 means the three seeds classified the test graphs equally well. The bench prints
both.
Not compared: BZR, COX2 and DHFR (their READMEs have no node-label table and the folders have no
edge labels: no element or bond type to write a SMILES from), NCI1 (the same).

The figures are the report's (coordinator/operations/report.py): the final round's test accuracy
and the test accuracy at the round of best mean validation accuracy; per dataset the mean and
sample std over the seeds, overall the mean over datasets of those (the report's "±": the mean
of the per-dataset stds). Three tests of "the same within noise", printed side by side:
- Welch's t-test on the three per-seed figures of each side (scipy): the difference is not
  significant when p >= 0.05. This is the test of the question asked: are the means different?
- the stricter one pooled standard deviation: |prepared - TU| <= sqrt((std_TU^2 +
  std_prepared^2) / 2), a band for single runs rather than for means of three;
- within resolution: at most the larger of that and one test graph, since a smaller difference
  cannot be told from the test set's own granularity (three seeds on one fixed test set can all
  agree exactly, std 0).

    python bench/prepared_vs_tu.py [--rounds 200] [--tu ../shared/data/tu]

Writes bench/results/prepared_vs_tu.json; the runs' result files go to
bench-run/prepared_vs_tu/{tu,prepared}/fedstar/seed-N.json (`coordinator report --results` reads
that folder).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.tu_molecules import write_molecules  # noqa: E402
from trellis.coordinator.operations.report import (  # noqa: E402
    aggregate,
    best_validation_accuracy,
    best_validation_round,
    final_accuracy,
)

TU = ROOT.parent / "shared" / "data" / "tu"
DATASETS = ("MUTAG", "PTC_MR", "AIDS")
NOT_CONVERTED = {
    "BZR": "README has no node-label table and the folder no edge labels",
    "COX2": "README has no node-label table and the folder no edge labels",
    "DHFR": "README has no node-label table and the folder no edge labels",
    "NCI1": "README has no node-label table and the folder no edge labels",
}
SEEDS = (1, 2, 3)
KINDS = ("tu", "prepared")
FEDERATION = "prepared-vs-tu"


def silo_name(dataset: str) -> str:
    """A silo name for a dataset (as bench/reproduce.py names them)."""
    return dataset.lower().replace("_", "-")


def test_sets(tu: Path, prepared: Path, kept: list[int]) -> dict[str, Any]:
    """The test parts both runs draw (split seed 123): their sizes, and whether they hold the
    same TU graphs (`kept[k]` is the TU graph of prepared graph k)."""
    from trellis.silo.data.datasets import load_graph_folder
    from trellis.silo.data.split import stratified_split

    def test_part(folder: Path) -> list[int]:
        labels = np.array([int(g.y) for g in load_graph_folder(folder).graphs])
        return [int(i) for i in stratified_split(labels).test]

    on_tu, on_prepared = test_part(tu), test_part(prepared)
    return {"tu_test_graphs": len(on_tu), "prepared_test_graphs": len(on_prepared),
            "same_test_graphs": sorted(on_tu) == sorted(kept[k] for k in on_prepared),
            "one_test_graph_pp": round(100 / len(on_tu), 2)}


def prepare(tu: Path, work: Path) -> tuple[dict[str, Path], dict[str, Any]]:
    """Write each dataset as SMILES and prepare it; (silo -> prepared folder, what was kept)."""
    folders: dict[str, Path] = {}
    conversion: dict[str, Any] = {}
    for dataset in DATASETS:
        smiles_dir = work / "smiles"
        smiles_dir.mkdir(parents=True, exist_ok=True)
        written = write_molecules(tu / dataset, smiles_dir)
        out = work / "prepared-data" / dataset
        shutil.rmtree(out, ignore_errors=True)
        proc = subprocess.run(
            [sys.executable, "-m", "trellis.silo.cli", "data", "prepare",
             str(written.smiles_csv), "--id-column", "id", "--out", str(out)],
            capture_output=True, text=True, cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)))
        if proc.returncode != 0:
            sys.exit(f"silo data prepare {written.smiles_csv} failed: {proc.stderr.strip()}")
        folders[silo_name(dataset)] = out
        conversion[dataset] = {
            "tu_graphs": len(written.molecules) + len(written.unwritable),
            "smiles_rows": len(written.molecules), "mended": written.mended,
            "not_written": [{"graph": g, "why": why} for g, why in written.unwritable],
            "prepare": proc.stdout.strip().replace(f"{work}{os.sep}", ""),
            **test_sets(tu / dataset, out, [m.index for m in written.molecules])}
    return folders, conversion


def plan_text(folders: dict[str, Path], seed: int, rounds: int) -> str:
    """A FedStar plan over these silo folders (the paper's CHEM settings are the defaults)."""
    silos = ", ".join(f'"{name}"' for name in folders)
    data = ", ".join(f'"{name}" = "{folder}"' for name, folder in folders.items())
    return (f'[federation]\nid = "{FEDERATION}"\nalgorithm = "fedstar"\nrounds = {rounds}\n'
            f"seed = {seed}\nsilos = [{silos}]\n\n[simulation]\ndata = {{ {data} }}\n")


def run(plan: Path) -> dict[str, Any]:
    """Simulate a plan in this process with one torch thread; its results document."""
    from tests.support.federation import simulate_like_silo_processes
    from trellis.protos.plan import load_plan

    return simulate_like_silo_processes(load_plan(plan))


def figures(docs: list[dict[str, Any]], silos: list[str]) -> dict[str, Any]:
    """Final and best-validation test accuracy (%), mean and std over seeds, of these silos."""
    out: dict[str, Any] = {}
    for protocol, per_doc in (("final", final_accuracy), ("best_val", best_validation_accuracy)):
        per_seed = [{s: v for s, v in per_doc(d).items() if s in silos} for d in docs]
        mean, std = aggregate(per_seed)
        out[protocol] = {"mean": round(mean, 2), "std": round(std, 2),
                         "per_seed": [round(100 * sum(r.values()) / len(r), 2)
                                      for r in per_seed]}
    return out


def welch_p(a: list[float], b: list[float]) -> float:
    """Welch's two-sided t-test p-value of two samples (1 or 0 when neither varies)."""
    from scipy.stats import ttest_ind

    if np.std(a) == 0 and np.std(b) == 0:
        return 1.0 if np.mean(a) == np.mean(b) else 0.0
    return float(ttest_ind(a, b, equal_var=False).pvalue)


def compare(tu: dict[str, Any], prepared: dict[str, Any], one_graph: float) -> dict[str, Any]:
    """Difference prepared - TU per protocol; Welch's p and whether it is >= 0.05; whether it
    is within one pooled std, and within the resolution (the larger of that std and
    `one_graph`, one test graph in points)."""
    out = {}
    for protocol in ("final", "best_val"):
        a, b = tu[protocol], prepared[protocol]
        noise = math.sqrt((a["std"] ** 2 + b["std"] ** 2) / 2)
        diff = b["mean"] - a["mean"]
        p = welch_p(a["per_seed"], b["per_seed"])
        out[protocol] = {"diff": round(diff, 2), "welch_p": round(p, 3),
                         "not_significant": p >= 0.05, "pooled_std": round(noise, 2),
                         "within_noise": abs(diff) <= noise,
                         "within_resolution": abs(diff) <= max(noise, one_graph) + 1e-9}
    return out


def main() -> None:
    """Prepare, run both plans for each seed, print the table, write the results file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--tu", type=Path, default=TU, help="folder of the TU datasets")
    parser.add_argument("--work", type=Path, default=ROOT / "bench-run" / "prepared_vs_tu")
    parser.add_argument("--reuse", action="store_true",
                        help="read the runs' result files already in --work instead of running "
                             "them again (after an interrupted run, or to recompute the table)")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "bench" / "results" / "prepared_vs_tu.json")
    args = parser.parse_args()
    if not args.tu.is_dir():
        sys.exit(f"needs the TU datasets at {args.tu} (see --tu)")
    started = time.monotonic()
    tu, work = args.tu.resolve(), args.work.resolve()
    prepared_folders, conversion = prepare(tu, work)
    folders = {"tu": {silo_name(d): tu / d for d in DATASETS}, "prepared": prepared_folders}
    docs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    for seed in SEEDS:
        for kind in KINDS:
            plan = work / "plans" / f"{kind}-seed-{seed}.toml"
            plan.parent.mkdir(parents=True, exist_ok=True)
            plan.write_text(plan_text(folders[kind], seed, args.rounds))
            t0 = time.monotonic()
            result = work / kind / "fedstar" / f"seed-{seed}.json"
            if args.reuse and result.is_file():
                docs[kind].append(json.loads(result.read_text()))
                print(f"{kind:8} seed {seed}: read {result}", flush=True)
                continue
            doc = run(plan)
            if doc["status"] != "completed":
                sys.exit(f"{kind} seed {seed}: {doc['status']}: {doc.get('failure')}")
            result.parent.mkdir(parents=True, exist_ok=True)
            result.write_text(json.dumps(doc))
            docs[kind].append(doc)
            print(f"{kind:8} seed {seed}: {args.rounds} rounds in {time.monotonic() - t0:.0f} s",
                  flush=True)

    groups = {d: [silo_name(d)] for d in DATASETS} | {"overall": [silo_name(d) for d in DATASETS]}
    table: dict[str, Any] = {}
    for group, silos in groups.items():
        row = {kind: figures(docs[kind], silos) for kind in KINDS}
        # One test graph, in points: of the dataset, or overall the mean over datasets.
        one_graph = float(np.mean([conversion[d]["one_test_graph_pp"] for d in DATASETS
                                   if silo_name(d) in silos]))
        row["prepared_minus_tu"] = compare(row["tu"], row["prepared"], one_graph)
        if group == "overall":
            row["best_val_rounds"] = {kind: [best_validation_round(d) for d in docs[kind]]
                                      for kind in KINDS}
        table[group] = row
    wall = time.monotonic() - started

    lines = [f"FedStar, {len(DATASETS)} silos ({', '.join(DATASETS)}), {args.rounds} rounds, "
             f"seeds {', '.join(map(str, SEEDS))}: test accuracy %, mean ± std over seeds",
             f"{'dataset':9} {'protocol':9} {'TU':>13} {'prepared':>13} {'diff':>7} "
             f"{'Welch p':>7} {'pooled std':>10}  within 1 std  within resolution"]
    for group, row in table.items():
        for protocol in ("final", "best_val"):
            a, b = row["tu"][protocol], row["prepared"][protocol]
            c = row["prepared_minus_tu"][protocol]
            lines.append(f"{group:9} {protocol:9} {a['mean']:6.2f} ± {a['std']:4.2f} "
                         f"{b['mean']:6.2f} ± {b['std']:4.2f} {c['diff']:+7.2f} "
                         f"{c['welch_p']:7.3f} {c['pooled_std']:10.2f}  "
                         f"{'yes' if c['within_noise'] else 'NO':12}  "
                         f"{'yes' if c['within_resolution'] else 'NO'}")
    significant = [f"{g} ({p})" for g, row in table.items() for p in ("final", "best_val")
                   if not row["prepared_minus_tu"][p]["not_significant"]]
    lines.append("no difference is significant (Welch's t-test, p >= 0.05)" if not significant
                 else "significant (Welch's t-test, p < 0.05): " + ", ".join(significant))
    outside = [f"{g} ({p})" for g, row in table.items() for p in ("final", "best_val")
               if not row["prepared_minus_tu"][p]["within_noise"]]
    lines.append("all differences are within one pooled standard deviation" if not outside else
                 "outside one pooled standard deviation: " + ", ".join(outside))
    unresolved = [f"{g} ({p})" for g, row in table.items() for p in ("final", "best_val")
                  if not row["prepared_minus_tu"][p]["within_resolution"]]
    lines.append("all differences are within the resolution" if not unresolved else
                 "outside the resolution: " + ", ".join(unresolved))
    for dataset, kept in conversion.items():
        lines.append(f"{dataset}: {kept['smiles_rows']} of {kept['tu_graphs']} graphs prepared; "
                     f"{kept['tu_test_graphs']} test graphs (one = {kept['one_test_graph_pp']} "
                     f"pp); the same test graphs as from TU: "
                     f"{'yes' if kept['same_test_graphs'] else 'no'}")
    lines.append(f"wall time {wall:.0f} s")
    print("\n".join(lines))

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python bench/prepared_vs_tu.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, 1 torch thread",
        "algorithm": "fedstar", "rounds": args.rounds, "seeds": list(SEEDS),
        "datasets": list(DATASETS), "not_converted": NOT_CONVERTED,
        "conversion": conversion, "accuracy": table, "not_significant": not significant,
        "within_noise": not outside,
        "within_resolution": not unresolved,
        "wall_s": round(wall, 1)}, indent=2) + "\n")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
