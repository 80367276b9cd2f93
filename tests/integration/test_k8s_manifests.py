"""deploy/k8s, rendered by `kubectl kustomize`, keeps its invariants."""

import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.paths import ROOT
from trellis.protos.plan import parse_plan

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


def test_every_kustomization_renders_the_workload_it_should(rendered):
    kinds = {name: sorted(d["kind"] for d in docs) for name, docs in rendered.items()}
    assert "Deployment" in kinds["base/coordinator"]
    assert "NetworkPolicy" in kinds["base/coordinator"]
    for silo in ("overlays/silo-hospital-a", "overlays/silo-pharma-b"):
        assert "Job" in kinds[silo] and "NetworkPolicy" in kinds[silo]


def test_coordinator_is_a_single_writer(rendered):
    deployment = _one(rendered["base/coordinator"], "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"


def test_coordinator_probes_are_grpc_on_the_health_port_only(rendered):
    docs = rendered["base/coordinator"]
    container = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
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


def test_plan_points_at_the_mounted_secret_and_state_volume(rendered):
    docs = rendered["base/coordinator"]
    plan_text = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["plan.toml"]
    plan = parse_plan(tomllib.loads(plan_text), base_dir=Path("/nonexistent"))
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    tls = next(n for n, v in volumes.items() if "secret" in v)
    state = next(n for n, v in volumes.items() if "persistentVolumeClaim" in v)
    for path in (plan.server.ca_cert, plan.server.server_cert, plan.server.server_key):
        assert path.parent == Path(mounts[tls]), path
    assert Path(mounts[state]) in plan.server.state_dir.parents
    assert plan.server.listen.endswith(":50051")


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


def test_silo_job_restarts_after_a_crash_but_not_after_a_deliberate_exit(rendered):
    job = _one(rendered["overlays/silo-hospital-a"], "Job")
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    fail = [r for r in job["spec"]["podFailurePolicy"]["rules"] if r["action"] == "FailJob"]
    assert fail[0]["onExitCodes"] == {"containerName": "silo", "operator": "In", "values": [1, 2]}
    assert job["spec"]["backoffLimit"] > 0


def test_the_gpu_component_adds_one_gpu(rendered):
    def gpu(name: str) -> Any:
        container = _one(rendered[name], "Job")["spec"]["template"]["spec"]["containers"][0]
        return container["resources"]["limits"].get("nvidia.com/gpu")

    assert gpu("overlays/silo-pharma-b") == 1
    assert gpu("overlays/silo-hospital-a") is None
