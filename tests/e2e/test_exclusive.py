"""One coordinator per port and per state directory (issue: "nothing silent, nothing lost").

Real processes: a second `coordinator serve` on the same state directory, or on a port that is
already taken, is refused at start with one line and exit code 2, instead of sharing the port
(gRPC's default SO_REUSEPORT) and splitting the silos between two coordinators.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.federation import port_of, start_coordinator, write_plan


def _serve(plan: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trellis.coordinator.cli", "serve", "--plan",
                           str(plan), "--quiet"], capture_output=True, text=True, timeout=120)


def _wait_listening(log: Path, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "listening on port" in log.read_text():
            return
        if process.poll() is not None:
            raise AssertionError(f"the first coordinator exited: {log.read_text()}")
        time.sleep(0.1)
    raise AssertionError("the first coordinator never listened")


@pytest.fixture()
def serving(workspace_factory, tmp_path):
    ws = workspace_factory("exclusive", graphs=20)
    plan = write_plan(ws, f"exclusive-{tmp_path.name}", rounds=1)
    log = tmp_path / "first.log"
    first = start_coordinator(plan, log)
    try:
        _wait_listening(log, first)
        yield ws, plan, first
    finally:
        first.kill()
        first.wait(timeout=30)


def test_a_second_coordinator_on_the_same_state_dir_is_refused_naming_the_holder(serving
                                                                                  ) -> None:
    _, plan, first = serving
    done = _serve(plan)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"another coordinator (pid {first.pid}) is serving" in lines[0]
    assert first.poll() is None                 # the first one is untouched


def test_a_coordinator_on_a_taken_port_is_refused_naming_the_port(serving) -> None:
    ws, plan, first = serving
    other = write_plan(ws, "exclusive-other-dir", rounds=1, port=port_of(plan))
    done = _serve(other)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert f"port {port_of(plan)} is already in use" in lines[0], lines
    assert first.poll() is None


def test_the_state_dir_is_free_again_once_the_holder_is_gone(serving) -> None:
    _, plan, first = serving
    first.kill()                               # even a kill -9 leaves no stale lock
    first.wait(timeout=30)
    log = plan.parent / "again.log"
    again = start_coordinator(plan, log)
    try:
        _wait_listening(log, again)
    finally:
        again.kill()
        again.wait(timeout=30)
