"""One round's differential-privacy mechanism on a silo: its public parameters and its noise.

Record level, a round is one DP-FedSGD step: the sum of per-graph gradients of ALL trainable
parameters, each graph's gradient clipped to L2 norm `clip`, over a Poisson sample of the
silo's graphs. The sum is scaled by s = 2^bits / clip and rounded to the nearest integer. One
graph moves the rounded sum by at most Delta2 = clip * s + sqrt(d) in L2 (the rounding errors of
two sums differ by less than 1 per coordinate), so that is the sensitivity the noise is scaled
to, with no conditional or stochastic rounding needed. The local slice, which never leaves the
silo but steers later shared gradients, gets the full noise z * Delta2 here; the shared slice
gets a share of it (ddg: z * Delta2 / sqrt(t - c), so every sum the coordinator can unmask
holds the full noise from honest silos) or the full noise (local-gaussian). Silo level, the
silo's clipped shared update is the record.

No I/O; the randomness is the caller's private source (crypto/discrete_gaussian.py).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from trellis.crypto.discrete_gaussian import sample_discrete_gaussian
from trellis.crypto.dp_encoding import DdgEncoding
from trellis.crypto.randomness import OsRandomSource, RandomSource, SeededRandomSource
from trellis.protos.privacy_plan import DEFAULT_BITS, PrivacyConfig

# Set, this makes every silo's DP randomness a function of it and the silo's name: reproducible
# runs for tests and research (a simulation equal to a real federation seed for seed), and NOT
# private. The silo says so in its log and its audit log.
INSECURE_SEED_VARIABLE = "TRELLIS_INSECURE_DP_SEED"
# Poisson sampling draws one uniform integer below this per graph; the rate is rounded to it.
_RATE_RESOLUTION = 1 << 52


@dataclass(frozen=True)
class PrivateStep:
    """The public parameters of one silo's mechanism in one round (what the audit log keeps)."""

    mechanism: str
    unit: str
    clip: float
    scale: float            # integer units per unit of the clipped vector
    dimension: int          # values the rounded vector holds (shared and local slices)
    sensitivity: float      # Delta2, in integer units
    noise_multiplier: float
    full_sigma: float       # noise std of the whole mechanism, integer units (z * Delta2)
    share_sigma: float      # noise std this silo adds to its shared slice
    threshold: int
    colluders: int
    sampling_rate: float

    @property
    def encoding(self) -> DdgEncoding:
        """This step's parameters as crypto/dp_encoding.py takes them."""
        return _encoding(self.mechanism, self.clip, round(math.log2(self.scale * self.clip)),
                         self.dimension, self.noise_multiplier, self.threshold, self.colluders)

    def record(self) -> dict[str, Any]:
        """The audit trail's form (public numbers only)."""
        return {k: (round(v, 6) if isinstance(v, float) else v)
                for k, v in asdict(self).items()}


def private_step(privacy: PrivacyConfig, *, threshold: int, dimension: int,
                 graphs: int) -> PrivateStep:
    """The mechanism's parameters for a silo with `graphs` training graphs."""
    colluders = privacy.colluders if privacy.mechanism == "ddg" else 0
    encoding = _encoding(privacy.mechanism, privacy.clip, privacy.bits or DEFAULT_BITS,
                         dimension, privacy.noise_multiplier, threshold, colluders)
    sensitivity = encoding.l2_sensitivity
    return PrivateStep(privacy.mechanism, privacy.unit, privacy.clip, encoding.scale, dimension,
                       sensitivity, privacy.noise_multiplier,
                       privacy.noise_multiplier * sensitivity, encoding.local_sigma, threshold,
                       colluders, privacy.sampling_rate(graphs))


def _encoding(mechanism: str, clip: float, bits: int, dimension: int, noise_multiplier: float,
              threshold: int, colluders: int) -> DdgEncoding:
    """Local-gaussian is the distributed case of one share carrying the full noise."""
    distributed = mechanism == "ddg"
    return DdgEncoding(clip, bits, dimension, noise_multiplier,
                       threshold=threshold if distributed else 1, colluders=colluders)


def noise_source_for(silo: str, environ: Mapping[str, str]) -> tuple[RandomSource, bool]:
    """The silo's private randomness, and whether it is the insecure seeded kind."""
    seed = environ.get(INSECURE_SEED_VARIABLE, "")
    if not seed:
        return OsRandomSource(), False
    return SeededRandomSource(hashlib.sha256(f"{seed}|{silo}".encode()).digest()), True


def poisson_ids(count: int, rate: float, source: RandomSource) -> np.ndarray:
    """Indices of a Poisson sample (each of `count` graphs kept with probability `rate`)."""
    if rate >= 1.0:
        return np.arange(count, dtype=np.int64)
    draws = source.uniform_below(np.full(count, _RATE_RESOLUTION, dtype=np.int64))
    return np.flatnonzero(draws < int(rate * _RATE_RESOLUTION)).astype(np.int64)


def to_integers(values: np.ndarray, scale: float) -> np.ndarray:
    """A clipped sum scaled to integer units and rounded to the nearest integer (int64)."""
    values = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(values)):
        raise ValueError("a private sum holds NaN or infinite values")
    return np.rint(values * scale).astype(np.int64)


def add_noise(integers: np.ndarray, sigma: float, source: RandomSource) -> np.ndarray:
    """Integers plus discrete Gaussian noise of std `sigma` (sigma^2 rounded up to an integer:
    never less noise, and an integer variance keeps the exact sampler on its fast path)."""
    if sigma <= 0 or integers.size == 0:
        return integers.copy()
    variance = Fraction(math.ceil(sigma * sigma))
    noise = sample_discrete_gaussian(variance, integers.size, source)
    return integers + noise.astype(np.int64)


def clip_vector(values: np.ndarray, clip: float) -> np.ndarray:
    """A vector scaled down to L2 norm at most `clip` (silo level: the whole update)."""
    norm = float(np.linalg.norm(values))
    return values if norm <= clip else values * (clip / norm)
