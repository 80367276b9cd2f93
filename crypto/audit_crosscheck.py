"""Match what a silo's audit log says it sent with what the coordinator's says it received.

Both sides hash the same bytes of four kinds of upload, so a reviewer can pair them on
(silo, round, attempt, kind) and compare the digests without trusting either side:

| kind             | silo record                | coordinator record                   |
| ---------------- | -------------------------- | ------------------------------------ |
| masked_input     | sent_tensor                | received_tensor, phase MASKED_INPUT  |
| sealed_envelope  | sent_envelope              | received_blobs, phase MASKED_INPUT   |
| group_seal       | sealed_group_secrets       | received_blobs, phase GROUP_SEAL     |
| encrypted_update | sent_encrypted_update      | received_blobs, phase ENCRYPT_UPDATE |

Key adverts, sealed shares, survivor signatures, revealed shares and metrics are recorded by
the silo but not hashed by the coordinator, so they are not compared. An upload the
coordinator refused is in neither log: it records an upload once it has accepted it, and the
silo once the call has returned. So a silo-only upload means the coordinator's log lost it; a
coordinator-only one means the silo's log lost it, or the silo died (or its connection did)
between the coordinator's acceptance and the answer. The second case is told apart where the
silo's log shows it: the silo's records stop during that very round and attempt and its log
then restarts (`resumed`, or the federation `joined` again). Such an upload is listed as
interrupted, not as a discrepancy: a silo killed mid-call leaves exactly this trace, and any
other coordinator-only upload still fails the check. This module reads JSON records only.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import AuditError

COORDINATOR_WRITER = "coordinator"
_SILO_KINDS = {
    "sent_tensor": "masked_input",
    "sent_envelope": "sealed_envelope",
    "sealed_group_secrets": "group_seal",
    "sent_encrypted_update": "encrypted_update",
}
_COORDINATOR_KINDS = {
    ("received_tensor", "MASKED_INPUT"): "masked_input",
    ("received_blobs", "MASKED_INPUT"): "sealed_envelope",
    ("received_blobs", "GROUP_SEAL"): "group_seal",
    ("received_blobs", "ENCRYPT_UPDATE"): "encrypted_update",
}

Record = tuple[int, dict[str, Any]]           # (line number, record)
_Key = tuple[int, int, str]                   # (round, attempt, kind)


@dataclass(frozen=True)
class Upload:
    """One upload as one log records it."""

    round: int
    attempt: int
    kind: str
    sha256: str
    line: int


@dataclass(frozen=True)
class Discrepancy:
    """An upload the two logs do not agree on: a differing digest, or one side lacks it."""

    round: int
    attempt: int
    kind: str
    silo: Upload | None
    coordinator: Upload | None

    def describe(self) -> str:
        """One line for the reviewer."""
        where = f"round {self.round} attempt {self.attempt} {self.kind}"
        if self.silo is not None and self.coordinator is not None:
            return (f"{where}: the silo sent sha256 {self.silo.sha256} (silo log line "
                    f"{self.silo.line}) but the coordinator recorded {self.coordinator.sha256} "
                    f"(coordinator log line {self.coordinator.line})")
        if self.silo is not None:
            return (f"{where}: in the silo's log (line {self.silo.line}, sha256 "
                    f"{self.silo.sha256}) but not in the coordinator's")
        shown = self.coordinator
        return (f"{where}: in the coordinator's log (line {shown.line if shown else '?'}, "
                f"sha256 {shown.sha256 if shown else '?'}) but not in the silo's")

    def to_json(self) -> dict[str, Any]:
        """Machine-readable form."""
        return {"round": self.round, "attempt": self.attempt, "kind": self.kind,
                "silo_sha256": self.silo.sha256 if self.silo else None,
                "silo_line": self.silo.line if self.silo else None,
                "coordinator_sha256": self.coordinator.sha256 if self.coordinator else None,
                "coordinator_line": self.coordinator.line if self.coordinator else None,
                "problem": self.describe()}


@dataclass(frozen=True)
class Interrupted:
    """A coordinator-only upload of the round and attempt during which the silo's log stops
    and then restarts: the silo stopped before the coordinator's answer reached it."""

    upload: Upload
    restart_line: int                # the silo log's `resumed` or repeated `joined` record

    def describe(self) -> str:
        """One line for the reviewer."""
        u = self.upload
        return (f"round {u.round} attempt {u.attempt} {u.kind}: in the coordinator's log (line "
                f"{u.line}, sha256 {u.sha256}) but not in the silo's, whose records stop during "
                f"that round and restart at line {self.restart_line}: the silo stopped before "
                "the coordinator's answer reached it")

    def to_json(self) -> dict[str, Any]:
        """Machine-readable form."""
        return {"round": self.upload.round, "attempt": self.upload.attempt,
                "kind": self.upload.kind, "coordinator_sha256": self.upload.sha256,
                "coordinator_line": self.upload.line, "silo_restart_line": self.restart_line,
                "note": self.describe()}


@dataclass
class CrossCheck:
    """The outcome: the silo's name, how many uploads matched, and every disagreement."""

    silo: str
    matched: int
    discrepancies: list[Discrepancy]
    problems: list[str]              # about the pair of logs rather than one upload
    interrupted: list[Interrupted] = field(default_factory=list)  # explained, not failures

    @property
    def ok(self) -> bool:
        """True when both logs agree on every upload."""
        return not self.discrepancies and not self.problems


def read_records(path: Path) -> list[Record]:
    """The JSON objects of a log with their line numbers (unparsable lines are skipped:
    verification reports them)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise AuditError(f"cannot read audit log {path}: {exc.strerror}") from None
    records = []
    for number, line in enumerate(data.splitlines(), start=1):
        try:
            record = json.loads(line)
        except (UnicodeDecodeError, ValueError, RecursionError):
            continue
        if isinstance(record, dict):
            records.append((number, record))
    return records


def cross_check(silo_records: list[Record], coordinator_records: list[Record]) -> CrossCheck:
    """Pair the silo's uploads with the coordinator's receipts and list every disagreement."""
    silo = _writer(silo_records, "silo")
    if silo == COORDINATOR_WRITER:
        raise AuditError("the first log is the coordinator's; give the silo's log first")
    writer = _writer(coordinator_records, "coordinator")
    if writer != COORDINATOR_WRITER:
        raise AuditError(f"the second log is written by {writer!r}, not by the coordinator; "
                         "give the coordinator's log second")
    federations = _recorded(coordinator_records, "serve", "federation")
    _same_federation_and_run(silo_records, coordinator_records)
    problems = []
    silo_uploads, silo_problems = _silo_uploads(silo_records, federations)
    problems.extend(silo_problems)
    if not any(r.get("silo") == silo for _, r in coordinator_records):
        problems.append(f"the coordinator's log never names silo {silo!r}: are these logs "
                        f"of the same federation ({', '.join(sorted(federations)) or '?'})?")
    coordinator_uploads = _coordinator_uploads(coordinator_records, silo)
    matched, discrepancies = _match(silo_uploads, coordinator_uploads)
    stops = _stops_before_restarts(silo_records, federations)
    interrupted, unexplained = [], []
    for d in discrepancies:
        restart = stops.get((d.round, d.attempt)) if d.silo is None else None
        if d.coordinator is not None and restart is not None:
            interrupted.append(Interrupted(d.coordinator, restart))
        else:
            unexplained.append(d)
    return CrossCheck(silo=silo, matched=matched, discrepancies=unexplained,
                      problems=problems, interrupted=interrupted)


def _stops_before_restarts(records: list[Record], federations: set[str]
                           ) -> dict[tuple[int, int], int]:
    """(round, attempt) the silo's records had reached when its log restarts, mapped to the
    restart's line: a `resumed` record, or a second `joined` of the same federation."""
    stops: dict[tuple[int, int], int] = {}
    joined: set[str] = set()
    reached: tuple[int, int] | None = None
    for line, record in records:
        event = record.get("event")
        federation = record.get("federation")
        restart = event == "resumed" or (event == "joined" and federation in joined)
        if restart:
            if reached is not None:
                stops.setdefault(reached, line)
            reached = None
        if event == "joined" and isinstance(federation, str) and (
                not federations or federation in federations):
            joined.add(federation)
            continue
        if event == "resumed":
            continue
        if (at := _round_attempt(record)) is not None:
            reached = max(reached or at, at)
    return stops


def _recorded(records: list[Record], event: str, field: str) -> set[str]:
    """Every value of ``field`` the log's ``event`` records name."""
    return {r[field] for _, r in records
            if r.get("event") == event and isinstance(r.get(field), str)}


def _same_federation_and_run(silo: list[Record], coordinator: list[Record]) -> None:
    """Stop at once when the two logs share no federation (or, where both record it, no run):
    matched upload by upload, such a pair only lists every upload as missing from one side."""
    joined, served = _recorded(silo, "joined", "federation"), _recorded(coordinator, "serve",
                                                                        "federation")
    if joined and served and not joined & served:
        raise AuditError(f"these logs are of different federations: the silo's log is of "
                         f"{_names(joined)}, the coordinator's of {_names(served)}; cross-check "
                         "a silo's log against the coordinator log of the federation it joined")
    joined_runs = _recorded(silo, "joined", "run_id")
    served_runs = _recorded(coordinator, "serve", "run_id")
    if joined_runs and served_runs and not joined_runs & served_runs:
        raise AuditError(f"these logs are of different runs of federation {_names(served)}: "
                         f"the silo's log is of run {_names(joined_runs)}, the coordinator's "
                         f"of run {_names(served_runs)}; cross-check a silo's log against the "
                         "coordinator log of the run it joined")


def _names(values: set[str]) -> str:
    return ", ".join(repr(v) for v in sorted(values))


def _writer(records: list[Record], side: str) -> str:
    for _, record in records:
        if isinstance(record.get("writer"), str):
            return str(record["writer"])
    raise AuditError(f"the {side}'s log has no records")


def _silo_uploads(records: list[Record], federations: set[str]
                  ) -> tuple[list[Upload], list[str]]:
    """The silo's uploads in the coordinator's federation (a reused state folder may hold
    the records of several: each belongs to the federation of the last "joined" before it)."""
    uploads, problems = [], []
    current: str | None = None
    for line, record in records:
        event = record.get("event")
        if event == "joined":
            current = record.get("federation")
            continue
        kind = _SILO_KINDS.get(event) if isinstance(event, str) else None
        if kind is None or (federations and current is not None and current not in federations):
            continue
        upload = _upload(record, kind, line)
        if upload is None:
            problems.append(f"silo log line {line}: {event} record lacks its round, attempt "
                            "or sha256 (written by an older version?)")
        else:
            uploads.append(upload)
    return uploads, problems


def _coordinator_uploads(records: list[Record], silo: str) -> list[Upload]:
    uploads = []
    for line, record in records:
        kind = _COORDINATOR_KINDS.get((str(record.get("event")), str(record.get("phase"))))
        if kind is None:
            if record.get("event") in ("received_tensor", "received_blobs"):
                kind = f"{record['event']}:{record.get('phase')}"    # unknown: shown unmatched
            else:
                continue
        if record.get("silo") != silo:
            continue
        upload = _upload(record, kind, line)
        if upload is not None:
            uploads.append(upload)
    return uploads


def _round_attempt(record: dict[str, Any]) -> tuple[int, int] | None:
    """A record's (round, attempt), when it names both as integers."""
    numbers = [n for n in (record.get("round"), record.get("attempt"))
               if isinstance(n, int) and not isinstance(n, bool)]
    return (numbers[0], numbers[1]) if len(numbers) == 2 else None


def _upload(record: dict[str, Any], kind: str, line: int) -> Upload | None:
    at, sha = _round_attempt(record), record.get("sha256")
    if at is None or not isinstance(sha, str):
        return None
    return Upload(round=at[0], attempt=at[1], kind=kind, sha256=sha, line=line)


def _match(silo: Iterable[Upload], coordinator: Iterable[Upload]
           ) -> tuple[int, list[Discrepancy]]:
    sides: dict[_Key, tuple[list[Upload], list[Upload]]] = defaultdict(lambda: ([], []))
    for upload in silo:
        sides[(upload.round, upload.attempt, upload.kind)][0].append(upload)
    for upload in coordinator:
        sides[(upload.round, upload.attempt, upload.kind)][1].append(upload)
    matched, discrepancies = 0, []
    for (round_, attempt, kind), (sent, received) in sorted(sides.items()):
        # Equal digests pair off first (a key may repeat, e.g. a retried call), then what is
        # left pairs as "differs", and the rest is one side's alone.
        left = list(received)
        unpaired = []
        for upload in sent:
            twin = next((r for r in left if r.sha256 == upload.sha256), None)
            if twin is None:
                unpaired.append(upload)
            else:
                left.remove(twin)
                matched += 1
        for index in range(max(len(unpaired), len(left))):
            discrepancies.append(Discrepancy(
                round_, attempt, kind,
                silo=unpaired[index] if index < len(unpaired) else None,
                coordinator=left[index] if index < len(left) else None))
    return matched, discrepancies
