"""Helpers for tests that run real coordinator and silo processes over mTLS on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from coordinator.plan import Plan
from crypto.pki import init_ca, request_identity, sign_request
from silo.synthetic import write_tu_folder

SILOS = ("hospital-a", "pharma-b", "social-c")
DOMAINS = ("molecules", "bio", "social")
# Four more, for federations large enough to lose three silos in one round.
EXTRA_SILOS = ("lab-d", "clinic-e", "insurer-f", "bank-g")


@dataclass
class Workspace:
    """A throwaway federation: data folders, CA, silo identity folders."""

    root: Path
    silos: tuple[str, ...] = SILOS

    def domain(self, silo: str) -> str:
        return DOMAINS[self.silos.index(silo) % len(DOMAINS)]

    def data(self, silo: str) -> Path:
        return self.root / "data" / silo

    def identity(self, silo: str) -> Path:
        return self.root / "id" / silo

    @property
    def ca(self) -> Path:
        return self.root / "ca"


def make_workspace(root: Path, graphs: int = 120, extra: int = 0) -> Workspace:
    """Synthetic data per silo, a real CA and signed identities (plus an unadmitted one)."""
    ws = Workspace(root, SILOS + EXTRA_SILOS[:extra])
    for i, silo in enumerate(ws.silos):
        domain = ws.domain(silo)
        write_tu_folder(ws.data(silo), domain.upper(), domain, graphs, seed=i + 1)
    init_ca(ws.ca, ["localhost", "127.0.0.1"])
    for silo in (*ws.silos, "intruder"):
        sign_request(request_identity(silo, ws.identity(silo)), ws.ca)
    return ws


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_plan(ws: Workspace, name: str, *, algorithm: str = "fedstar", rounds: int = 3,
               min_silos: int = 3, port: int | None = None, round_s: float = 120,
               extra: str = "") -> Path:
    """A plan for the workspace's three silos (with simulation data, for comparisons)."""
    port = port or free_port()
    data = ", ".join(f'"{s}" = "{ws.data(s) / ws.domain(s).upper()}"' for s in ws.silos)
    text = f"""
[federation]
id = "{name}"
algorithm = "{algorithm}"
rounds = {rounds}
seed = 7
min_silos = {min_silos}
silos = [{", ".join(f'"{s}"' for s in ws.silos)}]

[server]
listen = "127.0.0.1:{port}"
ca_cert = "{ws.ca / 'ca.crt'}"
server_cert = "{ws.ca / 'server.crt'}"
server_key = "{ws.ca / 'server.key'}"
state_dir = "{ws.root / name / 'coordinator'}"

[timeouts]
join_s = 120
round_s = {round_s}
report_s = 30

[simulation]
data = {{ {data} }}
{extra}
"""
    path = ws.root / f"{name}.toml"
    path.write_text(text)
    return path


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # Each process gets one core's share and waits passively (see silo --threads).
    env.update(OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", PYTHONUNBUFFERED="1")
    return env


def start_coordinator(plan: Path, log: Path, capture: Path | None = None) -> subprocess.Popen:
    args = [sys.executable, "-m", "coordinator.cli", "serve", "--plan", str(plan)]
    if capture is not None:
        args += ["--capture", str(capture)]
    return subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=_env())


def start_silo(ws: Workspace, silo: str, port: int, state: Path, log: Path,
               env: dict[str, str] | None = None) -> subprocess.Popen:
    args = [sys.executable, "-m", "silo.cli", "join", "--coordinator", f"127.0.0.1:{port}",
            "--data", str(ws.data(silo)), "--identity", str(ws.identity(silo)),
            "--state-dir", str(state), "--threads", "1", "--device", "cpu",
            "--connect-timeout", "60"]
    return subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env={**_env(), **(env or {})})


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[int]:
    """Wait for every process; kill the rest and fail loudly on timeout."""
    deadline = time.monotonic() + timeout
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return codes


def port_of(plan: Path) -> int:
    for line in plan.read_text().splitlines():
        if line.startswith("listen"):
            return int(line.rsplit(":", 1)[1].strip('"'))
    raise ValueError("no listen line")


def simulate_like_silo_processes(plan: Plan) -> dict:
    """`coordinator simulate` of a plan with one torch thread, as each silo process uses."""
    import torch

    from coordinator.simulate import run_simulation
    from silo.datasets import load_graph_folder

    datasets = {s: load_graph_folder(plan.simulation_data[s]) for s in plan.silos}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_simulation(plan, datasets, progress=False)
    finally:
        torch.set_num_threads(threads)
