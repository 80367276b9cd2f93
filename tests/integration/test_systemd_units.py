"""deploy/systemd: the standing units (`silo serve`, `coordinator serve --deployment`) restart
always, run hardened as a dedicated user, and run commands this version accepts; the one-plan
units (deploy/systemd/one-plan/) restart only after a crash."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path, PurePosixPath

import pytest

from tests.paths import ROOT
from tests.support.commands import check_command
from tests.support.systemd import environment_file, exec_start, unit_sections
from trellis.coordinator.jobs.deployment import parse_deployment

SYSTEMD = ROOT / "deploy" / "systemd"
STANDING = {"trellis-silo.service": "trellis-silo.env",
            "trellis-coordinator.service": "trellis-coordinator.env"}
ONE_PLAN = sorted((SYSTEMD / "one-plan").glob("*.service"))
VENV_BIN = "/srv/trellis/.venv/bin/"


def _unit(path: Path) -> configparser.ConfigParser:
    return unit_sections(path.read_text(), source=str(path))


def _standing(name: str) -> tuple[configparser.ConfigParser, list[str]]:
    unit = _unit(SYSTEMD / name)
    env_file = unit["Service"]["EnvironmentFile"]
    example = SYSTEMD / STANDING[name]
    # The example is what the unit reads, copied to /etc/trellis/.
    assert PurePosixPath(env_file).parent == PurePosixPath("/etc/trellis"), env_file
    return unit, exec_start(unit, environment_file(example.read_text()))


@pytest.mark.parametrize("name", sorted(STANDING))
def test_a_standing_unit_always_restarts_and_is_hardened(name: str) -> None:
    service = _standing(name)[0]["Service"]
    assert service["Restart"] == "always"
    assert service["User"] == service["Group"] == "trellis"
    assert service["SuccessExitStatus"] == "143"      # SIGTERM: a clean stop
    for key, value in {"NoNewPrivileges": "yes", "PrivateTmp": "yes", "ProtectSystem": "strict",
                       "ProtectHome": "yes", "UMask": "0077", "CapabilityBoundingSet": "",
                       "RestrictSUIDSGID": "yes"}.items():
        assert service[key] == value, key
    unit = _standing(name)[0]["Unit"]
    assert int(unit["StartLimitBurst"]) > 0 and int(unit["StartLimitIntervalSec"]) > 0


def test_the_silo_unit_runs_silo_serve_writing_only_its_state_root() -> None:
    unit, argv = _standing("trellis-silo.service")
    assert argv[0] == VENV_BIN + "silo" and argv[1] == "serve"
    params = check_command(argv)
    assert unit["Service"]["ReadWritePaths"] == str(params["state_root"])
    assert params["data"] and all("=" in item for item in params["data"])
    assert params["policy_file"] is not None
    assert unit["Service"]["KillMode"] == "mixed"      # serve stops its jobs itself


def test_the_coordinator_unit_serves_a_deployment_writing_only_its_state_root() -> None:
    unit, argv = _standing("trellis-coordinator.service")
    assert argv[0] == VENV_BIN + "coordinator" and argv[1] == "serve"
    params = check_command(argv)
    assert params["plan"] is None
    deployment_file = PurePosixPath(str(params["deployment"]))
    # deploy/deployment.example.toml, copied there: its relative state_root under that folder.
    example = tomllib.loads((ROOT / "deploy" / "deployment.example.toml").read_text())
    deployment = parse_deployment(example, base_dir=Path(deployment_file.parent))
    assert unit["Service"]["ReadWritePaths"] == str(deployment.state_root)
    assert str(params["health_listen"]).startswith("127.0.0.1:")   # plain text: loopback only


@pytest.mark.parametrize("path", ONE_PLAN, ids=lambda p: p.name)
def test_a_one_plan_unit_restarts_only_after_a_crash(path: Path) -> None:
    unit = _unit(path)
    assert unit["Service"]["Restart"] == "on-abnormal"   # a finished federation stays ended
    argv = shlex.split(unit["Service"]["ExecStart"])
    check_command(argv)
    assert argv[1] in {"join", "serve"} and "--deployment" not in argv


SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


@pytest.mark.skipif(SYSTEMD_ANALYZE is None,
                    reason="systemd-analyze not installed: the units are parsed above only")
@pytest.mark.parametrize("folder", [SYSTEMD, SYSTEMD / "one-plan"], ids=["standing", "one-plan"])
def test_systemd_analyze_verify_finds_nothing(folder: Path, tmp_path: Path) -> None:
    # verify wants ExecStart's program to exist (stubs stand in for the virtual environment's)
    # and exits 0 on an unknown key or a bad value, printing a line: any output fails.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program in ("coordinator", "silo"):
        (bin_dir / program).write_text("#!/bin/sh\n")
        (bin_dir / program).chmod(0o755)
    copies = []
    for unit in sorted(folder.glob("*.service")):
        copy = tmp_path / unit.name
        copy.write_text(unit.read_text().replace(VENV_BIN, f"{bin_dir}/"))
        copies.append(str(copy))
    done = subprocess.run([str(SYSTEMD_ANALYZE), "verify", *copies], capture_output=True,
                          text=True, timeout=120)
    assert (done.stdout + done.stderr).strip() == "", done.stdout + done.stderr
