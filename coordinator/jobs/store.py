"""The job table: every job, its silos' answers and its history, in SQLite, so that a standing
coordinator killed at any moment (kill -9, a power cut) restarts knowing every job it had.

One file, ``state_root/jobs.sqlite``, created 0600 like everything the coordinator keeps. WAL
journal with synchronous=FULL: a method that returned has its change on disk, and a crash
leaves each change whole or absent (every public method is one transaction). One connection,
guarded by a lock, serves every thread. The schema's version is the file's ``user_version``;
a file of another version is refused in one line rather than misread.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trellis.coordinator.jobs.records import (
    ALLOWED,
    STATES,
    TERMINAL,
    Answer,
    Job,
    JobEvent,
)

__all__ = ["STATES", "TERMINAL", "Answer", "AnswerRefused", "DuplicateSubmission",
           "InvalidTransition", "Job", "JobEvent", "JobNotFound", "JobStore", "JobStoreError",
           "SCHEMA_VERSION"]

FILE_NAME = "jobs.sqlite"
SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    federation TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    dataset TEXT NOT NULL,
    operator TEXT NOT NULL,
    submitted_at REAL NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL,
    updated_at REAL NOT NULL,
    silos TEXT NOT NULL,
    min_silos INTEGER NOT NULL,
    plan_toml BLOB NOT NULL,
    public_plan_json TEXT NOT NULL,
    submission_json TEXT NOT NULL,
    submission_sha256 TEXT NOT NULL UNIQUE,
    signature BLOB NOT NULL,
    operator_certificate_pem BLOB NOT NULL,
    started_at REAL,
    ended_at REAL
);
CREATE INDEX jobs_by_state ON jobs (state, id);
CREATE TABLE answers (
    job_id INTEGER NOT NULL REFERENCES jobs (id),
    silo TEXT NOT NULL,
    approved INTEGER NOT NULL,
    reason TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (job_id, silo)
);
CREATE TABLE events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id INTEGER NOT NULL REFERENCES jobs (id),
    at REAL NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX events_by_job ON events (job_id, seq);
"""
JOB_COLUMNS = ("id, federation, algorithm, dataset, operator, submitted_at, state, reason, "
               "updated_at, silos, min_silos, plan_toml, public_plan_json, submission_json, "
               "submission_sha256, signature, operator_certificate_pem, started_at, ended_at")


class JobStoreError(ValueError):
    """The job table refused an operation, or cannot be used; the message is one line."""


class JobNotFound(JobStoreError):
    """No job has this id."""


class InvalidTransition(JobStoreError):
    """A job cannot go from its state to the one asked (records.ALLOWED)."""


class DuplicateSubmission(JobStoreError):
    """A signed submission already stored under a job: a replay."""


class AnswerRefused(JobStoreError):
    """A silo's answer that cannot be taken: not the job's silo, a second one, or too late."""


class JobStore:
    """The job table of one standing coordinator (thread-safe)."""

    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path = path
        self._db = connection
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Path) -> JobStore:
        """Open the job table at `path`, creating it (0600) with the current schema if new."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        except OSError as exc:
            raise JobStoreError(f"{path}: cannot open the job table: {exc.strerror}") from None
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                                     timeout=30.0)
        store = cls(path, connection)
        try:
            with store._transaction("BEGIN IMMEDIATE") as db:
                store._check_schema(db)
            store._settle()
        except BaseException:
            connection.close()
            raise
        return store

    def _settle(self) -> None:
        """The connection's settings: WAL (set outside a transaction, the only place SQLite
        changes it), every commit synced, references checked."""
        try:
            mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            self._db.execute("PRAGMA synchronous = FULL")
            self._db.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as exc:
            raise JobStoreError(f"{self.path}: {exc}") from None
        if mode != "wal":
            raise JobStoreError(f"{self.path}: SQLite cannot keep this job table in WAL mode "
                                f"(got {mode}); put state_root on a local file system")

    def _check_schema(self, db: sqlite3.Connection) -> None:
        """Create the schema in a new file; refuse a file of another version."""
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if version == 0 and tables == 0:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        elif version != SCHEMA_VERSION:
            raise JobStoreError(f"{self.path}: a job table of schema version {version}; this "
                                f"coordinator reads version {SCHEMA_VERSION} (use the "
                                "coordinator release that wrote it, or another state_root)")

    @contextmanager
    def _transaction(self, begin: str = "BEGIN") -> Iterator[sqlite3.Connection]:
        """One transaction under the lock; an SQLite failure becomes one JobStoreError line."""
        with self._lock:
            try:
                self._db.execute(begin)
                try:
                    yield self._db
                except BaseException:
                    if self._db.in_transaction:   # SQLite may have rolled it back itself
                        self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise JobStoreError(f"{self.path}: {exc}") from None

    def submit(self, *, federation: str, algorithm: str, dataset: str, operator: str,
               plan_toml: bytes, public_plan_json: str, submission_json: str,
               submission_sha256: str, signature: bytes, operator_certificate_pem: bytes,
               silos: tuple[str, ...], min_silos: int, now: float) -> Job:
        """Store a new job in state "submitted" (ids 1, 2, 3, ..., never reused)."""
        if not silos or len(set(silos)) != len(silos) or not 1 <= min_silos <= len(silos):
            raise JobStoreError(f"a job needs unique silos and 1 <= min_silos <= their number; "
                                f"got {len(silos)} silos and min_silos={min_silos}")
        with self._transaction("BEGIN IMMEDIATE") as db:
            earlier = db.execute("SELECT id FROM jobs WHERE submission_sha256 = ?",
                                 (submission_sha256,)).fetchone()
            if earlier is not None:
                raise DuplicateSubmission(f"job {earlier[0]} already has this signed submission")
            reason = f"submitted by {operator}"
            cursor = db.execute(
                f"INSERT INTO jobs ({JOB_COLUMNS}) VALUES "
                "(NULL, ?, ?, ?, ?, ?, 'submitted', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL)",
                (federation, algorithm, dataset, operator, now, reason, now,
                 json.dumps(list(silos)), min_silos, plan_toml, public_plan_json,
                 submission_json, submission_sha256, signature, operator_certificate_pem))
            job_id = int(cursor.lastrowid or 0)
            db.execute("INSERT INTO events (job_id, at, state, reason) VALUES (?, ?, ?, ?)",
                       (job_id, now, "submitted", reason))
            return _job(db, job_id)

    def get(self, job_id: int) -> Job:
        """The job with this id (JobNotFound if none)."""
        with self._transaction() as db:
            return _job(db, job_id)

    def jobs(self, states: Iterable[str] | None = None) -> list[Job]:
        """Every job, or those in `states`, by id."""
        wanted = None if states is None else sorted(set(states))
        for state in wanted or ():
            if state not in STATES:
                raise JobStoreError(f"{state!r} is not a job state; valid: {', '.join(STATES)}")
        query = f"SELECT {JOB_COLUMNS} FROM jobs"
        if wanted is not None:
            query += f" WHERE state IN ({', '.join('?' * len(wanted))})"
        with self._transaction() as db:
            rows = db.execute(query + " ORDER BY id", wanted or ()).fetchall()
        return [_from_row(row) for row in rows]

    def transition(self, job_id: int, to: str, reason: str = "", *, now: float) -> Job:
        """Move a job to state `to` if records.ALLOWED lets it, recording why; entering
        "running" sets started_at, entering a terminal state ended_at."""
        if to not in STATES:
            raise InvalidTransition(f"{to!r} is not a job state; valid: {', '.join(STATES)}")
        with self._transaction("BEGIN IMMEDIATE") as db:
            job = _job(db, job_id)
            if to not in ALLOWED[job.state]:
                raise InvalidTransition(f"job {job_id} is {job.state}; it cannot become {to}")
            db.execute("UPDATE jobs SET state = ?, reason = ?, updated_at = ?, "
                       "started_at = CASE WHEN ? THEN ? ELSE started_at END, "
                       "ended_at = CASE WHEN ? THEN ? ELSE ended_at END WHERE id = ?",
                       (to, reason, now, to == "running", now, to in TERMINAL, now, job_id))
            db.execute("INSERT INTO events (job_id, at, state, reason) VALUES (?, ?, ?, ?)",
                       (job_id, now, to, reason))
            return _job(db, job_id)

    def answer(self, job_id: int, silo: str, approved: bool, reason: str, *,
               now: float) -> Answer:
        """Record a silo's answer to a job's offer: once per silo of the job, while the job
        awaits approval."""
        with self._transaction("BEGIN IMMEDIATE") as db:
            job = _job(db, job_id)
            if silo not in job.silos:
                raise AnswerRefused(f"silo {silo} is not one of job {job_id}'s silos "
                                    f"({', '.join(job.silos)})")
            if db.execute("SELECT 1 FROM answers WHERE job_id = ? AND silo = ?",
                          (job_id, silo)).fetchone() is not None:
                raise AnswerRefused(f"silo {silo} has already answered job {job_id}")
            if job.state != "awaiting_approval":
                raise AnswerRefused(f"job {job_id} is {job.state}, not awaiting approval: "
                                    f"silo {silo}'s answer is not taken")
            db.execute("INSERT INTO answers (job_id, silo, approved, reason, at) "
                       "VALUES (?, ?, ?, ?, ?)", (job_id, silo, int(approved), reason, now))
        return Answer(silo=silo, approved=approved, reason=reason, at=now)

    def answers(self, job_id: int) -> dict[str, Answer]:
        """The answers a job's silos gave, in the order they came."""
        with self._transaction() as db:
            _job(db, job_id)
            rows = db.execute("SELECT silo, approved, reason, at FROM answers WHERE job_id = ? "
                              "ORDER BY rowid", (job_id,)).fetchall()
        return {silo: Answer(silo=silo, approved=bool(approved), reason=reason, at=at)
                for silo, approved, reason, at in rows}

    def events(self, job_id: int) -> list[JobEvent]:
        """A job's history, oldest first (its submission, then every transition)."""
        with self._transaction() as db:
            _job(db, job_id)
            rows = db.execute("SELECT job_id, at, state, reason FROM events WHERE job_id = ? "
                              "ORDER BY seq", (job_id,)).fetchall()
        return [JobEvent(job_id=row[0], at=row[1], state=row[2], reason=row[3]) for row in rows]

    def close(self) -> None:
        """Close the file (every change is already on disk)."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> JobStore:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _job(db: sqlite3.Connection, job_id: int) -> Job:
    """The job `job_id`, read inside the caller's transaction."""
    row = db.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None:
        raise JobNotFound(f"no job {job_id}")
    return _from_row(row)


def _from_row(row: tuple[Any, ...]) -> Job:
    """A Job from a row of JOB_COLUMNS."""
    (job_id, federation, algorithm, dataset, operator, submitted_at, state, reason, updated_at,
     silos, min_silos, plan_toml, public_plan_json, submission_json, submission_sha256,
     signature, certificate, started_at, ended_at) = row
    return Job(id=job_id, federation=federation, algorithm=algorithm, dataset=dataset,
               operator=operator, submitted_at=submitted_at, state=state, reason=reason,
               updated_at=updated_at, silos=tuple(json.loads(silos)), min_silos=min_silos,
               plan_toml=bytes(plan_toml), public_plan_json=public_plan_json,
               submission_json=submission_json, submission_sha256=submission_sha256,
               signature=bytes(signature), operator_certificate_pem=bytes(certificate),
               started_at=started_at, ended_at=ended_at)
