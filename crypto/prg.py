"""Mask expansion: a cryptographic PRG (AES-256 in counter mode) keyed by a full 256-bit secret."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from trellis.crypto.errors import EncodingError

KEY_BYTES = 32
_NONCE = bytes(16)  # every key is used for exactly one mask: HKDF binds it to the round context
_CHUNK_BYTES = 1 << 24


def expand_mask(key: bytes, length: int, dtype: type[np.unsignedinteger]) -> np.ndarray:
    """Expand a 32-byte key into `length` uniformly random ring elements of `dtype`."""
    if length < 0:
        raise EncodingError("mask length must be non-negative")
    out = np.zeros(length, dtype=dtype)
    apply_masks(out, add=[key], subtract=[])
    return out


def apply_masks(target: np.ndarray, add: Iterable[bytes], subtract: Iterable[bytes]) -> None:
    """Add PRG(k) for every key in `add` and subtract it for every key in `subtract`, in place.

    The ring is the wrap-around arithmetic of target's unsigned dtype. Keystream is produced in
    chunks into one reused buffer, so memory stays at one chunk whatever the vector length.
    """
    if target.ndim != 1 or target.dtype not in (np.uint32, np.uint64):
        raise EncodingError("masks apply to 1-d uint32 or uint64 vectors")
    if not target.flags.c_contiguous or not target.flags.writeable:
        raise EncodingError("masks apply to a writeable contiguous vector")
    itemsize = target.dtype.itemsize
    chunk_items = max(1, _CHUNK_BYTES // itemsize)
    zeros = bytes(min(chunk_items, target.size) * itemsize)
    buffer = bytearray(len(zeros) + 16)
    for sign, keys in ((1, add), (-1, subtract)):
        for key in keys:
            if len(key) != KEY_BYTES:
                raise EncodingError("mask key must be 32 bytes")
            encryptor = Cipher(algorithms.AES(key), modes.CTR(_NONCE)).encryptor()
            for start in range(0, target.size, chunk_items):
                stop = min(start + chunk_items, target.size)
                nbytes = (stop - start) * itemsize
                encryptor.update_into(memoryview(zeros)[:nbytes], buffer)
                stream = np.frombuffer(buffer, dtype=target.dtype, count=stop - start)
                if sign > 0:
                    target[start:stop] += stream
                else:
                    target[start:stop] -= stream
