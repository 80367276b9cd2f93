"""Sealed envelopes of a fixed size: a set of records padded with dummies, under the group key.

FedHGN's silos exchange their coefficient vectors through the coordinator (DESIGN.md §2). Each
silo packs its records (opaque bytes, all of one length) into `slots` slots, marks every slot as
real or dummy inside the plaintext, fills dummies with random bytes and encrypts the whole with
AES-256-GCM under the silo group key (crypto/groupkey.py). Every envelope of a federation thus
has the same length whatever the number of real records, and only group members can open one.

Layout of the plaintext: b"TEV", version, slot count, record length, then per slot one flag
byte (1 real, 0 dummy) and the record. The ciphertext is nonce || AES-GCM(plaintext, aad).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from trellis.crypto.errors import ProtocolError, VerificationFailed
from trellis.crypto.groupkey import GROUP_KEY_BYTES
from trellis.crypto.keyagreement import encode_fields
from trellis.crypto.sharebox import NONCE_BYTES, TAG_BYTES

_MAGIC = b"TEV"
_VERSION = 1
_HEADER = struct.Struct(">3sBII")
_REAL, _DUMMY = 1, 0


def sealed_size(slots: int, record_bytes: int) -> int:
    """Length in bytes of every envelope with this many slots of this record length."""
    return NONCE_BYTES + _HEADER.size + slots * (1 + record_bytes) + TAG_BYTES


def envelope_aad(federation: str, purpose: str, *, run: str, job: str = "") -> bytes:
    """Associated data binding an envelope to its use and to the run of its federation."""
    return encode_fields("envelope", (("purpose", purpose), ("federation", federation),
                                      ("run", run), ("job", job)))


def seal_records(group_key: bytes, records: Sequence[bytes], *, slots: int,
                 record_bytes: int, aad: bytes,
                 random_bytes: Callable[[int], bytes] = os.urandom) -> bytes:
    """Pad the records to `slots` with marked dummies and encrypt under the group key."""
    _check_key(group_key)
    if len(records) > slots:
        raise ProtocolError(f"{len(records)} records do not fit in {slots} envelope slots")
    if any(not isinstance(r, bytes) or len(r) != record_bytes for r in records):
        raise ProtocolError(f"every record must be {record_bytes} bytes")
    parts = [_HEADER.pack(_MAGIC, _VERSION, slots, record_bytes)]
    for record in records:
        parts += [bytes([_REAL]), record]
    for _ in range(slots - len(records)):
        parts += [bytes([_DUMMY]), random_bytes(record_bytes)]
    nonce = random_bytes(NONCE_BYTES)
    return nonce + AESGCM(group_key).encrypt(nonce, b"".join(parts), aad)


def open_records(group_key: bytes, envelope: bytes, *, slots: int, record_bytes: int,
                 aad: bytes) -> list[bytes]:
    """Decrypt an envelope and return its real records (dummies dropped)."""
    _check_key(group_key)
    if not isinstance(envelope, bytes) or len(envelope) != sealed_size(slots, record_bytes):
        raise ProtocolError(f"an envelope must be {sealed_size(slots, record_bytes)} bytes")
    try:
        plain = AESGCM(group_key).decrypt(envelope[:NONCE_BYTES], envelope[NONCE_BYTES:], aad)
    except InvalidTag:
        raise VerificationFailed("envelope does not authenticate under the group key "
                                 "(tampered, or sealed for another federation or run)") from None
    magic, version, count, length = _HEADER.unpack_from(plain)
    if (magic, version, count, length) != (_MAGIC, _VERSION, slots, record_bytes):
        raise ProtocolError("envelope header does not match the federation's envelope format")
    records = []
    step = 1 + record_bytes
    for offset in range(_HEADER.size, len(plain), step):
        flag = plain[offset]
        if flag not in (_REAL, _DUMMY):
            raise ProtocolError(f"envelope slot flag {flag} is neither real nor dummy")
        if flag == _REAL:
            records.append(plain[offset + 1:offset + step])
    return records


def _check_key(group_key: bytes) -> None:
    if not isinstance(group_key, bytes) or len(group_key) != GROUP_KEY_BYTES:
        raise ProtocolError(f"the group key must be {GROUP_KEY_BYTES} bytes")
