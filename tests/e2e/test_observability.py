"""Health and metrics of a real federation: probes and scrapes checked against the audit logs.

One small FedStar federation (2 rounds, 3 silo processes) whose coordinator serves a plain
health port and metrics, and whose first silo serves metrics; both keep their endpoints up for a
few seconds after the end (`--linger`), so the test scrapes "after the last round" once each
process's audit log is closed, which happens just before it lingers. Values are checked against
the truth: the rounds, and the byte counts of the audit logs' own records.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.paths import ROOT
from tests.support.federation import (
    SILOS,
    free_port,
    port_of,
    start_coordinator,
    start_silo,
    wait_all,
    write_plan,
)
from trellis.crypto.pki import load_identity
from trellis.protos import codec
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos.messages import PROTOCOL_VERSION, Envelope, Phase

pytestmark = pytest.mark.slow
ROUNDS = 2
WATCHED = SILOS[0]                      # the silo that serves metrics
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
DASHBOARD = ROOT / "deploy" / "grafana" / "trellis-dashboard.json"
SENT_RECORDS = {"sent_tensor", "sent_shares", "sent_envelope", "sealed_group_secrets",
                "sent_encrypted_update"}


def scrape(port: int) -> dict[str, Any]:
    """{"samples": {(name, labels): value}, "names": every exported metric and sample name}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    names: set[str] = set()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "gauge": ("",)}
    for family in text_string_to_metric_families(text):
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
        for sample in family.samples:
            names.add(sample.name)
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return {"samples": samples, "names": names}


def value(scraped: dict[str, Any], name: str, **labels: str) -> float:
    return scraped["samples"].get((name, tuple(sorted(labels.items()))), 0.0)


def check(channel: grpc.Channel, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def closed(path: Path) -> bool:
    return path.is_file() and bool(text := path.read_text().strip()) and (
        json.loads(text.splitlines()[-1]).get("event") == "close")


def until(condition, timeout: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _answers(port: int) -> bool:
    try:
        scrape(port)
        return True
    except OSError:
        return False


def _mtls(ws, silo: str, port: int) -> grpc.Channel:
    ident = load_identity(ws.identity(silo))
    return grpc.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(
        root_certificates=ident.ca_pem, private_key=ident.key_pem,
        certificate_chain=ident.cert_pem))


def _probe(port: int) -> subprocess.CompletedProcess[str]:
    """`coordinator health`, the container images' health check, against the plain port."""
    return subprocess.run([sys.executable, "-m", "trellis.coordinator.cli", "health",
                           "--address", f"127.0.0.1:{port}"],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def run(workspace_factory) -> dict[str, Any]:
    """Run the federation, probing and scraping it mid-run and after its last round."""
    ws = workspace_factory("observability", graphs=30)
    plan = write_plan(ws, "observed", rounds=ROUNDS)
    folder = ws.root / "observed"
    folder.mkdir(exist_ok=True)
    health_port, coordinator_metrics, silo_metrics = free_port(), free_port(), free_port()
    coordinator = start_coordinator(plan, folder / "coordinator.log", extra=[
        "--health-listen", f"127.0.0.1:{health_port}",
        "--metrics-listen", f"127.0.0.1:{coordinator_metrics}", "--linger", "8"])
    out: dict[str, Any] = {"ws": ws, "folder": folder}
    plain = grpc.insecure_channel(f"127.0.0.1:{health_port}")
    watched: list[int] = []
    try:
        until(lambda: _answers(coordinator_metrics), 60, "the coordinator's metrics")
        until(lambda: check(plain) == SERVING, 60, "SERVING")

        def watch() -> None:
            stub = health_pb2_grpc.HealthStub(plain)
            try:
                for reply in stub.Watch(health_pb2.HealthCheckRequest(service="")):
                    watched.append(reply.status)
            except grpc.RpcError:
                pass              # the plain port closed after the linger

        threading.Thread(target=watch, daemon=True).start()
        # An unadmitted certificate of the federation's CA asks to attend: refused, counted.
        with _mtls(ws, "intruder", port_of(plan)) as channel:
            join = codec.attend_request(Envelope("", 0, 0, Phase.JOIN), PROTOCOL_VERSION)
            try:
                list(pb_grpc.FederationStub(channel).Attend(join, timeout=5))
            except grpc.RpcError as exc:
                out["intruder_code"] = exc.code()
        # Health while it runs, asked before any silo starts: the federation waits for its
        # silos then, so a fast run cannot end between the probes (a CI run once saw it end
        # during the probe command's start-up).
        out["plain_mid"] = {s: check(plain, s) for s in ("", "trellis.v1.Federation")}
        with _mtls(ws, WATCHED, port_of(plan)) as channel:
            out["mtls_mid"] = {s: check(channel, s) for s in ("", "trellis.v1.Federation")}
        out["probe_mid"] = _probe(health_port)
        silos = [start_silo(ws, s, port_of(plan), folder / s, folder / f"{s}.log",
                            extra=["--metrics-listen", f"127.0.0.1:{silo_metrics}",
                                   "--linger", "8"] if s == WATCHED else [])
                 for s in SILOS]
        until(lambda: value(scrape(coordinator_metrics),
                            "trellis_coordinator_connected_silos") == len(SILOS), 120,
              "three connected silos")
        out["mid"] = scrape(coordinator_metrics)
        until(lambda: _answers(silo_metrics), 60, "the silo's metrics")
        out["silo_mid"] = scrape(silo_metrics)
        # After the last round: each process's audit log is closed, then it lingers.
        until(lambda: closed(folder / "coordinator" / "audit.jsonl"), 180, "the coordinator")
        out["after"] = scrape(coordinator_metrics)
        out["plain_after"] = check(plain)
        out["probe_after"] = _probe(health_port)
        until(lambda: closed(folder / WATCHED / "audit.jsonl"), 60, "the silo's end")
        out["silo_after"] = scrape(silo_metrics)
        out["codes"] = wait_all([*silos, coordinator], timeout=60)
        out["probe_gone"] = _probe(health_port)
    finally:
        plain.close()
        if coordinator.poll() is None:
            coordinator.kill()
    out["watched"] = watched
    logs = {p.name: p.read_text() for p in folder.glob("*.log")}
    assert out["codes"] == [0, 0, 0, 0], logs
    return out


def test_health_serving_over_both_ports_while_running_then_not_serving(run) -> None:
    assert run["plain_mid"] == {"": SERVING, "trellis.v1.Federation": SERVING}
    assert run["mtls_mid"] == {"": SERVING, "trellis.v1.Federation": SERVING}
    assert run["plain_after"] == NOT_SERVING
    # A watcher that joined while it served saw the end.
    assert run["watched"][0] == SERVING and run["watched"][-1] == NOT_SERVING


def test_the_health_command_exits_0_only_while_the_federation_is_served(run) -> None:
    mid, after, gone = run["probe_mid"], run["probe_after"], run["probe_gone"]
    assert (mid.returncode, mid.stdout.strip()) == (0, "SERVING"), mid.stderr
    assert (after.returncode, after.stdout.strip()) == (1, "NOT_SERVING"), after.stderr
    assert gone.returncode == 1 and gone.stdout == ""
    assert gone.stderr.startswith("error: no health status at 127.0.0.1:")
    assert "Traceback" not in mid.stderr + after.stderr + gone.stderr


def test_coordinator_counts_rounds_and_bytes_received_as_its_audit_log(run) -> None:
    after = run["after"]
    log = records(run["folder"] / "coordinator" / "audit.jsonl")
    assert value(run["mid"], "trellis_coordinator_rounds_completed") < ROUNDS
    assert value(after, "trellis_coordinator_rounds_completed") == ROUNDS
    assert value(after, "trellis_coordinator_round") == ROUNDS
    for silo in SILOS:
        audited = sum(r["bytes"] for r in log if r["event"] in ("received_tensor",
                                                                "received_blobs")
                      and r["silo"] == silo)
        assert audited > 0
        assert value(after, "trellis_coordinator_received_bytes_total", silo=silo) == audited
        assert value(after, "trellis_coordinator_sent_bytes_total", silo=silo) > 0
    aborted = sum(r["event"] == "round_aborted" for r in log)
    assert value(after, "trellis_coordinator_aborted_attempts_total") == aborted
    completed = sum(r["event"] == "round_completed" for r in log)
    assert value(after, "trellis_coordinator_round_duration_seconds_count") == completed
    unmasked = sum(r["event"] == "stage_closed" and r.get("stage") == "unmask" for r in log)
    assert unmasked >= ROUNDS
    assert value(after, "trellis_coordinator_stage_duration_seconds_count",
                 stage="unmask") == unmasked


def test_refusal_of_an_unadmitted_silo_is_counted(run) -> None:
    assert run["intruder_code"] is grpc.StatusCode.PERMISSION_DENIED
    log = records(run["folder"] / "coordinator" / "audit.jsonl")
    refused = sum(r["event"] == "refused" and r["subject"] == "intruder" for r in log)
    assert refused >= 1
    assert value(run["after"], "trellis_coordinator_refusals_total",
                 reason="not_admitted") == refused


def test_silo_counts_bytes_as_its_audit_log_training_and_rounds(run) -> None:
    after = run["silo_after"]
    log = records(run["folder"] / WATCHED / "audit.jsonl")
    sent = sum(r["bytes"] for r in log if r["event"] in SENT_RECORDS)
    received = sum(r["bytes"] for r in log if r["event"] in ("received_tensor",
                                                              "received_envelopes"))
    assert sent > 0 and received > 0
    assert value(after, "trellis_silo_sent_bytes_total") == sent
    assert value(after, "trellis_silo_received_bytes_total") == received
    assert value(run["silo_mid"], "trellis_silo_rounds_completed") < ROUNDS
    assert value(after, "trellis_silo_rounds_completed") == ROUNDS
    trained = sum(r["event"] == "sent_shares" for r in log)      # each is followed by training
    assert value(after, "trellis_silo_training_seconds_count") == trained >= ROUNDS


def test_coordinator_exports_its_upload_budget(run) -> None:
    after = run["after"]
    assert value(after, "trellis_coordinator_upload_memory_limit_bytes") == 256 << 20
    assert value(after, "trellis_coordinator_upload_memory_bytes") == 0    # all summed
    # Three small uploads a round fit the budget together: none waited.
    assert "trellis_coordinator_upload_waits_total" in after["names"]
    assert value(after, "trellis_coordinator_upload_waits_total") == 0


def test_dashboard_queries_only_metrics_the_processes_export(run) -> None:
    exported = run["after"]["names"] | run["silo_after"]["names"]
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    expressions += [v["definition"] for v in dashboard["templating"]["list"]
                    if "definition" in v]
    used = {name for e in expressions for name in re.findall(r"\btrellis_[a-z_]+", e)}
    assert {"trellis_coordinator_refusals_total", "trellis_silo_training_seconds_sum"} <= used
    assert used - exported == set()
