"""GCFL over a real federation against `coordinator simulate`, on MOLECULES (= CHEM).

Starts `coordinator serve` and one `silo join` process per CHEM dataset over mTLS on loopback
(secure aggregation per cluster, silo group key, CKKS similarity when a split is due), then
simulates the same plan, and compares the cluster splits and each silo's final test accuracy.
Writes bench/results/gcfl_real_vs_sim.json. Needs the TU datasets (default ../shared/data/tu).

    python bench/gcfl_real_vs_sim.py [--rounds 200] [--seed 10] [--tu ../shared/data/tu]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TU = ROOT.parent / "shared" / "data" / "tu"
CHEM = ("MUTAG", "BZR", "COX2", "DHFR", "PTC_MR", "AIDS", "NCI1")


def silo_name(dataset: str) -> str:
    """A silo (certificate subject) name for a dataset folder."""
    return dataset.lower().replace("_", "-")


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_plan(work: Path, rounds: int, seed: int, port: int, preset: str,
               tu: Path) -> Path:
    """The plan shared by the real run and the simulation."""
    silos = [silo_name(d) for d in CHEM]
    data = ", ".join(f'"{silo_name(d)}" = "{tu / d}"' for d in CHEM)
    plan = work / "plan.toml"
    plan.write_text(f"""[federation]
id = "molecules-gcfl-s{seed}"
algorithm = "gcfl"
rounds = {rounds}
seed = {seed}
silos = [{", ".join(f'"{s}"' for s in silos)}]

[clustering]
preset = "{preset}"

[server]
listen = "127.0.0.1:{port}"
ca_cert = "{work / 'ca' / 'ca.crt'}"
server_cert = "{work / 'ca' / 'server.crt'}"
server_key = "{work / 'ca' / 'server.key'}"
state_dir = "{work / 'coordinator'}"

[timeouts]
join_s = 600
round_s = 1800
stage_s = 600

[simulation]
data = {{ {data} }}
""")
    return plan


def main() -> None:
    """Run both, compare, write the results file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--seed", type=int, default=10)
    parser.add_argument("--preset", default="MOLECULES")
    parser.add_argument("--tu", type=Path, default=TU, help="folder of the TU datasets")
    parser.add_argument("--work", type=Path, default=ROOT / "bench-run" / "gcfl-real")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "bench" / "results" / "gcfl_real_vs_sim.json")
    args = parser.parse_args()
    tu = args.tu.resolve()
    if not (tu / "MUTAG").is_dir():
        sys.exit(f"needs the TU datasets at {tu} (pass --tu)")
    sys.path.insert(0, str(ROOT))
    from trellis.crypto.pki import init_ca, request_identity, sign_request

    work = args.work.resolve()
    if work.exists():
        sys.exit(f"{work} exists: move it away (a finished run's state must not be reused)")
    work.mkdir(parents=True)
    init_ca(work / "ca", ["localhost", "127.0.0.1"])
    for dataset in CHEM:
        sign_request(request_identity(silo_name(dataset), work / "id" / silo_name(dataset)),
                     work / "ca")
    port = free_port()
    plan = write_plan(work, args.rounds, args.seed, port, args.preset, tu)
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE",
               PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    started = time.monotonic()
    logs = work / "logs"
    logs.mkdir()
    procs = [subprocess.Popen([sys.executable, "-m", "trellis.coordinator.cli", "serve", "--plan",
                               str(plan), "--quiet"], cwd=ROOT, env=env,
                              stdout=open(logs / "coordinator.log", "w"),
                              stderr=subprocess.STDOUT)]
    for dataset in CHEM:
        name = silo_name(dataset)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "trellis.silo.cli", "join", "--coordinator", f"127.0.0.1:{port}",
             "--data", str(tu / dataset), "--identity", str(work / "id" / name),
             "--state-dir", str(work / "silos" / name), "--threads", "1", "--device", "cpu",
             "--connect-timeout", "120"], cwd=ROOT, env=env,
            stdout=open(logs / f"{name}.log", "w"), stderr=subprocess.STDOUT))
    codes = [p.wait() for p in procs]
    real_s = time.monotonic() - started
    if any(codes):
        sys.exit(f"real federation failed (exit codes {codes}); see {logs}")
    real = json.loads((work / "coordinator" / "results.json").read_text())
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "trellis.coordinator.cli", "simulate", "--plan",
                    str(plan), "--quiet", "--threads", "1", "--out", str(work / "simulated.json")],
                   cwd=ROOT, env=env, check=True)
    sim_s = time.monotonic() - started
    simulated = json.loads((work / "simulated.json").read_text())
    differences = {s: abs(real["final_metrics"][s]["test_acc"]
                          - simulated["final_metrics"][s]["test_acc"])
                   for s in real["final_metrics"]}
    result = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python bench/gcfl_real_vs_sim.py " + " ".join(sys.argv[1:]),
        "rounds": args.rounds, "seed": args.seed, "preset": args.preset,
        "real_seconds": round(real_s, 1), "simulated_seconds": round(sim_s, 1),
        "real_splits": real["clustering"]["splits"],
        "simulated_splits": simulated["clustering"]["splits"],
        "same_splits": real["clustering"]["splits"] == simulated["clustering"]["splits"],
        "real_mean_test_acc": real["final_mean"].get("test_acc"),
        "simulated_mean_test_acc": simulated["final_mean"].get("test_acc"),
        "largest_test_acc_difference": max(differences.values()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if "splits" not in k}, indent=2))
    print(f"same splits: {result['same_splits']}; largest per-silo test accuracy difference "
          f"{result['largest_test_acc_difference'] * 100:.2f} points")


if __name__ == "__main__":
    main()
