"""Bad --metrics-listen / --health-listen values and taken ports, as real processes.

Each is refused with one `error:` line naming the option and what to do, and exit code 2,
before the coordinator serves or the silo dials.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.federation import Workspace, write_plan


@pytest.fixture(scope="module")
def ws(workspace_factory) -> Workspace:
    return workspace_factory("endpoint-options", graphs=20)


@pytest.fixture(scope="module")
def taken() -> Iterator[int]:
    """A loopback port another process listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def _serve(ws: Workspace, *options: str) -> subprocess.CompletedProcess[str]:
    plan = write_plan(ws, "endpoints")
    return subprocess.run([sys.executable, "-m", "trellis.coordinator.cli", "serve", "--plan",
                           str(plan), "--quiet", *options],
                          capture_output=True, text=True, timeout=60)


def _join(ws: Workspace, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trellis.silo.cli", "join", "--coordinator", "127.0.0.1:1",
         "--data", str(ws.data("hospital-a")), "--identity", str(ws.identity("hospital-a")),
         "--state-dir", str(ws.root / "silo"), "--threads", "1", "--connect-timeout", "1",
         *options], capture_output=True, text=True, timeout=120)


def _refused(done: subprocess.CompletedProcess[str], *parts: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for part in parts:
        assert part in lines[0], lines[0]


@pytest.mark.parametrize("option", ["--metrics-listen", "--health-listen"])
def test_coordinator_refuses_an_address_without_a_port(ws, option: str) -> None:
    _refused(_serve(ws, option, "localhost"), f"{option} 'localhost': expected host:port")


@pytest.mark.parametrize("option", ["--metrics-listen", "--health-listen"])
def test_coordinator_refuses_a_taken_port(ws, taken: int, option: str) -> None:
    _refused(_serve(ws, option, f"127.0.0.1:{taken}"), f"{option} 127.0.0.1:{taken}",
             "cannot listen there", "choose another")


def test_silo_refuses_a_bad_address_and_a_taken_port(ws, taken: int) -> None:
    _refused(_join(ws, "--metrics-listen", "9464"), "--metrics-listen '9464': expected host:port")
    _refused(_join(ws, "--metrics-listen", f"127.0.0.1:{taken}"),
             f"--metrics-listen 127.0.0.1:{taken}", "cannot listen there")
