"""Watching a real standing coordinator (in this process, over mTLS on loopback): its metrics
label each job's federation and count the jobs by state and the silos watching, `coordinator
status` lists its jobs over the Admin service and from its state root, and `coordinator audit
report` on the state root covers the deployment and each job. No silo process runs: a site's
answers go through the job host, as the Site service hands them over."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from typer.testing import CliRunner

from trellis.coordinator.cli.app import app
from trellis.coordinator.jobs.client import Deployment
from trellis.coordinator.jobs.deployment import load_deployment
from trellis.coordinator.jobs.standing import start_standing
from trellis.coordinator.serving.metrics import JOB_LABEL, CoordinatorMetrics
from trellis.crypto.pki import (
    init_ca,
    issue_operator,
    load_identity,
    request_identity,
    sign_request,
)
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos import jobs_codec
from trellis.protos.messages import PROTOCOL_VERSION

# Three, and min_silos = 2: one refusal leaves the second job waiting for the other two.
SILOS = ("hospital-a", "hospital-b", "hospital-c")


@pytest.fixture(scope="module")
def standing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("standing-observability")
    init_ca(root / "ca", ["localhost"])
    issue_operator(root / "ca", "ops-alice", root / "ops-alice")
    sign_request(request_identity(SILOS[0], root / SILOS[0]), root / "ca")
    (root / "deployment.toml").write_text(f"""
[deployment]
name = "observed"
silos = [{", ".join(f'"{s}"' for s in SILOS)}]

[server]
listen = "127.0.0.1:0"
ca_cert = "ca/ca.crt"
server_cert = "ca/server.crt"
server_key = "ca/server.key"
state_root = "state"
""")
    metrics = CoordinatorMetrics(per_job=True)
    server = start_standing(load_deployment(root / "deployment.toml"), metrics=metrics,
                            echo=False)
    operator = Deployment(f"localhost:{server.port}", root / "ops-alice")
    state: dict = {"root": root, "server": server, "metrics": metrics, "operator": operator}
    try:
        yield state
    finally:
        operator.close()
        if not state.get("stopped"):
            server.stop(0)


def _plan(root: Path, name: str) -> Path:
    path = root / f"{name}.toml"
    path.write_text(f"""
[federation]
id = "{name}"
algorithm = "fedavg"
dataset = "graphs"
rounds = 2
seed = 7
min_silos = 2
silos = [{", ".join(f'"{s}"' for s in SILOS)}]

[timeouts]
join_s = 300
""")
    return path


def test_jobs_are_counted_by_state_and_each_federation_under_its_job(standing: dict) -> None:
    server, operator = standing["server"], standing["operator"]
    first = operator.submit(_plan(standing["root"], "first"))
    second = operator.submit(_plan(standing["root"], "second"))
    for silo in SILOS:
        server.host.answer(silo, first.job_id, True, "")
    server.host.answer(SILOS[0], second.job_id, False, "policy: fedavg is not accepted")
    assert operator.job(first.job_id).state == "running"
    sample = standing["metrics"].registry.get_sample_value
    assert sample("trellis_coordinator_jobs", {"state": "running"}) == 1
    assert sample("trellis_coordinator_jobs", {"state": "awaiting_approval"}) == 1
    # Its federation's log fed its own series: served from round 1, nothing completed.
    assert sample("trellis_coordinator_rounds_completed", {JOB_LABEL: "1"}) == 0
    assert sample("trellis_coordinator_rounds_completed", {JOB_LABEL: "2"}) is None


def test_a_silo_watching_the_site_service_is_counted_while_it_watches(standing: dict) -> None:
    root, server = standing["root"], standing["server"]
    silo = load_identity(root / SILOS[0])
    credentials = grpc.ssl_channel_credentials(silo.ca_pem, silo.key_pem, silo.cert_pem)
    sample = standing["metrics"].registry.get_sample_value
    with grpc.secure_channel(f"localhost:{server.port}", credentials) as channel:
        watch = pb_grpc.SiteStub(channel).WatchJobs(jobs_codec.watch_request(PROTOCOL_VERSION))
        offers = jobs_codec.site_jobs_from_pb(next(watch))
        assert {o.job_id for o in offers} == {1, 2}
        assert sample("trellis_coordinator_site_silos") == 1
        watch.cancel()
    for _ in range(100):
        if sample("trellis_coordinator_site_silos") == 0:
            break
        time.sleep(0.05)           # the server sees the cancelled stream end a moment later
    assert sample("trellis_coordinator_site_silos") == 0


def test_coordinator_status_lists_the_jobs_over_admin_and_from_the_state_root(
        standing: dict) -> None:
    root, server = standing["root"], standing["server"]
    runner = CliRunner()
    remote = runner.invoke(app, ["status", "--coordinator", f"localhost:{server.port}",
                                 "--identity", str(root / "ops-alice"), "--json"])
    assert remote.exit_code == 0, remote.output
    listed = json.loads(remote.output)
    assert [(j["job_id"], j["state"]) for j in listed["jobs"]] == [(1, "running"),
                                                                    (2, "awaiting_approval")]
    assert listed["jobs"][0]["status"]["rounds"] == 2
    human = runner.invoke(app, ["status", "--coordinator", f"localhost:{server.port}",
                                "--identity", str(root / "ops-alice")])
    assert human.exit_code == 0, human.output
    assert human.output.startswith(f"standing coordinator at localhost:{server.port}: 2 jobs")
    assert "round 1 of 2, stage " in human.output
    local = runner.invoke(app, ["status", "--state-dir", str(root / "state")])
    assert local.exit_code == 0, local.output
    assert f"{root / 'state'}: coordinator running (pid " in local.output.splitlines()[0]
    refused = runner.invoke(app, ["status", "--coordinator", f"localhost:{server.port}",
                                  "--identity", str(root / SILOS[0])])
    assert refused.exit_code == 2
    assert "the coordinator refused 'hospital-a': " in refused.output


def test_the_compliance_report_covers_the_deployment_and_each_job(standing: dict) -> None:
    root, server, operator = standing["root"], standing["server"], standing["operator"]
    assert operator.stop(1).state in ("running", "stopped")
    assert operator.wait(1, timeout_s=30).state == "stopped"
    server.stop(0)
    standing["stopped"] = True
    out = root / "report.md"
    done = CliRunner().invoke(app, ["audit", "report", "--state-dir", str(root / "state"),
                                    "--ca", str(root / "ca"), "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert "the deployment's audit log and 1 job log verify" in done.output
    report = out.read_text()
    assert "# Compliance report of deployment observed" in report
    assert "| ops-alice | 2 | 0 | 0 | 1 | 1 |" in report          # by operator
    assert "| hospital-a | 2 | 1 | 1 | 0 |" in report              # by site
    assert "policy: fedavg is not accepted" in report
    assert ("its federation served the public plan the operator signed and admitted only "
            "silos that approved the job") in report
    assert "## Job 1: Rounds" in report


def test_coordinator_status_of_a_one_plan_coordinator_still_shows_its_federation(
        tmp_path: Path) -> None:
    from tests.support.federation import make_workspace, write_plan
    from trellis.coordinator.serving.service import start_server
    from trellis.protos.plan import load_plan

    ws = make_workspace(tmp_path, graphs=20)
    issue_operator(ws.ca, "ops-alice", tmp_path / "ops-alice")
    plan = load_plan(write_plan(ws, "one-plan", port=0, algorithm="fedavg", min_silos=2))
    server = start_server(plan, progress=False, listen="127.0.0.1:0")
    try:
        done = CliRunner().invoke(app, ["status", "--coordinator", f"localhost:{server.port}",
                                        "--identity", str(tmp_path / "ops-alice"), "--json"])
    finally:
        server.stop(0)
    assert done.exit_code == 0, done.output
    status = json.loads(done.output)
    assert status["federation"] == "one-plan" and status["state"] == "running"
