"""The tight accountant for discrete noise (crypto/dp_pld.py): its two lemmas checked on exact
pmfs, its epsilon never below the exact one of the discrete mechanism it bounds (one and two
dimensions, sums of shares, subsampled), equal to dp-accounting's Gaussian PLD where the noise is
large, monotone, and the ledger and calibration that use it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld

from trellis.crypto.dp_accountant import (
    PLD_ACCOUNTANT_VERSION,
    AccountingError,
    PrivacyLedger,
    RoundEvent,
    accountant_version,
    gaussian_epsilon_pld,
    noise_multiplier_for,
    projected_epsilon,
)
from trellis.crypto.dp_pld import (
    DISCRETIZATION,
    SMOOTHING,
    pld_epsilon,
    reduce_discrete_noise,
    share_sum_divergence,
    smoothing_divergence,
    theta_excess,
)

DELTA = 1e-5


def discrete_gaussian(sigma2: float, reach: int) -> np.ndarray:
    """N_Z(0, sigma^2) on -reach..reach (the mass beyond is below 1e-30 where it is used)."""
    k = np.arange(-reach, reach + 1, dtype=np.float64)
    weights = np.exp(-k * k / (2 * sigma2))
    return weights / weights.sum()


def ddg(sigma2: float, shares: int, l2: float, dim: int, q: float, steps: int) -> RoundEvent:
    return RoundEvent("ddg", q, steps, local_sigma2=sigma2, honest_shares=shares,
                      l2_sensitivity=l2, l1_sensitivity=l2 * min(math.sqrt(dim), l2), dim=dim)


def tight(event: RoundEvent, discretization: float = DISCRETIZATION) -> float:
    return pld_epsilon([event.gaussian_release()], DELTA, discretization)


def exact_epsilon(noise: dict[object, float], shifted: dict[object, float], q: float,
                  steps: int) -> float:
    """A lower bound (optimistic rounding) on the exact epsilon of `steps` Poisson-subsampled
    releases whose noise pmf is `noise` and, with the record, `shifted`: both directions."""
    mixture = {x: (1 - q) * noise.get(x, 0.0) + q * shifted.get(x, 0.0)
               for x in {*noise, *shifted}}

    def logs(pmf: dict[object, float]) -> dict[object, float]:
        return {x: math.log(p) if p > 0 else -math.inf for x, p in pmf.items()}

    worst = 0.0
    for upper, lower in ((mixture, noise), (noise, mixture)):
        one = pld.from_two_probability_mass_functions(
            logs(lower), logs(upper), pessimistic_estimate=False,
            value_discretization_interval=1e-4)
        worst = max(worst, one.self_compose(steps).get_epsilon_for_delta(DELTA))
    return worst


# ---- the two lemmas, on exact pmfs ----

@pytest.mark.parametrize("s", [0.3, 0.5, 0.8])
def test_theta_excess_bounds_the_shifted_lattice_sums(s: float) -> None:
    # Poisson summation: sum_k exp(-(k - c)^2 / 2s^2) = sqrt(2 pi) s (1 + e(c)), |e| <= bound.
    centres = np.linspace(0, 1, 201)
    k = np.arange(-60, 61)[:, None]
    sums = np.exp(-(k - centres) ** 2 / (2 * s * s)).sum(axis=0) / (math.sqrt(2 * math.pi) * s)
    worst = float(np.max(np.abs(sums - 1)))
    assert worst <= theta_excess(s) + 1e-12    # float error of the 121-term sums
    assert worst >= 0.99 * theta_excess(s)     # tight: reached at c = 0


@pytest.mark.parametrize(("s", "width"), [(0.5, 3.0), (0.7, 1.5)])
def test_rounding_a_gaussian_by_the_kernel_is_the_discrete_gaussian_up_to_the_bound(
        s: float, width: float) -> None:
    # K(x) ~ N_Z(x, s^2): P(K(G) = k) for G ~ N(0, w^2), by quadrature, against N_Z(0, w^2 + s^2).
    x = np.linspace(-14 * width, 14 * width, 200_001)
    lattice = np.arange(-40, 41)
    kernel_norm = np.exp(-(lattice[:, None] - x) ** 2 / (2 * s * s)).sum(axis=0)
    density = np.exp(-x * x / (2 * width**2)) / (math.sqrt(2 * math.pi) * width)
    ks = np.arange(-int(4 * width) - 2, int(4 * width) + 3)
    rounded = np.array([np.trapezoid(density * np.exp(-(k - x) ** 2 / (2 * s * s))
                                     / kernel_norm, x) for k in ks])
    target = discrete_gaussian(width**2 + s * s, 60)[60 + ks]
    assert float(np.max(np.abs(np.log(rounded / target)))) <= smoothing_divergence(s)
    # The quadrature can tell: the kernel's own variance s^2 is part of the result.
    unwidened = discrete_gaussian(width**2, 60)[60 + ks]
    assert float(np.max(np.abs(np.log(rounded / unwidened)))) > smoothing_divergence(s)


@pytest.mark.parametrize(("sigma2", "shares"), [(0.3, 2), (0.3, 5), (0.5, 4)])
def test_a_sum_of_shares_is_the_discrete_gaussian_of_the_summed_variance_up_to_the_bound(
        sigma2: float, shares: int) -> None:
    one = discrete_gaussian(sigma2, 40)
    total = one
    for _ in range(shares - 1):
        total = np.convolve(total, one)
    reach = (len(total) - 1) // 2
    target = discrete_gaussian(shares * sigma2, reach)
    middle = slice(reach - 8, reach + 9)          # where both are far above float error
    worst = float(np.max(np.abs(np.log(total[middle] / target[middle]))))
    assert 0 < worst <= share_sum_divergence(sigma2, shares)


# ---- never below the exact epsilon of the discrete mechanism ----

@pytest.mark.parametrize(("sigma", "sensitivity", "q", "steps"), [
    (3.0, 2, 1.0, 1), (3.0, 2, 0.1, 30), (12.0, 8, 0.2, 20), (40.0, 30, 0.05, 100)])
def test_one_dimension_is_never_below_the_exact_discrete_gaussian(
        sigma: float, sensitivity: int, q: float, steps: int) -> None:
    exact = pld.from_discrete_gaussian_mechanism(
        sigma, sensitivity, sampling_prob=q, pessimistic_estimate=False,
        value_discretization_interval=1e-5).self_compose(steps).get_epsilon_for_delta(DELTA)
    ours = tight(ddg(sigma**2, 1, sensitivity, 1, q, steps))
    assert exact <= ours
    if sigma >= 12:         # s^2 = 4 of sigma^2 is what the bound costs at small sigma
        assert ours <= exact * 1.05


def test_the_continuous_gaussian_under_reports_a_small_discrete_gaussian() -> None:
    # Why the discrete noise is not simply accounted as the continuous Gaussian: at sigma 3,
    # sensitivity 2, the exact discrete epsilon (2.762) exceeds the Gaussian's (2.753).
    exact = pld.from_discrete_gaussian_mechanism(
        3.0, 2, pessimistic_estimate=False,
        value_discretization_interval=1e-5).get_epsilon_for_delta(DELTA)
    assert gaussian_epsilon_pld(1.5, 1.0, 1, DELTA) < exact - 0.005
    assert tight(ddg(9.0, 1, 2, 1, 1.0, 1)) >= exact


@pytest.mark.parametrize(("sigma2", "shares", "q", "steps"), [(3.0, 3, 1.0, 1), (3.0, 3, 0.3, 10),
                                                              (20.0, 4, 0.2, 10)])
def test_a_sum_of_shares_is_never_below_its_exact_epsilon(sigma2: float, shares: int,
                                                          q: float, steps: int) -> None:
    one = discrete_gaussian(sigma2, math.ceil(9 * math.sqrt(sigma2)))
    total = one
    for _ in range(shares - 1):
        total = np.convolve(total, one)
    reach = (len(total) - 1) // 2
    noise = {int(x): float(p) for x, p in zip(range(-reach, reach + 1), total, strict=True)}
    shifted = {x + 3: p for x, p in noise.items()}
    ours = tight(ddg(sigma2, shares, 3.0, 1, q, steps))
    assert exact_epsilon(noise, shifted, q, steps) <= ours


@pytest.mark.parametrize("shift", [(5, 0), (3, 4)])
@pytest.mark.parametrize(("q", "steps"), [(1.0, 1), (0.4, 3)])
def test_two_dimensions_every_lattice_shift_is_covered(shift: tuple[int, int], q: float,
                                                       steps: int) -> None:
    # N_Z(0, 36)^2 moved by an integer vector of L2 norm 5, along an axis or diagonally: the
    # exact two-dimensional privacy loss differs between the two; the bound covers both.
    one = discrete_gaussian(36.0, 54)
    grid = range(-54, 55)
    noise = {(a, b): float(one[a + 54] * one[b + 54]) for a in grid for b in grid}
    shifted = {(a + shift[0], b + shift[1]): p for (a, b), p in noise.items()}
    ours = tight(ddg(36.0, 1, 5.0, 2, q, steps))
    exact = exact_epsilon(noise, shifted, q, steps)
    assert exact <= ours <= exact * 1.12


# ---- where it must agree with dp-accounting's Gaussian, and sanity ----

@pytest.mark.parametrize(("z", "q", "steps"), [(1.0, 0.05, 200), (3.2, 0.2, 200), (0.9, 1.0, 5)])
def test_large_noise_many_shares_is_the_gaussian_pld(z: float, q: float, steps: int) -> None:
    l2, dim, shares = 2.0**16 + 300, 90_000, 5
    ours = tight(ddg((z * l2) ** 2 / shares, shares, l2, dim, q, steps), 1e-4)
    gaussian = gaussian_epsilon_pld(z, q, steps, DELTA)
    # Equal up to the two computations' float rounding (ours read 2e-11 below on an AMD EPYC).
    assert gaussian * (1 - 1e-9) <= ours <= gaussian * (1 + 1e-6)


def test_monotone_and_never_below_the_central_gaussian() -> None:
    l2, shares = 1000.0, 4

    def eps(z: float, q: float, steps: int) -> float:
        return tight(ddg((z * l2) ** 2 / shares, shares, l2, 5000, q, steps))

    by_noise = [eps(z, 0.1, 50) for z in (0.8, 1.0, 1.5, 3.0)]
    by_steps = [eps(1.0, 0.1, t) for t in (1, 10, 50, 200)]
    by_rate = [eps(1.0, q, 50) for q in (0.01, 0.1, 0.5, 1.0)]
    assert by_noise == sorted(by_noise, reverse=True)
    assert by_steps == sorted(by_steps) and by_rate == sorted(by_rate)
    for z, q, t in [(0.8, 0.1, 50), (1.0, 0.01, 50), (1.0, 1.0, 50), (3.0, 0.1, 50)]:
        assert eps(z, q, t) >= gaussian_epsilon_pld(z, q, t, DELTA, DISCRETIZATION)


def test_no_noise_and_no_release() -> None:
    assert reduce_discrete_noise(3.0, 1, 2.0, 1).slack == math.inf          # sigma^2 <= s^2
    assert math.isinf(tight(ddg(4.0, 0, 10.0, 100, 0.1, 1)))                 # no honest share
    assert tight(ddg(4.0, 2, 10.0, 100, 0.0, 10)) == 0.0                     # never sampled
    assert math.isinf(smoothing_divergence(0.1)) and SMOOTHING == 2.0


# ---- the ledger and the calibration ----

def test_a_pld_ledger_records_composes_and_round_trips() -> None:
    rounds = [RoundEvent("local-gaussian", 0.05, 20, noise_multiplier=1.2),
              ddg(3e6, 4, 1100.0, 1000, 0.05, 20), ddg(3e6, 3, 1100.0, 1000, 1.0, 1)]
    ledger = PrivacyLedger(accountant="pld")
    for event in rounds:
        ledger.record(event)
    each = [projected_epsilon([e], DELTA, accountant="pld") for e in rounds]
    assert max(each) < ledger.epsilon(DELTA) < sum(each)
    again = PrivacyLedger.from_json(ledger.to_json())
    assert again.accountant == "pld" and again.epsilon(DELTA) == ledger.epsilon(DELTA)
    # Tighter than the RDP ledger of the same rounds.
    assert ledger.epsilon(DELTA) < PrivacyLedger(rounds).epsilon(DELTA)
    old = '{"version": 1, "orders": [2, 3], "events": []}'       # written before "pld"
    assert PrivacyLedger.from_json(old).accountant == "rdp"
    with pytest.raises(AccountingError):
        PrivacyLedger(accountant="moments")
    assert accountant_version("pld") == PLD_ACCOUNTANT_VERSION != accountant_version("rdp")


def test_the_distributed_arm_needs_the_central_gaussians_noise() -> None:
    # The bench's settings (bench/dp_noise_needed.py): 650 graphs per silo, batch 128, 200
    # rounds, 5 silos, epsilon 4. The old bound asked z = 15.5; the Gaussian's RDP 3.39.
    q, unit = 128 / 650, 2.0**16
    central = noise_multiplier_for(4.0, DELTA, q, 200, accountant="pld")
    distributed = noise_multiplier_for(4.0, DELTA, q, 200, "ddg", l2_sensitivity=unit,
                                       l1_sensitivity=unit, honest_shares=5, accountant="pld")
    assert central <= distributed <= central * 1.001
    assert distributed < 3.39
