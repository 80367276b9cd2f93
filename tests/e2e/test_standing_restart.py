"""End to end: a standing federation survives kill -9 of its coordinator and of a silo mid-job,
and runs two jobs at once on disjoint silos (max_concurrent_jobs = 2).

Real processes over mTLS on loopback; the coordinator dies at an exact point through its
failpoint (TRELLIS_COORDINATOR_FAILPOINT, a SIGKILL of itself), a silo's `silo serve` by
SIGKILL from the test. Every job ends completed, and every audit log verifies and cross-checks
against the coordinator's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

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
from trellis.crypto.audit_crosscheck import cross_check, read_records
from trellis.crypto.pki import issue_operator

pytestmark = pytest.mark.slow

FOUR = (*SILOS, "lab-d")


class Standing:
    """A standing deployment's processes, restartable one by one."""

    def __init__(self, ws: Workspace, port: int) -> None:
        self.ws = ws
        self.port = port
        self.logs = ws.root / "logs"
        self.logs.mkdir(exist_ok=True)
        self.deployment = write_deployment(ws, port, "restarts", FOUR, max_concurrent_jobs=2)
        self.coordinator: subprocess.Popen | None = None
        self.silos: dict[str, subprocess.Popen] = {}
        self.starts = 0

    def start_coordinator(self, failpoint: str = "") -> subprocess.Popen:
        self.starts += 1
        env = {**_env(), **({"TRELLIS_COORDINATOR_FAILPOINT": failpoint} if failpoint else {})}
        self.coordinator = subprocess.Popen(
            [sys.executable, "-m", "trellis.coordinator.cli", "serve", "--deployment",
             str(self.deployment)], env=env, stderr=subprocess.STDOUT,
            stdout=open(self.logs / f"coordinator-{self.starts}.log", "w"))
        return self.coordinator

    def start_silo(self, silo: str) -> subprocess.Popen:
        policy = self.ws.root / f"{silo}-policy.toml"
        policy.write_text('[jobs]\napprove = "auto"\n')
        log = open(self.logs / f"{silo}.log", "a")
        self.silos[silo] = subprocess.Popen(
            [sys.executable, "-m", "trellis.silo.cli", "serve", "--coordinator",
             f"127.0.0.1:{self.port}", "--identity", str(self.ws.identity(silo)), "--data",
             f"graphs={self.ws.data(silo) / self.ws.domain(silo).upper()}", "--policy",
             str(policy), "--state-root", str(self.ws.root / silo), "--device", "cpu",
             "--threads", "1"], stdout=log, stderr=subprocess.STDOUT, env=_env())
        return self.silos[silo]

    def stop(self) -> None:
        everything = [*self.silos.values(), *([self.coordinator] if self.coordinator else [])]
        for process in everything:
            if process.poll() is None:
                process.terminate()
        for process in everything:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()

    def logs_text(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in
                         sorted(self.logs.glob("*.log")))


@pytest.fixture(scope="module")
def standing(workspace_factory) -> Iterator[Standing]:
    ws: Workspace = workspace_factory("standing-restarts", graphs=60, extra=1)
    issue_operator(ws.ca, "ops-alice", ws.root / "ops-alice")
    running = Standing(ws, free_port())
    try:
        yield running
    finally:
        running.stop()


def job_plan(ws: Workspace, name: str, silos: tuple[str, ...], rounds: int) -> Path:
    path = ws.root / f"{name}.toml"
    path.write_text(f"""
[federation]
id = "{name}"
algorithm = "fedavg"
dataset = "graphs"
rounds = {rounds}
seed = 3
min_silos = 2
silos = [{", ".join(f'"{s}"' for s in silos)}]

[timeouts]
join_s = 120
round_s = 120
stage_s = 30
report_s = 30
""")
    return path


def operator(standing: Standing) -> Deployment:
    return Deployment(f"127.0.0.1:{standing.port}", standing.ws.root / "ops-alice")


def wait_for(check, timeout: float, what: str, standing: Standing) -> None:  # type: ignore[no-untyped-def]
    wait_until(check, timeout, what, standing.logs_text)


def audits_agree(standing: Standing, job_id: int, silos: tuple[str, ...],
                 killed: str | None = None) -> None:
    """Every log of the job verifies, and each silo's cross-checks with the coordinator's;
    only a killed silo may leave an upload interrupted (accepted, its answer never read)."""
    coordinator_log = standing.ws.root / "coordinator" / "jobs" / str(job_id) / "audit.jsonl"
    verify_audit_log(coordinator_log)
    for silo in silos:
        silo_log = standing.ws.root / silo / "jobs" / str(job_id) / "audit.jsonl"
        verify_audit_log(silo_log)
        checked = cross_check(read_records(silo_log), read_records(coordinator_log))
        assert checked.ok and checked.matched > 0, (silo, checked)
        assert silo == killed or not checked.interrupted, (silo, checked)
        assert len(checked.interrupted) <= 1, (silo, checked)


def test_coordinator_killed_mid_job_resumes_it_from_its_checkpoint(standing: Standing) -> None:
    first = standing.start_coordinator(failpoint="round_completed:3")
    for silo in SILOS:
        standing.start_silo(silo)
    with operator(standing) as ops:
        wait_for(lambda: "listening" in (standing.logs / "coordinator-1.log").read_text(), 60,
                 "the coordinator listening", standing)
        job = ops.submit(job_plan(standing.ws, "killed-coordinator", SILOS, rounds=6))
        # The failpoint SIGKILLs the coordinator once the job's round 3 is complete.
        assert first.wait(timeout=240) == -signal.SIGKILL, standing.logs_text()
        standing.start_coordinator()
        ended = ops.wait(job.job_id, timeout_s=240)
    assert ended.state == "completed", (ended.reason, standing.logs_text())
    assert ended.status is not None and ended.status.rounds_completed == 6
    resumed = [e for e in read_records(standing.ws.root / "coordinator" / "audit.jsonl")
               if e[1].get("event") == "job_federation"]
    assert [r[1]["resumed"] for r in resumed] == [False, True]
    audits_agree(standing, job.job_id, SILOS)


def test_silo_killed_mid_job_rejoins_it_after_its_restart(standing: Standing) -> None:
    with operator(standing) as ops:
        job = ops.submit(job_plan(standing.ws, "killed-silo", SILOS, rounds=30))
        wait_for(lambda: (ops.job(job.job_id).status is not None
                          and ops.job(job.job_id).status.rounds_completed >= 2), 180,
                 "round 2 of the job", standing)
        victim = standing.silos["pharma-b"]
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=30)
        standing.start_silo("pharma-b")
        ended = ops.wait(job.job_id, timeout_s=300)
    assert ended.state == "completed", (ended.reason, standing.logs_text())
    joined = [r for _, r in read_records(standing.ws.root / "pharma-b" / "audit.jsonl")
              if r.get("event") == "job_joined" and r.get("job") == job.job_id]
    assert len(joined) == 2          # before the kill, and again after the restart
    audits_agree(standing, job.job_id, SILOS, killed="pharma-b")


def test_two_jobs_on_disjoint_silos_run_at_once(standing: Standing) -> None:
    standing.start_silo("lab-d")
    with operator(standing) as ops:
        left = ops.submit(job_plan(standing.ws, "left", ("hospital-a", "pharma-b"), rounds=4))
        right = ops.submit(job_plan(standing.ws, "right", ("social-c", "lab-d"), rounds=4))
        ended = [ops.wait(left.job_id, timeout_s=240), ops.wait(right.job_id, timeout_s=240)]
    assert [j.state for j in ended] == ["completed", "completed"], standing.logs_text()
    spans = []
    for job in ended:
        at = {e.state: e.at for e in job.events}
        spans.append((at["running"], at["completed"]))
    (start_a, end_a), (start_b, end_b) = spans
    assert start_b < end_a and start_a < end_b      # they overlapped
    audits_agree(standing, left.job_id, ("hospital-a", "pharma-b"))
    audits_agree(standing, right.job_id, ("social-c", "lab-d"))
