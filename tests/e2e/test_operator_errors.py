"""Every mistake an operator makes with certificates and addresses, run as a real process.

One table: the mistake, the command's exit code (2 for a mistake of configuration, 1 for a
runtime failure) and the one line it must print, naming what is wrong and what to do. The silos
dial a real coordinator over loopback mTLS; the certificates come from real CAs.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import certs
from tests.support.federation import Workspace, free_port, write_plan


def _plan(ws: Workspace, name: str, ca: Path | None = None) -> Path:
    path = write_plan(ws, name, rounds=50)
    text = path.read_text().replace("join_s = 120", "join_s = 3600")
    if ca is not None:
        text = text.replace(str(ws.ca), str(ca))
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def serving(workspace_factory, tmp_path_factory):
    """A coordinator waiting for its silos, listening on every loopback address."""
    ws = workspace_factory("operator-errors", graphs=20)
    plan = _plan(ws, "mistakes")
    port = int(re.search(r":(\d+)\"", plan.read_text()).group(1))
    log = tmp_path_factory.mktemp("coordinator") / "coordinator.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "trellis.coordinator.cli", "serve", "--plan", str(plan),
         "--listen", f"0.0.0.0:{port}"], stdout=open(log, "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while "listening on port" not in log.read_text():
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the coordinator never listened"
        time.sleep(0.1)
    try:
        yield ws, port, log
    finally:
        process.kill()
        process.wait(timeout=30)


def _join(ws: Workspace, identity: Path, target: str, state: Path, silo: str = "hospital-a"
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trellis.silo.cli", "join", "--coordinator", target,
         "--data", str(ws.data(silo)), "--identity", str(identity), "--state-dir", str(state),
         "--threads", "1", "--device", "cpu", "--connect-timeout", "3"],
        capture_output=True, text=True, timeout=120)


Setup = Callable[[Workspace, int, Path], tuple[Path, str]]


def _local(ws: Workspace, port: int, tmp: Path) -> str:
    return f"127.0.0.1:{port}"


SILO_MISTAKES: list[tuple[str, Setup, int, str]] = [
    ("expired certificate",
     lambda ws, port, tmp: (certs.expired_identity(ws.ca, "hospital-a", tmp / "id"),
                            _local(ws, port, tmp)),
     2, r"certificate .*hospital-a\.crt expired on \d{4}-\d\d-\d\d .*valid from .* to .*renew"),
    ("certificate not yet valid",
     lambda ws, port, tmp: (certs.future_identity(ws.ca, "hospital-a", tmp / "id"),
                            _local(ws, port, tmp)),
     2, r"is not valid until \d{4}-\d\d-\d\d .*clock"),
    ("certificate from another CA (same CA name) with this federation's ca.crt",
     lambda ws, port, tmp: (certs.with_certificate_from(
         ws.identity("hospital-a"), certs.foreign_identity(tmp, "hospital-a"), "hospital-a",
         tmp / "id"), _local(ws, port, tmp)),
     2, r"names this federation's CA 'trellis federation CA' as issuer but its signature does "
        r"not verify.*same federation"),
    ("whole identity from another federation",
     lambda ws, port, tmp: (certs.foreign_identity(tmp, "hospital-a", federation="other"),
                            _local(ws, port, tmp)),
     2, r"the coordinator's certificate was issued by 'trellis federation CA', not by this "
        r"federation's CA 'other federation CA'.*ca\.crt"),
    ("host name not in the server's certificate",
     lambda ws, port, tmp: (ws.identity("hospital-a"), f"127.0.0.2:{port}"),
     2, r"the coordinator's certificate names localhost, 127\.0\.0\.1, not '127\.0\.0\.2'"),
    ("address without a port",
     lambda ws, port, tmp: (ws.identity("hospital-a"), "127.0.0.1"),
     2, r"expected host:port.*443"),
    ("nothing listening",
     lambda ws, port, tmp: (ws.identity("hospital-a"), f"127.0.0.1:{free_port()}"),
     1, r"never reached the coordinator at 127\.0\.0\.1:\d+ within 3 s: nothing is listening"),
    ("silo name not admitted by the plan",
     lambda ws, port, tmp: (ws.identity("intruder"), _local(ws, port, tmp)),
     2, r"'intruder' is not admitted by this federation's plan; ask the coordinator operator"),
    ("key that does not match the certificate",
     lambda ws, port, tmp: (certs.with_wrong_key(ws.identity("hospital-a"), "hospital-a",
                                                 tmp / "id"), _local(ws, port, tmp)),
     2, r"private key .* does not match certificate .*issued for another key"),
]


@pytest.mark.parametrize(("mistake", "setup", "code", "message"), SILO_MISTAKES,
                         ids=[m[0] for m in SILO_MISTAKES])
def test_a_silo_mistake_gets_its_own_line_and_exit_code(serving, tmp_path, mistake, setup,
                                                        code, message) -> None:
    ws, port, _ = serving
    identity, target = setup(ws, port, tmp_path)
    done = _join(ws, identity, target, tmp_path / "state")
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == code, done.stderr
    assert len(errors) == 1 and re.search(message, errors[0]), done.stderr
    assert "Traceback" not in done.stderr


def test_a_revoked_silo_is_refused_naming_the_revocation(serving, tmp_path) -> None:
    ws, port, log = serving
    revoke = subprocess.run([sys.executable, "-m", "trellis.coordinator.cli", "pki", "revoke",
                             "social-c", "--ca", str(ws.ca)], capture_output=True, text=True)
    assert revoke.returncode == 0, revoke.stderr
    deadline = time.monotonic() + 30
    while "revocation list" not in log.read_text():     # picked up without a restart
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    done = _join(ws, ws.identity("social-c"), f"127.0.0.1:{port}", tmp_path / "state",
                 silo="social-c")
    assert done.returncode == 2, done.stderr
    assert re.search(r"error: the coordinator refused this silo: the certificate of 'social-c' "
                     r"\(serial [0-9a-f]+\) was revoked on .*`silo pki renew`", done.stderr)


COORDINATOR_MISTAKES: list[tuple[str, Callable[[Path, Path], Path], str]] = [
    ("server key that does not match its certificate", certs.ca_with_wrong_server_key,
     r"server identity: private key .*server\.key does not match certificate .*server\.crt"),
    ("expired server certificate", certs.ca_with_expired_server,
     r"server identity: certificate .*server\.crt expired on \d{4}-\d\d-\d\d"),
]


@pytest.mark.parametrize(("mistake", "broken_ca", "message"), COORDINATOR_MISTAKES,
                         ids=[m[0] for m in COORDINATOR_MISTAKES])
def test_a_coordinator_mistake_gets_its_own_line_and_exit_code(workspace_factory, mistake,
                                                               broken_ca, message) -> None:
    ws = workspace_factory("coordinator-mistakes", graphs=20)
    plan = _plan(ws, "broken", ca=broken_ca(ws.ca, ws.root / "broken-ca"))
    done = subprocess.run([sys.executable, "-m", "trellis.coordinator.cli", "serve", "--plan",
                           str(plan), "--quiet"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), done.stderr
