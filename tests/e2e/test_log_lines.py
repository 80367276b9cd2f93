"""Logs people and log shippers can use: timestamps, the round's own metrics, refusals with
their reason, expected events not worded as errors, and one JSON object per line on request."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from tests.support.federation import SILOS, port_of, start_silo, wait_all, write_plan

ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


@pytest.fixture(scope="module")
def run(workspace_factory) -> dict:
    ws = workspace_factory("logs", graphs=30)
    plan = write_plan(ws, "logs", rounds=2)
    folder = ws.root / "logs-run"
    folder.mkdir()
    coordinator_log = folder / "coordinator.log"
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "trellis.coordinator.cli", "serve", "--plan", str(plan),
         "--log-format", "json"], stdout=subprocess.DEVNULL, stderr=open(coordinator_log, "w"))
    deadline = time.monotonic() + 60
    while "listening on port" not in coordinator_log.read_text():
        assert time.monotonic() < deadline and coordinator.poll() is None
        time.sleep(0.1)
    intruder = subprocess.run(
        [sys.executable, "-m", "trellis.silo.cli", "join", "--coordinator",
         f"127.0.0.1:{port_of(plan)}", "--data", str(ws.data("hospital-a")), "--identity",
         str(ws.identity("intruder")), "--state-dir", str(folder / "intruder"), "--threads", "1",
         "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert intruder.returncode == 2, intruder.stderr
    silos = [start_silo(ws, s, port_of(plan), folder / s, folder / f"{s}.log",
                        extra=["--log-format", "json"] if s == "pharma-b" else [])
             for s in SILOS]
    assert wait_all([*silos, coordinator], timeout=240) == [0, 0, 0, 0]
    return {"folder": folder, "coordinator": coordinator_log.read_text(),
            "results": json.loads((ws.root / "logs" / "coordinator" / "results.json")
                                  .read_text())}


def test_json_lines_each_parse_with_a_timestamp_level_and_source(run: dict) -> None:
    lines = [json.loads(line) for line in run["coordinator"].splitlines()]
    assert lines and all(re.fullmatch(ISO, r["ts"]) and r["source"] == "coordinator"
                         and r["level"] in ("info", "warning") for r in lines)
    silo = [json.loads(line) for line in (run["folder"] / "pharma-b.log").read_text()
            .splitlines()]
    assert silo and all(r["source"] == "pharma-b" and re.fullmatch(ISO, r["ts"]) for r in silo)


def test_each_round_logs_its_own_metrics_with_the_values_of_the_results(run: dict) -> None:
    lines = [json.loads(line) for line in run["coordinator"].splitlines()]
    shown = {r["round"]: r for r in lines if r.get("event") == "round_metrics"}
    assert sorted(shown) == [1, 2]
    for record in run["results"]["rounds"]:
        accs = [m["test_acc"] for m in record["metrics"].values()]
        assert shown[record["round"]]["mean_test_acc"] == pytest.approx(sum(accs) / len(accs))
    # Round 2's metrics come after round 2 is done, not with round 3 (there is none).
    order = [r.get("event") for r in lines]
    assert order.index("round_metrics", order.index("round_completed")) > order.index(
        "round_completed")


def test_a_refused_silo_is_logged_with_its_reason_as_a_warning(run: dict) -> None:
    lines = [json.loads(line) for line in run["coordinator"].splitlines()]
    refused = [r for r in lines if r.get("event") == "refused"]
    assert refused and refused[0]["level"] == "warning"
    assert refused[0]["subject"] == "intruder" and "not admitted" in refused[0]["reason"]


def test_text_lines_start_with_a_timestamp_and_the_silo(run: dict) -> None:
    text = (run["folder"] / "hospital-a.log").read_text().splitlines()
    assert text and all(re.match(rf"{ISO} (INFO|WARNING|ERROR)\s+hospital-a: ", line)
                        for line in text), text[:3]
    assert not any("error" in line.lower() for line in text)
