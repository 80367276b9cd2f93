"""FedHGN's coefficient rows as envelope records (crypto/envelopes.py seals them).

A record is one relation's coefficient vector as little-endian float32 bytes. Records carry no
relation name and leave in no meaningful order: a receiver pools them with every other silo's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_DTYPE = np.dtype("<f4")


def record_bytes(bases: int) -> int:
    """Bytes of one record for vectors of `bases` coefficients."""
    return bases * _DTYPE.itemsize


def rows_to_records(rows: np.ndarray) -> list[bytes]:
    """One record per row, rows shuffled away from the silo's relation order."""
    rows = np.asarray(rows, dtype=_DTYPE)
    if rows.ndim != 2:
        raise ValueError(f"coefficient rows must be a matrix, got shape {rows.shape}")
    order = np.random.default_rng().permutation(len(rows))
    return [rows[i].tobytes() for i in order]


def records_to_rows(records: Sequence[bytes], bases: int) -> np.ndarray:
    """Stack records into an (n, bases) float32 matrix; refuses wrong sizes and non-finite
    values."""
    size = record_bytes(bases)
    if any(len(r) != size for r in records):
        raise ValueError(f"every coefficient record must be {size} bytes")
    if not records:
        return np.zeros((0, bases), np.float32)
    rows = np.frombuffer(b"".join(records), dtype=_DTYPE).reshape(len(records), bases)
    if not np.all(np.isfinite(rows)):
        raise ValueError("a coefficient record holds NaN or infinite values")
    return rows.astype(np.float32)
