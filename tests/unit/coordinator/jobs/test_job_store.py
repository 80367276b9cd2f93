"""The job table on a real SQLite file: jobs survive closing and another process's writes,
transitions follow records.ALLOWED, replays and stray answers are refused, the file is private,
and a file of another schema version is refused in one line."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from trellis.coordinator.jobs.records import ALLOWED
from trellis.coordinator.jobs.store import (
    STATES,
    TERMINAL,
    Answer,
    AnswerRefused,
    DuplicateSubmission,
    InvalidTransition,
    JobEvent,
    JobNotFound,
    JobStore,
    JobStoreError,
)


def _submission(n: int = 1, **changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = dict(
        federation="tox21-fedstar", algorithm="fedstar", dataset="tox21", operator="alice",
        plan_toml=b'[federation]\nid = "tox21-fedstar"\n', public_plan_json='{"rounds": 5}',
        submission_json=f'{{"nonce": "{n}"}}', submission_sha256=f"{n:064x}",
        signature=b"\x00sig\xff", operator_certificate_pem=b"-----BEGIN CERTIFICATE-----\n",
        silos=("a", "b", "c"), min_silos=2, now=100.0 + n)
    fields.update(changes)
    return fields


@pytest.fixture()
def store(tmp_path: Path) -> Any:
    opened = JobStore.open(tmp_path / "state" / "jobs.sqlite")
    yield opened
    opened.close()


def test_a_submitted_job_reads_back_whole(store: JobStore) -> None:
    job = store.submit(**_submission())
    assert job.id == 1 and job.state == "submitted" and not job.terminal
    assert job.silos == ("a", "b", "c") and job.min_silos == 2 and job.operator == "alice"
    assert job.plan_toml == b'[federation]\nid = "tox21-fedstar"\n'
    assert job.signature == b"\x00sig\xff" and job.submitted_at == job.updated_at == 101.0
    assert job.started_at is None and job.ended_at is None
    assert store.get(1) == job
    assert store.events(1) == [JobEvent(1, 101.0, "submitted", "submitted by alice")]
    assert [store.submit(**_submission(n)).id for n in (2, 3)] == [2, 3]


def test_jobs_survive_closing_and_reopening(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    with JobStore.open(path) as first:
        first.submit(**_submission(1))
        first.submit(**_submission(2))
        first.transition(1, "awaiting_approval", "offered to 3 silos", now=200.0)
        first.answer(1, "b", False, "no GPU today", now=201.0)
    with JobStore.open(path) as second:
        assert [job.state for job in second.jobs()] == ["awaiting_approval", "submitted"]
        assert second.answers(1) == {"b": Answer("b", False, "no GPU today", 201.0)}
        assert second.submit(**_submission(3)).id == 3


WRITER = """
import sys
from pathlib import Path
from trellis.coordinator.jobs.store import JobStore
store = JobStore.open(Path(sys.argv[1]))
job = store.submit(federation="f", algorithm="fedavg", dataset="d", operator="bob",
                   plan_toml=b"plan", public_plan_json="{}", submission_json="{}",
                   submission_sha256="feed", signature=b"s", operator_certificate_pem=b"pem",
                   silos=("a", "b"), min_silos=2, now=5.0)
store.transition(job.id, "awaiting_approval", "offered to 2 silos", now=6.0)
print(job.id)
"""


def test_another_processs_writes_are_seen_by_an_open_store(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    with JobStore.open(path) as reader:
        reader.submit(**_submission(1))
        done = subprocess.run([sys.executable, "-c", WRITER, str(path)], capture_output=True,
                              text=True, timeout=60, check=True)
        assert done.stdout.strip() == "2"
        job = reader.get(2)
        assert (job.operator, job.state, job.silos) == ("bob", "awaiting_approval", ("a", "b"))
        assert [event.state for event in reader.events(2)] == ["submitted", "awaiting_approval"]


def test_the_file_and_its_journal_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        with JobStore.open(tmp_path / "jobs.sqlite") as store:
            store.submit(**_submission())
            for name in ("jobs.sqlite", "jobs.sqlite-wal", "jobs.sqlite-shm"):
                assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
    finally:
        os.umask(old)
    connection = sqlite3.connect(tmp_path / "jobs.sqlite")
    assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    connection.close()


def test_every_allowed_transition_and_no_other(tmp_path: Path) -> None:
    # One store per (from, to) pair: walk a job to `from` along the main path, then try `to`.
    path_to = {"submitted": [], "awaiting_approval": ["awaiting_approval"],
               "queued": ["awaiting_approval", "queued"],
               "running": ["awaiting_approval", "queued", "running"]}
    for state in TERMINAL:
        path_to[state] = ["awaiting_approval", "queued", "running", state]
    assert set(path_to) == set(STATES) == set(ALLOWED)
    with JobStore.open(tmp_path / "jobs.sqlite") as store:
        n = 0
        for start, steps in path_to.items():
            for to in STATES:
                n += 1
                job = store.submit(**_submission(n))
                for step in steps:
                    store.transition(job.id, step, now=300.0)
                if to in ALLOWED[start]:
                    assert store.transition(job.id, to, "why", now=400.0).state == to
                else:
                    with pytest.raises(InvalidTransition) as caught:
                        store.transition(job.id, to, now=400.0)
                    assert str(caught.value) == (f"job {job.id} is {start}; it cannot "
                                                 f"become {to}")
                    assert store.get(job.id).state == start


def test_a_transition_records_why_and_when(store: JobStore) -> None:
    store.submit(**_submission())
    store.transition(1, "awaiting_approval", "offered to 3 silos", now=110.0)
    store.transition(1, "queued", "approved by a, b, c", now=120.0)
    running = store.transition(1, "running", now=130.0)
    assert running.started_at == 130.0 and running.ended_at is None
    ended = store.transition(1, "completed", "200 rounds", now=140.0)
    assert ended.terminal and ended.reason == "200 rounds" and ended.updated_at == 140.0
    assert ended.started_at == 130.0 and ended.ended_at == 140.0
    assert [(e.state, e.at, e.reason) for e in store.events(1)] == [
        ("submitted", 101.0, "submitted by alice"), ("awaiting_approval", 110.0,
                                                     "offered to 3 silos"),
        ("queued", 120.0, "approved by a, b, c"), ("running", 130.0, ""),
        ("completed", 140.0, "200 rounds")]
    stopped = store.submit(**_submission(2))
    assert store.transition(stopped.id, "stopped", "by alice", now=150.0).ended_at == 150.0
    assert store.get(stopped.id).started_at is None


def test_unknown_jobs_and_states_are_one_line(store: JobStore) -> None:
    for call in (lambda: store.get(9), lambda: store.answers(9), lambda: store.events(9),
                 lambda: store.transition(9, "failed", now=1.0),
                 lambda: store.answer(9, "a", True, "", now=1.0)):
        with pytest.raises(JobNotFound, match="^no job 9$"):
            call()
    store.submit(**_submission())
    with pytest.raises(InvalidTransition, match="'done' is not a job state"):
        store.transition(1, "done", now=1.0)
    with pytest.raises(JobStoreError, match="'done' is not a job state"):
        store.jobs(["done"])


def test_jobs_filters_by_state_in_id_order(store: JobStore) -> None:
    for n in (1, 2, 3):
        store.submit(**_submission(n))
    store.transition(2, "failed", "bad", now=1.0)
    assert [job.id for job in store.jobs()] == [1, 2, 3]
    assert [job.id for job in store.jobs(["submitted"])] == [1, 3]
    assert [job.id for job in store.jobs({"failed", "running"})] == [2]
    assert store.jobs([]) == []


def test_a_replayed_submission_is_refused(store: JobStore) -> None:
    store.submit(**_submission(1))
    with pytest.raises(DuplicateSubmission, match="^job 1 already has this signed submission$"):
        store.submit(**_submission(1, now=999.0, operator="mallory"))
    assert [job.id for job in store.jobs()] == [1]
    assert store.submit(**_submission(2)).id == 2


def test_a_job_needs_sensible_silos(store: JobStore) -> None:
    for silos, min_silos in (((), 1), (("a", "a"), 1), (("a", "b"), 3), (("a",), 0)):
        with pytest.raises(JobStoreError, match="a job needs unique silos"):
            store.submit(**_submission(silos=silos, min_silos=min_silos))
    assert store.jobs() == []


def test_answers_are_taken_once_per_silo_while_awaiting_approval(store: JobStore) -> None:
    store.submit(**_submission())
    with pytest.raises(AnswerRefused, match="job 1 is submitted, not awaiting approval"):
        store.answer(1, "a", True, "", now=1.0)
    store.transition(1, "awaiting_approval", now=2.0)
    assert store.answer(1, "c", True, "", now=3.0) == Answer("c", True, "", 3.0)
    store.answer(1, "a", False, "policy: no fedstar", now=4.0)
    with pytest.raises(AnswerRefused, match="^silo x is not one of job 1's silos \\(a, b, c\\)$"):
        store.answer(1, "x", True, "", now=5.0)
    with pytest.raises(AnswerRefused, match="^silo a has already answered job 1$"):
        store.answer(1, "a", True, "changed my mind", now=5.0)
    store.transition(1, "queued", now=6.0)
    with pytest.raises(AnswerRefused, match="job 1 is queued, not awaiting approval: silo b's"):
        store.answer(1, "b", True, "", now=7.0)
    assert list(store.answers(1)) == ["c", "a"]
    assert store.answers(1)["a"] == Answer("a", False, "policy: no fedstar", 4.0)


def test_threads_share_one_store(store: JobStore) -> None:
    def submit(start: int) -> None:
        for n in range(start, start + 10):
            store.submit(**_submission(n))

    threads = [threading.Thread(target=submit, args=(1 + 10 * i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [job.id for job in store.jobs()] == list(range(1, 41))


def test_a_file_of_another_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    JobStore.open(path).close()
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA user_version = 7")
    connection.close()
    with pytest.raises(JobStoreError) as caught:
        JobStore.open(path)
    assert str(caught.value).startswith(f"{path}: a job table of schema version 7; this "
                                        "coordinator reads version 1")


def test_a_file_that_is_not_a_job_table_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite"
    connection = sqlite3.connect(other)
    connection.execute("CREATE TABLE t (x)")
    connection.close()
    with pytest.raises(JobStoreError, match="schema version 0"):
        JobStore.open(other)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all, just some bytes" * 100)
    with pytest.raises(JobStoreError, match="file is not a database"):
        JobStore.open(junk)
    with pytest.raises(JobStoreError, match="cannot open the job table"):
        JobStore.open(junk / "jobs.sqlite")
