"""A standing coordinator's edge with real TLS, in-process: what it refuses, and why.

Operators: a silo's certificate, an operator the deployment does not list, a plan other than
the one signed, a broken plan, a replayed submission, a stop of an ended job. Silos: an
unadmitted certificate, an answer to a job that does not name the silo. Federation calls: no
job named, a job that does not exist or does not run.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2

from tests.support.federation import Workspace, free_port, make_workspace
from trellis.coordinator.jobs.client import Deployment, JobRefused
from trellis.coordinator.jobs.deployment import load_deployment
from trellis.coordinator.jobs.standing import StandingServer, start_standing
from trellis.coordinator.serving.health import FederationHealth
from trellis.crypto.audit import verify_audit_log
from trellis.crypto.pki import Identity, issue_operator, load_identity
from trellis.protos import codec, jobs_codec
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos.jobs import JOB_METADATA_KEY
from trellis.protos.messages import PROTOCOL_VERSION, Envelope, Phase
from trellis.protos.plan import PlanError
from trellis.protos.submission import new_submission, sign_submission


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    ws = make_workspace(tmp_path_factory.mktemp("standing-edge"), graphs=20)
    issue_operator(ws.ca, "ops-alice", ws.root / "ops-alice")
    issue_operator(ws.ca, "ops-eve", ws.root / "ops-eve")
    return ws


@pytest.fixture(scope="module")
def running(ws: Workspace) -> Iterator[StandingServer]:
    path = ws.root / "deployment.toml"
    path.write_text(f"""
[deployment]
name = "edge"
silos = ["hospital-a", "pharma-b"]
operators = ["ops-alice"]

[server]
listen = "127.0.0.1:{free_port()}"
ca_cert = "{ws.ca / 'ca.crt'}"
server_cert = "{ws.ca / 'server.crt'}"
server_key = "{ws.ca / 'server.key'}"
state_root = "{ws.root / 'state'}"
""")
    server = start_standing(load_deployment(path), echo=False, health=FederationHealth())
    yield server
    server.stop(0)
    verify_audit_log(ws.root / "state" / "audit.jsonl")


def plan_bytes(name: str, silos: tuple[str, ...] = ("hospital-a", "pharma-b"),
               extra: str = "") -> bytes:
    return (f'[federation]\nid = "{name}"\nalgorithm = "fedavg"\ndataset = "graphs"\n'
            f'rounds = 2\nsilos = [{", ".join(repr(s) for s in silos)}]\n{extra}').encode()


def client(ws: Workspace, running: StandingServer, who: str = "ops-alice") -> Deployment:
    return Deployment(f"127.0.0.1:{running.port}", ws.root / who)


def channel(ws: Workspace, running: StandingServer, silo: str) -> grpc.Channel:
    ident: Identity = load_identity(ws.identity(silo))
    return grpc.secure_channel(f"127.0.0.1:{running.port}", grpc.ssl_channel_credentials(
        root_certificates=ident.ca_pem, private_key=ident.key_pem,
        certificate_chain=ident.cert_pem))


def test_it_serves_without_a_plan_or_a_job(running: StandingServer) -> None:
    """A standing coordinator is SERVING from its start: it needs no plan, and no job."""
    assert running.health is not None
    assert running.health.status("") == health_pb2.HealthCheckResponse.SERVING


def test_a_signed_plan_becomes_a_job_awaiting_its_silos(ws: Workspace,
                                                        running: StandingServer) -> None:
    with client(ws, running) as ops:
        job = ops.submit(plan_bytes("first"))
        assert job.state == "awaiting_approval" and job.operator == "ops-alice"
        assert {a.silo: a.answer for a in ops.job(job.job_id).answers} == {
            "hospital-a": "", "pharma-b": ""}
        assert job.job_id in [j.job_id for j in ops.jobs()]


def test_operators_not_listed_and_silo_certificates_cannot_submit(
        ws: Workspace, running: StandingServer) -> None:
    with client(ws, running, "ops-eve") as eve, pytest.raises(JobRefused,
                                                              match="may not submit"):
        eve.submit(plan_bytes("by-eve"))
    silo = Deployment(f"127.0.0.1:{running.port}", ws.identity("hospital-a"))
    with silo, pytest.raises(JobRefused, match="not an operator's"):
        silo.jobs()


def test_a_plan_other_than_the_one_signed_is_refused(ws: Workspace,
                                                     running: StandingServer) -> None:
    ident = load_identity(ws.root / "ops-alice")
    signed, sent = plan_bytes("signed"), plan_bytes("swapped")
    statement = new_submission(_public_sha(signed), signed, "ops-alice")
    stub = admin(ident, running)
    with pytest.raises(grpc.RpcError) as refused:
        stub.SubmitJob(jobs_codec.submit_request(sent, statement.to_json(),
                                                 sign_submission(ident.key_pem, statement)),
                       timeout=10)
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "not the plan file the operator signed" in refused.value.details()
    # The same submission replayed under a new job: refused as a replay.
    good = sign_submission(ident.key_pem, statement)
    stub.SubmitJob(jobs_codec.submit_request(signed, statement.to_json(), good), timeout=10)
    with pytest.raises(grpc.RpcError) as replayed:
        stub.SubmitJob(jobs_codec.submit_request(signed, statement.to_json(), good), timeout=10)
    assert "already has this signed submission" in replayed.value.details()


def test_broken_plans_are_refused_with_every_problem(ws: Workspace,
                                                     running: StandingServer) -> None:
    with_server = plan_bytes("with-server", extra='[server]\nlisten = "0.0.0.0:1"\n')
    no_dataset = plan_bytes("no-dataset").replace(b'dataset = "graphs"\n', b"")
    with client(ws, running) as ops:
        # The operator's client refuses them before signing anything...
        with pytest.raises(PlanError, match=r"\[server\]"):
            ops.submit(with_server)
        with pytest.raises(PlanError, match="federation.dataset"):
            ops.submit(no_dataset)
        # ... and the coordinator what only the deployment can tell.
        with pytest.raises(JobRefused, match="social-c"):
            ops.submit(plan_bytes("stranger", silos=("hospital-a", "social-c")))
    # A client that signs a plan with [server] anyway: the coordinator refuses it too.
    ident = load_identity(ws.root / "ops-alice")
    statement = new_submission("0" * 64, with_server, "ops-alice")
    with pytest.raises(grpc.RpcError) as refused:
        admin(ident, running).SubmitJob(jobs_codec.submit_request(
            with_server, statement.to_json(), sign_submission(ident.key_pem, statement)),
            timeout=10)
    assert "[server]" in refused.value.details()


def test_stopping_a_job_twice_says_it_has_ended(ws: Workspace,
                                                running: StandingServer) -> None:
    with client(ws, running) as ops:
        job = ops.submit(plan_bytes("to-stop"))
        assert ops.stop(job.job_id).state == "stopped"
        with pytest.raises(JobRefused, match="already ended"):
            ops.stop(job.job_id)
        with pytest.raises(JobRefused, match="no job 999"):
            ops.job(999)


def test_sites_see_only_their_jobs_and_answer_only_those(ws: Workspace,
                                                         running: StandingServer) -> None:
    with client(ws, running) as ops:
        mine = ops.submit(plan_bytes("for-a-and-b"))
    with channel(ws, running, "hospital-a") as ch:
        stub = pb_grpc.SiteStub(ch)
        watch = stub.WatchJobs(jobs_codec.watch_request(PROTOCOL_VERSION), timeout=5)
        offers = jobs_codec.site_jobs_from_pb(next(iter(watch)))
        watch.cancel()
        assert mine.job_id in [o.job_id for o in offers]
        stub.AnswerJob(jobs_codec.answer_to_pb(mine.job_id, False, "not this week"),
                       timeout=10)
        with pytest.raises(grpc.RpcError) as twice:
            stub.AnswerJob(jobs_codec.answer_to_pb(mine.job_id, True, ""), timeout=10)
        assert twice.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    with channel(ws, running, "social-c") as ch, pytest.raises(grpc.RpcError) as stranger:
        next(iter(pb_grpc.SiteStub(ch).WatchJobs(jobs_codec.watch_request(PROTOCOL_VERSION),
                                                 timeout=5)))
    assert stranger.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "not admitted by deployment edge" in stranger.value.details()


@pytest.mark.parametrize(("metadata", "code", "text"), [
    ((), grpc.StatusCode.FAILED_PRECONDITION, "silo serve"),
    (((JOB_METADATA_KEY, "12345"),), grpc.StatusCode.NOT_FOUND, "no such job"),
    (((JOB_METADATA_KEY, "{waiting}"),), grpc.StatusCode.NOT_FOUND, "awaiting approval"),
    (((JOB_METADATA_KEY, "one"),), grpc.StatusCode.INVALID_ARGUMENT, "not a number"),
])
def test_federation_calls_go_to_a_running_job_or_are_refused(
        ws: Workspace, running: StandingServer, metadata: tuple, code: grpc.StatusCode,
        text: str) -> None:
    with client(ws, running) as ops:
        waiting = ops.submit(plan_bytes(f"routing-{code.name.lower()}-{len(text)}"))
        assert waiting.state == "awaiting_approval"
    metadata = tuple((k, v.format(waiting=waiting.job_id)) for k, v in metadata)
    with channel(ws, running, "hospital-a") as ch:
        stream = pb_grpc.FederationStub(ch).Attend(
            codec.attend_request(Envelope("", 0, 0, Phase.JOIN), PROTOCOL_VERSION),
            metadata=metadata, timeout=10)
        with pytest.raises(grpc.RpcError) as refused:
            next(iter(stream))
    assert refused.value.code() is code and text in refused.value.details()


def admin(ident: Identity, running: StandingServer) -> pb_grpc.AdminStub:
    return pb_grpc.AdminStub(grpc.secure_channel(
        f"127.0.0.1:{running.port}", grpc.ssl_channel_credentials(
            root_certificates=ident.ca_pem, private_key=ident.key_pem,
            certificate_chain=ident.cert_pem)))


def _public_sha(plan: bytes) -> str:
    from trellis.coordinator.jobs.job_plan import parse_job_plan

    return parse_job_plan(plan).public.sha256()

