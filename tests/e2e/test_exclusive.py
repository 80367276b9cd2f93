"""One coordinator per port and per state directory (issue: "nothing silent, nothing lost"), and
what a killed one leaves for the next command that reads its folder.

Real processes: a second `coordinator serve` on the same state directory, or on a port that is
already taken, is refused at start with one line and exit code 2, instead of sharing the port
(gRPC's default SO_REUSEPORT) and splitting the silos between two coordinators. Once the holder
is killed (kill -9), `coordinator status` says it stopped and how to resume, and the state
directory is free again for the next coordinator.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.federation import port_of, start_coordinator, write_plan

pytestmark = pytest.mark.slow


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trellis.coordinator.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def _wait_listening(log: Path, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "listening on port" in log.read_text():
            return
        if process.poll() is not None:
            raise AssertionError(f"the coordinator exited: {log.read_text()}")
        time.sleep(0.1)
    raise AssertionError("the coordinator never listened")


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# One coordinator serves every check below in turn, then is killed and replaced: each check
# once had a coordinator process of its own (three here, and one in test_coordinator_status.py
# that was killed the same way), for the same start and the same kill.
def test_one_coordinator_per_state_dir_and_port_until_it_is_killed(workspace_factory) -> None:
    ws = workspace_factory("exclusive", graphs=20)
    plan = write_plan(ws, "exclusive", rounds=1)
    state = ws.root / "exclusive" / "coordinator"
    log = ws.root / "first.log"
    first = start_coordinator(plan, log)
    try:
        _wait_listening(log, first)
        deadline = time.monotonic() + 60          # status.json is written off the serving path
        while not (state / "status.json").exists():
            assert first.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        running = json.loads(_cli("status", "--state-dir", state, "--json").stdout)
        assert running["state"] == "running" and running["stage"] == "waiting"

        # A second coordinator on the same state directory: refused, naming the holder.
        line = _one_error_line(_cli("serve", "--plan", plan, "--quiet"))
        assert f"another coordinator (pid {first.pid}) is serving" in line
        assert first.poll() is None                 # the first one is untouched

        # Another state directory on the same port: refused, naming the port.
        other = write_plan(ws, "exclusive-other-dir", rounds=1, port=port_of(plan))
        line = _one_error_line(_cli("serve", "--plan", other, "--quiet"))
        assert f"port {port_of(plan)} is already in use" in line, line
        assert first.poll() is None
    finally:
        first.kill()                                # even a kill -9 leaves no stale lock
        first.wait(timeout=30)

    done = _cli("status", "--state-dir", state)
    assert done.returncode == 0, done.stderr
    assert re.search(rf"^state +stopped \(not running; `coordinator serve --plan "
                     rf"{re.escape(str(plan))}` resumes\)$", done.stdout, re.M), done.stdout

    again_log = ws.root / "again.log"
    again = start_coordinator(plan, again_log)
    try:
        _wait_listening(again_log, again)
    finally:
        again.kill()
        again.wait(timeout=30)
