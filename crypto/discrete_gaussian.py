"""Exact sampler of the discrete Gaussian N_Z(0, sigma^2) (Canonne, Kamath, Steinke 2020).

Algorithms 1-3 of CKS20 ("The discrete Gaussian for differential privacy", NeurIPS'20): a
Bernoulli(exp(-gamma)) by the k-loop, a discrete Laplace by rejection, and the discrete Gaussian
by rejection from that Laplace. sigma^2 is a rational p/q and every accept/reject decision
compares integers, so the output distribution is exactly N_Z(0, p/q): no float rounding enters.

Speed comes from running many samples as numpy int64 lanes at once: the rejection loops draw
a batch of independent candidates a little larger than they need and keep the first accepted,
and the inner loops go on only over the lanes not yet decided, so a call's count of numpy
loops grows with the logarithm of its size only. The vectorised path needs D = 2 t^2 p q < 2^62
(t = floor(sigma) + 1), which for an integer sigma^2 means sigma^2 <= VECTOR_MAX_SIGMA2 (sigma
about 38,900); larger, or with a large denominator q, every sample goes through the exact
pure-Python-int path, which is 15-20 times slower (bench/discrete_gaussian_speed.py: ~92k
against ~1.4M samples/s). Inside the vectorised path a lane whose test value (|Y| t q - p)^2
would overflow int64 (a Laplace draw tens of sigmas out) is finished in Python ints too, so no
lane is ever decided on a wrapped integer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from trellis.crypto.errors import EncodingError
from trellis.crypto.randomness import RandomSource

_VECTOR_MAX_DEN = 2**62        # D = 2 t^2 p q below this: uniform_below(D) and D * 2 fit int64
_A_MAX = math.isqrt(2**63 - 1)  # |a| <= _A_MAX  =>  a^2 fits int64
# Bernoulli(exp(-1)) trials drawn per lane at once for the discrete Laplace's V when at most
# _ONE_TRIAL_LANES lanes are still going: one loop of numpy calls per three steps instead of one
# per step; the trials past a lane's first failure are drawn and dropped.
_TRIALS = 3
_ONE_TRIAL_LANES = 4096
# Lower bounds of how often a candidate is kept, to size the draws (they never decide one):
# Algorithm 2 keeps U with probability at least 1 - 1/e; Algorithm 3 accepts a Laplace draw
# with probability 0.70 at sigma 1.5 and 0.76 from sigma 20 up (summed from the two pmfs).
_LAPLACE_KEPT = 0.63
_GAUSSIAN_KEPT = 0.69


def _as_fraction(sigma2: Fraction | int) -> Fraction:
    """Validate sigma^2 as a positive exact rational."""
    # A float hides its real denominator (0.1 is 3602879701896397/2^55): ask for exactness.
    if isinstance(sigma2, bool) or not isinstance(sigma2, Fraction | int):
        raise EncodingError("sigma2 must be an int or a fractions.Fraction (exact), not a float")
    value = Fraction(sigma2)
    if value <= 0:
        raise EncodingError("sigma2 must be positive")
    return value


def _params(sigma2: Fraction) -> tuple[int, int, int, int]:
    """(p, q, t, D) of CKS20 Algorithm 3 for sigma^2 = p/q: t = floor(sigma) + 1, D = 2 t^2 p q."""
    p, q = sigma2.numerator, sigma2.denominator
    t = math.isqrt(p // q) + 1  # floor(sqrt(p/q)) == isqrt(floor(p/q))
    return p, q, t, 2 * t * t * p * q


def _largest_vector_sigma2() -> int:
    """The largest integer sigma^2 whose D fits the vectorised path."""
    lo, hi = 1, 2**31
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _params(Fraction(mid))[3] < _VECTOR_MAX_DEN else (lo, mid - 1)
    return lo


VECTOR_MAX_SIGMA2 = _largest_vector_sigma2()


# ---- pure-Python exact path (any size; the reference the vectorised path must agree with) ----

def _bern_exp_frac_py(source: RandomSource, num: int, den: int) -> bool:
    """Bernoulli(exp(-num/den)) for num/den in [0, 1]: CKS20 Algorithm 1, the k-loop."""
    k = 1
    while source.randbelow(den * k) < num:  # Bernoulli(gamma / k)
        k += 1
    return k % 2 == 1


def _bern_exp_py(source: RandomSource, num: int, den: int) -> bool:
    """Bernoulli(exp(-num/den)) for any num/den >= 0: exp(-1) once per whole unit, then the rest."""
    whole, frac = divmod(num, den)
    for _ in range(whole):
        if not _bern_exp_frac_py(source, 1, 1):
            return False
    return _bern_exp_frac_py(source, frac, den)


def _dlap_py(source: RandomSource, t: int) -> int:
    """Discrete Laplace with scale t: CKS20 Algorithm 2."""
    while True:
        u = source.randbelow(t)
        if not _bern_exp_frac_py(source, u, t):
            continue
        v = 0
        while _bern_exp_frac_py(source, 1, 1):
            v += 1
        x = u + t * v
        negative = source.randbelow(2) == 1
        if not (negative and x == 0):  # otherwise 0 would be counted twice
            return -x if negative else x


def _dg_py(source: RandomSource, sigma2: Fraction) -> int:
    """One discrete Gaussian sample: CKS20 Algorithm 3 in Python ints."""
    p, q, t, den = _params(sigma2)
    while True:
        y = _dlap_py(source, t)
        # gamma = (|y| - sigma^2/t)^2 / (2 sigma^2) = (|y| t q - p)^2 / (2 t^2 p q)
        if _bern_exp_py(source, (abs(y) * t * q - p) ** 2, den):
            return y


# ---- vectorised path: the same algorithms over int64 lanes ----

def _bern_exp_frac(source: RandomSource, num: np.ndarray, den: int) -> np.ndarray:
    """Per lane Bernoulli(exp(-num/den)), num in [0, den], den < 2^62: Algorithm 1 vectorised."""
    result = np.zeros(num.size, dtype=bool)
    k = np.ones(num.size, dtype=np.int64)
    active = np.arange(num.size)
    while active.size:
        # Bernoulli(num / (den k)) without forming den * k (which could overflow): a uniform in
        # [0, den k) is a pair (u1 in [0, k), u2 in [0, den)), and it is below num <= den exactly
        # when u1 == 0 and u2 < num. A bound of 1 costs no randomness.
        ok = source.uniform_below(np.full(active.size, den)) < num[active]
        ok &= source.uniform_below(k[active]) == 0
        stop = active[~ok]
        result[stop] = (k[stop] & 1) == 1
        active = active[ok]
        k[active] += 1
    return result


def _bern_exp(source: RandomSource, num: np.ndarray, den: int) -> np.ndarray:
    """Per lane Bernoulli(exp(-num/den)) for num >= 0 (int64), den < 2^62."""
    whole, frac = np.divmod(num, den)
    alive = np.ones(num.size, dtype=bool)
    lanes = np.flatnonzero(whole > 0)
    ones = np.ones(num.size, dtype=np.int64)
    while lanes.size:
        passed = _bern_exp_frac(source, ones[: lanes.size], 1)  # exp(-1) per whole unit
        alive[lanes[~passed]] = False
        whole[lanes] -= 1
        lanes = lanes[passed & (whole[lanes] > 0)]
    rest = np.flatnonzero(alive)
    alive[rest] = _bern_exp_frac(source, frac[rest], den)
    return alive


def _exp_one_successes(source: RandomSource, count: int) -> np.ndarray:
    """Per lane, the Bernoulli(exp(-1)) successes before the first failure (Algorithm 2's V)."""
    v = np.zeros(count, dtype=np.int64)
    going = np.arange(count)
    while going.size:
        # Many lanes: one trial each, as the algorithm runs (a loop's numpy calls are cheap
        # beside its work). Few: several, since then the calls are the cost.
        width = 1 if going.size > _ONE_TRIAL_LANES else _TRIALS
        ok = _bern_exp_frac(source, np.ones(going.size * width, dtype=np.int64),
                            1).reshape(going.size, width)
        passed = ok.all(axis=1)
        v[going] += np.where(passed, width, np.argmin(ok, axis=1))
        going = going[passed]
    return v


def _candidates(need: int, acceptance: float) -> int:
    """How many independent candidates to draw for `need` accepted ones: three standard
    deviations over the expected count, so a second go is rare and little is drawn in vain."""
    expected = need / acceptance
    return int(expected + 3 * math.sqrt(expected)) + 8


def _first_accepted(count: int, acceptance: float,
                    accepted: Callable[[int], np.ndarray]) -> np.ndarray:
    """count samples of a rejection loop, where ``accepted(n)`` runs n independent candidates
    and returns the accepted ones in order: candidates are independent and each accepted one is
    an exact sample, so keeping the first ones accepted is the loop run lane by lane."""
    out = np.empty(count, dtype=np.int64)
    filled = 0
    while filled < count:
        need = count - filled
        kept = accepted(_candidates(need, acceptance))[:need]
        out[filled:filled + kept.size] = kept
        filled += kept.size
    return out


def _dlap(source: RandomSource, t: int, count: int) -> np.ndarray:
    """count discrete Laplace samples of scale t: Algorithm 2 vectorised."""
    def accepted(candidates: int) -> np.ndarray:
        u = source.uniform_below(np.full(candidates, t))
        u = u[_bern_exp_frac(source, u, t)]
        # Overflowing u + t V needs V > 2^63 / t > 2^32 (t < 2^31 here), probability
        # exp(-2^32): not guarded.
        x = u + t * _exp_one_successes(source, u.size)
        negative = source.uniform_below(np.full(x.size, 2)) == 1
        valid = ~(negative & (x == 0))  # otherwise 0 would be counted twice
        return np.where(negative, -x, x)[valid]

    return _first_accepted(count, _LAPLACE_KEPT, accepted)


def _dg(source: RandomSource, sigma2: Fraction, count: int) -> np.ndarray:
    """count discrete Gaussian samples: Algorithm 3 vectorised, overflow-prone lanes in Python."""
    p, q, t, den = _params(sigma2)
    tq = t * q
    y_max = (_A_MAX + p) // tq  # |y| <= y_max keeps |y| t q - p within int64 arithmetic

    def accepted(candidates: int) -> np.ndarray:
        y = _dlap(source, t, candidates)
        ay = np.abs(y)
        small = ay <= y_max
        a = np.where(small, ay, 0) * tq - p
        fast = small & (np.abs(a) <= _A_MAX)
        accept = np.zeros(y.size, dtype=bool)
        lanes = np.flatnonzero(fast)
        accept[lanes] = _bern_exp(source, a[lanes] * a[lanes], den)
        for lane in np.flatnonzero(~fast):  # rare: exact in Python ints
            accept[lane] = _bern_exp_py(source, (int(ay[lane]) * tq - p) ** 2, den)
        return y[accept]

    return _first_accepted(count, _GAUSSIAN_KEPT, accepted)


@dataclass(frozen=True)
class DiscreteGaussian:
    """The discrete Gaussian N_Z(0, sigma2) on the integers, sigma2 an exact rational."""

    sigma2: Fraction

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma2", _as_fraction(self.sigma2))

    @property
    def vectorised(self) -> bool:
        """Whether samples take the fast int64 path (else the exact pure-Python path)."""
        return _params(self.sigma2)[3] < _VECTOR_MAX_DEN

    def sample(self, count: int, source: RandomSource) -> np.ndarray:
        """Draw `count` independent samples as an int64 vector."""
        if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 0:
            raise EncodingError("count must be a non-negative integer")
        if self.vectorised:
            return _dg(source, self.sigma2, int(count))
        return np.array([_dg_py(source, self.sigma2) for _ in range(int(count))], dtype=np.int64)

    def pmf(self, values: np.ndarray) -> np.ndarray:
        """Probability of each integer value, exp(-x^2 / 2 sigma^2) / normaliser, as float64."""
        return discrete_gaussian_pmf(values, self.sigma2)


def sample_discrete_gaussian(sigma2: Fraction | int, count: int,
                             source: RandomSource) -> np.ndarray:
    """Draw `count` exact N_Z(0, sigma2) samples as int64 from `source`."""
    return DiscreteGaussian(Fraction(_as_fraction(sigma2))).sample(count, source)


def discrete_gaussian_pmf(values: np.ndarray, sigma2: Fraction | int) -> np.ndarray:
    """Probability mass of N_Z(0, sigma2) at each integer value (float64; for tests)."""
    s2 = float(_as_fraction(sigma2))
    half_width = int(math.ceil(38.0 * math.sqrt(s2))) + 1  # exp(-38^2 / 2) underflows float64
    support = np.arange(-half_width, half_width + 1, dtype=np.float64)
    normaliser = float(np.exp(-(support**2) / (2.0 * s2)).sum())
    x = np.asarray(values, dtype=np.float64)
    return np.exp(-(x**2) / (2.0 * s2)) / normaliser
