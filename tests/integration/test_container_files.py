"""deploy/docker and deploy/compose keep the promises docs/deploy.md makes about them.

The linters of `make check-deploy` judge the files line by line; these tests read them as a
whole: whose volumes hold a silo's key, which command the health check asks, what the plan of
the compose federation names. `make deploy-check` builds the images and runs the federation.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.paths import ROOT
from trellis.protos.plan import parse_plan

COMPOSE = ROOT / "deploy" / "compose"
DOCKER = ROOT / "deploy" / "docker"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((COMPOSE / "compose.yaml").read_text())   # anchors resolved


@pytest.fixture(scope="module")
def plan() -> Any:
    return parse_plan(tomllib.loads((COMPOSE / "plan.toml").read_text()), base_dir=COMPOSE)


def _mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """volume or host path -> (where it is mounted, read-only)."""
    out = {}
    for spec in service.get("volumes", []):
        source, target, *mode = spec.split(":")
        out[source] = (target, mode == ["ro"])
    return out


def _silos(compose: dict[str, Any]) -> list[str]:
    return [name for name, s in compose["services"].items()
            if s.get("command", [None])[0] == "join"]


def test_the_compose_silos_are_the_plans(compose: dict[str, Any], plan: Any) -> None:
    assert sorted(_silos(compose)) == sorted(plan.silos)
    assert plan.public.rounds >= 1 and plan.min_silos == len(plan.silos)


def test_a_silos_key_stays_in_its_own_volume(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for silo in _silos(compose):
        volume = f"{silo}-identity"
        users = {name for name, s in services.items() if volume in _mounts(s)}
        # Made by the silo's init step, completed by its enrol step (certificate only), read
        # by the silo: no other container, the signer least of all, ever mounts it.
        assert users == {f"{silo}-init", f"{silo}-enrol", silo}, volume
        assert _mounts(services[silo])[volume] == ("/etc/trellis/identity", True)
        assert _mounts(services[silo])[f"{silo}-data"] == ("/data", True)
        assert "pki request" in services[f"{silo}-init"]["command"][0]
        # What crosses to the signer is the CSR, copied to the exchange volume.
        assert re.search(r"cp \S+\.csr\" /var/lib/trellis/exchange/",
                         services[f"{silo}-init"]["command"][0])


def test_the_coordinator_never_sees_the_ca_key(compose: dict[str, Any], plan: Any) -> None:
    services = compose["services"]
    assert {name for name, s in services.items() if "ca" in _mounts(s)} == {"signer"}
    # The server key: the signer writes it, the coordinator reads it, nothing else mounts it.
    assert {name for name, s in services.items()
            if "coordinator-tls" in _mounts(s)} == {"signer", "coordinator"}
    mounts = _mounts(services["coordinator"])
    assert mounts["coordinator-tls"] == ("/etc/trellis/tls", True)
    assert mounts["./plan.toml"] == ("/etc/trellis/plan/plan.toml", True)
    # The plan's [server] files are where the coordinator's mounts put them.
    for path in (plan.server.ca_cert, plan.server.server_cert, plan.server.server_key):
        assert str(path).startswith("/etc/trellis/tls/")
    assert str(plan.server.state_dir).startswith(mounts["coordinator-state"][0] + "/")
    signer = services["signer"]["command"][0]
    assert "cp ca/ca.crt ca/server.crt ca/server.key /etc/trellis/tls/" in signer
    assert "ca.key" not in signer


def test_every_container_is_hardened(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name
        assert "user" not in service, name          # the images' own non-root user


def test_silos_wait_for_a_healthy_coordinator(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for silo in _silos(compose):
        assert services[silo]["depends_on"] == {
            f"{silo}-enrol": {"condition": "service_completed_successfully"},
            "coordinator": {"condition": "service_healthy"}}
        assert "coordinator:50051" in services[silo]["command"]


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the final stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and not line.strip().startswith("#")]
    parsed = [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]
    last_from = max(i for i, (op, _) in enumerate(parsed) if op == "FROM")
    return parsed[last_from:]


@pytest.mark.parametrize("image", ["coordinator", "silo"])
def test_images_run_as_a_non_root_user_in_exec_form(image: str) -> None:
    final = dict(_instructions(DOCKER / f"{image}.Dockerfile"))
    assert final["USER"] == "10001:10001"       # the manifests' runAsUser
    assert json.loads(final["ENTRYPOINT"]) == [image]
    json.loads(final["CMD"])                    # exec form: signals reach the process
    assert json.loads(final["VOLUME"]) == ["/var/lib/trellis/state"]


def test_the_coordinator_health_check_asks_the_port_its_command_opens() -> None:
    final = dict(_instructions(DOCKER / "coordinator.Dockerfile"))
    command = json.loads(final["CMD"])
    listen = command[command.index("--health-listen") + 1]
    check = json.loads(final["HEALTHCHECK"].split("CMD", 1)[1])
    assert check == ["coordinator", "health", "--address", listen]


def test_the_coordinator_image_installs_no_torch() -> None:
    text = (DOCKER / "coordinator.Dockerfile").read_text()
    assert "torch" not in text.replace("without torch", "").replace("no torch", "")
    assert "/src[silo]" not in text


def test_the_build_context_admits_only_the_sources() -> None:
    lines = [line for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line and not line.startswith("#")]
    assert lines[0] == "*"            # nothing unless allowed: no .venv, state or keys
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "silo", "coordinator", "crypto", "protos",
                       "deploy/docker/wheelhouse"}
