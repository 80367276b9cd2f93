"""Integer encoding and noise shares for the distributed discrete Gaussian (Kairouz et al. 2021).

Kairouz, Liu, Steinke, "The distributed discrete Gaussian mechanism for federated learning with
secure aggregation", ICML'21 (arXiv 2102.06387). Each contribution (one record's clipped vector,
or a silo's whole clipped update) is L2-clipped to C, scaled by s = 2^bits / C and stochastically
rounded to integers; a silo sums its rounded contributions, adds its discrete Gaussian noise
share, and maps the integers into the secure-aggregation ring (two's complement). The ring sum of
all silos, read as signed integers and divided by s, is the noisy sum of the clipped vectors.

Sensitivity (Kairouz Thm 1): a rounded contribution has L2 norm at most C s + sqrt(d) (every
coordinate moves by less than 1), or, with conditional rounding at beta > 0 (re-draw until the
norm is within the bound), at most sqrt(C^2 s^2 + d/4 + sqrt(2 ln(1/beta)) (C s + sqrt(d)/2)).
Noise: each silo adds N_Z(0, sigma_l^2) with sigma_l = z Delta2 / sqrt(t - c). A sum the
coordinator can unmask has at least t inputs (the secure-aggregation threshold), of which at
least t - c are honest if at most c silos collude, so it carries at least (t - c) sigma_l^2 =
(z Delta2)^2 of noise, the full central noise, whoever drops out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from trellis.crypto.discrete_gaussian import DiscreteGaussian
from trellis.crypto.errors import EncodingError
from trellis.crypto.randomness import RandomSource

_MAX_BITS = 40        # C s = 2^bits stays far inside float64's exact integers (2^53)
_SIGMA2_PRECISION = 20  # sigma_l^2 is rounded UP to a rational within 2^-20 relative
_MAX_ROUNDING_TRIES = 1000


def _round_up_rational(value: float) -> Fraction:
    """A rational >= value, within 2^-20 relative, with a small power-of-two denominator."""
    if value <= 0:
        return Fraction(0)
    # Integers when value >= 2^20; else a denominator 2^k just fine enough. The small power-of-two
    # denominator keeps the sampler on its fast path; 1 + 2^-50 absorbs float64 error in value.
    k = max(0, _SIGMA2_PRECISION - math.floor(math.log2(value)))
    return Fraction(math.ceil(value * (1 + 2**-50) * 2**k), 2**k)


@dataclass(frozen=True)
class DdgEncoding:
    """Scale, rounding, sensitivity, noise share and ring mapping of one DDG release."""

    clip: float              # C: L2 bound of one contribution, in float units
    bits: int                # C s = 2^bits: the clipped norm in integer units
    dim: int                 # d: length of the vector
    noise_multiplier: float  # z: central noise std / L2 sensitivity
    threshold: int           # t: least number of inputs in any sum the coordinator can unmask
    colluders: int = 0       # c: silos assumed to collude (their noise is not counted)
    ring_bits: int = 64
    beta: float = 0.0        # conditional rounding; 0: the deterministic bound C s + sqrt(d)

    def __post_init__(self) -> None:
        problems = []
        if not (math.isfinite(self.clip) and self.clip > 0):
            problems.append("clip must be a positive finite number")
        if not 1 <= self.bits <= _MAX_BITS:
            problems.append(f"bits must be between 1 and {_MAX_BITS}")
        if self.dim < 1:
            problems.append("dim must be at least 1")
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0):
            problems.append("noise_multiplier must be a finite number >= 0")
        if self.colluders < 0 or self.threshold <= self.colluders:
            problems.append("need threshold > colluders >= 0: a sum of colluders only has no "
                            "honest noise")
        if self.ring_bits not in (32, 64):
            problems.append("ring_bits must be 32 or 64")
        if not 0 <= self.beta < 1:
            problems.append("beta must be in [0, 1)")
        if problems:
            raise EncodingError("; ".join(problems))

    @property
    def scale(self) -> float:
        """s = 2^bits / C: float units to integer units."""
        return 2.0**self.bits / self.clip

    @property
    def l2_sensitivity(self) -> float:
        """Delta2: the L2 norm bound of one rounded contribution (Kairouz Thm 1)."""
        cs, d = 2.0**self.bits, float(self.dim)
        bound = cs + math.sqrt(d)
        if self.beta > 0:
            conditional = cs**2 + d / 4 + math.sqrt(2 * math.log(1 / self.beta)) * (
                cs + math.sqrt(d) / 2)
            bound = min(bound, math.sqrt(conditional))
        return bound

    @property
    def l1_sensitivity(self) -> float:
        """Delta1: L1 <= sqrt(d) L2 always, and <= L2^2 for integer vectors."""
        delta2 = self.l2_sensitivity
        return delta2 * min(math.sqrt(self.dim), delta2)

    @property
    def local_sigma2(self) -> Fraction:
        """sigma_l^2 >= (z Delta2)^2 / (t - c), exactly rational, rounded up (never less noise)."""
        return _round_up_rational(
            (self.noise_multiplier * self.l2_sensitivity) ** 2 / (self.threshold - self.colluders))

    @property
    def local_sigma(self) -> float:
        """sigma_l, the standard deviation parameter of one silo's noise share."""
        return math.sqrt(self.local_sigma2)

    def central_sigma2(self, honest_shares: int) -> Fraction:
        """The noise parameter of a sum holding `honest_shares` honest noise shares."""
        return honest_shares * self.local_sigma2

    def check_capacity(self, contributions: int, silos: int) -> None:
        """Raise EncodingError unless m (C s + 1) + 8 sigma_total < 2^(ring_bits - 1)."""
        # |coordinate| <= L2 norm <= C s + 1 after rounding (each moves by < 1); the noise sum
        # stays within 8 standard deviations but with probability ~1e-15 per coordinate.
        reach = contributions * (2.0**self.bits + 1) + 8 * self.local_sigma * math.sqrt(silos)
        limit = 2.0 ** (self.ring_bits - 1)
        if reach >= limit:
            raise EncodingError(
                f"{contributions} contributions at 2^{self.bits} plus noise of {silos} silos "
                f"(sigma_l {self.local_sigma:.3g}) can reach {reach:.3g}, beyond the "
                f"{self.ring_bits}-bit ring's signed range {limit:.3g}: lower bits, or use a "
                "64-bit ring")

    def encode(self, rows: np.ndarray, source: RandomSource) -> np.ndarray:
        """Clip each row (or the one vector) to C, scale, round; return the int64 sum of rows."""
        data = np.asarray(rows, dtype=np.float64)
        data = data.reshape(1, -1) if data.ndim == 1 else data
        if data.ndim != 2 or data.shape[1] != self.dim:
            raise EncodingError(f"expected a vector of length {self.dim} or rows of that length")
        if not np.all(np.isfinite(data)):
            raise EncodingError("cannot encode a vector containing NaN or infinite values")
        norms = np.linalg.norm(data, axis=1, keepdims=True)
        clipped = data * np.minimum(1.0, self.clip / np.maximum(norms, np.finfo(float).tiny))
        scaled = clipped * self.scale
        total = np.zeros(self.dim, dtype=np.int64)
        for row in scaled:
            total += self._round(row, source)
        return total

    def _round(self, row: np.ndarray, source: RandomSource) -> np.ndarray:
        """Stochastic rounding (unbiased), re-drawn until the L2 norm is within Delta2."""
        low = np.floor(row)
        frac = row - low  # exact in float64 for |row| <= 2^40
        bound2 = self.l2_sensitivity**2
        for _ in range(_MAX_ROUNDING_TRIES):
            # Bernoulli(frac) from 53 private random bits: P(up) = ceil(frac 2^53) / 2^53.
            uniform = (source.random_words(row.size) >> np.uint64(11)).astype(np.float64)
            rounded = (low + (uniform < frac * 2.0**53)).astype(np.int64)
            as_float = rounded.astype(np.float64)
            if float(as_float @ as_float) <= bound2:
                return rounded
        # Impossible at beta = 0 (the bound always holds); at beta > 0 a miss has prob <= beta.
        raise EncodingError("stochastic rounding kept exceeding the L2 bound: is beta too small?")

    def noise_share(self, source: RandomSource) -> np.ndarray:
        """One silo's noise share: d samples of N_Z(0, sigma_l^2), int64."""
        if self.local_sigma2 == 0:
            return np.zeros(self.dim, dtype=np.int64)
        return DiscreteGaussian(self.local_sigma2).sample(self.dim, source)

    @property
    def dtype(self) -> type[np.unsignedinteger]:
        """The unsigned dtype whose wrap-around arithmetic is the ring."""
        return np.uint64 if self.ring_bits == 64 else np.uint32

    def to_ring(self, values: np.ndarray) -> np.ndarray:
        """Map signed integers into the ring (two's complement): int64 -> uint64 or uint32."""
        ints = np.asarray(values)
        if ints.dtype != np.int64 or ints.shape != (self.dim,):
            raise EncodingError(f"expected an int64 vector of length {self.dim}")
        return to_ring(ints, self.ring_bits)

    def from_ring(self, total: np.ndarray) -> np.ndarray:
        """Read a ring sum as signed integers (int64)."""
        ring = np.asarray(total)
        if ring.dtype != self.dtype or ring.shape != (self.dim,):
            raise EncodingError(
                f"expected a {np.dtype(self.dtype).name} vector of length {self.dim}")
        return from_ring(ring)

    def decode(self, total: np.ndarray) -> np.ndarray:
        """Ring sum -> the noisy sum of clipped vectors in float units (signed integers / s)."""
        return self.from_ring(total).astype(np.float64) / self.scale


def to_ring(values: np.ndarray, ring_bits: int) -> np.ndarray:
    """Signed integers (int64) as ring elements, two's complement; EncodingError if one lies
    outside the ring's signed range (it would wrap silently)."""
    ints = np.asarray(values, dtype=np.int64)
    half = 2 ** (ring_bits - 1)
    if ints.size and (int(ints.min()) < -half or int(ints.max()) >= half):
        raise EncodingError(f"a value lies outside the {ring_bits}-bit ring's signed range")
    if ring_bits == 64:
        return ints.copy().view(np.uint64)
    return ints.astype(np.int32).view(np.uint32)


def from_ring(total: np.ndarray) -> np.ndarray:
    """A ring sum (uint64 or uint32) read as signed integers (int64)."""
    ring = np.asarray(total)
    if ring.ndim != 1 or ring.dtype not in (np.uint32, np.uint64):
        raise EncodingError("expected a 1-d vector of ring elements (uint32 or uint64)")
    signed = np.int64 if ring.dtype == np.uint64 else np.int32
    return ring.view(signed).astype(np.int64)
