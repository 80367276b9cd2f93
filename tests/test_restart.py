"""A coordinator killed in the middle of a round and started again: the federation goes on.

DESIGN.md §6: the coordinator checkpoints after every round and, restarted, resumes at the last
completed round while the silos reconnect with backoff. Here real processes do this over mTLS:
the coordinator SIGKILLs itself once every silo has trained and uploaded its masked input for
round 2 (TRELLIS_COORDINATOR_FAILPOINT, an exact point an external kill could not hit), the
silo processes keep running, and a second coordinator process is started on the same plan.
"""

from __future__ import annotations

import json
import signal

import pytest

from coordinator.plan import load_plan
from crypto.audit import verify_audit_log
from tests.federation_helpers import (
    SILOS,
    make_workspace,
    port_of,
    simulate_like_silo_processes,
    start_coordinator,
    start_silo,
    wait_all,
    write_plan,
)

pytestmark = pytest.mark.slow


def test_coordinator_killed_mid_round_resumes_and_ends_as_an_uninterrupted_run(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    ws = make_workspace(tmp_path_factory.mktemp("restart"))
    plan_path = write_plan(ws, "restart", rounds=3)
    folder = ws.root / "restart"
    folder.mkdir(exist_ok=True)
    first = start_coordinator(plan_path, folder / "coordinator-1.log",
                              env={"TRELLIS_COORDINATOR_FAILPOINT": "stage_closed/input:2"})
    silos = [start_silo(ws, s, port_of(plan_path), folder / s, folder / f"{s}.log")
             for s in SILOS]
    try:
        assert first.wait(timeout=180) == -signal.SIGKILL, (
            folder / "coordinator-1.log").read_text()
    finally:
        if first.poll() is None:
            first.kill()
            for silo in silos:
                silo.kill()
    checkpoint = json.loads((folder / "coordinator" / "checkpoint.json").read_text())
    assert checkpoint["completed_rounds"] == 1
    assert checkpoint["open_attempt"] == {"round": 2, "attempt": 1}
    # Round 1's metrics reached the coordinator after round 1's checkpoint: they must survive.
    assert set(checkpoint["history"][0]["metrics"]) == set(SILOS)

    second = start_coordinator(plan_path, folder / "coordinator-2.log")
    codes = wait_all([*silos, second], timeout=240)
    logs = {p.name: p.read_text() for p in folder.glob("*.log")}
    assert codes == [0, 0, 0, 0], logs
    assert "resumed_at_round" in (folder / "coordinator" / "audit.jsonl").read_text()

    results = json.loads((folder / "coordinator" / "results.json").read_text())
    assert results["status"] == "completed" and results["rounds_completed"] == 3
    assert [r["attempts"] for r in results["rounds"]] == [1, 2, 1]   # round 2's attempt 2
    assert all(set(r["metrics"]) == set(SILOS) for r in results["rounds"])
    # Each silo went back to its state from before round 2 and trained it again with the same
    # random stream: the interrupted federation ends exactly where an uninterrupted one does.
    simulated = simulate_like_silo_processes(load_plan(plan_path))
    for silo in SILOS:
        real = results["final_metrics"][silo]
        sim = simulated["final_metrics"][silo]
        assert real["test_acc"] == pytest.approx(sim["test_acc"], abs=1e-9), silo
        assert real["train_loss"] == pytest.approx(sim["train_loss"], rel=1e-5), silo

    # Both coordinator processes wrote one hash chain; every trail verifies.
    report = verify_audit_log(folder / "coordinator" / "audit.jsonl",
                              cert_pem=(ws.ca / "server.crt").read_bytes())
    assert report.ok and report.closed, report.problems
    for silo in SILOS:
        cert = (ws.identity(silo) / f"{silo}.crt").read_bytes()
        silo_report = verify_audit_log(folder / silo / "audit.jsonl", cert_pem=cert)
        assert silo_report.ok and silo_report.closed, silo_report.problems
