"""A federation across real hosts: a coordinator and three silos in Linux network namespaces.

Each process has its own network stack, joined by a veth pair to one bridge in a namespace of
its own (a switch: the host's firewall, such as the FORWARD policy DROP a running Docker daemon
sets, never sees the traffic), with addresses from 198.18.0.0/15 (the benchmarking range, never
a private range a machine may route). One silo's link is cut in the middle of the federation,
as a cable pulled out would: no reset, no closed socket, only silence. The coordinator must drop
it at the stage deadline and recover the round through secure aggregation; the silo, whose link
never comes back, must notice by keepalive and give up on its own. A silo dialling an address
its coordinator's certificate does not name is refused with the one line that says so
(silo/federation/diagnose.py).
Needs root and iproute2; skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.federation import DOMAINS, SILOS, Workspace
from trellis.crypto.pki import init_ca, request_identity, sign_request
from trellis.silo.data.synthetic import write_tu_folder

# Every namespace, veth and bridge of this module is named PREFIX + the pid of the pytest
# process that made it (6 hex digits) + a role: unique per run, and a leftover of a run whose
# process is gone is recognisable (and removed) without touching a run still going.
PREFIX = "tmh"
COORDINATOR_IP = "198.18.7.1"
OTHER_IP = "198.18.7.2"            # also the coordinator's, but not in its certificate
SILO_IPS = ("198.18.7.11", "198.18.7.12", "198.18.7.13")
PORT = 50051                       # each namespace is a fresh stack: nothing else listens there
CUT = SILOS[2]                     # the silo whose link is cut


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=20)


@dataclass
class Hosts:
    """The namespaces of one run: one per host, each with its veth on the switch's bridge."""

    tag: str

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    @property
    def switch(self) -> str:
        """The namespace of the bridge and of the hosts' far veth ends."""
        return f"{self.tag}sw"

    @property
    def names(self) -> tuple[str, ...]:
        return ("c", "s1", "s2", "s3")

    def ns(self, host: str) -> str:
        return f"{self.tag}{host}"

    def veth(self, host: str) -> str:
        """The switch's end of the host's link (`ip -n SWITCH link set ... down` cuts it)."""
        return f"{self.tag}{host}v"

    def silo_host(self, silo: str) -> str:
        return f"s{SILOS.index(silo) + 1}"

    def exec(self, host: str, args: Sequence[str], log: Path) -> subprocess.Popen:
        """Start a process inside the host's namespace (`ip netns exec` execs it: same pid)."""
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
               "PYTHONUNBUFFERED": "1", "TRELLIS_PROGRESS": "0",
               # Pings every 2 s: a dead link is noticed within seconds (protos/keepalive.py).
               "TRELLIS_KEEPALIVE_S": "2"}
        return subprocess.Popen(["ip", "netns", "exec", self.ns(host), *args],
                                stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)


def _remove(tag: str) -> None:
    """Delete every namespace and link named with this tag (killing what runs inside)."""
    for ns in _ip("netns", "list", check=False).stdout.split():
        if ns.startswith(tag):
            for pid in _ip("netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "delete", ns, check=False)
    for link in re.findall(r"^\d+: ([^:@]+)", _ip("-o", "link", check=False).stdout, re.M):
        if link.startswith(tag):
            _ip("link", "delete", link, check=False)


def _remove_leftovers() -> None:
    """Remove what runs of this module left behind whose pytest process no longer exists."""
    names = _ip("netns", "list", check=False).stdout.split()
    names += re.findall(r"^\d+: ([^:@]+)", _ip("-o", "link", check=False).stdout, re.M)
    for name in names:
        found = re.match(rf"{PREFIX}([0-9a-f]{{6}})", name)
        if found and not Path(f"/proc/{int(found.group(1), 16)}").exists():
            _remove(found.group(0))


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    """Four namespaces on one bridge: the coordinator at 198.18.7.1, silos at .11, .12, .13."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("network namespaces need the `ip` command (iproute2)")
    _remove_leftovers()
    net = Hosts(f"{PREFIX}{os.getpid():06x}")
    _remove(net.tag)
    try:
        _ip("netns", "add", net.ns("c"))
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot create a network namespace: {exc.stderr.strip()}")
    try:
        _ip("netns", "add", net.switch)
        _ip("-n", net.switch, "link", "add", net.bridge, "type", "bridge")
        _ip("-n", net.switch, "link", "set", net.bridge, "up")
        for host, address in zip(net.names, (COORDINATOR_IP, *SILO_IPS), strict=True):
            ns, inner = net.ns(host), f"{net.tag}{host}i"
            if host != "c":
                _ip("netns", "add", ns)
            _ip("-n", net.switch, "link", "add", net.veth(host), "type", "veth", "peer", "name",
                inner, "netns", ns)
            _ip("-n", net.switch, "link", "set", net.veth(host), "master", net.bridge)
            _ip("-n", net.switch, "link", "set", net.veth(host), "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
        _ip("-n", net.ns("c"), "addr", "add", f"{OTHER_IP}/24", "dev", f"{net.tag}ci")
        yield net
    finally:
        _remove(net.tag)


def _workspace(root: Path) -> Workspace:
    """Small data per silo, a CA whose server certificate names only 198.18.7.1."""
    ws = Workspace(root, SILOS)
    for i, silo in enumerate(SILOS):
        write_tu_folder(ws.data(silo), DOMAINS[i].upper(), DOMAINS[i], 24, seed=i + 1)
    init_ca(ws.ca, [COORDINATOR_IP])
    for silo in SILOS:
        sign_request(request_identity(silo, ws.identity(silo)), ws.ca)
    return ws


def _plan(ws: Workspace, name: str, listen: str) -> Path:
    """Three silos, two enough; short deadlines, so a silent silo is dropped within seconds."""
    path = ws.root / f"{name}.toml"
    path.write_text(f"""
[federation]
id = "{name}"
algorithm = "fedavg"
rounds = 3
seed = 7
min_silos = 2
silos = [{", ".join(f'"{s}"' for s in SILOS)}]

[server]
listen = "{listen}"
ca_cert = "{ws.ca / 'ca.crt'}"
server_cert = "{ws.ca / 'server.crt'}"
server_key = "{ws.ca / 'server.key'}"
state_dir = "{ws.root / name}"

[timeouts]
join_s = 40
round_s = 20
stage_s = 6
report_s = 6
""")
    return path


def _coordinator(plan: Path) -> list[str]:
    return [sys.executable, "-m", "trellis.coordinator.cli", "serve", "--plan", str(plan)]


def _silo(ws: Workspace, silo: str, address: str, connect_timeout: float) -> list[str]:
    return [sys.executable, "-m", "trellis.silo.cli", "join", "--coordinator", address,
            "--data", str(ws.data(silo)), "--identity", str(ws.identity(silo)),
            "--state-dir", str(ws.root / "silo-state" / silo), "--threads", "1",
            "--device", "cpu", "--connect-timeout", str(connect_timeout)]


def _audit(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _wait(procs: dict[str, subprocess.Popen], timeout: float) -> dict[str, int | None]:
    """Exit codes, None for a process still running at the deadline (then killed)."""
    deadline = time.monotonic() + timeout
    codes: dict[str, int | None] = {}
    for name, proc in procs.items():
        try:
            codes[name] = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            codes[name] = None
    return codes


@pytest.fixture(scope="module")
def run(hosts: Hosts, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The federation, with CUT's link pulled as soon as the coordinator opens round 2."""
    ws = _workspace(tmp_path_factory.mktemp("multi-host"))
    plan = _plan(ws, "fed", f"{COORDINATOR_IP}:{PORT}")
    logs = ws.root / "logs"
    logs.mkdir()
    started = time.monotonic()
    coordinator = hosts.exec("c", _coordinator(plan), logs / "coordinator.log")
    silos = {silo: hosts.exec(hosts.silo_host(silo),
                              _silo(ws, silo, f"{COORDINATOR_IP}:{PORT}", 8),
                              logs / f"{silo}.log")
             for silo in SILOS}
    audit = ws.root / "fed" / "audit.jsonl"
    cut_at = None
    # Watched as long as the plan lets the federation run (join_s, then a round_s per round):
    # on a loaded machine a first attempt can time out a stage and round 2 open after a minute.
    while time.monotonic() - started < 40 + 3 * 20 + 30 and coordinator.poll() is None:
        opened = [e for e in _audit(audit) if e.get("event") == "round_opened"]
        if any(e.get("round") == 2 for e in opened):
            _ip("-n", hosts.switch, "link", "set", hosts.veth(hosts.silo_host(CUT)), "down")
            cut_at = time.monotonic() - started
            break
        time.sleep(0.01)
    codes = _wait({"coordinator": coordinator}, timeout=60)
    # The link stays dead: only keepalive can tell CUT that nobody is there any more.
    codes.update(_wait(silos, timeout=40))
    _ip("-n", hosts.switch, "link", "set", hosts.veth(hosts.silo_host(CUT)), "up")
    return {"ws": ws, "plan": plan, "codes": codes, "cut_at": cut_at, "audit": audit,
            "seconds": time.monotonic() - started,
            "logs": {p.stem: p.read_text() for p in logs.glob("*.log")}}


def test_a_silo_cut_off_mid_federation_is_dropped_and_the_rounds_recovered(run: dict) -> None:
    codes, logs = run["codes"], run["logs"]
    assert run["cut_at"] is not None, ("round 2 never opened", logs)
    assert codes["coordinator"] == 0, logs["coordinator"]
    assert all(codes[s] == 0 for s in SILOS if s != CUT), (codes, logs)
    results = json.loads((run["ws"].root / "fed" / "results.json").read_text())
    assert results["status"] == "completed" and results["rounds_completed"] == 3, results
    first, second, third = results["rounds"]
    assert first["participants"] == sorted(SILOS), first
    assert [r["attempts"] for r in results["rounds"]] == [1, 1, 1], "recovered, never retried"
    # The cut lands within milliseconds of round 2's opening, before or after the silo's key
    # advertisement or key shares: it is dropped from round 2, and the two others' masks are
    # unmasked without it. (Only a cut after its masked input would keep it in the sum.)
    survivors = sorted(s for s in SILOS if s != CUT)
    inputs = {e["silo"] for e in _audit(run["audit"])
              if e.get("event") == "masked_input" and e.get("round") == 2}
    if CUT in inputs:
        assert second["participants"] == sorted(SILOS), second
    else:
        assert second["participants"] == survivors and CUT in second["dropped"], second
    # By round 3 keepalive has shown the coordinator that CUT is gone: the round opens
    # without it (or, had it opened first, drops it).
    assert third["participants"] == survivors, third


def test_the_cut_silo_gives_up_on_its_own(run: dict) -> None:
    """Its link dead for good, the silo notices by keepalive and exits (exit 1, 'lost')."""
    code = run["codes"][CUT]
    assert code is not None, ("the cut silo was still running 40 s after the end",
                              run["logs"][CUT])
    assert code == 1 and "lost the coordinator" in run["logs"][CUT], run["logs"][CUT]


def test_the_coordinators_audit_log_verifies(run: dict) -> None:
    ws = run["ws"]
    done = subprocess.run([sys.executable, "-m", "trellis.coordinator.cli", "audit", "verify",
                           str(run["audit"]), "--cert", str(ws.ca / "server.crt")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    dropped = [e for e in _audit(run["audit"]) if e.get("event") == "stage_closed"
               and e.get("round") == 2 and CUT in e.get("dropped", [])]
    assert dropped, "the coordinator's audit log records no stage of round 2 closed without it"


def test_a_name_not_in_the_certificate_is_refused(hosts: Hosts, run: dict) -> None:
    """A coordinator reached at 198.18.7.2, which its certificate does not name: exit 2."""
    ws = run["ws"]
    plan = _plan(ws, "other", f"{OTHER_IP}:{PORT}")
    logs = ws.root / "logs"
    coordinator = hosts.exec("c", _coordinator(plan), logs / "other-coordinator.log")
    try:
        silo = hosts.exec("s1", _silo(ws, SILOS[0], f"{OTHER_IP}:{PORT}", 30),
                          logs / "wrong-name.log")
        code = _wait({"silo": silo}, timeout=60)["silo"]
    finally:
        coordinator.terminate()
        _wait({"coordinator": coordinator}, timeout=10)
    text = (logs / "wrong-name.log").read_text()
    assert code == 2, text
    assert f"the coordinator's certificate names {COORDINATOR_IP}, not '{OTHER_IP}'" in text, text
    assert text.count("error:") == 1 and "Traceback" not in text, text
