"""A silo's policy with real processes: a real coordinator and three silos over loopback mTLS.

Two silos join; the third joins with a policy the plan breaks (too many rounds): it names the
clause and the plan's value, records `refused_plan`, sends nothing and exits 2, and the
coordinator, seeing its stream close, runs the federation with the other two. The silo whose
policy the plan satisfies takes part and records the plan's hash (and its policy's) on joining.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from subprocess import Popen

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
from trellis.protos.plan import load_plan

pytestmark = pytest.mark.slow

ACCEPTING, PLAIN, REFUSING = SILOS
STRICT = '[accept]\nalgorithms = ["fedstar"]\nmax_rounds = 1\n'
LENIENT = """[accept]
algorithms = ["fedstar", "feddense"]
max_rounds = 50
shared_tensors = ["embedding_s", "graph_convs_s_gcn"]
min_aggregate_silos = 2
ring_bits = [32, 64]
reveal_update_norms = false
"""


def _verified(ws: Workspace, silo: str, path: Path) -> bool:
    report = verify_audit_log(path, cert_pem=(ws.identity(silo) / f"{silo}.crt").read_bytes())
    return report.ok and report.closed


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _wait_joined(log: Path, process: Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "joined federation" in log.read_text():
            return
        if process.poll() is not None:
            raise AssertionError(f"{log.name} exited: {log.read_text()}")
        time.sleep(0.2)
    raise AssertionError(f"{log.name} never joined")


@pytest.fixture(scope="module")
def run(workspace_factory) -> dict:
    ws: Workspace = workspace_factory("policy", graphs=40)
    folder = ws.root / "run"
    folder.mkdir()
    plan = write_plan(ws, "policy", rounds=2, min_silos=2)
    strict, lenient = folder / "strict.toml", folder / "lenient.toml"
    strict.write_text(STRICT)
    lenient.write_text(LENIENT)
    port = port_of(plan)
    coordinator = start_coordinator(plan, folder / "coordinator.log")
    accepting = start_silo(ws, ACCEPTING, port, folder / ACCEPTING, folder / f"{ACCEPTING}.log",
                           extra=["--policy", str(lenient)])
    plain = start_silo(ws, PLAIN, port, folder / PLAIN, folder / f"{PLAIN}.log")
    procs = [accepting, plain, coordinator]
    try:
        _wait_joined(folder / f"{ACCEPTING}.log", accepting)
        _wait_joined(folder / f"{PLAIN}.log", plain)
    except AssertionError:
        wait_all(procs, timeout=0.1)
        raise
    # The third silo completes the roster: the coordinator opens round 1 as it joins, so its
    # refusal is seen mid-round, as a silo that closed its stream before advertising keys.
    refusing = start_silo(ws, REFUSING, port, folder / REFUSING, folder / f"{REFUSING}.log",
                          extra=["--policy", str(strict)])
    codes = wait_all([refusing, *procs], timeout=240)
    logs = {p.name: p.read_text() for p in folder.glob("*.log")}
    return {"ws": ws, "folder": folder, "plan": load_plan(plan), "codes": codes, "logs": logs,
            "strict": strict, "lenient": lenient}


def test_the_refusing_silo_names_the_clause_and_the_plan_value_and_exits_2(run: dict) -> None:
    assert run["codes"][0] == 2, run["logs"]
    log = run["logs"][f"{REFUSING}.log"].strip().splitlines()
    assert any(line.endswith(f" {REFUSING}: policy: accept.max_rounds allows at most 1; the "
                             "plan asks 2 rounds") for line in log), log
    assert not any("accept.algorithms" in line for line in log)       # fedstar is allowed
    assert log[-1] == (f"error: refused the plan of federation policy: it breaks 1 clause of "
                       f"{run['strict']} (listed above); nothing was sent. Ask the coordinator "
                       "operator to change the plan, or change the policy")
    assert "Traceback" not in run["logs"][f"{REFUSING}.log"]


def test_the_refusal_is_audited_and_nothing_left_the_silo(run: dict) -> None:
    path = run["folder"] / REFUSING / "audit.jsonl"
    assert _verified(run["ws"], REFUSING, path)
    records = _records(path)
    events = [r["event"] for r in records]
    assert "refused_plan" in events and "joined" not in events
    assert not [e for e in events if e.startswith("sent_") or e in ("signed_survivors",
                                                                    "revealed_shares")]
    [refused] = [r for r in records if r["event"] == "refused_plan"]
    assert refused["plan_sha256"] == run["plan"].public.sha256()
    assert refused["policy_sha256"] == hashlib.sha256(run["strict"].read_bytes()).hexdigest()
    assert refused["violations"] == [{"clause": "accept.max_rounds", "allows": "at most 1",
                                      "plan": "2 rounds"}]
    assert not (run["folder"] / REFUSING / "final_model.pt").exists()


def test_the_coordinator_saw_it_leave_and_ran_the_federation_without_it(run: dict) -> None:
    assert run["codes"][1:] == [0, 0, 0], run["logs"]
    state = run["ws"].root / "policy" / "coordinator"
    results = json.loads((state / "results.json").read_text())
    assert results["status"] == "completed" and results["rounds_completed"] == 2
    assert set(results["final_metrics"]) == {ACCEPTING, PLAIN}
    audit = _records(state / "audit.jsonl")
    about = [r["event"] for r in audit if r.get("silo") == REFUSING]
    assert "disconnected" in about, about


def test_the_joined_record_carries_the_plan_hash_and_the_policy_hash(run: dict) -> None:
    digest = run["plan"].public.sha256()
    lenient = hashlib.sha256(run["lenient"].read_bytes()).hexdigest()
    for silo, policy in ((ACCEPTING, lenient), (PLAIN, None)):
        path = run["folder"] / silo / "audit.jsonl"
        assert _verified(run["ws"], silo, path)
        [joined] = [r for r in _records(path) if r["event"] == "joined"]
        assert joined["plan_sha256"] == digest
        assert joined.get("policy_sha256") == policy
    # The coordinator names the same plan, so a reviewer can match the two sides.
    coordinator = run["ws"].root / "policy" / "coordinator" / "audit.jsonl"
    assert [r["plan_sha256"] for r in _records(coordinator) if r["event"] == "serve"] == [digest]
