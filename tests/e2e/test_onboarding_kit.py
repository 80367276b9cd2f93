"""A silo onboarded from its kit alone joins a real federation, following the kit's README.

The silo operator makes a key and CSR in a fresh folder (`silo pki request`); the coordinator
operator signs it with `pki sign --kit`; the silo operator unpacks the tarball, runs the
README's commands (copy the certificates beside the key, copy the policy, `silo join` with
the kit's address) with every clause of the pre-filled policy uncommented, and takes part in a
two-round FedStar federation with two silos set up the usual way.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.support.federation import (
    SILOS,
    Workspace,
    port_of,
    start_coordinator,
    start_silo,
    wait_all,
    write_plan,
)
from trellis.crypto.audit import verify_audit_log

pytestmark = pytest.mark.slow

ONBOARDED = SILOS[2]
SILO = [sys.executable, "-m", "trellis.silo.cli"]
COORDINATOR = [sys.executable, "-m", "trellis.coordinator.cli"]
# What the test adds to the README's `silo join`: its own state folder and one thread each.
TEST_OPTIONS = ["--state-dir", "state", "--threads", "1", "--device", "cpu",
                "--connect-timeout", "60"]


def _run(args: list[str], cwd: Path) -> str:
    """Run a command to completion; fail with its output unless it exits 0."""
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def _readme_commands(readme: str, program: str) -> list[list[str]]:
    """The README's indented command lines that start with `program`, comments cut."""
    return [shlex.split(line.split("#", 1)[0]) for line in readme.splitlines()
            if line.startswith(f"  {program} ")]


@pytest.fixture(scope="module")
def run(workspace_factory) -> dict:
    ws: Workspace = workspace_factory("onboarding", graphs=20)
    plan = write_plan(ws, "onboarding", rounds=2, min_silos=3)
    port = port_of(plan)
    operator = ws.root / "silo-operator"          # the onboarded silo's machine: nothing else
    operator.mkdir()
    shutil.copytree(ws.data(ONBOARDED), operator / "graphs")
    _run([*SILO, "pki", "request", "--name", ONBOARDED, "--dir", "id"], operator)
    # The workspace signed a certificate for every silo; this one is onboarded afresh, so the
    # workspace's certificate of its name is revoked first (one valid certificate per name).
    _run([*COORDINATOR, "pki", "revoke", ONBOARDED, "--ca", str(ws.ca)], ws.root)
    desk = ws.root / "coordinator-desk"             # the CSR, as the coordinator operator got it
    desk.mkdir()
    shutil.copy(operator / "id" / f"{ONBOARDED}.csr", desk)
    signed = _run([*COORDINATOR, "pki", "sign", str(desk / f"{ONBOARDED}.csr"), "--ca",
                   str(ws.ca), "--kit", str(desk / f"{ONBOARDED}-kit"),
                   "--coordinator-address", f"127.0.0.1:{port}", "--plan", str(plan)], desk)
    tarball = desk / f"{ONBOARDED}-kit.tar.gz"
    shutil.copy(tarball, operator)                 # all that travels back to the silo
    with tarfile.open(operator / tarball.name) as tar:
        tar.extractall(operator, filter="data")
    kit = operator / f"{ONBOARDED}-kit"
    readme = (kit / "README.txt").read_text()
    for command in _readme_commands(readme, "cp"):
        _run(command, operator)
    policy = operator / "policy.toml"
    policy.write_text(re.sub(r"^# (\w+ = )", r"\1", policy.read_text(), flags=re.MULTILINE))
    version = _run([*SILO, "--version"], operator)
    [join] = [c for c in _readme_commands(readme, "silo") if c[1] == "join"]
    folder = ws.root / "run"
    folder.mkdir()
    coordinator = start_coordinator(plan, folder / "coordinator.log")
    others = [start_silo(ws, silo, port, folder / silo, folder / f"{silo}.log")
              for silo in SILOS[:2]]
    onboarded = subprocess.Popen([*SILO, *join[1:], *TEST_OPTIONS], cwd=operator,
                                 stdout=open(folder / f"{ONBOARDED}.log", "w"),
                                 stderr=subprocess.STDOUT)
    codes = wait_all([onboarded, *others, coordinator], timeout=240)
    logs = {p.name: p.read_text() for p in folder.glob("*.log")}
    return {"ws": ws, "operator": operator, "kit": kit, "tarball": tarball, "readme": readme,
            "join": join, "signed": signed, "version": version, "codes": codes, "logs": logs,
            "port": port, "folder": folder}


def test_the_onboarded_silo_set_up_from_its_key_and_the_kit_took_part(run: dict) -> None:
    assert run["codes"] == [0, 0, 0, 0], run["logs"]
    assert sorted(p.name for p in (run["operator"] / "id").iterdir()) == [
        "ca.crt", f"{ONBOARDED}.crt", f"{ONBOARDED}.csr", f"{ONBOARDED}.key"]
    assert run["join"][:4] == ["silo", "join", "--coordinator", f"127.0.0.1:{run['port']}"]
    assert "--policy" in run["join"]
    results = json.loads((run["ws"].root / "onboarding" / "coordinator" / "results.json")
                         .read_text())
    assert results["status"] == "completed" and results["rounds_completed"] == 2
    assert set(results["final_metrics"]) == set(SILOS)
    state = run["operator"] / "state"
    cert = (run["operator"] / "id" / f"{ONBOARDED}.crt").read_bytes()
    report = verify_audit_log(state / "audit.jsonl", cert_pem=cert)
    assert report.ok and report.closed
    joined = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()
              if '"joined"' in line]
    assert joined and joined[0]["policy_sha256"]    # it joined under the kit's policy


def test_the_readme_names_the_version_silo_version_prints(run: dict) -> None:
    version = run["version"].split()[1]
    assert f"runs trellis-fgl {version};" in run["readme"]


def test_no_key_material_anywhere_in_the_kit_or_its_tarball(run: dict) -> None:
    files = [p for p in run["kit"].iterdir()]
    assert len(files) == 7
    with tarfile.open(run["tarball"]) as tar:
        members = [tar.extractfile(m).read() for m in tar.getmembers()]  # type: ignore[union-attr]
    for data in [*(p.read_bytes() for p in files), *members, run["tarball"].read_bytes()]:
        assert b"PRIVATE KEY" not in data
    key = (run["operator"] / "id" / f"{ONBOARDED}.key").read_bytes()
    body = b"".join(key.splitlines()[1:-1])
    assert all(body not in data for data in members)
