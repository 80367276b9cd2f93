"""Sources of uniform random integers for the DP samplers: operating-system or seeded (tests)."""

from __future__ import annotations

import hashlib
import os
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from trellis.crypto.errors import EncodingError

_WIDTHS: dict[int, np.dtype[Any]] = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"),
                                   8: np.dtype("<u8")}
_SEED_DOMAIN = b"trellis/dp/seeded-random-source/v1"


def _width(mask: int) -> int:
    """Bytes per draw that cover a mask of all ones: a draw wider than that wastes randomness."""
    return next(w for w in (1, 2, 4, 8) if mask < 1 << (8 * w))


def _bit_masks(bounds: np.ndarray) -> np.ndarray:
    """Per lane, the smallest all-ones mask 2^k - 1 that covers bounds - 1."""
    x = bounds - np.uint64(1)
    for shift in (1, 2, 4, 8, 16, 32):  # smear the top bit down: exact, unlike a float log2
        x |= x >> np.uint64(shift)
    return x


class RandomSource(ABC):
    """Uniform random bytes and, built on them, exact uniform integers (no modulo bias)."""

    @abstractmethod
    def random_bytes(self, count: int) -> bytes:
        """Return `count` uniformly random bytes."""

    def random_words(self, count: int, width: int = 8) -> np.ndarray:
        """Return `count` uniformly random unsigned `width`-byte values (1, 2, 4 or 8) as uint64."""
        return np.frombuffer(self.random_bytes(width * count),
                             dtype=_WIDTHS[width]).astype(np.uint64)

    def uniform_below(self, bounds: np.ndarray) -> np.ndarray:
        """Return, per lane, an integer uniform in [0, bound) as int64; bounds in [1, 2^63)."""
        bounds = np.asarray(bounds)
        if bounds.size and (int(bounds.min()) < 1 or int(bounds.max()) >= 2**63):
            raise EncodingError("uniform bounds must lie in [1, 2^63)")
        if bounds.size and int(bounds.min()) == int(bounds.max()):
            return self._uniform_below_one(int(bounds.flat[0]), bounds.shape)
        shape, bounds = bounds.shape, bounds.astype(np.uint64).reshape(-1)
        masks = _bit_masks(bounds)
        out = np.zeros(bounds.shape, dtype=np.uint64)
        pending = np.flatnonzero(masks)  # a bound of 1 has only the value 0: no randomness
        # Rejection on the smallest power of two above the bound: each try succeeds with
        # probability > 1/2, and the accepted values are exactly uniform.
        width = _width(int(masks.max())) if masks.size else 8
        while pending.size:
            draw = self.random_words(pending.size, width) & masks[pending]
            ok = draw < bounds[pending]
            out[pending[ok]] = draw[ok]
            pending = pending[~ok]
        return out.astype(np.int64).reshape(shape)

    def _uniform_below_one(self, bound: int, shape: tuple[int, ...]) -> np.ndarray:
        """uniform_below with one bound for every lane: the mask is computed once."""
        out = np.zeros(shape, dtype=np.uint64)
        if bound == 1:
            return out.astype(np.int64)
        flat = out.reshape(-1)
        mask, limit = np.uint64((1 << (bound - 1).bit_length()) - 1), np.uint64(bound)
        pending = np.arange(flat.size)
        width = _width(int(mask))
        while pending.size:
            draw = self.random_words(pending.size, width) & mask
            ok = draw < limit
            flat[pending[ok]] = draw[ok]
            pending = pending[~ok]
        return out.astype(np.int64)

    def randbelow(self, bound: int) -> int:
        """Return a Python int uniform in [0, bound), for any positive bound."""
        if bound < 1:
            raise EncodingError("uniform bound must be positive")
        bits = (bound - 1).bit_length()
        if bits == 0:
            return 0
        nbytes = (bits + 7) // 8
        while True:
            value = int.from_bytes(self.random_bytes(nbytes), "little") >> (8 * nbytes - bits)
            if value < bound:
                return value


class OsRandomSource(RandomSource):
    """Randomness from the operating system's CSPRNG (os.urandom): the one to use for privacy.

    Bytes are read ahead in blocks: the samplers ask for a few bytes hundreds of thousands of
    times per round, and one system call each cost more than the sampling. Bytes are served once
    and the block is dropped in a forked child, so no two processes ever use the same bytes.
    """

    BLOCK = 1 << 16

    def __init__(self) -> None:
        self._block = b""
        self._used = 0
        self._pid = os.getpid()

    def random_bytes(self, count: int) -> bytes:
        """Return `count` bytes from os.urandom (read ahead in blocks; never served twice)."""
        if os.getpid() != self._pid:        # a forked child: the parent may serve these bytes
            self._block, self._used, self._pid = b"", 0, os.getpid()
        if count > self.BLOCK:
            return os.urandom(count)
        if self._used + count > len(self._block):
            self._block, self._used = os.urandom(self.BLOCK), 0
        start, self._used = self._used, self._used + count
        return self._block[start:self._used]


class SeededRandomSource(RandomSource):
    """Deterministic AES-256-CTR stream keyed by SHA-256 of a seed. NOT private: tests only.

    Anyone who knows the seed can recompute every sample, hence every noise value it produced;
    use it for tests and seed-for-seed reproducible simulations, never for a real release.
    """

    def __init__(self, seed: bytes) -> None:
        if not isinstance(seed, bytes | bytearray) or not seed:
            raise EncodingError("seed must be non-empty bytes")
        key = hashlib.sha256(_SEED_DOMAIN + bytes(seed)).digest()
        self._stream = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()

    def random_bytes(self, count: int) -> bytes:
        """Return the next `count` bytes of the keystream."""
        return self._stream.update(bytes(count))
