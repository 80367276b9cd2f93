"""The signed head of an audit log: a sidecar ``<log>.head`` that remembers how long it was.

A log alone cannot show that its last lines were cut off: what remains still chains and its
last checkpoint still verifies. So every time the writer signs a record (a checkpoint, or the
final close) it also replaces ``<log>.head`` atomically with that record's position: how many
records the log had up to and including it, the hash of its line, and the record's own
signature. A log shorter than its head, or whose line at that position hashes differently, has
been cut or rewritten. The head only says "at least": the log may have grown since. A reviewer
archives the ``.head`` with the log (or copies it away while the federation runs), because
whoever can cut the log can also put back an older head.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .certificates import verify_bytes
from .durable import write_atomic
from .errors import AuditError, VerificationFailed

GENESIS = "trellis-audit-v1"
HEAD_FORMAT = "trellis-audit-head-v1"
HEAD_SUFFIX = ".head"
_SIGNED_EVENTS = frozenset({"checkpoint", "close"})


def signed_message(writer: str, event: str, count: int, head: str, ts: str) -> bytes:
    """The bytes a checkpoint or close record's signature covers."""
    # The event and timestamp are signed too: otherwise a truncated log could end in a
    # checkpoint relabelled as "close", or the last record's time could be changed unseen.
    return f"{GENESIS}|{writer}|{event}|{count}|{head}|{ts}".encode()


@dataclass(frozen=True)
class AuditHead:
    """Where a log's latest signed record stands: records up to it and the hash of its line."""

    writer: str
    event: str          # "checkpoint" or "close"
    count: int          # records up to and including the signed one
    head: str           # SHA-256 of the signed record's line
    prev: str           # the hash that record chains to (its "head" field, which it signs)
    ts: str
    signature: str | None

    def to_bytes(self) -> bytes:
        """The sidecar's JSON text."""
        return json.dumps({"format": HEAD_FORMAT, **asdict(self)}, sort_keys=True,
                          indent=1).encode() + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes) -> AuditHead:
        """Parse a sidecar; AuditError names what is wrong with a damaged one."""
        try:
            raw: Any = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise AuditError("not valid JSON") from None
        if not isinstance(raw, dict) or raw.get("format") != HEAD_FORMAT:
            raise AuditError(f"not an audit head (no \"format\": \"{HEAD_FORMAT}\")")
        count = raw.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise AuditError("missing or malformed field 'count'")
        for key in ("writer", "event", "head", "prev", "ts"):
            if not isinstance(raw.get(key), str):
                raise AuditError(f"missing or malformed field {key!r}")
        if raw["event"] not in _SIGNED_EVENTS:
            raise AuditError(f"event {raw['event']!r} is not checkpoint or close")
        signature = raw.get("signature")
        if signature is not None and not isinstance(signature, str):
            raise AuditError("malformed field 'signature'")
        return cls(writer=raw["writer"], event=raw["event"], count=count, head=raw["head"],
                   prev=raw["prev"], ts=raw["ts"], signature=signature)


def head_path(log_path: Path) -> Path:
    """The sidecar of a log: ``audit.jsonl`` -> ``audit.jsonl.head`` beside it."""
    log_path = Path(log_path)
    return log_path.with_name(log_path.name + HEAD_SUFFIX)


def write_head(path: Path, head: AuditHead) -> None:
    """Replace the sidecar atomically (temporary sibling, fsync, rename, fsync the folder)."""
    data = head.to_bytes()
    try:
        write_atomic(path, lambda handle: handle.write(data))
    except OSError as exc:
        raise AuditError(f"cannot write the audit head {path}: {exc.strerror}") from None


def read_head(path: Path) -> AuditHead:
    """Read a sidecar; AuditError if it cannot be read or is damaged."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise AuditError(f"cannot read the audit head {path}: {exc.strerror}") from None
    try:
        return AuditHead.from_bytes(data)
    except AuditError as exc:
        raise AuditError(f"the audit head {path} is damaged: {exc}") from None


def head_problems(head: AuditHead, line_hashes: list[str], writer: str | None,
                  cert_pem: bytes | None) -> list[str]:
    """What is wrong with a log (given by its lines' hashes) measured against its signed head."""
    problems = []
    if writer is not None and head.writer != writer:
        problems.append(f"the signed head is by {head.writer!r} but the log by {writer!r}")
    if len(line_hashes) < head.count:
        problems.append(f"log has {len(line_hashes)} records; its signed head (written at "
                        f"{head.ts}) says at least {head.count}: its end was cut off")
    elif line_hashes[head.count - 1] != head.head:
        problems.append(f"line {head.count} is not the record its signed head (written at "
                        f"{head.ts}) names: the log was rewritten up to there")
    if cert_pem is not None:
        problems.extend(_signature_problems(head, cert_pem))
    return problems


def _signature_problems(head: AuditHead, cert_pem: bytes) -> list[str]:
    if head.signature is None:
        return ["the signed head carries no signature"]
    try:
        signature = base64.b64decode(head.signature, validate=True)
    except (binascii.Error, ValueError):
        return ["the signed head's signature does not verify"]
    message = signed_message(head.writer, head.event, head.count - 1, head.prev, head.ts)
    try:
        verify_bytes(cert_pem, message, signature)
    except VerificationFailed:
        return ["the signed head's signature does not verify (forged, or another writer's)"]
    return []
