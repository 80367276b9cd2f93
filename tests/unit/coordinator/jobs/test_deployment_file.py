"""Deployment files: a valid one parses with defaults and resolved paths; a bad one reports every
field with its path in one line; the example operators copy loads, commented lines included."""

from __future__ import annotations

from pathlib import Path

import pytest

from trellis.coordinator.jobs.deployment import (
    DeploymentConfig,
    DeploymentError,
    load_deployment,
    parse_deployment,
)
from trellis.protos.plan import ServerConfig

EXAMPLE = Path(__file__).resolve().parents[4] / "deploy" / "deployment.example.toml"

GOOD = """
[deployment]
name = "chem"
silos = ["a", "b", "c"]

[server]
state_root = "st"
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deployment.toml"
    path.write_text(text)
    return path


def _problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(DeploymentError) as caught:
        load_deployment(_write(tmp_path, text))
    assert "\n" not in str(caught.value)
    return caught.value.problems


def test_a_minimal_deployment_takes_the_defaults_and_resolves_paths(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    deployment = load_deployment(path)
    assert deployment.name == "chem" and deployment.silos == ("a", "b", "c")
    assert deployment.operators == () and deployment.admits_operator("anyone")
    assert deployment.max_concurrent_jobs == 1 and deployment.approval_deadline_s == 3600.0
    assert deployment.listen == ServerConfig().listen
    assert deployment.state_root == (tmp_path / "st").resolve()
    assert deployment.ca_cert == (tmp_path / "ca" / "ca.crt").resolve()
    assert deployment.crl is None and deployment.health_listen is None
    assert deployment.metrics_listen is None and deployment.source == path


def test_the_server_config_of_a_job_is_the_deployments_with_the_jobs_folder(
        tmp_path: Path) -> None:
    deployment = load_deployment(_write(tmp_path, GOOD.replace(
        'state_root = "st"', 'state_root = "st"\ncrl = "revoked.pem"\nlisten = "0.0.0.0:7"\n'
        "upload_memory_mb = 32\nstream_window_kb = 128")))
    folder = deployment.job_folder(12)
    assert folder == (tmp_path / "st" / "jobs" / "12").resolve()
    server = deployment.server_config(folder)
    assert server == ServerConfig(listen="0.0.0.0:7", ca_cert=deployment.ca_cert,
                                  server_cert=deployment.server_cert,
                                  server_key=deployment.server_key, state_dir=folder,
                                  crl=(tmp_path / "revoked.pem").resolve(),
                                  upload_memory_mb=32, stream_window_kb=128)
    assert server.crl_path == (tmp_path / "revoked.pem").resolve()


def test_operators_limit_who_may_submit(tmp_path: Path) -> None:
    deployment = load_deployment(_write(tmp_path, GOOD.replace(
        'silos = ["a", "b", "c"]', 'silos = ["a"]\noperators = ["alice", "bob"]')))
    assert deployment.operators == ("alice", "bob")
    assert deployment.admits_operator("bob") and not deployment.admits_operator("eve")


def test_every_bad_field_is_reported_with_its_path(tmp_path: Path) -> None:
    problems = _problems(tmp_path, """
colour = "blue"
[deployment]
name = "no spaces"
silos = ["a", "b b", "a"]
operators = "alice"
max_concurrent_jobs = 65
approval_deadline_s = 0
extra = 1
[server]
listen = "nowhere"
state_dir = "st"
ca_cert = ""
stream_window_kb = 8
health_listen = "127.0.0.1:8081"
metrics_listen = "127.0.0.1:8081"
""")
    text = "\n".join(problems)
    for expected in ("colour: unknown field", "deployment.name: letters, digits",
                     "deployment.silos[1]: 'b b' is not a valid silo name",
                     "deployment.silos: names must be unique",
                     "deployment.operators: must be a list of operator names",
                     "deployment.max_concurrent_jobs: must be <= 64, got 65",
                     "deployment.approval_deadline_s: must be > 0, got 0.0",
                     "deployment.extra: unknown field",
                     "server.listen: expected 'host:port', got 'nowhere'",
                     "server.state_dir: unknown field",
                     "server.ca_cert: must be a path string",
                     "server.stream_window_kb: must be >= 16, got 8",
                     "server.metrics_listen: 127.0.0.1:8081 is already server.health_listen"):
        assert expected in text, expected
    assert len(problems) == 13


def test_the_name_and_silos_are_required(tmp_path: Path) -> None:
    assert _problems(tmp_path, "[deployment]\nsilos = []\n") == [
        "deployment.name: required",
        "deployment.silos: must be a non-empty list of silo names (certificate subjects)"]
    assert _problems(tmp_path, "") == [
        "deployment.name: required",
        "deployment.silos: must be a non-empty list of silo names (certificate subjects)"]


def test_an_unreadable_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(DeploymentError, match="cannot read deployment file"):
        load_deployment(tmp_path / "absent.toml")
    path = tmp_path / "deployment.toml"
    path.write_bytes(b'[deployment]\nname = "\xff"\n')
    with pytest.raises(DeploymentError, match="not UTF-8 text: byte 0xff at line 2"):
        load_deployment(path)
    path.write_text("[deployment\n")
    with pytest.raises(DeploymentError, match="not valid TOML"):
        load_deployment(path)


def test_the_error_names_its_source() -> None:
    with pytest.raises(DeploymentError) as caught:
        parse_deployment({"deployment": {"silos": ["a"]}}, base_dir=Path("."))
    assert str(caught.value) == "deployment: deployment.name: required"


def test_the_example_deployment_loads() -> None:
    deployment = load_deployment(EXAMPLE)
    assert isinstance(deployment, DeploymentConfig)
    assert deployment.name == "chem-consortium"
    assert deployment.silos == ("hospital-a", "pharma-b", "lab-c")
    assert deployment.operators == ("alice",) and deployment.listen == "0.0.0.0:50051"
    assert deployment.state_root == EXAMPLE.parent / "state"


def test_the_examples_commented_settings_are_valid_when_uncommented(tmp_path: Path) -> None:
    lines = EXAMPLE.read_text().splitlines()
    settings = [i for i, line in enumerate(lines)
                if line.startswith("# ") and " = " in line.split("#")[1]]
    assert len(settings) == 5
    for i in settings:
        lines[i] = lines[i][2:]
    deployment = load_deployment(_write(tmp_path, "\n".join(lines)))
    assert deployment.crl == (tmp_path / "ca" / "crl.pem").resolve()
    assert deployment.health_listen == "127.0.0.1:8081"
    assert deployment.metrics_listen == "127.0.0.1:9090"
    assert deployment.upload_memory_mb == 256 and deployment.stream_window_kb == 64
