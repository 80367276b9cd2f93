"""Mistakes with the standing federation's commands, in real processes: one line, exit 2 (or 1
for a coordinator that does not answer), never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trellis.crypto.pki import init_ca, issue_operator, request_identity, sign_request


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          timeout=120)


def _error(result: subprocess.CompletedProcess, code: int = 2) -> str:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


@pytest.mark.parametrize("options", [(), ("--plan", "p.toml", "--deployment", "d.toml")])
def test_serve_takes_a_plan_or_a_deployment(options: tuple[str, ...]) -> None:
    said = _error(_run("trellis.coordinator.cli", "serve", *options))
    assert "give --plan PLAN (one federation) or --deployment DEPLOYMENT" in said


def test_a_broken_deployment_lists_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "deployment.toml"
    path.write_text('[deployment]\nname = "x y"\nsilos = []\nmax_concurrent_jobs = 0\n')
    said = _error(_run("trellis.coordinator.cli", "serve", "--deployment", str(path)))
    assert f"invalid deployment {path}" in said
    for field in ("deployment.name", "deployment.silos", "deployment.max_concurrent_jobs"):
        assert field in said


@pytest.mark.parametrize(("data", "text"), [
    ("graphs", "expected NAME=PATH"),
    ("graphs=/no/such/folder", "no such folder"),
])
def test_silo_serve_refuses_a_bad_dataset_option(data: str, text: str) -> None:
    said = _error(_run("trellis.silo.cli", "serve", "--coordinator", "127.0.0.1:1",
                       "--data", data))
    assert text in said


def test_jobs_commands_say_when_the_coordinator_does_not_answer(tmp_path: Path) -> None:
    init_ca(tmp_path / "ca", ["localhost"])
    issue_operator(tmp_path / "ca", "ops-alice", tmp_path / "ops")
    said = _error(_run("trellis.coordinator.cli", "jobs", "list", "--coordinator",
                       "127.0.0.1:1", "--identity", str(tmp_path / "ops")), code=1)
    assert "no answer from the coordinator at 127.0.0.1:1" in said
    said = _error(_run("trellis.coordinator.cli", "jobs", "list", "--coordinator",
                       "localhost", "--identity", str(tmp_path / "ops")))
    assert "expected host:port" in said


def test_a_job_plan_with_server_is_refused_before_anything_is_signed(tmp_path: Path) -> None:
    init_ca(tmp_path / "ca", ["localhost"])
    issue_operator(tmp_path / "ca", "ops-alice", tmp_path / "ops")
    plan = tmp_path / "plan.toml"
    plan.write_text('[federation]\nid = "f"\nalgorithm = "fedavg"\nrounds = 2\n'
                    'silos = ["a", "b"]\n[server]\nlisten = "0.0.0.0:1"\n')
    said = _error(_run("trellis.coordinator.cli", "jobs", "submit", str(plan),
                       "--coordinator", "127.0.0.1:1", "--identity", str(tmp_path / "ops")))
    assert "[server]" in said and "federation.dataset" in said


def test_silo_join_approved_plan_goes_with_job(tmp_path: Path) -> None:
    sign_request(request_identity("hospital-a", tmp_path / "id"), _ca(tmp_path))
    from trellis.silo.data.synthetic import write_tu_folder

    write_tu_folder(tmp_path / "data", "MOLECULES", "molecules", 30, seed=1)
    said = _error(_run("trellis.silo.cli", "join", "--coordinator", "127.0.0.1:1",
                       "--data", str(tmp_path / "data" / "MOLECULES"), "--identity",
                       str(tmp_path / "id"), "--approved-plan", "ab" * 32))
    assert "--approved-plan goes with --job" in said


def _ca(root: Path) -> Path:
    init_ca(root / "ca", ["localhost"])
    return root / "ca"
