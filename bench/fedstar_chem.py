"""Benchmark: FedStar on CHEM (7 silos) -- one-process simulation vs a real federation.

Prints seconds per round for both, their ratio, peak RSS of the coordinator and of one silo
process, and the final mean test accuracy; appends the figures to docs/benchmarks.md and writes
bench-run/fedstar_chem.json. Needs ../shared/data/tu (the papers' datasets).

    python bench/fedstar_chem.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.process_sampler import ProcessSampler  # noqa: E402
from tests.support.federation import free_port  # noqa: E402

CHEM = ("MUTAG", "BZR", "COX2", "DHFR", "PTC_MR", "AIDS", "NCI1")
TU = ROOT.parent / "shared" / "data" / "tu"


def silo_name(dataset: str) -> str:
    return dataset.lower().replace("_", "-")


def write_plan(run: Path, rounds: int, port: int) -> Path:
    silos = ", ".join(f'"{silo_name(d)}"' for d in CHEM)
    data = ", ".join(f'"{silo_name(d)}" = "{TU / d}"' for d in CHEM)
    plan = run / "plan.toml"
    plan.write_text(f"""
[federation]
id = "bench-chem"
algorithm = "fedstar"
rounds = {rounds}
seed = 1
silos = [{silos}]

[server]
listen = "127.0.0.1:{port}"
ca_cert = "ca/ca.crt"
server_cert = "ca/server.crt"
server_key = "ca/server.key"
state_dir = "state"

[timeouts]
join_s = 600
round_s = 600

[simulation]
data = {{ {data} }}
""")
    return plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-run")
    args = parser.parse_args()
    if not TU.exists():
        sys.exit(f"needs the shared datasets at {TU}")
    run = args.out / "fedstar_chem"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    bindir = Path(sys.executable).parent
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    coordinator, silo = str(bindir / "coordinator"), str(bindir / "silo")
    subprocess.run([coordinator, "pki", "init", "--dir", str(run / "ca"), "--host",
                    "127.0.0.1"], check=True, capture_output=True)
    for d in CHEM:
        ident = run / "id" / silo_name(d)
        subprocess.run([silo, "pki", "request", "--name", silo_name(d), "--dir", str(ident)],
                       check=True, capture_output=True)
        subprocess.run([coordinator, "pki", "sign", str(ident / f"{silo_name(d)}.csr"), "--ca",
                        str(run / "ca")], check=True, capture_output=True)
    plan = write_plan(run, args.rounds, free_port())

    # 1. Simulation: one process, all cores.
    sim = subprocess.Popen([coordinator, "simulate", "--plan", str(plan), "--quiet", "--out",
                            str(run / "sim.json")], env=env, stdout=subprocess.DEVNULL)
    sim_rss = ProcessSampler(sim.pid)
    if sim.wait() != 0:
        sys.exit("simulation failed")
    sim_results = json.loads((run / "sim.json").read_text())

    # 2. Real federation: a coordinator and 7 silo processes sharing the cores.
    cores = os.cpu_count() or 1
    server = subprocess.Popen([coordinator, "serve", "--plan", str(plan), "--quiet"], env=env,
                              stdout=subprocess.DEVNULL, stderr=open(run / "serve.log", "w"))
    server_rss = ProcessSampler(server.pid)
    silos = []
    for d in CHEM:
        silos.append(subprocess.Popen(
            [silo, "join", "--coordinator", plan.read_text().split('listen = "')[1].split('"')[0],
             "--data", str(TU / d), "--identity", str(run / "id" / silo_name(d)),
             "--state-dir", str(run / "silo-state" / silo_name(d)), "--threads", "1",
             "--device", "cpu"], env=env, stdout=subprocess.DEVNULL,
            stderr=open(run / f"{silo_name(d)}.log", "w")))
    silo_rss = {d: ProcessSampler(p.pid) for d, p in zip(CHEM, silos, strict=True)}
    codes = [p.wait() for p in silos] + [server.wait()]
    if any(codes):
        sys.exit(f"federation failed: exit codes {codes}; see {run}")
    real_results = json.loads((run / "state" / "results.json").read_text())

    def per_round(results: dict) -> float:
        # Round 1 includes start-up effects (first allocations); steady state from round 2.
        secs = [r["seconds"] for r in results["rounds"][1:]] or [results["rounds"][0]["seconds"]]
        return sum(secs) / len(secs)

    sim_s, real_s = per_round(sim_results), per_round(real_results)
    largest = max(silo_rss, key=lambda d: silo_rss[d].peak_bytes)
    figures = {
        "date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, "
        f"{cores} cores", "rounds": args.rounds,
        "sim_s_per_round": round(sim_s, 3), "real_s_per_round": round(real_s, 3),
        "ratio_real_over_sim": round(real_s / sim_s, 3),
        "sim_peak_rss_mb": round(sim_rss.peak_bytes / 2**20, 1),
        "coordinator_peak_rss_mb": round(server_rss.peak_bytes / 2**20, 1),
        "silo_peak_rss_mb": {d: round(r.peak_bytes / 2**20, 1) for d, r in silo_rss.items()},
        "largest_silo": largest,
        "sim_mean_test_acc": round(sim_results["final_mean"].get("test_acc", float("nan")), 4),
        "real_mean_test_acc": round(real_results["final_mean"].get("test_acc", float("nan")),
                                    4),
    }
    (args.out / "fedstar_chem.json").write_text(json.dumps(figures, indent=2))
    lines = [
        f"simulation: {sim_s:.3f} s/round   real federation: {real_s:.3f} s/round   "
        f"ratio {real_s / sim_s:.2f}x (target <= 1.3x)",
        f"peak RSS: coordinator {figures['coordinator_peak_rss_mb']} MB, silo {largest} "
        f"{figures['silo_peak_rss_mb'][largest]} MB (largest), simulation process "
        f"{figures['sim_peak_rss_mb']} MB",
        f"final mean test accuracy after {args.rounds} rounds: simulation "
        f"{figures['sim_mean_test_acc']}, federation {figures['real_mean_test_acc']}",
    ]
    print("\n".join(lines))
    doc = ROOT / "docs" / "benchmarks.md"
    if not doc.exists():
        doc.write_text("# Benchmarks\n\nAppended by the scripts in `bench/`; each entry is one "
                       "run on one machine (ratios are only compared within a run).\n")
    with open(doc, "a") as handle:
        handle.write(f"\n## FedStar CHEM, simulation vs federation ({figures['date']}, "
                     f"{figures['machine']})\n\n`python bench/fedstar_chem.py --rounds "
                     f"{args.rounds}`\n\n" + "\n".join(f"- {line}" for line in lines) + "\n")


if __name__ == "__main__":
    main()
