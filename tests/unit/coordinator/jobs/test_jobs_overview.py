"""A standing coordinator's jobs read from its state root: the real job table opened read-only
(while its writer holds it), each job's status.json, and `coordinator status --state-dir` on it
in one table or JSON."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trellis.coordinator.cli.app import app
from trellis.coordinator.jobs.overview import (
    format_jobs,
    is_state_root,
    job_folder,
    open_read_only,
    read_jobs,
)
from trellis.coordinator.jobs.store import JobStore, JobStoreError
from trellis.protos.plan import AggregationConfig, ModelConfig, PublicPlan, TrainingConfig
from trellis.protos.status import FederationStatus

SILOS = ("hospital-a", "hospital-b")


def _submit(store: JobStore, n: int, operator: str = "ops-alice") -> int:
    plan = PublicPlan(f"fed-{n}", "fedstar", 3, 1, ModelConfig(), TrainingConfig(),
                      AggregationConfig(threshold=2), dataset="graphs")
    job = store.submit(federation=f"fed-{n}", algorithm="fedstar", dataset="graphs",
                       operator=operator, plan_toml=b"plan", public_plan_json=plan.to_json(),
                       submission_json=f'{{"n": {n}}}', submission_sha256=f"{n:064x}",
                       signature=b"s", operator_certificate_pem=b"c", silos=SILOS,
                       min_silos=2, now=1_700_000_000.0 + n)
    return job.id


@pytest.fixture
def state_root(tmp_path: Path) -> Path:
    """A state root with a running job (and its status.json), a refused one, a new one."""
    root = tmp_path / "state"
    with JobStore.open(root / "jobs.sqlite") as store:
        running, refused, _ = (_submit(store, n) for n in (1, 2, 3))
        for job in (running, refused):
            store.transition(job, "awaiting_approval", now=1_700_000_010.0)
        for silo in SILOS:
            store.answer(running, silo, True, "", now=1_700_000_020.0)
        store.transition(running, "queued", now=1_700_000_021.0)
        store.transition(running, "running", now=1_700_000_022.0)
        store.answer(refused, SILOS[0], False, "policy: algorithm fedstar is not accepted",
                     now=1_700_000_030.0)
        store.transition(refused, "failed", "too few silos approved", now=1_700_000_031.0)
    folder = job_folder(root, running)
    folder.mkdir(parents=True)
    status = FederationStatus(federation="fed-1", algorithm="fedstar", run_id="r1", round=2,
                              rounds=3, rounds_completed=1, stage="input", connected=SILOS,
                              metrics_round=1, reported=2, metrics={"val_acc": 0.75})
    (folder / "status.json").write_text(json.dumps(status.to_json()))
    return root


def test_the_jobs_are_read_with_answers_history_and_status(state_root: Path) -> None:
    assert is_state_root(state_root) and not is_state_root(state_root / "jobs" / "1")
    jobs = read_jobs(state_root)
    assert [(j.job_id, j.state) for j in jobs] == [(1, "running"), (2, "failed"),
                                                   (3, "submitted")]
    running, refused, new = jobs
    assert running.rounds == 3 and running.status is not None
    assert running.status.rounds_completed == 1 and running.status.connected == SILOS
    assert [(a.silo, a.answer) for a in refused.answers] == [(SILOS[0], "refused"),
                                                             (SILOS[1], "")]
    assert refused.answers[0].reason.startswith("policy:")
    assert [e.state for e in refused.events] == ["submitted", "awaiting_approval", "failed"]
    assert new.status is None


def test_the_table_is_read_only_and_never_holds_its_writer_up(state_root: Path) -> None:
    with JobStore.open(state_root / "jobs.sqlite") as writer:
        reader = open_read_only(state_root)
        try:
            writer.transition(3, "awaiting_approval", now=1_700_000_050.0)
            assert reader.get(3).state == "awaiting_approval"    # sees the writer's commits
            with pytest.raises(JobStoreError, match="readonly"):
                reader.transition(3, "stopped", now=1_700_000_060.0)
        finally:
            reader.close()
    assert read_jobs(state_root)[2].state == "awaiting_approval"


def test_a_table_of_another_schema_version_is_refused_in_one_line(state_root: Path) -> None:
    with sqlite3.connect(state_root / "jobs.sqlite") as db:
        db.execute("PRAGMA user_version = 9")
    with pytest.raises(JobStoreError, match="schema version 9; this coordinator reads"):
        read_jobs(state_root)


def test_the_table_shows_each_running_job_round(state_root: Path) -> None:
    lines = format_jobs(read_jobs(state_root), serving=False).splitlines()
    assert lines[0].split() == ["job", "state", "algorithm", "dataset", "operator",
                                "submitted", "round"]
    assert lines[1].split()[:2] == ["1", "running"] and lines[1].endswith(" 1/3")
    assert lines[2].strip() == ("round 2 of 3, stage input; connected 2: hospital-a, "
                                "hospital-b; round 1: val_acc 0.7500 (when the coordinator "
                                "stopped)")
    assert lines[3].split()[:2] == ["2", "failed"] and lines[3].endswith(" 0/3")
    assert format_jobs([]).startswith("no jobs yet")


def test_coordinator_status_lists_a_state_root_jobs(state_root: Path) -> None:
    runner = CliRunner()
    shown = runner.invoke(app, ["status", "--state-dir", str(state_root)])
    assert shown.exit_code == 0, shown.output
    first, *rest = shown.output.splitlines()
    assert first == (f"deployment state root {state_root}: no coordinator running "
                     "(`coordinator serve --deployment FILE` resumes the jobs recorded as "
                     "running)")
    assert rest[1].split()[:2] == ["1", "running"]
    as_json = runner.invoke(app, ["status", "--state-dir", str(state_root), "--json"])
    assert as_json.exit_code == 0, as_json.output
    doc = json.loads(as_json.output)
    assert doc["deployment"] == {"state_root": str(state_root), "running": False, "pid": None}
    assert [j["state"] for j in doc["jobs"]] == ["running", "failed", "submitted"]
    assert doc["jobs"][0]["status"]["metrics"] == {"val_acc": 0.75}
    assert doc["jobs"][1]["answers"][0]["answer"] == "refused"
