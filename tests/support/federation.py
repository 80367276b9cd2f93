"""Helpers for tests that run real coordinator and silo processes over mTLS on loopback."""

from __future__ import annotations

import fcntl
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest

from trellis.crypto.pki import init_ca, request_identity, sign_request
from trellis.protos import codec
from trellis.protos import federation_pb2 as pb
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos.messages import PROTOCOL_VERSION, Envelope, Phase
from trellis.protos.plan import Plan
from trellis.silo.data.hetero import HeteroGraph, save_hetero_folder
from trellis.silo.data.synthetic import write_tu_folder

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


_PORT_BOOK = Path(tempfile.gettempdir()) / "trellis-test-ports"


def free_port() -> int:
    """A loopback port no other test process of this machine will be given.

    Asking the kernel for port 0 and closing the socket races: the kernel may hand the same
    ephemeral port to anyone before the coordinator binds it. So ports come from below the
    kernel's ephemeral range (which it never hands out by itself), are checked free by binding,
    and are written, under a file lock, in a book shared by concurrent test processes; a port
    stays booked while the process that booked it lives. A restarted coordinator must keep its
    port (its silos redial it), which is why port 0 cannot be used instead.
    """
    low = _ephemeral_low()
    start = 20000 if low > 21000 else 1024
    with open(_PORT_BOOK, "a+") as book:
        fcntl.flock(book, fcntl.LOCK_EX)
        book.seek(0)
        booked = {}
        for line in book.read().split():
            port, _, pid = line.partition(":")
            if port.isdigit() and pid.isdigit() and _alive(int(pid)):
                booked[int(port)] = int(pid)
        span = low - start
        offset = random.randrange(span)
        for i in range(span):
            port = start + (offset + i) % span
            if port in booked:
                continue
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue
            booked[port] = os.getpid()
            book.seek(0)
            book.truncate()
            book.write(" ".join(f"{p}:{pid}" for p, pid in booked.items()))
            return port
    raise RuntimeError(f"no free loopback port between {start} and {low}")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


def start_coordinator(plan: Path, log: Path, capture: Path | None = None,
                      env: dict[str, str] | None = None,
                      extra: Sequence[str] = ()) -> subprocess.Popen:
    """`coordinator serve` as a process (`extra`: more options, e.g. --metrics-listen)."""
    args = [sys.executable, "-m", "trellis.coordinator.cli", "serve", "--plan", str(plan),
            *extra]
    if capture is not None:
        args += ["--capture", str(capture)]
    return subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env={**_env(), **(env or {})})


def start_silo(ws: Workspace, silo: str, port: int, state: Path, log: Path,
               env: dict[str, str] | None = None, extra: Sequence[str] = ()) -> subprocess.Popen:
    """`silo join` as a process (`extra`: more options, e.g. --policy FILE)."""
    args = [sys.executable, "-m", "trellis.silo.cli", "join", "--coordinator", f"127.0.0.1:{port}",
            "--data", str(ws.data(silo)), "--identity", str(ws.identity(silo)),
            "--state-dir", str(state), "--threads", "1", "--device", "cpu",
            "--connect-timeout", "60", *extra]
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

    from trellis.coordinator.simulation.sequential import run_simulation
    from trellis.silo.data.datasets import load_graph_folder

    datasets = {s: load_graph_folder(plan.simulation_data[s]) for s in plan.silos}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_simulation(plan, datasets, progress=False)
    finally:
        torch.set_num_threads(threads)


# -- heterogeneous graphs (FedHGN) ------------------------------------------------------------
# Silo names of one length, so that no message size differs by the sender's name.
HETERO_SILOS = ("silo-aa", "silo-bb", "silo-cc")
# Per silo: target type, auxiliary node types with their (forward, reverse) relation names, a
# target-to-target relation (or None) and the number of target nodes. Every name carries the
# marker "zqxjv_" so a test can search any byte string for a schema leak.
HETERO_SCHEMAS: dict[str, tuple[str, tuple[tuple[str, str, str], ...], str | None, int]] = {
    "silo-aa": ("zqxjv_secret_customer",
                (("zqxjv_secret_merchant", "zqxjv_rel_pays_7", "zqxjv_rel_paid_by_7"),),
                "zqxjv_rel_refers_2", 48),
    "silo-bb": ("zqxjv_hidden_patient",
                (("zqxjv_hidden_ward", "zqxjv_rel_admitted_to", "zqxjv_rel_houses"),
                 ("zqxjv_hidden_drug", "zqxjv_rel_prescribed", "zqxjv_rel_given_to")),
                None, 60),
    "silo-cc": ("zqxjv_private_account",
                (("zqxjv_private_branch", "zqxjv_rel_opened_at", "zqxjv_rel_hosts_acct"),
                 ("zqxjv_private_device", "zqxjv_rel_logs_in_from", "zqxjv_rel_seen_with"),
                 ("zqxjv_private_region", "zqxjv_rel_resides_in", "zqxjv_rel_home_of")),
                "zqxjv_rel_transfers_to", 72),
}


def planted_hetero_graph(target: str, aux: Sequence[tuple[str, str, str]], near: str | None,
                         items: int, seed: int, classes: int = 3) -> HeteroGraph:
    """Target nodes labelled i % classes; each links to one of its class's two nodes of every
    auxiliary type plus a random one (and back), and, with `near`, to two nodes of its class:
    labels are learnable from structure. Splits: half train, a quarter each val and test."""
    rng = np.random.default_rng(seed)
    labels = np.arange(items) % classes
    edges: dict[tuple[str, str, str], np.ndarray] = {}
    num_nodes = {target: items}
    for aux_type, forward, reverse in aux:
        num_nodes[aux_type] = 2 * classes
        own = labels * 2 + rng.integers(0, 2, items)
        noise = rng.integers(0, 2 * classes, items)
        links = np.stack([np.tile(np.arange(items), 2), np.concatenate([own, noise])])
        edges[(target, forward, aux_type)] = links
        edges[(aux_type, reverse, target)] = links[::-1].copy()
    if near is not None:
        dst = np.repeat(np.arange(items), 2)
        src = (dst + classes * rng.integers(1, items // classes, dst.size)) % items
        edges[(target, near, target)] = np.stack([src, dst])
    order = rng.permutation(items)
    half, three = items // 2, (3 * items) // 4
    return HeteroGraph(tuple(num_nodes), num_nodes, tuple(edges), edges, target, classes,
                       labels, np.sort(order[:half]), np.sort(order[half:three]),
                       np.sort(order[three:]))


def hetero_graphs() -> dict[str, HeteroGraph]:
    """The three silos' graphs: different node-type and relation names and counts."""
    return {silo: planted_hetero_graph(target, aux, near, items, seed=i + 1)
            for i, (silo, (target, aux, near, items)) in enumerate(HETERO_SCHEMAS.items())}


def schema_names(graph: HeteroGraph) -> set[str]:
    """Every node-type and relation name of a graph."""
    return set(graph.node_types) | set(graph.relations)


def make_hetero_workspace(root: Path) -> Workspace:
    """Heterogeneous graph folders per silo (HETERO_SCHEMAS), a real CA and identities."""
    ws = Workspace(root, HETERO_SILOS)
    for silo, graph in hetero_graphs().items():
        save_hetero_folder(graph, ws.data(silo))
    init_ca(ws.ca, ["localhost", "127.0.0.1"])
    for silo in (*ws.silos, "intruder"):
        sign_request(request_identity(silo, ws.identity(silo)), ws.ca)
    return ws


FEDHGN_TABLE = """
[fedhgn]
classes = 3
hidden = 16
bases = 3
lr = 0.5
local_epochs = 10
coefficient_slots = {slots}
patience = {patience}
"""


def write_hetero_plan(ws: Workspace, name: str, *, rounds: int = 6, slots: int = 8,
                      patience: int = 10, algorithm: str = "fedhgn", port: int | None = None,
                      round_s: float = 120) -> Path:
    """A FedHGN plan for a heterogeneous workspace (data folders are the silos' own)."""
    path = write_plan(ws, name, algorithm=algorithm, rounds=rounds, port=port,
                      round_s=round_s,
                      extra=FEDHGN_TABLE.format(slots=slots, patience=patience))
    text = path.read_text()
    for silo in ws.silos:
        text = text.replace(str(ws.data(silo) / ws.domain(silo).upper()), str(ws.data(silo)))
    path.write_text(text)
    return path


def hetero_sessions(plan: Plan, graphs: dict[str, HeteroGraph], identities: dict,
                    relations: Sequence[str] | None = None) -> dict:
    """Real silo sessions for a FedHGN-family plan, each over its own graph, plan accepted
    (`relations`: the union schema of the simulation-only baselines)."""
    from trellis.silo.federation.session import SiloSession
    from trellis.silo.training.trainers import make_hetero_trainer

    sessions = {}
    for name in plan.silos:
        session = SiloSession(identities[name],
                              lambda public, g=graphs[name], n=name: make_hetero_trainer(
                                  g, public, n, relations))
        session.accept_plan(plan.public.to_json())
        sessions[name] = session
    return sessions


def drive_machine_until(machine, sessions: dict, done, clock=time.monotonic) -> None:
    """Step the silo sessions through the machine's instructions with the silo driver over the
    in-process link, as coordinator/simulation/sequential.py does, until `done()` (e.g. the machine
    reaches a stage); events are dropped."""
    from trellis.coordinator.simulation.sequential import InProcessLink
    from trellis.silo.federation.driver import SiloDriver

    drivers = {name: SiloDriver(session, InProcessLink(name, machine, clock, lambda _: None),
                                log=lambda _: None)
               for name, session in sessions.items()}
    for _ in range(10_000):
        if done():
            return
        stage = machine.stage
        waiting = sorted(machine.waiting_for())
        if not waiting:
            raise RuntimeError(f"machine waits for nobody at {machine.describe()}")
        for name in waiting:
            drivers[name].handle(machine.instruction(name))
            if machine.stage is not stage or done():
                break
    raise RuntimeError("the machine never got there")


def keep_attending(stub: pb_grpc.FederationStub) -> grpc.Future:
    """Attend as a silo and drain the instruction stream in the background."""
    stream = stub.Attend(codec.attend_request(Envelope("", 0, 0, Phase.JOIN),
                                              PROTOCOL_VERSION))

    def drain() -> None:
        try:
            for _ in stream:
                pass
        except grpc.RpcError:
            pass              # cancelled by the test when it is done

    threading.Thread(target=drain, daemon=True).start()
    return stream


def assert_refused(call, request, code: grpc.StatusCode, text: str) -> None:
    """A unary or server-streaming RPC fails with this status and a detail containing text."""
    with pytest.raises(grpc.RpcError) as info:
        result = call(request, timeout=5)
        if not isinstance(result, pb.Ack):
            list(result)      # a server stream fails when read
    assert info.value.code() is code, info.value.details()
    assert text in info.value.details(), info.value.details()


# -- standing federations (coordinator serve --deployment, silo serve) --------------------------
def write_deployment(ws: Workspace, port: int, name: str, silos: Sequence[str], *,
                     max_concurrent_jobs: int = 1,
                     approval_deadline_s: float | None = None) -> Path:
    """A deployment.toml for the workspace's CA, state root `<root>/coordinator`."""
    deadline = ("" if approval_deadline_s is None
                else f"approval_deadline_s = {approval_deadline_s:g}\n")
    path = ws.root / "deployment.toml"
    path.write_text(f"""
[deployment]
name = "{name}"
silos = [{", ".join(f'"{s}"' for s in silos)}]
max_concurrent_jobs = {max_concurrent_jobs}
{deadline}
[server]
listen = "127.0.0.1:{port}"
ca_cert = "{ws.ca / 'ca.crt'}"
server_cert = "{ws.ca / 'server.crt'}"
server_key = "{ws.ca / 'server.key'}"
state_root = "{ws.root / 'coordinator'}"
""")
    return path


def wait_until(check: Callable[[], object], timeout: float, what: str,
               context: Callable[[], str] = lambda: "") -> None:
    """Poll check until it is true; fail naming what did not happen (and context, e.g. logs)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            more = context()
            raise AssertionError(f"not within {timeout:g} s: {what}" + (f"\n{more}" if more
                                                                          else ""))
        time.sleep(0.3)
