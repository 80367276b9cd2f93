"""Mask expansion: a cryptographic PRG (AES-256 in counter mode) keyed by a full 256-bit secret."""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from crypto.errors import EncodingError

KEY_BYTES = 32
_NONCE = bytes(16)  # every key is used for exactly one mask: HKDF binds it to the round context
_CHUNK_BYTES = 1 << 24


def expand_mask(key: bytes, length: int, dtype: type[np.unsignedinteger]) -> np.ndarray:
    """Expand a 32-byte key into `length` uniformly random ring elements of `dtype`."""
    if len(key) != KEY_BYTES:
        raise EncodingError("mask key must be 32 bytes")
    if length < 0:
        raise EncodingError("mask length must be non-negative")
    itemsize = np.dtype(dtype).itemsize
    encryptor = Cipher(algorithms.AES(key), modes.CTR(_NONCE)).encryptor()
    out = np.empty(length * itemsize, dtype=np.uint8)
    zeros = bytes(min(_CHUNK_BYTES, out.size))
    for start in range(0, out.size, _CHUNK_BYTES):
        stop = min(start + _CHUNK_BYTES, out.size)
        out[start:stop] = np.frombuffer(encryptor.update(zeros[: stop - start]), dtype=np.uint8)
    return out.view(dtype)
