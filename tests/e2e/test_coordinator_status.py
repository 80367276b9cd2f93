"""`coordinator status` and results as they happen, on a real federation of processes.

One small FedStar federation (three silo processes, real mTLS on loopback) is watched from the
start through its state folder. Once round 1 is in, one silo is paused (SIGSTOP), which holds
the federation mid-run while the checks run: status.json and `coordinator status` (from the
folder and over the Admin service with an operator certificate) agree, an intruder shows as
refused, a silo's certificate is refused by the Admin service and an operator's by the
Federation service, and results.json already says "running" and `coordinator report` reads it.
Then the silo goes on and the finished federation is checked.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from tests.support.federation import (
    SILOS,
    Workspace,
    assert_refused,
    port_of,
    start_coordinator,
    start_silo,
    wait_all,
    write_plan,
)
from trellis.crypto.pki import issue_operator, load_identity
from trellis.protos import codec
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos.messages import PROTOCOL_VERSION, Envelope, Phase

pytestmark = pytest.mark.slow
PAUSED = SILOS[2]


def cli(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trellis.coordinator.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def stub_as(identity: Path, port: int) -> pb_grpc.FederationStub:
    ident = load_identity(identity)
    creds = grpc.ssl_channel_credentials(ident.ca_pem, ident.key_pem, ident.cert_pem)
    return pb_grpc.FederationStub(grpc.secure_channel(f"127.0.0.1:{port}", creds))


def attend(identity: Path, port: int, text: str) -> None:
    stub = stub_as(identity, port)
    request = codec.attend_request(Envelope("", 0, 0, Phase.JOIN), PROTOCOL_VERSION)
    assert_refused(stub.Attend, request, grpc.StatusCode.PERMISSION_DENIED, text)


class Watch:
    """What the test saw of a federation while it ran."""

    def __init__(self, ws: Workspace, plan: Path, folder: Path, operator: Path) -> None:
        self.ws, self.plan, self.folder, self.operator = ws, plan, folder, operator
        self.state = folder / "coordinator"
        self.port = port_of(plan)
        self.seen: list[tuple[int, str]] = []       # (round, stage) as status.json changed
        self.mid: dict = {}                          # results of the checks while paused
        self.logs: dict[str, str] = {}


def wait_for(watch: Watch, done, timeout: float = 150) -> dict:
    """Poll status.json, noting every (round, stage), until done(status)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = read_json(watch.state / "status.json")
        if status is not None:
            position = (status["round"], status["stage"])
            if not watch.seen or watch.seen[-1] != position:
                watch.seen.append(position)
            if done(status):
                return status
        time.sleep(0.05)
    raise AssertionError(f"status never got there; seen {watch.seen}")


@pytest.fixture(scope="module")
def watched(workspace_factory) -> Watch:
    ws = workspace_factory("status", graphs=30)
    plan = write_plan(ws, "watched", rounds=3)
    folder = ws.root / "watched"
    folder.mkdir()
    made = cli("pki", "operator", "--name", "ops-alice", "--ca", ws.ca, "--out",
               ws.root / "ops")
    assert made.returncode == 0, made.stderr
    watch = Watch(ws, plan, folder, ws.root / "ops")
    coordinator = start_coordinator(plan, folder / "coordinator.log")
    silos = {s: start_silo(ws, s, watch.port, folder / s, folder / f"{s}.log") for s in SILOS}
    try:
        wait_for(watch, lambda s: len(s["connected"]) == 3 or s["rounds_completed"] >= 1)
        attend(ws.identity("intruder"), watch.port, "is not admitted")
        # Round 1 done and every silo's metrics for it in (they come early in round 2).
        wait_for(watch, lambda s: s["metrics_round"] >= 1 and s["reported"] == 3)
        os.kill(silos[PAUSED].pid, signal.SIGSTOP)      # holds the federation mid-run
        try:
            _checks_while_paused(watch)
        finally:
            os.kill(silos[PAUSED].pid, signal.SIGCONT)
        codes = wait_all([*silos.values(), coordinator], timeout=240)
    finally:
        for p in (*silos.values(), coordinator):
            if p.poll() is None:
                p.kill()
        watch.logs = {p.name: p.read_text() for p in folder.glob("*.log")}
    assert codes == [0, 0, 0, 0], watch.logs
    return watch


def _checks_while_paused(watch: Watch) -> None:
    """Run every mid-run command while one silo is stopped; keep what they said."""
    mid = watch.mid
    mid["results"] = read_json(watch.state / "results.json")
    mid["report"] = cli("report", "--results", watch.state / "results.json", "--out",
                        watch.folder / "report-mid", timeout=120)
    # Both views settle once the federation waits for the paused silo.
    deadline = time.monotonic() + 30
    while True:
        local = cli("status", "--state-dir", watch.state, "--json")
        remote = cli("status", "--coordinator", f"127.0.0.1:{watch.port}", "--identity",
                     watch.operator, "--json")
        mid["local"], mid["remote"] = local, remote
        if local.returncode or remote.returncode or time.monotonic() > deadline:
            break
        fields = ("round", "stage", "connected", "refused", "rounds_completed", "run_id")
        a, b = json.loads(local.stdout), json.loads(remote.stdout)
        if all(a[f] == b[f] for f in fields):
            break
        time.sleep(0.3)
    mid["human"] = cli("status", "--state-dir", watch.state)
    mid["silo_cert"] = cli("status", "--coordinator", f"127.0.0.1:{watch.port}", "--identity",
                           watch.ws.identity(SILOS[0]))
    # An operator certificate named like an admitted silo gets nothing of the federation.
    twin = issue_operator(watch.ws.ca, SILOS[0], watch.ws.root / "twin-ops").parent
    attend(twin, watch.port, "operator's certificate")
    attend(watch.operator, watch.port, "operator's certificate")


def test_status_advances_and_lists_connected_and_refused_silos(watched: Watch) -> None:
    rounds = [r for r, _ in watched.seen]
    assert rounds == sorted(rounds) and {1, 2} <= set(rounds), watched.seen
    # Stages quicker than the file's throttle (0.5 s) may go unseen; a waiting one never.
    assert len(set(watched.seen)) >= 3 and watched.seen[0] == (1, "waiting"), watched.seen
    local = watched.mid["local"]
    assert local.returncode == 0, local.stderr
    status = json.loads(local.stdout)
    assert status["state"] == "running" and status["rounds"] == 3
    assert status["rounds_completed"] >= 1 and status["round"] >= 2
    assert status["connected"] == sorted(SILOS)
    assert {"subject": "intruder", "reason": "not admitted by the plan"} in status["refused"]
    # The paused silo may not have reported for the latest round: the mean is over those that did.
    assert status["metrics_round"] >= 1 and 1 <= status["reported"] <= 3
    assert {"val_acc", "test_acc"} <= set(status["metrics"])
    assert status["eta_s"] is not None and status["eta_s"] > 0
    human = watched.mid["human"].stdout
    assert re.search(r"^state +running \(pid \d+\)$", human, re.M), human
    assert re.search(rf"^connected +3: {', '.join(sorted(SILOS))}$", human, re.M), human
    assert re.search(r"^refused +intruder \(not admitted by the plan\)$", human, re.M), human
    assert re.search(r"^time left +about .* \(\d rounds at .* each\)$", human, re.M), human


def test_admin_status_with_an_operator_certificate_matches_the_state_folder(watched: Watch
                                                                            ) -> None:
    remote = watched.mid["remote"]
    assert remote.returncode == 0, remote.stderr
    a, b = json.loads(watched.mid["local"].stdout), json.loads(remote.stdout)
    for field in ("federation", "algorithm", "run_id", "round", "rounds", "stage",
                  "rounds_completed", "connected", "refused", "pid", "state"):
        assert a[field] == b[field], field


def test_a_silo_certificate_is_refused_by_the_admin_service(watched: Watch) -> None:
    done = watched.mid["silo_cert"]
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the coordinator refused "), lines
    assert "is not an operator's" in lines[0] and "coordinator pki operator" in lines[0]


def test_operator_certificates_get_nothing_of_the_federation(watched: Watch) -> None:
    # attend() asserted PERMISSION_DENIED; the coordinator's audit log names the refusals.
    records = [json.loads(line) for line in
               (watched.state / "audit.jsonl").read_text().splitlines()]
    refused = {(r["subject"], r["reason"]) for r in records if r["event"] == "refused"}
    assert (SILOS[0], "an operator's certificate, not a silo's") in refused
    assert ("ops-alice", "an operator's certificate, not a silo's") in refused
    assert (SILOS[0], "not an operator's certificate") in refused      # the Admin refusal
    # The twin never took hospital-a's place: all three silos finished.
    assert watched.logs, "the federation ran"


def test_results_are_written_as_rounds_complete_and_report_reads_them(watched: Watch) -> None:
    results = watched.mid["results"]
    assert results is not None and results["status"] == "running"
    assert results["rounds_completed"] >= 1 and results["rounds_planned"] == 3
    report = watched.mid["report"]
    assert report.returncode == 0, report.stderr
    table = (watched.folder / "report-mid" / "README.md").read_text()
    # One run: a run report (no paper columns), its status and the per-silo figures so far.
    assert table.startswith("# Run report: federation watched") and "fedstar, from" in table
    assert "status running" in table and "| mean over silos |" in table


def test_status_after_the_end_says_finished_with_elapsed_and_last_metrics(watched: Watch
                                                                          ) -> None:
    done = cli("status", "--state-dir", watched.state, "--json")
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["state"] == "finished" and status["rounds_completed"] == 3
    assert status["metrics_round"] == 3 and status["reported"] == 3
    assert 0 < status["elapsed_s"] and status["eta_s"] == 0.0
    human = cli("status", "--state-dir", watched.state).stdout
    assert re.search(r"^state +finished$", human, re.M), human
    assert re.search(r"^metrics +round 3, mean over 3 reporting silos: test_acc ", human, re.M)
    assert json.loads((watched.state / "results.json").read_text())["status"] == "completed"


def test_status_refuses_bad_options_with_one_line(tmp_path: Path) -> None:
    for args, text in ((("status",), "give --state-dir DIR"),
                       (("status", "--state-dir", tmp_path), "no status.json in"),
                       (("status", "--coordinator", "localhost", "--identity", tmp_path),
                        "expected host:port"),
                       (("status", "--coordinator", "localhost:1"), "needs --identity")):
        done = cli(*args)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], lines
