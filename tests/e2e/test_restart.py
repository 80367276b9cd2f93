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
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.federation import (
    SILOS,
    hetero_graphs,
    make_hetero_workspace,
    make_workspace,
    port_of,
    simulate_like_silo_processes,
    start_coordinator,
    start_silo,
    wait_all,
    write_hetero_plan,
    write_plan,
)
from trellis.coordinator.simulation.sequential import run_simulation
from trellis.crypto.audit import verify_audit_log
from trellis.crypto.groupkey import GroupSecrets
from trellis.crypto.pki import load_identity
from trellis.protos.messages import Envelope, Instruction, Phase
from trellis.protos.plan import load_plan
from trellis.silo.federation.agent import RESUME_FILE, SiloAgent
from trellis.silo.federation.session import SiloSession
from trellis.silo.training.trainer import snapshot_from_bytes
from trellis.silo.training.trainers import load_silo_data, make_silo_trainer


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
    assert (f"resuming federation restart at round 2 of 3 from "
            f"{folder / 'coordinator' / 'checkpoint.json'}") in logs["coordinator-2.log"]

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


def _agent(ws, plan_json: str, state: Path, silo: str = "hospital-a",
           run_id: str = "run-1") -> SiloAgent:
    ident = load_identity(ws.identity(silo))
    data = load_silo_data(ws.data(silo))
    session = SiloSession(ident, lambda p: make_silo_trainer(data, p, silo, torch.device("cpu")))
    agent = SiloAgent("127.0.0.1:1", ident, session, state, log=lambda m: None)
    join = Instruction(Envelope("", 0, 0, Phase.JOIN), public_plan_json=plan_json,
                       run_id=run_id)
    try:
        agent.join(join)                 # JOIN makes no call
    except Exception:
        agent.audit.close()              # as SiloAgent.run does when it stops
        raise
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

    # Another plan under the same federation id, or a damaged file, stops the silo before it
    # sends anything; a fresh run of the coordinator (a new run id) discards the saved state.
    changed = load_plan(write_plan(ws, "disk", rounds=6))
    with pytest.raises(ValueError, match="belongs to another plan"):
        _agent(ws, changed.public.to_json(), state)
    fresh = _agent(ws, plan.public.to_json(), state, run_id="a-new-run")
    assert fresh.session.round == 0 and not (state / RESUME_FILE).exists()
    fresh.audit.close()
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
    # Finished: what is kept is the state after the last round, for an extension only.
    assert snapshot_from_bytes((folder / "pharma-b" / RESUME_FILE).read_bytes())["finished"]
    cert = (ws.identity("pharma-b") / "pharma-b.crt").read_bytes()
    report = verify_audit_log(folder / "pharma-b" / "audit.jsonl", cert_pem=cert)
    assert report.ok and report.closed, report.problems


def _kill_then_restart(ws, plan_path: Path, folder: Path, failpoint: str,
                       between: Callable[[], None] = lambda: None) -> list[int]:
    """Run a federation whose first coordinator dies at `failpoint`; return every exit code."""
    folder.mkdir(exist_ok=True)
    first = start_coordinator(plan_path, folder / "coordinator-1.log",
                              env={"TRELLIS_COORDINATOR_FAILPOINT": failpoint})
    silos = [start_silo(ws, s, port_of(plan_path), folder / s, folder / f"{s}.log")
             for s in ws.silos]
    try:
        assert first.wait(timeout=300) == -signal.SIGKILL, (
            folder / "coordinator-1.log").read_text()[-3000:]
        between()
    finally:
        if first.poll() is None:
            for process in (first, *silos):
                process.kill()
    second = start_coordinator(plan_path, folder / "coordinator-2.log")
    codes = wait_all([*silos, second], timeout=400)
    logs = {p.name: p.read_text()[-3000:] for p in folder.glob("*.log")}
    assert codes == [0] * (len(ws.silos) + 1), logs
    return codes


@pytest.mark.slow
def test_a_silo_asked_to_stop_ends_cleanly_with_its_state_kept(tmp_path: Path) -> None:
    """SIGTERM (docker stop, kubectl delete, systemctl stop) mid-federation: the silo exits 143
    at once with one line saying how it goes on, its audit log closed and verified, its resume
    state on disk; the others finish without it."""
    ws = make_workspace(tmp_path)
    plan_path = write_plan(ws, "silo-stop", rounds=40, min_silos=2)
    folder = ws.root / "silo-stop"
    folder.mkdir(exist_ok=True)
    coordinator = start_coordinator(plan_path, folder / "coordinator.log")
    port = port_of(plan_path)
    silos = {s: start_silo(ws, s, port, folder / s, folder / f"{s}.log") for s in SILOS}
    stopped = silos["pharma-b"]
    try:
        deadline = time.monotonic() + 180
        while "round 2/40" not in (folder / "pharma-b.log").read_text():
            assert time.monotonic() < deadline and stopped.poll() is None, (
                folder / "pharma-b.log").read_text()
            time.sleep(0.05)
        stopped.send_signal(signal.SIGTERM)
        assert stopped.wait(timeout=30) == 143
        codes = wait_all([*silos.values(), coordinator], timeout=300)
    finally:
        for process in (coordinator, *silos.values()):
            if process.poll() is None:
                process.kill()
    logs = {p.stem: p.read_text() for p in folder.glob("*.log")}
    assert codes == [0, 143, 0, 0], logs
    assert ("stopped (SIGTERM); the same `silo join` goes on from the last round this silo "
            "finished") in logs["pharma-b"], logs["pharma-b"]
    assert "Traceback" not in logs["pharma-b"]
    assert (folder / "pharma-b" / RESUME_FILE).exists()
    cert = (ws.identity("pharma-b") / "pharma-b.crt").read_bytes()
    report = verify_audit_log(folder / "pharma-b" / "audit.jsonl", cert_pem=cert)
    assert report.ok and report.closed, report.problems
    results = json.loads((folder / "coordinator" / "results.json").read_text())
    assert results["status"] == "completed"
    assert "pharma-b" not in results["rounds"][-1]["participants"]


@pytest.mark.slow
def test_gcfl_coordinator_killed_before_a_split_resumes_with_its_clusters_and_ckks_context(
        tmp_path: Path) -> None:
    """GCFL: killed after round 21's masked inputs, just before the CKKS similarity that splits
    the cluster. The restarted coordinator has its cluster sums and the public CKKS context back
    from its checkpoint, the silos their group secrets from their own disks: the split and every
    accuracy are those of the simulation, and no file the coordinator wrote holds a secret."""
    from tests.integration.test_gcfl import FORCE_SPLIT, _secret_key_bytes

    ws = make_workspace(tmp_path, graphs=40, extra=1)
    plan_path = write_plan(ws, "gcfl-restart", algorithm="gcfl", rounds=22, min_silos=4,
                           extra=FORCE_SPLIT)
    folder = ws.root / "gcfl-restart"
    secrets: list[bytes] = []

    def read_group_secrets() -> None:
        saved = snapshot_from_bytes((folder / ws.silos[0] / RESUME_FILE).read_bytes())
        group = GroupSecrets.from_bytes(saved["group_secrets"].numpy().tobytes())
        secrets.extend([group.group_key, _secret_key_bytes(group.ckks_secret)[-4096:]])

    _kill_then_restart(ws, plan_path, folder, "stage_closed/input:21", read_group_secrets)
    results = json.loads((folder / "coordinator" / "results.json").read_text())
    assert results["status"] == "completed" and results["rounds"][20]["attempts"] == 2
    simulated = simulate_like_silo_processes(load_plan(plan_path))
    assert results["clustering"]["splits"] and (
        results["clustering"]["splits"] == simulated["clustering"]["splits"])
    assert results["clustering"]["clusters"] == simulated["clustering"]["clusters"]
    for silo in ws.silos:
        real = results["final_metrics"][silo]["test_acc"]
        assert real == pytest.approx(simulated["final_metrics"][silo]["test_acc"], abs=1e-9)
    assert len(secrets) == 2 and all(len(s) >= 32 for s in secrets)
    stored = [p for p in (folder / "coordinator").rglob("*") if p.is_file()]
    assert {p.name for p in stored} >= {"checkpoint.json", "audit.jsonl"}
    assert any(p.name.startswith("durable_state-") for p in stored)
    for path in [*stored, *folder.glob("coordinator-*.log")]:
        data = path.read_bytes()
        assert not any(secret in data for secret in secrets), path


@pytest.mark.slow
def test_fedhgn_coordinator_killed_mid_round_resumes_with_the_envelope_pool(
        tmp_path: Path) -> None:
    """FedHGN: killed after round 4's masked inputs. The restarted coordinator hands out the
    sealed envelopes of round 3 from its checkpoint, the silos open them with the group key
    from their own disks, and early stopping picks what the simulation picks."""
    ws = make_hetero_workspace(tmp_path)
    plan_path = write_hetero_plan(ws, "hgn-restart", rounds=6)
    folder = ws.root / "hgn-restart"
    _kill_then_restart(ws, plan_path, folder, "stage_closed/input:4")
    results = json.loads((folder / "coordinator" / "results.json").read_text())
    assert results["status"] == "completed" and results["rounds"][3]["attempts"] == 2
    threads = torch.get_num_threads()
    torch.set_num_threads(1)        # as each silo process trains
    try:
        simulated = run_simulation(load_plan(plan_path), hetero_graphs(), progress=False)
    finally:
        torch.set_num_threads(threads)
    assert results["early_stopping"]["best_round"] == simulated["early_stopping"]["best_round"]
    for silo in ws.silos:
        for name in ("val_acc", "test_acc"):
            real, sim = (r["final_metrics"][silo][name] for r in (results, simulated))
            assert real == pytest.approx(sim, abs=1e-9), (silo, name)


@pytest.mark.slow
def test_coordinator_killed_during_the_group_key_setup_runs_it_again(tmp_path: Path) -> None:
    """Killed once the leader has sealed the group secrets, before the peers opened them: the
    restarted coordinator starts a second setup run, every silo takes part in it (the first
    run's instructions are not mistaken for the new ones), and the federation completes."""
    ws = make_workspace(tmp_path, graphs=30)
    plan_path = write_plan(ws, "setup-restart", algorithm="gcfl", rounds=2)
    folder = ws.root / "setup-restart"
    _kill_then_restart(ws, plan_path, folder, "group_sealed")
    audit = [json.loads(line) for line in
             (folder / "coordinator" / "audit.jsonl").read_text().splitlines()]
    runs = [e["generation"] for e in audit if e.get("event") == "group_setup_started"]
    assert runs == [1, 2]
    assert len([e for e in audit if e.get("event") == "group_ready"]) == 1
    results = json.loads((folder / "coordinator" / "results.json").read_text())
    assert results["status"] == "completed" and results["rounds_completed"] == 2
    simulated = simulate_like_silo_processes(load_plan(plan_path))
    for silo in ws.silos:
        real = results["final_metrics"][silo]["test_acc"]
        assert real == pytest.approx(simulated["final_metrics"][silo]["test_acc"], abs=1e-9)
        setups = [e for e in (folder / silo / "audit.jsonl").read_text().splitlines()
                  if '"event":"sent_setup_key"' in e]
        assert len(setups) == 2, silo


@pytest.mark.slow
@pytest.mark.parametrize(("stop", "code", "said"), [
    (signal.SIGINT, 130, "interrupted;"),
    # docker stop, kubectl delete, systemctl stop: as Ctrl-C, not an instant death.
    (signal.SIGTERM, 143, "stopped (SIGTERM);")])
def test_ctrl_c_or_a_stop_request_on_the_coordinator_says_how_to_resume(
        tmp_path: Path, stop: signal.Signals, code: int, said: str) -> None:
    ws = make_workspace(tmp_path, graphs=20)
    plan_path = write_plan(ws, "interrupt", rounds=3)
    log = tmp_path / "coordinator.log"
    coordinator = start_coordinator(plan_path, log)
    try:
        # Only once it serves: a signal during its imports would test nothing of this.
        deadline = time.monotonic() + 120
        while "listening" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            assert coordinator.poll() is None, log.read_text()
            time.sleep(0.05)
        coordinator.send_signal(stop)
        try:
            assert coordinator.wait(timeout=30) == code
        except subprocess.TimeoutExpired:
            raise AssertionError("no exit 30 s after the signal:\n" + log.read_text()) from None
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
    assert said in log.read_text()
    assert f"Run `coordinator serve --plan {plan_path}` again to resume" in log.read_text()
    assert "Traceback" not in log.read_text()
    results = json.loads((ws.root / "interrupt" / "coordinator" / "results.json").read_text())
    assert results["status"] == "interrupted"


@pytest.mark.slow
def test_metrics_a_restarted_coordinator_lost_are_sent_again(tmp_path: Path) -> None:
    """Killed right after the first silo's report of round 1 reached it (before anything wrote
    it down): the silos send their round-1 metrics again in the new attempt, so the results
    have every silo's metrics for every round."""
    ws = make_workspace(tmp_path, graphs=30)
    plan_path = write_plan(ws, "metrics-restart", rounds=3)
    folder = ws.root / "metrics-restart"
    _kill_then_restart(ws, plan_path, folder, "metrics:1")
    results = json.loads((folder / "coordinator" / "results.json").read_text())
    assert results["status"] == "completed" and results["rounds"][1]["attempts"] == 2
    assert all(set(r["metrics"]) == set(SILOS) for r in results["rounds"])


def test_a_crash_between_state_files_and_checkpoint_leaves_the_older_checkpoint(
        tmp_path: Path) -> None:
    """The state files of round 2 are on disk, the checkpoint naming them is not: the restart
    uses round 1's files, which are still there, not the newer ones."""
    from trellis.coordinator.rounds.machine import RoundMachine, RoundRecord
    from trellis.coordinator.rounds.strategies import make_strategy
    from trellis.coordinator.state.checkpoint import load_checkpoint, save_checkpoint

    ws = make_workspace(tmp_path, graphs=20)
    plan = load_plan(write_plan(ws, "atomic", algorithm="fedavg", rounds=3))
    state_dir = plan.server.state_dir
    history = [RoundRecord(1, 1, plan.silos, 30, 0.0, 1.0)]
    after_one = np.full(4, 1.0, np.float32)
    save_checkpoint(state_dir, RoundMachine(plan, make_strategy("fedavg"), 0.0, start_round=2,
                                            global_state=after_one, history=history))
    checkpoint = (state_dir / "checkpoint.json").read_bytes()
    save_checkpoint(state_dir, RoundMachine(
        plan, make_strategy("fedavg"), 0.0, start_round=3, global_state=after_one + 1,
        history=history + [RoundRecord(2, 1, plan.silos, 30, 1.0, 2.0)]))
    # Undo the last step of that save, and its clean-up: as if the process died before them.
    (state_dir / "checkpoint.json").write_bytes(checkpoint)
    np.save(state_dir / "global_state-1.npy", after_one)
    assert (state_dir / "global_state-2.npy").exists()
    resume = load_checkpoint(state_dir, plan)
    assert resume is not None and resume.next_round == 2
    assert np.array_equal(resume.global_state, after_one)
