"""deploy/docker and deploy/compose keep the promises docs/deploy.md makes about them.

The linters of `make check-deploy` judge the files line by line; these tests read them as a
whole: whose volumes hold a silo's key, which command the health check asks, what the
deployment and the plans of the compose federations name, and whether every command line they
run is one this version's `coordinator` and `silo` accept. Two compose files: the standing
deployment (compose.yaml: `coordinator serve --deployment`, `silo serve`, restarted unless
stopped) and one federation of one plan (one-plan/compose.yaml). `make deploy-check` builds the
images and runs the one-plan federation.
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
from tests.support.commands import check_command, shell_commands
from trellis.coordinator.jobs.deployment import parse_deployment
from trellis.coordinator.jobs.job_plan import admit_job_plan, parse_job_plan
from trellis.protos.plan import parse_plan
from trellis.silo.privacy.policy import load_policy

COMPOSE = ROOT / "deploy" / "compose"
ONE_PLAN = COMPOSE / "one-plan"
DOCKER = ROOT / "deploy" / "docker"
FILES = {"standing": COMPOSE / "compose.yaml", "one-plan": ONE_PLAN / "compose.yaml"}


@pytest.fixture(scope="module", params=sorted(FILES))
def compose(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Each compose file, anchors resolved."""
    loaded: dict[str, Any] = yaml.safe_load(FILES[request.param].read_text())
    return loaded


@pytest.fixture(scope="module")
def standing() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(FILES["standing"].read_text())
    return loaded


@pytest.fixture(scope="module")
def one_plan() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(FILES["one-plan"].read_text())
    return loaded


@pytest.fixture(scope="module")
def plan() -> Any:
    return parse_plan(tomllib.loads((ONE_PLAN / "plan.toml").read_text()), base_dir=ONE_PLAN)


@pytest.fixture(scope="module")
def deployment() -> Any:
    return parse_deployment(tomllib.loads((COMPOSE / "deployment.toml").read_text()),
                            base_dir=COMPOSE)


def _mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """volume or host path -> (where it is mounted, read-only)."""
    out = {}
    for spec in service.get("volumes", []):
        source, target, *mode = spec.split(":")
        out[source] = (target, mode == ["ro"])
    return out


def _silos(compose: dict[str, Any]) -> list[str]:
    """The services that are silos: the silo image running `silo join` or `silo serve`."""
    return [name for name, s in compose["services"].items()
            if "TRELLIS_SILO_IMAGE" in s["image"] and "entrypoint" not in s]


def _argv(service: dict[str, Any]) -> list[str]:
    """The command line a service's container runs (the image's entrypoint, then its command)."""
    program = "silo" if "TRELLIS_SILO_IMAGE" in service["image"] else "coordinator"
    return [program, *service["command"]]


def test_the_one_plan_silos_are_the_plans(one_plan: dict[str, Any], plan: Any) -> None:
    assert sorted(_silos(one_plan)) == sorted(plan.silos)
    assert plan.public.rounds >= 1 and plan.min_silos == len(plan.silos)
    assert {_argv(one_plan["services"][s])[1] for s in _silos(one_plan)} == {"join"}


def test_the_standing_silos_are_the_deployments(standing: dict[str, Any],
                                                deployment: Any) -> None:
    assert sorted(_silos(standing)) == sorted(deployment.silos)
    assert {_argv(standing["services"][s])[1] for s in _silos(standing)} == {"serve"}
    assert _argv(standing["services"]["coordinator"])[1:3] == ["serve", "--deployment"]


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


def test_the_coordinator_never_sees_the_ca_key(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {name for name, s in services.items() if "ca" in _mounts(s)} == {"signer"}
    # The server key: the signer writes it, the coordinator reads it, nothing else mounts it.
    assert {name for name, s in services.items()
            if "coordinator-tls" in _mounts(s)} == {"signer", "coordinator"}
    assert _mounts(services["coordinator"])["coordinator-tls"] == ("/etc/trellis/tls", True)
    signer = services["signer"]["command"][0]
    assert "cp ca/ca.crt ca/server.crt ca/server.key /etc/trellis/tls/" in signer
    assert "ca.key" not in signer


def test_the_one_plan_coordinator_serves_its_plan(one_plan: dict[str, Any], plan: Any) -> None:
    mounts = _mounts(one_plan["services"]["coordinator"])
    argv = _argv(one_plan["services"]["coordinator"])
    assert mounts["./plan.toml"] == (argv[argv.index("--plan") + 1], True)
    # The plan's [server] files are where the coordinator's mounts put them.
    for path in (plan.server.ca_cert, plan.server.server_cert, plan.server.server_key):
        assert str(path).startswith("/etc/trellis/tls/")
    assert str(plan.server.state_dir).startswith(mounts["coordinator-state"][0] + "/")


def test_the_standing_coordinator_serves_its_deployment(standing: dict[str, Any],
                                                        deployment: Any) -> None:
    mounts = _mounts(standing["services"]["coordinator"])
    argv = _argv(standing["services"]["coordinator"])
    assert mounts["./deployment.toml"] == (argv[argv.index("--deployment") + 1], True)
    for path in (deployment.ca_cert, deployment.server_cert, deployment.server_key):
        assert str(path).startswith("/etc/trellis/tls/")
    assert str(deployment.state_root) == mounts["coordinator-state"][0]


def test_standing_services_restart_and_one_shot_steps_do_not(compose: dict[str, Any]) -> None:
    long_lived = {"coordinator", *_silos(compose)}
    standing = "serve" in _argv(compose["services"]["coordinator"])[1:2] and \
        "--deployment" in compose["services"]["coordinator"]["command"]
    for name, service in compose["services"].items():
        wanted = "unless-stopped" if standing and name in long_lived else "no"
        assert service["restart"] == wanted, name


def test_every_command_is_one_this_version_accepts(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        if service.get("entrypoint") == ["sh", "-ec"]:
            env = {k: str(v) for k, v in service.get("environment", {}).items()}
            script = service["command"][0].replace("$$", "$")
            argvs = shell_commands(script, env)     # none in an enrol step: it copies
        else:
            argvs = [_argv(service)]
        with pytest.MonkeyPatch.context() as env_of_the_container:
            for key, value in service.get("environment", {}).items():
                env_of_the_container.setenv(key, str(value))   # options read from env
            for argv in argvs:
                try:
                    check_command(argv)
                except Exception as exc:
                    raise AssertionError(f"{name}: {' '.join(argv)}: {exc}") from exc


def test_each_standing_silo_serves_the_dataset_of_the_jobs_by_its_policy(
        standing: dict[str, Any], deployment: Any) -> None:
    plans = sorted((COMPOSE / "jobs").glob("*.toml"))
    assert plans
    approve = {}
    for silo in _silos(standing):
        service = standing["services"][silo]
        params = check_command(_argv(service))
        mounts = {target: source for source, (target, _) in _mounts(service).items()}
        policy = load_policy(COMPOSE / mounts[str(params["policy_file"])])
        approve[silo] = policy.jobs.approve
        assert policy.jobs.operators == deployment.operators, silo
        datasets = dict(item.split("=", 1) for item in params["data"])
        assert set(datasets.values()) == {"/data"}
        for path in plans:
            job = admit_job_plan(parse_job_plan(path.read_bytes(), source=str(path)),
                                 deployment, 1)
            assert job.public.dataset in datasets, (silo, path.name)
    # One site approves by hand, as docs/deploy.md shows with `silo jobs approve`.
    assert sorted(approve.values()) == ["auto", "auto", "manual"]


def test_the_operator_holds_an_operator_identity_only(standing: dict[str, Any],
                                                      deployment: Any) -> None:
    services = standing["services"]
    assert {name for name, s in services.items()
            if "operator-identity" in _mounts(s)} == {"signer", "operator"}
    operator = services["operator"]
    assert _mounts(operator)["operator-identity"] == (operator["environment"]
                                                      ["TRELLIS_IDENTITY"], True)
    assert operator["environment"]["TRELLIS_COORDINATOR"] == "coordinator:50051"
    issued = re.findall(r"pki operator --name (\S+)", services["signer"]["command"][0])
    assert issued == list(deployment.operators)


def test_the_documented_operator_and_site_commands_parse(
        standing: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The header's `docker compose run --rm operator ...` and `exec <silo> ...` lines."""
    operator = standing["services"]["operator"]
    for key, value in operator["environment"].items():
        monkeypatch.setenv(key, value)      # as the operator service's container has them
    header = FILES["standing"].read_text().split("\n\n", 1)[0]
    found = 0
    for line in header.splitlines():
        words = line.lstrip("# ").split("#", 1)[0].split()
        if words[:4] == ["docker", "compose", "run", "--rm"] and words[4] == "operator":
            argv = ["coordinator", *words[5:]]
        elif words[:3] == ["docker", "compose", "exec"] and words[3] in _silos(standing):
            argv = words[4:]
        else:
            continue
        check_command(argv)
        found += 1
    assert found >= 4


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
    # The image's health check asks 127.0.0.1:8081: the command must open it there.
    command = services["coordinator"]["command"]
    assert command[command.index("--health-listen") + 1] == "127.0.0.1:8081"


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
