"""The tight accountant for discrete Gaussian noise: a reduction to the continuous Gaussian, then
privacy-loss distributions (dp-accounting's PLD, Poisson-subsampled and composed).

The noise a sum carries is discrete: each honest silo adds N_Z(0, sigma_l^2) per coordinate
(crypto/dp_encoding.py). Its privacy loss in d dimensions is not the Gaussian's, so instead of
accounting it directly we compare, in max-divergence, the whole mechanism with an ideal one whose
noise is K(N(0, w^2)) per coordinate: K rounds a real x to an integer drawn from N_Z(x, s^2)
(the discrete Gaussian centred at x, width s = SMOOTHING). K commutes with integer shifts, so
the ideal mechanism is K applied to (rounded sum + continuous Gaussian noise): a post-processing
of the Gaussian mechanism, which dp-accounting accounts tightly (rotation invariance makes the
d-dimensional L2 shift a one-dimensional one). Poisson summation bounds both comparisons:

- theta_excess(s) bounds |sum_k exp(-(k - c)^2 / 2 s^2) / (sqrt(2 pi) s) - 1| over all c;
- one step of a sum of shares (k shares then one more) moves the pmf from N_Z(0, (k+1)
  sigma_l^2) by at most smoothing_divergence(sigma_l sqrt(k / (k + 1))) in max-divergence;
- N_Z(0, sigma^2) is within smoothing_divergence(s) of K(N(0, sigma^2 - s^2)).

Per coordinate and step the two distributions are within `slack` of each other both ways; over
d coordinates and T steps, within c = the sum of d * slack. A mechanism within c of an (eps, delta')
-DP one is (eps + 2c, e^c delta')-DP, so epsilon(delta) <= eps_Gaussian(delta e^-c) + 2c. Proof
sketch: docs/privacy.md, "The tight accountant". numpy-free, scipy-free: math and dp-accounting.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

# s, integer units: the rounding kernel's width. At s = 2 the kernel's error is 2e-34 per
# coordinate and step; it costs s^2 = 4 of the central variance, which is (z Delta2)^2 with
# Delta2 >= 2^8 integer units in any plan (z 1 at 2^16 units: 4e-9 of it).
SMOOTHING = 2.0
# dp-accounting's privacy-loss grid. Pessimistic rounding keeps any grid an upper bound; 1e-3
# is within 1e-4 of 1e-4's epsilon at the bench's settings, at a tenth of the time.
DISCRETIZATION = 1e-3


def theta_excess(s: float) -> float:
    """An upper bound on 2 sum_{m>=1} exp(-2 pi^2 s^2 m^2) (m^2 >= 1 + 3 (m - 1) for m >= 1)."""
    if s <= 0:
        return math.inf
    a = 2 * math.pi**2 * s * s
    return 2 * math.exp(-a) / -math.expm1(-3 * a)


def smoothing_divergence(s: float) -> float:
    """log((1 + e) / (1 - e)), e = theta_excess(s): a pmf ratio bound both ways (inf if e >= 1)."""
    excess = theta_excess(s)
    if excess >= 1:
        return math.inf
    return math.log1p(excess) - math.log1p(-excess)


def share_sum_divergence(local_sigma2: float, shares: int) -> float:
    """Max-divergence (both ways) between a sum of `shares` N_Z(0, sigma_l^2) and N_Z(0, shares
    sigma_l^2): the sum over k < shares of smoothing_divergence(sigma_l sqrt(k / (k + 1)))."""
    if shares < 1 or local_sigma2 <= 0:
        return math.inf
    total = 0.0
    for k in range(1, shares):
        step = smoothing_divergence(math.sqrt(local_sigma2 * k / (k + 1)))
        total += step
        if step == 0.0:       # underflow: exp(-2 pi^2 s^2) < 1e-308, and s grows with k
            break
    return total


@dataclass(frozen=True)
class GaussianReduction:
    """A discrete-noise release as a post-processed Gaussian one, up to `slack`."""

    noise_multiplier: float   # z' = sqrt(central sigma^2 - s^2) / Delta2 of the ideal Gaussian
    slack: float              # max-divergence, both ways, of one release against the ideal


def reduce_discrete_noise(local_sigma2: float, shares: int, l2_sensitivity: float,
                          dim: int, smoothing: float = SMOOTHING) -> GaussianReduction:
    """The Gaussian reduction of `shares` honest N_Z(0, sigma_l^2) shares per coordinate, a
    `dim`-vector, integer L2 sensitivity Delta2 (z' = 0 and inf slack where none exists)."""
    central = shares * local_sigma2
    if shares < 1 or local_sigma2 <= 0 or central <= smoothing**2 or l2_sensitivity <= 0:
        return GaussianReduction(0.0, math.inf)
    per_coordinate = share_sum_divergence(local_sigma2, shares) + smoothing_divergence(smoothing)
    return GaussianReduction(math.sqrt(central - smoothing**2) / l2_sensitivity,
                             dim * per_coordinate)


@lru_cache(maxsize=64)
def _gaussian_pld(noise_multiplier: float, q: float, discretization: float) -> Any:
    """dp-accounting's PLD of one Poisson-subsampled Gaussian (both adjacencies, pessimistic)."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    return pld.from_gaussian_mechanism(noise_multiplier, sampling_prob=q,
                                       value_discretization_interval=discretization)


def pld_epsilon(releases: Iterable[tuple[float, float, int, float]], delta: float,
                discretization: float = DISCRETIZATION) -> float:
    """Epsilon at delta of Poisson-subsampled Gaussian releases (z, q, steps, slack per step),
    composed by PLD and charged c, their total slack: eps_Gaussian(delta e^-c) + 2c. A release
    with q = 0 or no steps never sees the record: it costs nothing, slack included."""
    counts: dict[tuple[float, float], int] = {}
    slack = 0.0
    for z, q, steps, step_slack in releases:
        if steps > 0 and q > 0:
            counts[(z, q)] = counts.get((z, q), 0) + steps
            slack += steps * step_slack
    if not counts:
        return 0.0
    if math.isinf(slack) or any(z <= 0 for z, _ in counts):
        return math.inf
    composed = [_gaussian_pld(z, q, discretization).self_compose(steps)
                for (z, q), steps in sorted(counts.items())]
    total = composed[0]
    for more in composed[1:]:
        total = total.compose(more)
    return float(total.get_epsilon_for_delta(delta * math.exp(-slack))) + 2 * slack
