"""A silo onboarded from its kit alone takes part in a standing federation, following the
kit's README.

The silo operator makes a key and CSR in a fresh folder (`silo pki request`); the coordinator
operator signs it with `pki sign --kit`, the kit pre-filled from the job plan an operator will
submit; the silo operator unpacks the tarball, runs the README's commands (copy the
certificates beside the key, copy the policy, `silo serve` with the kit's address) with every
clause of the pre-filled policy uncommented, and, once the job is offered, answers it with the
README's `silo jobs list` and `silo jobs approve`. The job, a two-round FedStar with two silos
set up the usual way, completes.
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

from tests.support.commands import commands_in_text
from tests.support.federation import (
    SILOS,
    Workspace,
    _env,
    free_port,
    wait_until,
    write_deployment,
)
from trellis.coordinator.jobs.client import Deployment
from trellis.crypto.audit import verify_audit_log
from trellis.crypto.pki import issue_operator

pytestmark = pytest.mark.slow

ONBOARDED = SILOS[2]
SILO = [sys.executable, "-m", "trellis.silo.cli"]
COORDINATOR = [sys.executable, "-m", "trellis.coordinator.cli"]
# What the test adds to the README's `silo serve`: one thread on the CPU.
TEST_OPTIONS = ["--threads", "1", "--device", "cpu"]
OPERATOR = "ops-alice"            # the operator name the kit's policy template gives


def _run(args: list[str], cwd: Path) -> str:
    """Run a command to completion; fail with its output unless it exits 0."""
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=_env())
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def _shell_commands(readme: str, program: str) -> list[list[str]]:
    """The README's indented `program` lines (cp, ...), split as a shell would."""
    return [shlex.split(line.split("#", 1)[0]) for line in readme.splitlines()
            if line.startswith(f"  {program} ")]


def _job_plan(ws: Workspace) -> Path:
    """The job the operator submits: three silos, dataset "graphs", two rounds."""
    path = ws.root / "coordinator-desk" / "job.toml"
    path.write_text(f"""
[federation]
id = "onboarding"
algorithm = "fedstar"
dataset = "graphs"
rounds = 2
seed = 7
silos = [{", ".join(f'"{s}"' for s in SILOS)}]

[timeouts]
join_s = 120
round_s = 120
report_s = 30
""")
    return path


@pytest.fixture(scope="module")
def run(workspace_factory) -> dict:  # type: ignore[no-untyped-def]
    ws: Workspace = workspace_factory("onboarding", graphs=20)
    port = free_port()
    issue_operator(ws.ca, OPERATOR, ws.root / OPERATOR)
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
    plan = _job_plan(ws)
    signed = _run([*COORDINATOR, "pki", "sign", str(desk / f"{ONBOARDED}.csr"), "--ca",
                   str(ws.ca), "--kit", str(desk / f"{ONBOARDED}-kit"),
                   "--coordinator-address", f"127.0.0.1:{port}", "--plan", str(plan)], desk)
    tarball = desk / f"{ONBOARDED}-kit.tar.gz"
    shutil.copy(tarball, operator)                 # all that travels back to the silo
    with tarfile.open(operator / tarball.name) as tar:
        tar.extractall(operator, filter="data")
    kit = operator / f"{ONBOARDED}-kit"
    readme = (kit / "README.txt").read_text()
    for command in _shell_commands(readme, "cp"):
        _run(command, operator)
    policy = operator / "policy.toml"
    policy.write_text(re.sub(r"^# (\w+ = )", r"\1", policy.read_text(), flags=re.MULTILINE))
    version = _run([*SILO, "--version"], operator)
    commands = commands_in_text(readme)
    # Step 4's `silo serve`, step 5's first `silo jobs list` and its `silo jobs approve`.
    [serve] = [c for c in commands if c[:2] == ["silo", "serve"]]
    listing = next(c for c in commands if c[:3] == ["silo", "jobs", "list"])
    [approval] = [c for c in commands if c[:3] == ["silo", "jobs", "approve"]]

    logs = ws.root / "logs"
    logs.mkdir()
    deployment = write_deployment(ws, port, "onboarding-test", SILOS, approval_deadline_s=120)
    processes = [subprocess.Popen(
        [*COORDINATOR, "serve", "--deployment", str(deployment)],
        stdout=open(logs / "coordinator.log", "w"), stderr=subprocess.STDOUT, env=_env())]
    for silo in SILOS[:2]:
        other = ws.root / f"{silo}-policy.toml"
        other.write_text(f'[jobs]\napprove = "auto"\noperators = ["{OPERATOR}"]\n')
        processes.append(subprocess.Popen(
            [*SILO, "serve", "--coordinator", f"127.0.0.1:{port}", "--identity",
             str(ws.identity(silo)), "--data", f"graphs={ws.data(silo)}", "--policy",
             str(other), "--state-root", str(ws.root / silo), *TEST_OPTIONS],
            stdout=open(logs / f"{silo}.log", "w"), stderr=subprocess.STDOUT, env=_env()))
    processes.append(subprocess.Popen(
        [*SILO, *serve[1:], *TEST_OPTIONS], cwd=operator,
        stdout=open(logs / f"{ONBOARDED}.log", "w"), stderr=subprocess.STDOUT, env=_env()))
    client = Deployment(f"127.0.0.1:{port}", ws.root / OPERATOR)
    try:
        wait_until(lambda: all("connected to the coordinator" in (logs / f"{s}.log").read_text()
                              for s in SILOS), 60, "every silo connected")
        job = client.submit(plan)
        # The kit's policy holds the job for the silo's operator, who answers it as the
        # README says.
        wait_until(lambda: any(j["job_id"] == job.job_id for j in json.loads(
            _run([*SILO, *listing[1:], "--json"], operator))), 60, "the job offered")
        held = client.job(job.job_id)
        approval = [*approval[:3], str(job.job_id), *approval[4:]]
        approved = _run([*SILO, *approval[1:]], operator)
        ended = client.wait(job.job_id, timeout_s=240)
        results = ws.root / "results"
        client.results(job.job_id, results)
    finally:
        client.close()
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
    return {"ws": ws, "operator": operator, "kit": kit, "tarball": tarball, "readme": readme,
            "serve": serve, "signed": signed, "version": version, "held": held,
            "approved": approved, "ended": ended, "results": results, "job": job.job_id,
            "logs": {p.name: p.read_text() for p in logs.glob("*.log")}, "port": port}


def test_the_onboarded_silo_set_up_from_its_key_and_the_kit_took_part(run: dict) -> None:
    assert run["ended"].state == "completed", (run["ended"].reason, run["logs"])
    assert {a.silo: a.answer for a in run["held"].answers}[ONBOARDED] == ""   # held for a person
    assert "approved" in run["approved"]
    assert sorted(p.name for p in (run["operator"] / "id").iterdir()) == [
        "ca.crt", f"{ONBOARDED}.crt", f"{ONBOARDED}.csr", f"{ONBOARDED}.key"]
    assert run["serve"][:4] == ["silo", "serve", "--coordinator", f"127.0.0.1:{run['port']}"]
    results = json.loads((run["results"] / "results.json").read_text())
    assert results["status"] == "completed" and results["rounds_completed"] == 2
    assert set(results["final_metrics"]) == set(SILOS)
    state = run["operator"] / "state"
    cert = (run["operator"] / "id" / f"{ONBOARDED}.crt").read_bytes()
    assert verify_audit_log(state / "audit.jsonl", cert_pem=cert).ok
    job_log = state / "jobs" / str(run["job"]) / "audit.jsonl"
    report = verify_audit_log(job_log, cert_pem=cert)
    assert report.ok and report.closed
    joined = [json.loads(line) for line in job_log.read_text().splitlines()
              if '"joined"' in line]
    assert joined and joined[0]["policy_sha256"]    # it joined under the kit's policy


def test_the_readme_names_the_version_silo_version_prints(run: dict) -> None:
    version = run["version"].split()[1]
    assert f"runs trellis-fgl {version};" in run["readme"]


def test_no_key_material_anywhere_in_the_kit_or_its_tarball(run: dict) -> None:
    files = [p for p in run["kit"].iterdir()]
    assert len(files) == 8
    with tarfile.open(run["tarball"]) as tar:
        members = [tar.extractfile(m).read() for m in tar.getmembers()]  # type: ignore[union-attr]
    for data in [*(p.read_bytes() for p in files), *members, run["tarball"].read_bytes()]:
        assert b"PRIVATE KEY" not in data
    key = (run["operator"] / "id" / f"{ONBOARDED}.key").read_bytes()
    body = b"".join(key.splitlines()[1:-1])
    assert all(body not in data for data in members)
