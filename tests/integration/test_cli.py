"""The command lines as a user meets them: one readable line and a documented exit code."""

from __future__ import annotations

import gzip
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.federation import free_port, write_plan


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


@pytest.fixture(scope="module")
def ws(workspace_factory):
    return workspace_factory("cli", graphs=20)


def test_broken_plan_lists_every_bad_field_and_exits_2(tmp_path: Path) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text('[federation]\nid = "x"\nalgorithm = "fedsgd"\nrounds = 0\nsilos = []\n')
    result = _run("trellis.coordinator.cli", "serve", "--plan", str(plan))
    assert result.returncode == 2
    assert "federation.algorithm: 'fedsgd' is not an algorithm" in result.stderr
    assert "federation.rounds: must be >= 1, got 0" in result.stderr
    assert "federation.silos: must be a non-empty list" in result.stderr
    assert "Traceback" not in result.stderr


def test_malformed_data_folder_names_file_and_line(ws, tmp_path: Path) -> None:
    bad = tmp_path / "graphs"
    bad.mkdir()
    (bad / "BAD_graph_indicator.txt").write_text("1\n1\n")
    (bad / "BAD_graph_labels.txt").write_text("1\n")
    with gzip.open(bad / "BAD_A.txt.gz", "wt") as handle:
        handle.write("1, 2\n2, x\n")
    result = _run("trellis.silo.cli", "join", "--coordinator", "127.0.0.1:1", "--data", str(bad),
                  "--identity", str(ws.identity("hospital-a")), "--device", "cpu")
    assert result.returncode == 2, result.stderr
    assert "BAD_A.txt.gz line 2" in result.stderr and "Traceback" not in result.stderr


def test_a_dataset_too_small_to_split_is_refused_at_join_with_its_counts(ws, tmp_path: Path
                                                                        ) -> None:
    """Before, 4 graphs left the test split empty and the silo joined; its undefined accuracy
    surfaced mid-federation. Now it is refused before anything is sent (the coordinator
    address dials nothing)."""
    from trellis.silo.data.synthetic import write_tu_folder

    tiny = tmp_path / "tiny"
    write_tu_folder(tiny, "TINY", "molecules", 4, seed=1)
    result = _run("trellis.silo.cli", "join", "--coordinator", "127.0.0.1:1", "--data",
                  str(tiny), "--identity", str(ws.identity("hospital-a")), "--device", "cpu")
    assert result.returncode == 2, result.stderr
    line = [x for x in result.stderr.splitlines() if x.startswith("error:")][0]
    assert "4 graphs (class 0:" in line and "split would be empty" in line
    assert "at least 6 graphs" in line and "Traceback" not in result.stderr


def _catches_sigterm(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


@pytest.mark.parametrize(("stop", "code", "said"), [
    (signal.SIGINT, 130, "interrupted before joining the federation; nothing was sent"),
    (signal.SIGTERM, 143, "stopped (SIGTERM) before joining the federation; nothing was sent")])
def test_a_stop_before_joining_says_so_with_its_exit_code(ws, stop: signal.Signals, code: int,
                                                          said: str) -> None:
    """Before, a stop while torch loaded or the data was read ended the command silently with
    130, SIGTERM too. The signal goes as soon as the silo handles SIGTERM, which it does
    before importing torch and reading its data: seconds before it could dial."""
    process = subprocess.Popen(
        [sys.executable, "-m", "trellis.silo.cli", "join", "--coordinator", "127.0.0.1:1",
         "--data", str(ws.data("hospital-a")), "--identity", str(ws.identity("hospital-a")),
         "--device", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not _catches_sigterm(process.pid):
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        process.send_signal(stop)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == code, out + err
    assert err.strip().splitlines()[-1] == said, err
    assert "Traceback" not in err


def test_an_address_without_a_port_is_refused_before_dialling(ws) -> None:
    result = _run("trellis.silo.cli", "join", "--coordinator", "127.0.0.1", "--data",
                  str(ws.data("hospital-a")), "--identity", str(ws.identity("hospital-a")))
    assert result.returncode == 2
    assert "expected host:port" in result.stderr and "443" in result.stderr


def test_a_coordinator_never_reached_is_said_so_not_lost(ws, tmp_path: Path) -> None:
    port = free_port()          # booked for this test, and nothing listens on it
    result = _run("trellis.silo.cli", "join", "--coordinator", f"127.0.0.1:{port}", "--data",
                  str(ws.data("hospital-a")), "--identity", str(ws.identity("hospital-a")),
                  "--device", "cpu", "--connect-timeout", "2", "--state-dir",
                  str(tmp_path / "state"))
    assert result.returncode == 1, result.stderr
    assert f"never reached the coordinator at 127.0.0.1:{port} within 2 s" in result.stderr
    assert "lost" not in result.stderr and "Traceback" not in result.stderr


def test_a_broken_policy_is_refused_before_dialling_naming_file_and_clause(ws, tmp_path: Path
                                                                          ) -> None:
    port = free_port()          # booked for this test, and nothing listens on it
    policy = tmp_path / "policy.toml"
    policy.write_text('[accept]\nmax_rounds = "ten"\nreveal_metrics = false\n')
    result = _run("trellis.silo.cli", "join", "--coordinator", f"127.0.0.1:{port}", "--data",
                  str(ws.data("hospital-a")), "--identity", str(ws.identity("hospital-a")),
                  "--device", "cpu", "--state-dir", str(tmp_path / "state"), "--policy",
                  str(policy))
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {policy}: ")
    assert "accept.max_rounds: must be an integer, got 'ten'" in line
    assert "accept.reveal_metrics: not a clause; the plan does not choose what a silo " \
           "reports; this silo's --report option does" in line
    assert not (tmp_path / "state").exists()        # refused before the silo did anything


def test_missing_identity_explains_what_to_do(ws, tmp_path: Path) -> None:
    result = _run("trellis.silo.cli", "join", "--coordinator", "127.0.0.1:1", "--data",
                  str(ws.data("hospital-a")), "--identity", str(tmp_path / "nothing"))
    assert result.returncode == 2 and "error:" in result.stderr
    assert "Traceback" not in result.stderr


def test_pki_init_refuses_to_overwrite_and_sign_round_trip(tmp_path: Path) -> None:
    assert _run("trellis.coordinator.cli", "pki", "init", "--dir", str(tmp_path / "ca"), "--host",
                "localhost").returncode == 0
    again = _run("trellis.coordinator.cli", "pki", "init", "--dir", str(tmp_path / "ca"), "--host",
                 "localhost")
    assert again.returncode == 2 and "refusing to overwrite" in again.stderr
    assert _run("trellis.silo.cli", "pki", "request", "--name", "lab-1", "--dir",
                str(tmp_path / "id")).returncode == 0
    assert (tmp_path / "id" / "lab-1.key").stat().st_mode & 0o777 == 0o600
    signed = _run("trellis.coordinator.cli", "pki", "sign", str(tmp_path / "id" / "lab-1.csr"),
                  "--ca", str(tmp_path / "ca"))
    assert signed.returncode == 0 and (tmp_path / "id" / "lab-1.crt").exists()


def test_audit_verify_exit_codes(ws, tmp_path: Path) -> None:
    from trellis.crypto.audit import AuditLog

    log = tmp_path / "audit.jsonl"
    with AuditLog(log, writer="w") as audit:
        for i in range(5):
            audit.append("event", i=i)
    assert _run("trellis.coordinator.cli", "audit", "verify", str(log)).returncode == 0
    lines = log.read_text().splitlines()
    lines[2] = lines[2].replace('"i":2', '"i":9')   # edit line 3: caught at line 4
    log.write_text("\n".join(lines) + "\n")
    result = _run("trellis.coordinator.cli", "audit", "verify", str(log))
    assert result.returncode == 1 and "line 4" in result.stdout


def test_serve_with_unreadable_tls_files_fails_cleanly(ws, tmp_path: Path) -> None:
    plan = write_plan(ws, "notls")
    text = plan.read_text().replace(str(ws.ca / "server.key"), str(tmp_path / "missing.key"))
    plan.write_text(text)
    result = _run("trellis.coordinator.cli", "serve", "--plan", str(plan))
    assert result.returncode == 2 and "server.server_key" in result.stderr


def test_both_commands_tell_their_version_and_protocol() -> None:
    from trellis.protos.messages import PROTOCOL_VERSION
    from trellis.protos.version import package_version

    for command in ("coordinator", "silo"):
        result = _run(f"trellis.{command}.cli", "--version")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"{command} {package_version()} ")
        assert f"protocol {PROTOCOL_VERSION}" in result.stdout


def test_simulate_help_names_its_simulation_table() -> None:
    result = _run("trellis.coordinator.cli", "simulate", "--help")
    assert result.returncode == 0 and "[simulation]" in result.stdout, result.stdout
