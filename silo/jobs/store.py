"""The site's record of job offers and its answers: one SQLite file, <state root>/jobs.sqlite.

``silo serve`` records every offer with its evaluation (silo/jobs/approval.py); a job the
policy approves or refuses is answered at once, one it holds waits for ``silo jobs approve`` or
``refuse``, which another process may run while ``silo serve`` holds the file open. An answer
is kept until it reached the coordinator (``unsent``, ``mark_sent``), so a restart loses none.

The file is the silo operator's (0600), in WAL mode with synchronous=FULL: an answer given is on
disk before the call returns. Its schema version is SQLite's user_version; a file of another
version is refused, never migrated silently. Every method is one transaction on one connection
behind a lock, so threads may share a store.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trellis.silo.jobs.approval import APPROVE, HOLD, REFUSE, VERDICTS, Decision, Offer

STORE_FILE = "jobs.sqlite"
SCHEMA_VERSION = 1
APPROVED = "approved"
REFUSED = "refused"
BY_POLICY = "policy"
BY_OPERATOR = "operator"
# How long a write waits for another process's (`silo jobs approve` beside `silo serve`).
_BUSY_TIMEOUT_S = 10.0

_SCHEMA = """
CREATE TABLE jobs (
    job_id INTEGER PRIMARY KEY,
    federation TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    dataset TEXT NOT NULL,
    operator TEXT NOT NULL,
    public_plan_json TEXT NOT NULL,
    public_sha256 TEXT NOT NULL,
    submission_json TEXT NOT NULL,
    submission_sha256 TEXT NOT NULL,
    signature BLOB NOT NULL,
    operator_certificate_pem BLOB NOT NULL,
    received_at REAL NOT NULL,
    decision TEXT NOT NULL CHECK (decision IN ('approve', 'refuse', 'hold')),
    answer TEXT CHECK (answer IN ('approved', 'refused')),
    reason TEXT NOT NULL,
    answered_at REAL,
    answered_by TEXT NOT NULL CHECK (answered_by IN ('', 'policy', 'operator')),
    sent INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL DEFAULT ''
);
CREATE INDEX jobs_by_submission ON jobs (submission_sha256) WHERE submission_sha256 != '';
"""
_COLUMNS = ("job_id", "federation", "algorithm", "dataset", "operator", "public_plan_json",
            "public_sha256", "submission_json", "submission_sha256", "signature",
            "operator_certificate_pem", "received_at", "decision", "answer", "reason",
            "answered_at", "answered_by", "sent", "state")
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM jobs"


class SiteJobError(ValueError):
    """The job store cannot be opened, or a request to it cannot be done; one line says why."""


class JobNotFound(SiteJobError):
    """No job of that number was ever offered to this silo."""


class NotPending(SiteJobError):
    """The job is not held for a decision: it was answered already."""


@dataclass(frozen=True)
class SiteJob:
    """One job offered to this silo, with the silo's evaluation and answer."""

    job_id: int
    federation: str
    algorithm: str             # "" when the plan did not parse
    dataset: str
    operator: str              # the verified operator; "" when the signature did not verify
    public_plan_json: str
    public_sha256: str         # of the plan offered; "" when it did not parse
    submission_json: str
    submission_sha256: str     # "" unless the signature verified (replays are looked up by it)
    signature: bytes
    operator_certificate_pem: bytes
    received_at: float
    decision: str              # the evaluation: "approve" | "refuse" | "hold"
    answer: str | None         # "approved" | "refused" | None (pending: held for the operator)
    reason: str
    answered_at: float | None
    answered_by: str           # "policy" (automatic) or "operator"; "" while pending
    sent: bool                 # the answer reached the coordinator
    state: str                 # the coordinator's last known state of the job ("" if unknown)

    @property
    def pending(self) -> bool:
        """Whether the job waits for `silo jobs approve` or `refuse`."""
        return self.answer is None


def store_path(state_root: Path) -> Path:
    """Where a silo with this state root keeps its job store."""
    return Path(state_root) / STORE_FILE


def when(timestamp: float) -> str:
    """A Unix time as an operator reads it (UTC, to the second)."""
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class SiteJobStore:
    """The job store of one silo (open it with `SiteJobStore.open`)."""

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        self._db = connection
        self._lock = threading.Lock()
        self.path = path

    @classmethod
    def open(cls, path: Path) -> SiteJobStore:
        """Open the store at `path`, creating it (0600) and its folder if need be."""
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
            db = sqlite3.connect(path, timeout=_BUSY_TIMEOUT_S, isolation_level=None,
                                 check_same_thread=False)
        except OSError as exc:
            raise SiteJobError(f"cannot open the job store {path}: {exc.strerror}") from None
        except sqlite3.Error as exc:
            raise SiteJobError(f"cannot open the job store {path}: {exc}") from None
        try:
            _prepare(db, path)
        except BaseException:
            db.close()
            raise
        return cls(db, path)

    def close(self) -> None:
        """Close the file; the store cannot be used afterwards."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> SiteJobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def record_offer(self, offer: Offer, decision: Decision, *, now: float) -> SiteJob:
        """Record an offer and its evaluation; a job number already recorded is returned as it
        is (an offer sent again changes nothing). "approve" and "refuse" are answered at once,
        by the policy; "hold" waits for the operator."""
        if decision.verdict not in VERDICTS:
            raise SiteJobError(f"decision {decision.verdict!r}: expected one of "
                               + ", ".join(VERDICTS))
        with self._transaction():
            found = self._find(offer.job_id)
            if found is not None:
                return found
            plan, submission = decision.plan, decision.submission
            answer = {APPROVE: APPROVED, REFUSE: REFUSED, HOLD: None}[decision.verdict]
            job = SiteJob(
                job_id=offer.job_id, federation=offer.federation,
                algorithm=plan.algorithm if plan else "", dataset=plan.dataset if plan else "",
                operator=submission.operator if submission else "",
                public_plan_json=offer.public_plan_json,
                public_sha256=plan.sha256() if plan else "",
                submission_json=offer.submission_json,
                submission_sha256=submission.sha256 if submission else "",
                signature=bytes(offer.signature),
                operator_certificate_pem=bytes(offer.operator_certificate_pem),
                received_at=now, decision=decision.verdict, answer=answer,
                reason=decision.reason, answered_at=None if answer is None else now,
                answered_by="" if answer is None else BY_POLICY, sent=False, state="")
            self._db.execute(f"INSERT INTO jobs ({', '.join(_COLUMNS)}) VALUES "
                             f"({', '.join('?' * len(_COLUMNS))})",
                             [getattr(job, c) for c in _COLUMNS])
            return job

    def get(self, job_id: int) -> SiteJob:
        """One job (JobNotFound if it was never offered)."""
        with self._transaction(write=False):
            return self._get(job_id)

    def jobs(self) -> list[SiteJob]:
        """Every job offered, oldest number first."""
        with self._transaction(write=False):
            rows = self._db.execute(f"{_SELECT} ORDER BY job_id").fetchall()
        return [_job(row) for row in rows]

    def approve(self, job_id: int, *, now: float) -> SiteJob:
        """The operator approves a job held for a decision (NotPending if it was answered)."""
        return self._answer(job_id, APPROVED, "approved by this silo's operator "
                                              "(`silo jobs approve`)", now)

    def refuse(self, job_id: int, reason: str, *, now: float) -> SiteJob:
        """The operator refuses a job held for a decision, saying why (sent to the coordinator)."""
        line = " ".join(str(reason).split())
        if not line:
            raise SiteJobError("a refusal needs a reason: the coordinator and the job's "
                               "operator are told it")
        return self._answer(job_id, REFUSED, line, now)

    def unsent(self) -> list[SiteJob]:
        """Answered jobs whose answer has not reached the coordinator yet, oldest first."""
        with self._transaction(write=False):
            rows = self._db.execute(f"{_SELECT} WHERE answer IS NOT NULL AND sent = 0 "
                                    "ORDER BY job_id").fetchall()
        return [_job(row) for row in rows]

    def mark_sent(self, job_id: int) -> None:
        """The coordinator has the answer to this job."""
        with self._transaction():
            job = self._get(job_id)
            if job.answer is None:
                raise NotPending(f"job {job_id} has no answer to send: it awaits `silo jobs "
                                 f"approve {job_id}` or `refuse`")
            self._db.execute("UPDATE jobs SET sent = 1 WHERE job_id = ?", (job_id,))

    def note_state(self, job_id: int, state: str) -> None:
        """What the coordinator last said of the job (running, finished, ...)."""
        with self._transaction():
            self._get(job_id)
            self._db.execute("UPDATE jobs SET state = ? WHERE job_id = ?", (state, job_id))

    def seen_submission(self, submission_sha256: str) -> int | None:
        """The first job a verified statement was offered as (None: never)."""
        if not submission_sha256:
            return None
        with self._transaction(write=False):
            row = self._db.execute("SELECT min(job_id) FROM jobs WHERE submission_sha256 = ?",
                                   (submission_sha256,)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def _answer(self, job_id: int, answer: str, reason: str, now: float) -> SiteJob:
        with self._transaction():
            job = self._get(job_id)
            if job.answer is not None:
                raise NotPending(_answered(job))
            self._db.execute("UPDATE jobs SET answer = ?, reason = ?, answered_at = ?, "
                             "answered_by = ?, sent = 0 WHERE job_id = ?",
                             (answer, reason, now, BY_OPERATOR, job_id))
            return self._get(job_id)

    def _find(self, job_id: int) -> SiteJob | None:
        row = self._db.execute(f"{_SELECT} WHERE job_id = ?", (job_id,)).fetchone()
        return None if row is None else _job(row)

    def _get(self, job_id: int) -> SiteJob:
        job = self._find(job_id)
        if job is None:
            raise JobNotFound(f"no job {job_id} in {self.path}: it was never offered to this "
                              "silo (`silo jobs list` shows those that were)")
        return job

    @contextmanager
    def _transaction(self, *, write: bool = True) -> Iterator[None]:
        """One transaction; a write one takes the file's write lock at once, so that two
        processes never deadlock upgrading a read lock."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.Error as exc:
                raise SiteJobError(f"job store {self.path}: {exc}") from None
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._db.execute("ROLLBACK")
                raise SiteJobError(f"job store {self.path}: {exc}") from None


def _prepare(db: sqlite3.Connection, path: Path) -> None:
    """Set the pragmas, then check the schema version (creating the schema in a new file)."""
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("BEGIN IMMEDIATE")
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                    raise SiteJobError(f"{path} is an SQLite file but not a job store; move "
                                       "it away or give another state root")
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            elif version != SCHEMA_VERSION:
                raise SiteJobError(f"{path} is a job store of schema version {version}; this "
                                   f"silo reads version {SCHEMA_VERSION} (use the silo version "
                                   "that wrote it)")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    except sqlite3.Error as exc:
        raise SiteJobError(f"{path} cannot be read as a job store: {exc}") from None


def _job(row: tuple[Any, ...]) -> SiteJob:
    values = dict(zip(_COLUMNS, row, strict=True))
    values["sent"] = bool(values["sent"])
    values["signature"] = bytes(values["signature"])
    values["operator_certificate_pem"] = bytes(values["operator_certificate_pem"])
    return SiteJob(**values)


def _answered(job: SiteJob) -> str:
    """Why a job cannot be answered by hand: when and how it was answered."""
    at = when(job.answered_at) if job.answered_at is not None else "an unknown time"
    if job.answered_by == BY_POLICY:
        if job.answer == REFUSED:
            return f"job {job.job_id} was refused automatically: {job.reason}"
        return (f"job {job.job_id} was approved automatically on {at}: {job.reason}; only a "
                "job held for a decision can be answered by hand")
    return (f"job {job.job_id} was {job.answer} on {at} by this silo's operator"
            + (f": {job.reason}" if job.answer == REFUSED else
               "; only a job held for a decision can be answered by hand"))
