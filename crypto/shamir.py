"""Vectorised Shamir t-of-n secret sharing of byte strings over the prime field GF(2^31 - 1).

A secret is cut into 16-bit limbs; every limb is shared with its own random polynomial of
degree t-1 (shares are evaluated for all holders and limbs at once with Horner's rule in int64,
which cannot overflow since every operand is below 2^31). Reconstruction is Lagrange
interpolation at zero, batched over many secrets that share one set of holders. Holder
coordinates are small positive integers (a silo's position in the round's roster, plus one).
Random coefficients are 64-bit draws reduced mod p: their bias is below 2^-33 per limb.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np

from trellis.crypto.errors import EncodingError

PRIME = (1 << 31) - 1
LIMB_BITS = 16
SHARE_DTYPE = np.dtype("<u4")

RandomBytes = Callable[[int], bytes]


def limbs_of(secret: bytes) -> np.ndarray:
    """The secret's 16-bit little-endian limbs as int64 (odd lengths are refused)."""
    if len(secret) == 0 or len(secret) % 2:
        raise EncodingError("a shared secret must be a non-empty even number of bytes")
    return np.frombuffer(secret, dtype="<u2").astype(np.int64)


def split_secrets(secrets: Sequence[bytes], holders: Sequence[int], threshold: int,
                  random_bytes: RandomBytes = os.urandom) -> np.ndarray:
    """Shares of several secrets for each holder: array (holders, total limbs) of uint32."""
    xs = _check_holders(holders)
    if not 1 <= threshold <= len(xs):
        raise EncodingError(f"threshold {threshold} must be between 1 and {len(xs)} holders")
    constant = np.concatenate([limbs_of(s) for s in secrets])
    draws = np.frombuffer(random_bytes(8 * (threshold - 1) * constant.size), dtype="<u8")
    coefficients = (draws % np.uint64(PRIME)).astype(np.int64).reshape(threshold - 1,
                                                                     constant.size)
    x = np.asarray(xs, dtype=np.int64)[:, None]
    acc = np.zeros((len(xs), constant.size), dtype=np.int64)
    for row in coefficients[::-1]:
        acc = (acc + row) * x % PRIME
    return ((acc + constant) % PRIME).astype(SHARE_DTYPE)


def reconstruct_secrets(holders: Sequence[int], shares: np.ndarray, sizes: Sequence[int]
                        ) -> list[bytes]:
    """Recover secrets of the given byte sizes from shares (rows in the order of holders)."""
    xs = _check_holders(holders)
    shares = np.asarray(shares)
    limbs = sum(sizes) // 2
    if shares.shape != (len(xs), limbs) or any(s <= 0 or s % 2 for s in sizes):
        raise EncodingError(f"expected shares of shape ({len(xs)}, {limbs}), got {shares.shape}")
    values = combine(xs, shares[None, :, :])[0]
    if np.any(values >= 1 << LIMB_BITS):
        raise EncodingError("shares are inconsistent: a recovered limb is out of range")
    raw = values.astype("<u2").tobytes()
    out, offset = [], 0
    for size in sizes:
        out.append(raw[offset:offset + size])
        offset += size
    return out


def combine(holders: Sequence[int], shares: np.ndarray) -> np.ndarray:
    """Lagrange interpolation at 0 of a batch: shares (batch, holders, limbs) -> (batch, limbs)."""
    weights = np.asarray(lagrange_at_zero(tuple(holders)), dtype=np.int64)
    values = shares.astype(np.int64) % PRIME
    total = np.zeros((values.shape[0], values.shape[2]), dtype=np.int64)
    for i, weight in enumerate(weights):
        total = (total + values[:, i, :] * weight) % PRIME
    return total


@lru_cache(maxsize=256)
def lagrange_at_zero(holders: tuple[int, ...]) -> tuple[int, ...]:
    """Lagrange basis values at x = 0 for distinct holder coordinates, mod p."""
    xs = _check_holders(holders)
    weights = []
    for i, xi in enumerate(xs):
        numerator, denominator = 1, 1
        for j, xj in enumerate(xs):
            if i != j:
                numerator = numerator * xj % PRIME
                denominator = denominator * (xj - xi) % PRIME
        weights.append(numerator * pow(denominator, -1, PRIME) % PRIME)
    return tuple(weights)


def _check_holders(holders: Sequence[int]) -> tuple[int, ...]:
    xs = tuple(int(x) for x in holders)
    if not xs:
        raise EncodingError("at least one holder is needed")
    if len(set(xs)) != len(xs) or min(xs) < 1 or max(xs) >= PRIME:
        raise EncodingError("holder coordinates must be distinct integers in [1, p)")
    return xs
