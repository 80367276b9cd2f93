"""A coordinator killed in the middle of a round and started again: the federation goes on.

DESIGN.md §6: the coordinator checkpoints after every round and, restarted, resumes at the last
completed round while the silos reconnect with backoff. Here real processes do this over mTLS:
the coordinator SIGKILLs itself once every silo has trained and uploaded its masked input for
round 2 (TRELLIS_COORDINATOR_FAILPOINT, an exact point an external kill could not hit), the
silo processes keep running, and a second coordinator process is started on the same plan.
A silo keeps its model, optimiser and round counter on its own disk and resumes likewise.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from coordinator.plan import load_plan
from crypto.audit import verify_audit_log
from crypto.pki import load_identity
from protos.messages import Envelope, Instruction, Phase
from silo.agent import RESUME_FILE, SiloAgent
from silo.hgn_setup import load_silo_data, make_silo_trainer
from silo.session import SiloSession
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


@pytest.mark.slow
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


def _agent(ws, plan_json: str, state: Path, silo: str = "hospital-a") -> SiloAgent:
    ident = load_identity(ws.identity(silo))
    data = load_silo_data(ws.data(silo))
    session = SiloSession(ident, lambda p: make_silo_trainer(data, p, silo, torch.device("cpu")))
    agent = SiloAgent("127.0.0.1:1", ident, session, state, log=lambda m: None)
    join = Instruction(Envelope("", 0, 0, Phase.JOIN), public_plan_json=plan_json)
    agent._handle(None, join)            # type: ignore[arg-type]  # JOIN makes no call
    return agent


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_a_restarted_silo_process_goes_on_from_its_state_on_disk(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, graphs=30)
    plan = load_plan(write_plan(ws, "disk", rounds=5))
    state = tmp_path / "state"
    first = _agent(ws, plan.public.to_json(), state)
    session = first.session
    for round_no in (1, 2):
        session.open_round(Instruction(Envelope("disk", round_no, 1, Phase.ROUND_OPEN),
                                       plan.silos))
        before = session.trainer.snapshot()          # type: ignore[union-attr]
        session.metrics_report(round_no - 1)
        first._save_resume_state()
        session.trainer.train()      # type: ignore[union-attr]  # round 2's is lost with the process
    assert (state / RESUME_FILE).stat().st_mode & 0o077 == 0     # private to the silo
    first.audit.close()                                          # the process is gone

    second = _agent(ws, plan.public.to_json(), state)
    resumed = second.session
    assert (resumed.round, resumed.attempt, resumed.reported) == (2, 1, {1})
    assert _same(resumed.trainer.snapshot(), before)  # type: ignore[union-attr]
    # The coordinator retries round 2: the silo starts it from exactly that state again.
    resumed.open_round(Instruction(Envelope("disk", 2, 2, Phase.ROUND_OPEN), plan.silos))
    assert _same(resumed.trainer.snapshot(), before)  # type: ignore[union-attr]
    second.audit.close()
    assert "resumed" in (state / "audit.jsonl").read_text()

    # Another federation's state in the folder is left alone; another plan under the same
    # federation id, or a damaged file, stops the silo before it sends anything.
    other = load_plan(write_plan(ws, "other", rounds=5))
    unrelated = _agent(ws, other.public.to_json(), state)
    assert unrelated.session.round == 0
    unrelated.audit.close()
    changed = load_plan(write_plan(ws, "disk", rounds=6))
    with pytest.raises(ValueError, match="belongs to another plan"):
        _agent(ws, changed.public.to_json(), state)
    (state / RESUME_FILE).write_bytes(b"not a saved state")
    with pytest.raises(ValueError, match="resume.pt cannot be read"):
        _agent(ws, plan.public.to_json(), state)


@pytest.mark.slow
def test_silo_killed_mid_round_rejoins_with_its_model(tmp_path: Path) -> None:
    """A silo process dies in round 2 after sending its key shares; the round completes without
    it (dropout recovery); started again on the same state folder, it resumes and takes part in
    round 3 with its own model, without reporting round 1 again."""
    ws = make_workspace(tmp_path)
    plan_path = write_plan(ws, "silo-restart", rounds=3)
    folder = ws.root / "silo-restart"
    folder.mkdir(exist_ok=True)
    coordinator = start_coordinator(plan_path, folder / "coordinator.log")
    port = port_of(plan_path)
    others = [start_silo(ws, s, port, folder / s, folder / f"{s}.log")
              for s in SILOS if s != "pharma-b"]
    crashing = start_silo(ws, "pharma-b", port, folder / "pharma-b", folder / "pharma-b-1.log",
                          env={"TRELLIS_FAILPOINT": "after_shares:2"})
    try:
        assert crashing.wait(timeout=180) == -signal.SIGKILL, (
            folder / "pharma-b-1.log").read_text()
    finally:
        if crashing.poll() is None:
            for process in (crashing, coordinator, *others):
                process.kill()
    restarted = start_silo(ws, "pharma-b", port, folder / "pharma-b", folder / "pharma-b-2.log")
    codes = wait_all([*others, restarted, coordinator], timeout=240)
    logs = {p.name: p.read_text() for p in folder.glob("*.log")}
    assert codes == [0, 0, 0, 0], logs
    assert "resumed from" in logs["pharma-b-2.log"], logs["pharma-b-2.log"]
    assert "not accepted" not in logs["pharma-b-2.log"]     # round 1 was not reported twice
    results = json.loads((folder / "coordinator" / "results.json").read_text())
    assert results["status"] == "completed" and results["rounds_completed"] == 3
    second, third = results["rounds"][1], results["rounds"][2]
    assert second["dropped"] == ["pharma-b"] and "pharma-b" not in second["participants"]
    assert third["participants"] == sorted(SILOS)
    audit = [json.loads(line) for line in (folder / "pharma-b" / "audit.jsonl").read_text()
             .splitlines()]
    resumed = [e for e in audit if e.get("event") == "resumed"]
    assert [(e["round"], e["attempt"]) for e in resumed] == [(2, 1)]
    assert not (folder / "pharma-b" / RESUME_FILE).exists()    # finished: nothing to resume
    cert = (ws.identity("pharma-b") / "pharma-b.crt").read_bytes()
    report = verify_audit_log(folder / "pharma-b" / "audit.jsonl", cert_pem=cert)
    assert report.ok and report.closed, report.problems
