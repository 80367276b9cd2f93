"""End to end: one standing coordinator and three standing silos, real processes over mTLS,
running jobs back to back without a restart (issue "A standing federation").

The silos approve by policy, except social-c, which holds every job for its operator; a job is
refused by one silo's policy, another by every silo (an operator they do not trust), and
each job that runs ends where `coordinator simulate` of its plan ends, seed for seed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.federation import (
    SILOS,
    Workspace,
    _env,
    free_port,
    simulate_like_silo_processes,
    wait_until,
    write_deployment,
)
from trellis.coordinator.jobs.client import Deployment, JobRefused
from trellis.crypto.audit import verify_audit_log
from trellis.crypto.audit_crosscheck import read_records
from trellis.crypto.pki import issue_operator
from trellis.protos.jobs import JobView
from trellis.protos.plan import load_plan

pytestmark = pytest.mark.slow

MANUAL = "social-c"          # holds every job until `silo jobs approve`


@pytest.fixture(scope="module")
def standing(workspace_factory) -> dict:
    """A standing coordinator and three `silo serve` processes, up for the whole module."""
    ws: Workspace = workspace_factory("standing", graphs=60)
    issue_operator(ws.ca, "ops-alice", ws.root / "ops-alice")
    issue_operator(ws.ca, "ops-mallory", ws.root / "ops-mallory")
    port = free_port()
    deployment = write_deployment(ws, port, "standing-test", SILOS, approval_deadline_s=120)
    logs = ws.root / "logs"
    logs.mkdir()
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "trellis.coordinator.cli", "serve", "--deployment",
         str(deployment)], stdout=open(logs / "coordinator.log", "w"),
        stderr=subprocess.STDOUT, env=_env())
    silos = {}
    for silo in SILOS:
        policy = ws.root / f"{silo}-policy.toml"
        refuse = '\n[accept]\nalgorithms = ["fedstar", "gcfl", "fedavg"]\n' if (
            silo == "hospital-a") else ""
        policy.write_text(f'[jobs]\napprove = "{"manual" if silo == MANUAL else "auto"}"\n'
                          f'operators = ["ops-alice"]\n{refuse}')
        silos[silo] = subprocess.Popen(
            [sys.executable, "-m", "trellis.silo.cli", "serve", "--coordinator",
             f"127.0.0.1:{port}", "--identity", str(ws.identity(silo)), "--data",
             f"graphs={ws.data(silo) / ws.domain(silo).upper()}", "--policy", str(policy),
             "--state-root", str(ws.root / silo), "--device", "cpu", "--threads", "1"],
            stdout=open(logs / f"{silo}.log", "w"), stderr=subprocess.STDOUT, env=_env())
    operator = Deployment(f"127.0.0.1:{port}", ws.root / "ops-alice")
    try:
        wait_until(lambda: _connected(logs), 60, "every silo connected")
        yield {"ws": ws, "operator": operator, "port": port, "logs": logs,
               "coordinator": coordinator, "silos": silos}
    finally:
        operator.close()
        for process in [*silos.values(), coordinator]:
            process.terminate()
        for process in [*silos.values(), coordinator]:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def _connected(logs: Path) -> bool:
    return all("connected to the coordinator" in (logs / f"{s}.log").read_text()
               for s in SILOS)


def job_plan(ws: Workspace, name: str, algorithm: str, rounds: int = 3) -> Path:
    """A job plan: today's plan without [server], naming the dataset (with [simulation] data,
    which a job ignores, for the comparison with `coordinator simulate`)."""
    data = ", ".join(f'"{s}" = "{ws.data(s) / ws.domain(s).upper()}"' for s in SILOS)
    path = ws.root / f"{name}.toml"
    path.write_text(f"""
[federation]
id = "{name}"
algorithm = "{algorithm}"
dataset = "graphs"
rounds = {rounds}
seed = 7
silos = [{", ".join(f'"{s}"' for s in SILOS)}]

[timeouts]
join_s = 120
round_s = 120
report_s = 30

[simulation]
data = {{ {data} }}
""")
    return path


def approve_by_hand(standing: dict, job_id: int) -> str:
    """`silo jobs approve` at the manual silo, once the offer has reached it."""
    root = standing["ws"].root / MANUAL

    def held() -> bool:
        listed = subprocess.run([sys.executable, "-m", "trellis.silo.cli", "jobs", "list",
                                 "--state-root", str(root), "--json"],
                                capture_output=True, text=True, timeout=60)
        return listed.returncode == 0 and any(j["job_id"] == job_id
                                              for j in json.loads(listed.stdout))

    wait_until(held, 60, f"job {job_id} offered to {MANUAL}")
    done = subprocess.run([sys.executable, "-m", "trellis.silo.cli", "jobs", "approve",
                           str(job_id), "--state-root", str(root)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def finished(standing: dict, job_id: int, timeout: float = 240) -> JobView:
    return standing["operator"].wait(job_id, timeout_s=timeout)


def same_as_simulated(results: dict, plan: Path) -> None:
    simulated = simulate_like_silo_processes(load_plan(plan))
    assert [r["metrics"] for r in results["rounds"]] == [
        r["metrics"] for r in simulated["rounds"]]


def test_a_job_one_silo_refuses_fails_and_that_silo_takes_the_next(standing: dict) -> None:
    """First in the module: hospital-a, having refused this job, takes part in the next three
    (test_three_jobs_back_to_back_each_equal_to_its_simulation)."""
    ws, operator = standing["ws"], standing["operator"]
    refused = operator.submit(job_plan(ws, "proximal", "fedprox"))
    approve_by_hand(standing, refused.job_id)
    ended = finished(standing, refused.job_id, timeout=60)
    assert ended.state == "failed"
    assert "refused by hospital-a" in ended.reason and "algorithms" in ended.reason
    assert not (ws.root / "hospital-a" / "jobs" / str(refused.job_id)).exists()


def test_three_jobs_back_to_back_each_equal_to_its_simulation(standing: dict,
                                                              tmp_path: Path) -> None:
    ws, operator = standing["ws"], standing["operator"]
    plans = {alg: job_plan(ws, f"sweep-{alg}", alg) for alg in ("fedstar", "gcfl", "fedavg")}
    jobs = {alg: operator.submit(plan) for alg, plan in plans.items()}
    first = jobs["fedstar"]
    assert first.state in ("submitted", "awaiting_approval")
    # The manual silo holds the first job: it waits for its operator.
    time.sleep(2)
    assert operator.job(first.job_id).state == "awaiting_approval"
    held = {a.silo: a.answer for a in operator.job(first.job_id).answers}
    assert held == {"hospital-a": "approved", "pharma-b": "approved", MANUAL: ""}
    for job in jobs.values():
        assert "approved" in approve_by_hand(standing, job.job_id)
    for alg, job in jobs.items():
        ended = finished(standing, job.job_id)
        assert ended.state == "completed", (alg, ended.reason, ended.events)
        out = tmp_path / alg
        written = {p.name for p in operator.results(job.job_id, out)}
        assert {"results.json", "audit.jsonl", "job.log"} <= written
        results = json.loads((out / "results.json").read_text())
        same_as_simulated(results, plans[alg])
        verify_audit_log(out / "audit.jsonl")
        for silo in SILOS:
            verify_audit_log(ws.root / silo / "jobs" / str(job.job_id) / "audit.jsonl")
        assert (ws.root / "hospital-a" / "jobs" / str(job.job_id) / "final_model.pt").is_file()
    # A job's folder is a one-plan state folder: the same commands work on it unchanged.
    folder = ws.root / "coordinator" / "jobs" / str(first.job_id)
    for command, says in ((["status", "--state-dir", str(folder)], "sweep-fedstar"),
                          (["audit", "cross-check", str(ws.root / "pharma-b" / "jobs" /
                                                        str(first.job_id) / "audit.jsonl"),
                            str(folder / "audit.jsonl")], "agree on every upload")):
        done = subprocess.run([sys.executable, "-m", "trellis.coordinator.cli", *command],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and says in done.stdout, (command, done.stdout,
                                                              done.stderr)
    # No restart: one coordinator process and the same three silo processes all along.
    assert standing["coordinator"].poll() is None
    assert all(p.poll() is None for p in standing["silos"].values())


def test_a_job_of_an_operator_no_silo_trusts_is_refused_by_every_silo(standing: dict) -> None:
    ws = standing["ws"]
    with Deployment(f"127.0.0.1:{standing['port']}", ws.root / "ops-mallory") as mallory:
        job = mallory.submit(job_plan(ws, "untrusted", "fedavg"))
        ended = mallory.wait(job.job_id, timeout_s=60)
    # The first refusal fails it (min_silos = 3 is out of reach); every silo refused it anyway.
    assert ended.state == "failed" and "ops-mallory" in ended.reason
    def decided(silo: str) -> list[dict]:
        return [r for _, r in read_records(ws.root / silo / "audit.jsonl")
                if r.get("event") == "job_offered" and r.get("job") == job.job_id]

    for silo in SILOS:
        wait_until(lambda s=silo: bool(decided(s)), 30, f"{silo} deciding job {job.job_id}")
        [offered] = decided(silo)
        assert offered["decision"] == "refuse" and "ops-mallory" in offered["reason"], offered
        assert not (ws.root / silo / "jobs" / str(job.job_id)).exists()


def test_jobs_stop_ends_a_running_job_and_keeps_what_it_wrote(standing: dict) -> None:
    ws, operator = standing["ws"], standing["operator"]
    long = operator.submit(job_plan(ws, "long", "fedavg", rounds=200))
    approve_by_hand(standing, long.job_id)
    wait_until(lambda: (operator.job(long.job_id).status or _NoStatus).rounds_completed >= 1,
              120, "the long job's first round")
    stopped = operator.stop(long.job_id)
    assert stopped.state in ("running", "stopped")
    ended = finished(standing, long.job_id, timeout=60)
    assert ended.state == "stopped" and "stopped by ops-alice" in ended.reason
    folder = ws.root / "coordinator" / "jobs" / str(long.job_id)
    results = json.loads((folder / "results.json").read_text())
    assert results["status"] == "stopped" and results["rounds"]
    verify_audit_log(folder / "audit.jsonl")
    with pytest.raises(JobRefused, match="already ended"):
        operator.stop(long.job_id)


class _NoStatus:
    rounds_completed = 0
