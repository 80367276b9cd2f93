"""Metrics of a standing coordinator: each job's federation counted under its own job_id, the
jobs by state read from the job table, and the one-plan coordinator's series unchanged."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trellis.coordinator.jobs.store import JobStore
from trellis.coordinator.serving.metrics import JOB_LABEL, CoordinatorMetrics
from trellis.crypto.audit import AuditLog

SILOS = ("hospital-a", "hospital-b")


def _one_round(log: AuditLog, round_number: int, silo_bytes: int) -> None:
    """A federation's records for one round, as its audit log writes them."""
    log.append("serve", federation="f", algorithm="fedstar", rounds=3, resumed_at_round=1,
               admitted=list(SILOS), plan_sha256="0" * 64)
    for silo in SILOS:
        log.append("connected", silo=silo, certificate="ab")
    log.append("round_opened", round=round_number, attempt=1, participants=list(SILOS))
    log.append("received_tensor", silo=SILOS[0], round=round_number, attempt=1,
               bytes=silo_bytes, sha256="1" * 64)
    log.append("refused", subject="intruder", reason="not admitted by the plan")
    log.append("round_completed", round=round_number, attempt=1, seconds=2.5,
               participants=list(SILOS), dropped=[])


def _samples(metrics: CoordinatorMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition text, as Prometheus would read it."""
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_each_job_federation_is_counted_under_its_job(tmp_path: Path) -> None:
    metrics = CoordinatorMetrics(per_job=True)
    for job_id, rounds, received in ((1, 2, 100), (2, 1, 7)):
        with AuditLog(tmp_path / f"{job_id}.jsonl", writer="coordinator") as log:
            log.observe(metrics.for_job(job_id).observe)
            for number in range(1, rounds + 1):
                _one_round(log, number, received)
            log.append("disconnected", silo=SILOS[1])
    sample = metrics.registry.get_sample_value
    assert sample("trellis_coordinator_rounds_completed", {JOB_LABEL: "1"}) == 2
    assert sample("trellis_coordinator_rounds_completed", {JOB_LABEL: "2"}) == 1
    assert sample("trellis_coordinator_received_bytes_total",
                  {"silo": SILOS[0], JOB_LABEL: "1"}) == 200
    assert sample("trellis_coordinator_received_bytes_total",
                  {"silo": SILOS[0], JOB_LABEL: "2"}) == 7
    assert sample("trellis_coordinator_refusals_total",
                  {"reason": "not_admitted", JOB_LABEL: "1"}) == 2
    assert sample("trellis_coordinator_round_duration_seconds_count", {JOB_LABEL: "2"}) == 1
    # Each federation keeps its own set of open streams: one left in each.
    assert sample("trellis_coordinator_connected_silos", {JOB_LABEL: "1"}) == 1
    assert sample("trellis_coordinator_connected_silos", {JOB_LABEL: "2"}) == 1
    assert metrics.for_job(1) is metrics.for_job("1")


def test_the_one_plan_coordinator_series_carry_no_job_label(tmp_path: Path) -> None:
    metrics = CoordinatorMetrics()
    with AuditLog(tmp_path / "audit.jsonl", writer="coordinator") as log:
        log.observe(metrics.observe)
        _one_round(log, 1, 64)
    metrics.count_refusal("tls_handshake")
    samples = _samples(metrics)
    assert samples[("trellis_coordinator_rounds_completed", ())] == 1
    assert samples[("trellis_coordinator_received_bytes_total", (("silo", SILOS[0]),))] == 64
    assert samples[("trellis_coordinator_refusals_total", (("reason", "tls_handshake"),))] == 1
    assert not any(JOB_LABEL in dict(labels) for _, labels in samples)
    # The deployment-wide families exist (the dashboard's queries), with nothing to say.
    assert samples[("trellis_coordinator_site_silos", ())] == 0
    assert not any(name == "trellis_coordinator_jobs" for name, _ in samples)


def test_jobs_by_state_are_read_from_the_job_table_at_each_scrape(tmp_path: Path) -> None:
    metrics = CoordinatorMetrics(per_job=True)
    store = JobStore.open(tmp_path / "jobs.sqlite")
    metrics.watch_jobs(lambda: _count(store))
    for number in range(3):
        store.submit(federation=f"f{number}", algorithm="fedstar", dataset="graphs",
                     operator="ops-alice", plan_toml=b"plan", public_plan_json="{}",
                     submission_json="{}", submission_sha256=f"{number}" * 64,
                     signature=b"s", operator_certificate_pem=b"c", silos=SILOS, min_silos=1,
                     now=1.0)
    store.transition(1, "awaiting_approval", now=2.0)
    store.transition(2, "stopped", "stopped by ops-alice", now=2.0)
    jobs = {dict(labels)["state"]: value for (name, labels), value in _samples(metrics).items()
            if name == "trellis_coordinator_jobs"}
    assert jobs == {"submitted": 1, "awaiting_approval": 1, "queued": 0, "running": 0,
                    "completed": 0, "failed": 0, "stopped": 1}
    store.close()          # a scrape after the table closed still answers, without the jobs
    assert not any(name == "trellis_coordinator_jobs" for name, _ in _samples(metrics))


def _count(store: JobStore) -> dict[str, int]:
    counts: dict[str, int] = {}
    for job in store.jobs():
        counts[job.state] = counts.get(job.state, 0) + 1
    return counts


def test_a_bad_record_warns_once_and_counting_goes_on(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    metrics = CoordinatorMetrics(per_job=True)
    observe = metrics.for_job(4).observe
    observe({"event": "round_completed"})              # no round: cannot be counted
    observe({"event": "round_completed", "round": 3})  # no seconds
    observe({"event": "round_aborted"})
    assert capsys.readouterr().err.count("warning: metrics") == 1
    assert metrics.registry.get_sample_value("trellis_coordinator_aborted_attempts_total",
                                             {JOB_LABEL: "4"}) == 1


def test_the_dashboard_picks_jobs_and_queries_only_exported_coordinator_metrics() -> None:
    from tests.paths import ROOT

    dashboard = json.loads((ROOT / "deploy" / "grafana" / "trellis-dashboard.json").read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["job_id"]["allValue"] == ".*"     # All includes the unlabelled one-plan
    for metrics in (CoordinatorMetrics(), CoordinatorMetrics(per_job=True)):
        text = generate_latest(metrics.registry).decode()
        exported = {name for line in text.splitlines() if line.startswith("# TYPE ")
                    for name in _names(*line.split()[2:4])}
        used = {n for e in expressions for n in re.findall(r"\btrellis_coordinator_[a-z_]+", e)}
        assert used - exported == set()
    per_federation = [e for e in expressions if "trellis_coordinator_" in e and not any(
        deployment_wide in e for deployment_wide in ("_jobs{", "_site_silos", "_upload_"))]
    assert per_federation and all('job_id=~"$job_id"' in e for e in per_federation)


def _names(name: str, kind: str) -> set[str]:
    """The sample names of a family, as its TYPE line names it (counters with _total)."""
    suffixes = {"histogram": ("_bucket", "_sum", "_count")}
    return {name + suffix for suffix in suffixes.get(kind, ("",))}
