"""deploy/k8s, rendered by `kubectl kustomize`, keeps its invariants: a standing coordinator
(`coordinator serve --deployment`) and standing silos (`silo serve`), long-lived Deployments
whose command lines this version's CLIs accept."""

import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from tests.paths import ROOT
from tests.support.commands import check_command
from trellis.coordinator.jobs.deployment import parse_deployment
from trellis.silo.privacy.policy import parse_policy

KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed: nothing to render")

# The files operators provide (gitignored), as placeholders; ca.key sits beside the coordinator's
# as an operator might leave it, and must still never reach a Secret.
OPERATOR_FILES = {
    "base/coordinator/tls": ["ca.crt", "server.crt", "server.key", "ca.key"],
    "overlays/silo-hospital-a/identity": ["hospital-a.key", "hospital-a.crt", "ca.crt"],
    "overlays/silo-pharma-b/identity": ["pharma-b.key", "pharma-b.crt", "ca.crt"],
}
RENDERED = ["base/coordinator", "overlays/silo-hospital-a", "overlays/silo-pharma-b"]
SILOS = ["overlays/silo-hospital-a", "overlays/silo-pharma-b"]
Manifest = dict[str, Any]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Manifest]]:
    """Each kustomization's rendered objects, from a copy holding placeholder identities."""
    tree = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(ROOT / "deploy" / "k8s", tree)
    for folder, names in OPERATOR_FILES.items():
        (tree / folder).mkdir(parents=True, exist_ok=True)
        for name in names:
            (tree / folder / name).write_text(f"placeholder {name}\n")
    out = {}
    for kustomization in RENDERED:
        text = subprocess.run([str(KUBECTL), "kustomize", str(tree / kustomization)],
                              check=True, capture_output=True, text=True).stdout
        out[kustomization] = [doc for doc in yaml.safe_load_all(text) if doc]
    return out


def _all(rendered: dict[str, list[Manifest]]) -> Iterator[Manifest]:
    for docs in rendered.values():
        yield from docs


def _one(docs: list[Manifest], kind: str) -> Manifest:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def _pod_specs(rendered: dict[str, list[Manifest]]) -> Iterator[tuple[str, Manifest]]:
    for doc in _all(rendered):
        if doc["kind"] in {"Deployment", "StatefulSet", "Job", "DaemonSet"}:
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def _container(docs: list[Manifest]) -> Manifest:
    containers = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _command(docs: list[Manifest]) -> list[str]:
    """The container's command line as the kubelet runs it: $(VAR) from its env, a ConfigMap
    key as rendered, a resource field as its limit."""
    container = _container(docs)
    maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    env = {}
    for var in container.get("env", []):
        source = var.get("valueFrom", {})
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[var["name"]] = maps[ref["name"]][ref["key"]]
        elif "resourceFieldRef" in source:
            field = source["resourceFieldRef"]["resource"].split(".", 1)
            env[var["name"]] = str(container["resources"][field[0]][field[1]])
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)
            for arg in container["command"] + container["args"]]


def _mounts(docs: list[Manifest]) -> dict[str, tuple[PurePosixPath, Manifest]]:
    """volume name -> (where the container mounts it, the volume)."""
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {m["name"]: (PurePosixPath(m["mountPath"]), volumes[m["name"]])
            for m in _container(docs)["volumeMounts"]}


def _config_file(docs: list[Manifest], path: str) -> str:
    """The text of the ConfigMap key mounted at `path`."""
    for where, volume in _mounts(docs).values():
        if "configMap" in volume and PurePosixPath(path).parent == where:
            data = next(d for d in docs if d["kind"] == "ConfigMap"
                        and d["metadata"]["name"] == volume["configMap"]["name"])["data"]
            return str(data[PurePosixPath(path).name])
    raise AssertionError(f"no ConfigMap is mounted at {path}")


def test_every_kustomization_renders_a_long_lived_deployment(rendered):
    # Standing services never end by themselves: no Job (a finished one-plan coordinator
    # restarted by its Deployment was a CrashLoop).
    for name in RENDERED:
        kinds = sorted(d["kind"] for d in rendered[name])
        assert kinds.count("Deployment") == 1 and "NetworkPolicy" in kinds, name
        assert "Job" not in kinds and "StatefulSet" not in kinds, name
        pod = _one(rendered[name], "Deployment")["spec"]["template"]["spec"]
        assert pod.get("restartPolicy", "Always") == "Always", name


def test_each_deployment_is_the_single_writer_of_its_state(rendered):
    for name in RENDERED:
        deployment = _one(rendered[name], "Deployment")
        assert deployment["spec"]["replicas"] == 1, name
        assert deployment["spec"]["strategy"]["type"] == "Recreate", name
        claims = [v["persistentVolumeClaim"] for _, v in _mounts(rendered[name]).values()
                  if "persistentVolumeClaim" in v]
        assert {c["claimName"] for c in claims} <= {
            d["metadata"]["name"] for d in rendered[name] if d["kind"] == "PersistentVolumeClaim"}


def test_the_coordinator_serves_its_deployment_file(rendered):
    docs = rendered["base/coordinator"]
    argv = _command(docs)
    params = check_command(argv)
    assert argv[1] == "serve" and params["plan"] is None
    deployment = parse_deployment(tomllib.loads(_config_file(docs, str(params["deployment"]))),
                                  base_dir=Path("/nonexistent"))
    mounts = _mounts(docs)
    tls = next(where for where, v in mounts.values() if "secret" in v)
    state = next(where for where, v in mounts.values() if "persistentVolumeClaim" in v)
    for path in (deployment.ca_cert, deployment.server_cert, deployment.server_key):
        assert PurePosixPath(path).parent == tls, path
    assert PurePosixPath(deployment.state_root) == state
    assert deployment.listen.endswith(":50051")
    assert {"name": "federation", "containerPort": 50051, "protocol": "TCP"} in [
        {k: p[k] for k in ("name", "containerPort", "protocol")}
        for p in _container(docs)["ports"]]
    metrics = int(str(params["metrics_listen"]).rsplit(":", 1)[1])
    service_ports = {p["port"] for d in docs if d["kind"] == "Service" for p in d["spec"]["ports"]}
    assert {50051, metrics} <= service_ports


@pytest.mark.parametrize("name", SILOS)
def test_a_silo_serves_its_datasets_by_its_policy(rendered, name):
    docs = rendered[name]
    argv = _command(docs)
    params = check_command(argv)
    assert argv[1] == "serve"
    mounts = _mounts(docs)
    by_path = dict(mounts.values())
    assert "secret" in by_path[PurePosixPath(str(params["identity"]))]
    assert "persistentVolumeClaim" in by_path[PurePosixPath(str(params["state_root"]))]
    data, volume = mounts["data"]
    assert volume["persistentVolumeClaim"]["readOnly"] is True
    for item in params["data"]:
        dataset, _, path = item.partition("=")
        assert dataset and data in PurePosixPath(path).parents, item
    policy = parse_policy(tomllib.loads(_config_file(docs, str(params["policy_file"]))))
    assert policy.jobs.approve in {"auto", "manual"}
    assert params["coordinator"].endswith(":50051")


def test_hospital_a_approves_its_operator_at_once_and_pharma_b_by_hand(rendered):
    def jobs(name: str) -> Any:
        argv = _command(rendered[name])
        text = _config_file(rendered[name], _flag(argv, "--policy"))
        return parse_policy(tomllib.loads(text)).jobs

    assert jobs("overlays/silo-hospital-a").approve == "auto"
    assert jobs("overlays/silo-hospital-a").operators == ("ops-alice",)
    assert jobs("overlays/silo-pharma-b").approve == "manual"


def test_coordinator_probes_are_grpc_on_the_health_port_only(rendered):
    docs = rendered["base/coordinator"]
    container = _container(docs)
    health_port = int(_flag(container["args"], "--health-listen").rsplit(":", 1)[1])
    assert {"name": "health", "containerPort": health_port, "protocol": "TCP"} in \
        container["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": health_port}, probe
    # The plain-text health port is for the kubelet: no Service and no ingress rule names it.
    service_ports = [p for d in docs if d["kind"] == "Service" for p in d["spec"]["ports"]]
    assert health_port not in {p["port"] for p in service_ports}
    assert "health" not in {p["targetPort"] for p in service_ports}
    policy = _one(docs, "NetworkPolicy")
    assert health_port not in {p["port"] for rule in policy["spec"]["ingress"]
                               for p in rule["ports"]}


def test_metrics_are_admitted_from_the_monitoring_namespace_only(rendered):
    for name in RENDERED:
        policy = _one(rendered[name], "NetworkPolicy")
        for rule in policy["spec"]["ingress"]:
            if {p["port"] for p in rule["ports"]} & {9464, 9465}:
                assert rule["from"] == [{"namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": "monitoring"}}}]


def test_no_secret_carries_the_ca_key(rendered):
    secrets = [d for d in _all(rendered) if d["kind"] == "Secret"]
    assert secrets
    for secret in secrets:
        keys = set(secret.get("data", {})) | set(secret.get("stringData", {}))
        assert not {k for k in keys if k.endswith("ca.key")}, secret["metadata"]["name"]
    coordinator = _one(rendered["base/coordinator"], "Secret")
    assert set(coordinator["data"]) == {"ca.crt", "server.crt", "server.key"}


def test_every_container_is_hardened_and_bounded(rendered):
    specs = list(_pod_specs(rendered))
    assert len(specs) == 3
    for name, pod in specs:
        assert pod["automountServiceAccountToken"] is False, name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in pod["containers"] + pod.get("initContainers", []):
            where = f"{name}/{container['name']}"
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][bound]), where
            context = container["securityContext"]
            assert context["runAsNonRoot"] is True, where
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["capabilities"]["drop"] == ["ALL"], where
            assert isinstance(container["args"], list) and container["command"], where


def test_silos_accept_no_connection(rendered):
    for name in SILOS:
        policy = _one(rendered[name], "NetworkPolicy")
        assert "Ingress" in policy["spec"]["policyTypes"] and policy["spec"]["ingress"] == []
        assert "ports" not in _container(rendered[name])


def test_the_gpu_component_adds_one_gpu(rendered):
    def gpu(name: str) -> Any:
        return _container(rendered[name])["resources"]["limits"].get("nvidia.com/gpu")

    assert gpu("overlays/silo-pharma-b") == 1
    assert gpu("overlays/silo-hospital-a") is None
