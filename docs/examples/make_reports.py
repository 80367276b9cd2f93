"""Write the example reviewer reports in this folder from a tiny real federation.

Three silo processes and a coordinator over mTLS on loopback (FedStar, 2 rounds, 30 synthetic
graphs per silo), an unadmitted 'intruder' that tries to join, then `silo audit report` for
hospital-a and `coordinator audit report`, each as Markdown and as self-contained HTML. Every
step is the command an operator runs. About a minute on two cores:

    .venv/bin/python docs/examples/make_reports.py
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SILOS = {"hospital-a": "molecules", "pharma-b": "bio", "social-c": "social"}
SILO_CLI = [sys.executable, "-m", "trellis.silo.cli"]
COORDINATOR_CLI = [sys.executable, "-m", "trellis.coordinator.cli"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def main() -> None:
    """Run the federation in a scratch folder and copy the four reports here."""
    with tempfile.TemporaryDirectory(prefix="trellis-reports-") as scratch:
        run = Path(scratch)
        federate(run)
        for fmt in ("html", "md"):
            step(run, *SILO_CLI, "audit", "report", "--state-dir", "hospital-a/state",
                 "--identity", "hospital-a/id", "--out", f"silo-audit-report.{fmt}")
            step(run, *COORDINATOR_CLI, "audit", "report", "--state-dir", "coordinator-state",
                 "--ca", "ca", "--out", f"coordinator-report.{fmt}")
            for name in ("silo-audit-report", "coordinator-report"):
                shutil.copy(run / f"{name}.{fmt}", HERE / f"{name}.{fmt}")
                print(f"wrote {HERE / f'{name}.{fmt}'}")


def federate(run: Path) -> None:
    """Identities, data, plan; then the coordinator, an intruder and the three silos."""
    step(run, *COORDINATOR_CLI, "pki", "init", "--dir", "ca", "--host", "127.0.0.1",
         "--federation", "example")
    for i, (silo, domain) in enumerate(SILOS.items()):
        step(run, *SILO_CLI, "make-demo-data", "--out", f"{silo}/graphs", "--domain", domain,
             "--graphs", "30", "--seed", str(i + 1))
    for silo in (*SILOS, "intruder"):
        step(run, *SILO_CLI, "pki", "request", "--name", silo, "--dir", f"{silo}/id")
        step(run, *COORDINATOR_CLI, "pki", "sign", f"{silo}/id/{silo}.csr", "--ca", "ca")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (run / "plan.toml").write_text(f"""
[federation]
id = "example-fedstar"
algorithm = "fedstar"
rounds = 2
seed = 1
min_silos = 3
silos = [{", ".join(f'"{s}"' for s in SILOS)}]

[server]
listen = "127.0.0.1:{port}"
ca_cert = "ca/ca.crt"
server_cert = "ca/server.crt"
server_key = "ca/server.key"
state_dir = "coordinator-state"
""")
    coordinator = spawn(run, *COORDINATOR_CLI, "serve", "--plan", "plan.toml", "--quiet")

    def join(silo: str, data: str) -> subprocess.Popen:
        return spawn(run, *SILO_CLI, "join", "--coordinator", f"127.0.0.1:{port}", "--data",
                     data, "--identity", f"{silo}/id", "--state-dir", f"{silo}/state",
                     "--threads", "1", "--device", "cpu", "--connect-timeout", "60")

    if join("intruder", "hospital-a/graphs").wait(90) != 2:
        sys.exit("the intruder was not refused")
    silos = [join(silo, f"{silo}/graphs") for silo in SILOS]
    for process in (*silos, coordinator):
        if process.wait(300) != 0:
            sys.exit(f"{' '.join(map(str, process.args))} failed")


def step(run: Path, *args: str) -> None:
    """Run one command in the scratch folder; stop on failure."""
    subprocess.run(args, cwd=run, env=ENV, check=True, stdout=subprocess.DEVNULL)


def spawn(run: Path, *args: str) -> subprocess.Popen:
    """Start one long-running command in the scratch folder."""
    return subprocess.Popen(args, cwd=run, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
