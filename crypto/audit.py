"""Tamper-evident audit trail: hash-chained JSON lines with signed checkpoints (DESIGN.md s. 6).

Each line holds the SHA-256 of the previous line's bytes, so editing, removing or
reordering a line breaks the chain at the next one. Checkpoint and close records carry an
ECDSA signature by the writer's key over everything in the record, so a verifier holding
the writer's certificate can also tell that the last record is genuine, and the final
"close" record shows that the log was not truncated after it.

Cutting lines off the end leaves a log whose chain still holds, so each signed record is also
written to a sidecar ``<log>.head`` (crypto/audit_head.py) and the verifier measures the log
against it. A log that does not end with its close record fails verification, unless its
writer still holds the log's lock: then it is reported "open" (the writer is still running).
A writer killed and restarted resumes the same chain; only the end of the log must be a close.

Over 400 lines because the writer and the verifier of the format are kept together, so that a
change to one is seen beside the other.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

from .audit_head import (
    GENESIS,
    AuditHead,
    head_path,
    head_problems,
    read_head,
    signed_message,
    write_head,
)
from .certificates import certificate_subject, sign_bytes, verify_bytes
from .durable import (
    fsync_dir,
    held_exclusively,
    lock_exclusive,
    open_append_private,
    uninterrupted,
)
from .errors import AuditError, PkiError, VerificationFailed
from .pem import load_private_key

__all__ = ["GENESIS", "AuditHead", "AuditLog", "AuditReport", "format_report", "head_path",
           "verify_audit_log", "writer_running"]
CHECKPOINT = "checkpoint"
CLOSE = "close"

_RESERVED_FIELDS = frozenset({"seq", "ts", "writer", "event", "prev"})
# Only the log's own checkpoint and close records may carry a signature.
_USER_RESERVED_FIELDS = _RESERVED_FIELDS | {"signature"}
_SIGNED_EVENTS = frozenset({CHECKPOINT, CLOSE})
_SIGNED_FIELDS = frozenset({"head", "count", "signature"})
_BROKEN_CHAIN = "hash chain broken (line edited, removed or reordered before this point)"


def _sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _encode(record: dict[str, Any]) -> bytes:
    return json.dumps(
        record, separators=(",", ":"), sort_keys=True, ensure_ascii=True, allow_nan=False
    ).encode("ascii")


class AuditLog:
    """Append-only, hash-chained JSONL audit log; resumes the chain of an existing file."""

    def __init__(
        self,
        path: Path,
        *,
        writer: str,
        signing_key_pem: bytes | None = None,
        checkpoint_every: int = 50,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(writer, str) or not writer:
            raise AuditError("audit log writer must be a non-empty string")
        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int):
            raise AuditError("checkpoint_every must be a positive integer")
        if checkpoint_every < 1:
            raise AuditError("checkpoint_every must be a positive integer")
        if signing_key_pem is not None:
            try:
                load_private_key(signing_key_pem)
            except PkiError:
                raise AuditError("audit signing key is not an ECDSA P-256 private key") from None
        self.path = Path(path)
        self.writer = writer
        self._key = signing_key_pem
        self._checkpoint_every = checkpoint_every
        self._clock = clock
        self._lock = threading.Lock()
        self._broken = False
        self._observers: list[Callable[[dict[str, Any]], None]] = []
        # The file is locked before it is read, so no other writer can extend it meanwhile.
        self._handle: BinaryIO | None = self._open()
        try:
            self._seq, self._prev, self._unsigned = self._resume()
        except BaseException:
            self._release()
            raise

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one record (and a signed checkpoint when one is due); return the record."""
        if not isinstance(event, str) or not event:
            raise AuditError("audit event must be a non-empty string")
        if event in _SIGNED_EVENTS:
            raise AuditError(f"audit event {event!r} is reserved for the log itself")
        reserved = sorted(_USER_RESERVED_FIELDS.intersection(fields))
        if reserved:
            raise AuditError(f"audit field names {reserved} are reserved")
        try:
            for name, value in fields.items():
                _check_value(value, name)
        except RecursionError:
            raise AuditError("audit fields are nested too deeply or refer to themselves") from None
        with self._lock:
            record = self._write({"event": event, **fields})
            self._unsigned += 1
            if self._key is not None and self._unsigned >= self._checkpoint_every:
                self._write_signed(CHECKPOINT)
        for observer in self._observers:
            observer(record)
        return record

    def observe(self, observer: Callable[[dict[str, Any]], None]) -> None:
        """Call observer with every record appended from now on, once it is written.

        Observers (operational metrics) see what the log says, after it says it; they must not
        raise, and they run on the appending thread.
        """
        self._observers.append(observer)

    def checkpoint(self) -> bool:
        """Append a signed checkpoint and update the head now; False if unsigned or nothing new."""
        with self._lock:
            if self._handle is None or self._broken:
                raise AuditError(f"audit log {self.path} is closed")
            if self._key is None or self._unsigned == 0:
                return False
            self._write_signed(CHECKPOINT)
            return True

    def close(self) -> None:
        """Append the final (signed, if a key was given) "close" record and close the file."""
        with self._lock:
            if self._handle is None:
                return
            try:
                if not self._broken:
                    self._write_signed(CLOSE)
            finally:
                self._release()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _write_signed(self, event: str) -> None:
        record: dict[str, Any] = {"event": event, "head": self._prev, "count": self._seq}
        ts = self._timestamp()
        if self._key is not None:
            message = signed_message(self.writer, event, self._seq, self._prev, ts)
            record["signature"] = base64.b64encode(sign_bytes(self._key, message)).decode()
        prev = self._prev
        self._write(record, ts=ts)
        self._unsigned = 0
        # After the record: a crash between the two leaves a head one checkpoint behind, which
        # still says "at least" truly; the reverse order could claim a record never written.
        write_head(head_path(self.path), AuditHead(
            writer=self.writer, event=event, count=self._seq, head=self._prev, prev=prev,
            ts=ts, signature=record.get("signature")))

    def _write(self, body: dict[str, Any], *, ts: str | None = None) -> dict[str, Any]:
        if self._handle is None or self._broken:
            raise AuditError(f"audit log {self.path} is closed")
        record = {
            **body,
            "seq": self._seq,
            "ts": ts if ts is not None else self._timestamp(),
            "writer": self.writer,
            "prev": self._prev,
        }
        try:
            line = _encode(record)
        except (TypeError, ValueError) as exc:
            raise AuditError(f"audit record cannot be encoded as JSON: {exc}") from None
        # A stop request (SIGTERM) waits for the end of this: a record on disk whose sequence
        # number and hash were not yet taken would make the next record break the chain.
        with uninterrupted():
            try:
                self._handle.write(line + b"\n")
                self._handle.flush()
                os.fsync(self._handle.fileno())
            except OSError as exc:
                # The file may now end in a partial line: refuse to chain anything onto it.
                self._broken = True
                raise AuditError(f"cannot write audit log {self.path}: {exc.strerror}") from None
            self._seq += 1
            self._prev = _sha256_hex(line)
        return record

    def _timestamp(self) -> str:
        moment = datetime.fromtimestamp(self._clock(), tz=UTC)
        return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")

    def _resume(self) -> tuple[int, str, int]:
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise AuditError(f"cannot read audit log {self.path}: {exc.strerror}") from None
        scan = _scan(data, cert_pem=None)
        if scan.problems:
            raise AuditError(
                f"cannot resume audit log {self.path}: {scan.problems[0]}"
                f" ({len(scan.problems)} problem(s) in total)"
            )
        self._check_head(scan)
        return scan.records, scan.head, scan.unsigned_tail

    def _check_head(self, scan: _Scan) -> None:
        """Refuse to extend a log cut while no writer held it: the next head would hide it."""
        sidecar = head_path(self.path)
        if not sidecar.exists():
            return
        problems = head_problems(read_head(sidecar), scan.hashes, self.writer, cert_pem=None)
        if problems:
            raise AuditError(
                f"cannot resume audit log {self.path}: {problems[0]}; keep it and {sidecar.name} "
                "for review and move both away to start a new log"
            )

    def _open(self) -> BinaryIO:
        is_new = not self.path.exists()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = open_append_private(self.path)
        except OSError as exc:
            raise AuditError(f"cannot open audit log {self.path}: {exc.strerror}") from None
        if not lock_exclusive(handle.fileno()):
            handle.close()
            raise AuditError(f"audit log {self.path} is already open by another writer")
        if is_new:
            fsync_dir(self.path.parent)
        return handle

    def _release(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


@dataclass
class AuditReport:
    """Outcome of verifying an audit log."""

    path: Path
    records: int
    checkpoints: int
    closed: bool
    problems: list[str]
    signatures_checked: bool = False
    open: bool = False                  # not closed, and its writer holds it: still running
    head: AuditHead | None = None       # the signed head it was measured against, if any
    head_file: Path | None = None

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems


def verify_audit_log(path: Path, *, cert_pem: bytes | None = None,
                     head: Path | None = None) -> AuditReport:
    """Check an audit log's chain, signatures (given the writer's cert), head and ending.

    The signed head is read from ``head`` or, by default, from ``<log>.head`` when present.
    A log that does not end with its close record fails unless its writer is still running.
    """
    path = Path(path)
    if cert_pem is not None:
        # Fails early with a clear message rather than one bad signature per checkpoint.
        certificate_subject(cert_pem)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise AuditError(f"cannot read audit log {path}: {exc.strerror}") from None
    scan = _scan(data, cert_pem=cert_pem)
    report = AuditReport(
        path=path,
        records=scan.records,
        checkpoints=scan.checkpoints,
        closed=scan.closed,
        problems=scan.problems,
        signatures_checked=cert_pem is not None,
    )
    sidecar = head if head is not None else head_path(path)
    if head is not None or sidecar.exists():
        report.head_file = sidecar
        try:
            report.head = read_head(sidecar)
        except AuditError as exc:
            if not sidecar.exists():
                raise
            report.problems.append(str(exc))
    if report.head is not None:
        report.problems.extend(head_problems(report.head, scan.hashes, scan.writer, cert_pem))
    if not scan.closed:
        report.open = writer_running(path)
        if not report.open:
            expected = max(scan.records, report.head.count if report.head else 0) + 1
            report.problems.append(
                f"log ends without its closing entry after {scan.records} records; expected at "
                f"least {expected}: its end was cut off, or its writer was killed (restarting "
                "that coordinator or silo on the same state folder resumes and closes it)"
            )
    return report


def writer_running(path: Path) -> bool:
    """Whether a writer holds the log open now (it keeps an exclusive lock while it runs)."""
    try:
        handle = open(path, "rb")
    except OSError:
        return False
    with handle:
        return held_exclusively(handle.fileno())


def format_report(report: AuditReport) -> str:
    """Render an AuditReport as a short human-readable summary."""
    if not report.signatures_checked:
        signatures = "signatures not checked (no certificate given)"
    elif report.ok:
        signatures = "signatures verified against the given certificate"
    else:
        # Never "verified" in a failing report: the problems below say which did not.
        signatures = "signatures checked against the given certificate"
    if report.closed:
        closed = "yes"
    elif report.open:
        closed = "no; open: the writer is still running (check again once it has finished)"
    else:
        closed = "no"
    if report.head is not None:
        head = (f"signed head: at least {report.head.count} records at {report.head.ts} "
                f"({report.head_file})")
    elif report.head_file is not None:
        head = f"signed head: unreadable ({report.head_file})"
    else:
        head = (f"signed head: none (no {head_path(report.path).name} beside the log: a cut "
                "after the last signed record could not be told)")
    lines = [
        f"audit log: {report.path}",
        f"records: {report.records}",
        f"signed checkpoints: {report.checkpoints}, {signatures}",
        head,
        f"closed: {closed}",
    ]
    if report.ok:
        lines.append(f"OK: {report.records} records, chain intact")
    else:
        lines.extend(f"FAILED: {problem}" for problem in report.problems)
    return "\n".join(lines)


@dataclass
class _Scan:
    records: int = 0
    checkpoints: int = 0
    closed: bool = False
    head: str = field(default_factory=lambda: _sha256_hex(GENESIS.encode()))
    unsigned_tail: int = 0
    problems: list[str] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)     # of each line, for the signed head
    writer: str | None = None                           # the first record's


def _scan(data: bytes, *, cert_pem: bytes | None) -> _Scan:
    scan = _Scan()
    if not data:
        return scan
    lines = data.split(b"\n")
    complete = lines[-1] == b""
    if complete:
        lines.pop()
    expected_seq = 0
    for number, line in enumerate(lines, start=1):
        record = _parse(line)
        problems = _check_record(record, line, expected_seq, scan.head, cert_pem, scan)
        scan.problems.extend(f"line {number}: {problem}" for problem in problems)
        scan.head = _sha256_hex(line)
        scan.hashes.append(scan.head)
        if scan.writer is None and record is not None and isinstance(record.get("writer"), str):
            scan.writer = record["writer"]
        scan.records += 1
        scan.closed = record is not None and record.get("event") == CLOSE
        expected_seq += 1
        if record is not None and _is_int(record.get("seq")):
            # Resynchronise so that one missing line is reported once, not on every line.
            expected_seq = record["seq"] + 1
    if not complete:
        scan.problems.append(f"line {len(lines)}: incomplete final line (no newline)")
    return scan


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_record(
    record: dict[str, Any] | None,
    line: bytes,
    expected_seq: int,
    expected_prev: str,
    cert_pem: bytes | None,
    scan: _Scan,
) -> list[str]:
    if record is None:
        return ["not valid JSON (or not a JSON object)"]
    problems: list[str] = []
    if not _is_int(record.get("seq")):
        problems.append("missing or malformed field 'seq'")
    for key in ("ts", "writer", "event", "prev"):
        if not isinstance(record.get(key), str):
            problems.append(f"missing or malformed field {key!r}")
    if problems:
        return problems
    if record["prev"] != expected_prev:
        problems.append(_BROKEN_CHAIN)
    if record["seq"] != expected_seq:
        problems.append(f"sequence number {record['seq']}, expected {expected_seq}")
    try:
        canonical = _encode(record) == line
    except ValueError:
        canonical = False
    if not canonical:
        problems.append("record is not in canonical form (compact JSON, sorted keys)")
    if record["event"] in _SIGNED_EVENTS:
        problems.extend(_check_signed(record, cert_pem, scan))
    elif "signature" in record:
        problems.append(f"unexpected signature on a {record['event']!r} record")
    else:
        scan.unsigned_tail += 1
    return problems


def _check_signed(record: dict[str, Any], cert_pem: bytes | None, scan: _Scan) -> list[str]:
    event = record["event"]
    extra = sorted(set(record) - _RESERVED_FIELDS - _SIGNED_FIELDS)
    if extra:
        return [f"{event} record has unexpected fields {extra}"]
    if record.get("head") != record["prev"] or not _is_int(record.get("count")):
        return [f"{event} record does not match its position in the log"]
    if record["count"] != record["seq"]:
        return [f"{event} record does not match its position in the log"]
    signature_text = record.get("signature")
    if signature_text is None:
        if event == CHECKPOINT:
            return ["checkpoint record has no signature"]
        # An unsigned close comes from a writer without a key; it cannot show more.
        return []
    scan.checkpoints += 1
    scan.unsigned_tail = 0
    if cert_pem is None:
        return []
    if not isinstance(signature_text, str):
        return [f"{event} signature does not verify"]
    try:
        signature = base64.b64decode(signature_text, validate=True)
    except (binascii.Error, ValueError):
        return [f"{event} signature does not verify"]
    # Base64 padding bits are ignored on decode; insist on the one canonical spelling.
    if base64.b64encode(signature).decode() != signature_text:
        return [f"{event} signature does not verify"]
    message = signed_message(
        record["writer"], event, record["count"], record["head"], record["ts"]
    )
    try:
        verify_bytes(cert_pem, message, signature)
    except VerificationFailed:
        return [f"{event} signature does not verify"]
    return []


def _check_value(value: Any, where: str) -> None:
    # Only plain JSON data is allowed, which keeps tensors and arrays out by construction.
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise AuditError(f"audit field {where!r} is not a finite number")
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_value(item, f"{where}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise AuditError(f"audit field {where!r} has a non-string key")
            _check_value(item, f"{where}.{key}")
        return
    raise AuditError(
        f"audit field {where!r} has type {type(value).__name__}; "
        "only JSON strings, numbers, booleans, null, lists and dicts are allowed"
    )
