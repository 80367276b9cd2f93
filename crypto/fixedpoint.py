"""Fixed-point encoding of weighted float vectors into the ring Z_(2^ring_bits) (DESIGN.md §5).

A silo encodes ``round(clip(v) * weight * 2**fraction_bits)`` per element and appends its integer
weight, so that the coordinator, summing vectors modulo 2^ring_bits, recovers
``sum_m weight_m * v_m`` and ``sum_m weight_m`` and hence the weighted mean, without ever seeing
one silo's weight. The absolute error of the decoded weighted mean is at most
``n_silos * 0.5 / (2**fraction_bits * total_weight)`` per element, plus the clipping of values
outside ``[-clip, clip]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from trellis.crypto.errors import EncodingError

# Integers up to 2^53 are exact in float64: the scaled value must stay below this before rounding.
_FLOAT_EXACT_BITS = 53


@dataclass(frozen=True)
class FixedPointSpec:
    """How floats become ring elements: clipping range, fractional bits and ring size."""

    clip: float
    fraction_bits: int
    ring_bits: int = 64
    max_weight: int = 1_000_000

    def __post_init__(self) -> None:
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise EncodingError("clip must be a positive finite number")
        if self.ring_bits not in (32, 64):
            raise EncodingError("ring_bits must be 32 or 64")
        if not 0 <= self.fraction_bits <= 52:
            raise EncodingError("fraction_bits must be between 0 and 52")
        if self.max_weight < 1:
            raise EncodingError("max_weight must be at least 1")

    @property
    def dtype(self) -> type[np.unsignedinteger]:
        """The numpy dtype whose wrap-around arithmetic is the ring."""
        return np.uint64 if self.ring_bits == 64 else np.uint32

    @property
    def scale(self) -> float:
        """Multiplier from float to fixed point."""
        return float(2**self.fraction_bits)

    def largest_sum(self, n_silos: int) -> float:
        """Largest absolute value the sum of n_silos encoded elements can reach."""
        return n_silos * self.max_weight * (self.clip * self.scale + 0.5)

    def check_capacity(self, n_silos: int) -> None:
        """Raise EncodingError if n_silos encoded vectors could overflow the ring or float64."""
        if self.max_weight * self.clip * self.scale >= 2.0**_FLOAT_EXACT_BITS:
            raise EncodingError(
                "max_weight x clip x 2^fraction_bits = "
                f"{self.max_weight * self.clip * self.scale:.3g}"
                f" exceeds 2^{_FLOAT_EXACT_BITS}: lower fraction_bits, clip or max_weight"
            )
        # Signed interpretation: sums must stay inside (-2^(ring-1), 2^(ring-1)).
        limit = 2.0 ** (self.ring_bits - 1)
        if self.largest_sum(n_silos) >= limit or n_silos * self.max_weight >= limit:
            raise EncodingError(
                f"{n_silos} silos x max_weight {self.max_weight} x clip {self.clip} x "
                f"2^{self.fraction_bits} can reach {self.largest_sum(n_silos):.3g}, beyond the "
                f"{self.ring_bits}-bit ring's signed range {limit:.3g}: lower fraction_bits, clip "
                "or max_weight, or use ring_bits = 64"
            )

    def error_bound(self, n_silos: int, total_weight: int) -> float:
        """Largest absolute rounding error of a decoded weighted mean (clipping aside)."""
        return n_silos * 0.5 / (self.scale * max(total_weight, 1))

    def encode(self, values: np.ndarray, weight: int) -> np.ndarray:
        """Encode float values with an integer weight as ring elements; the weight is appended."""
        if not isinstance(weight, int | np.integer) or not 1 <= int(weight) <= self.max_weight:
            raise EncodingError(f"weight must be an integer in [1, {self.max_weight}]")
        flat = np.asarray(values, dtype=np.float64).reshape(-1)
        if not np.all(np.isfinite(flat)):
            raise EncodingError("cannot encode a vector containing NaN or infinite values")
        scaled = np.rint(np.clip(flat, -self.clip, self.clip) * (float(weight) * self.scale))
        out = np.empty(flat.size + 1, dtype=self.dtype)
        signed = np.int64 if self.ring_bits == 64 else np.int32
        # int64 -> uint64 view is two's complement: negative values wrap into the ring.
        out[:-1] = scaled.astype(np.int64).astype(signed).view(self.dtype)
        out[-1] = int(weight)
        return out

    def decode_mean(self, total: np.ndarray) -> tuple[np.ndarray, int]:
        """Turn a ring sum of encoded vectors into (weighted mean as float64, total weight)."""
        total = np.asarray(total)
        if total.dtype != self.dtype or total.ndim != 1 or total.size < 1:
            raise EncodingError(f"expected a 1-d {np.dtype(self.dtype).name} vector")
        total_weight = int(total[-1])
        if total_weight < 1:
            raise EncodingError("aggregate carries no weight")
        signed = np.int64 if self.ring_bits == 64 else np.int32
        weighted_sum = total[:-1].view(signed).astype(np.float64) / self.scale
        return weighted_sum / total_weight, total_weight

    def encode_both(self, values: np.ndarray, weight: int) -> np.ndarray:
        """Encode values twice, weighted and with weight 1, so sums yield both kinds of mean."""
        return np.concatenate([self.encode(values, weight), self.encode(values, 1)])

    def decode_both(self, total: np.ndarray) -> tuple[np.ndarray, int, np.ndarray, int]:
        """Ring sum of `encode_both` vectors -> (weighted mean, total weight, plain mean, count)."""
        total = np.asarray(total)
        if total.ndim != 1 or total.size < 2 or total.size % 2:
            raise EncodingError("expected a 1-d vector of two equal halves")
        half = total.size // 2
        weighted, total_weight = self.decode_mean(total[:half])
        plain, count = self.decode_mean(total[half:])
        return weighted, total_weight, plain, count
