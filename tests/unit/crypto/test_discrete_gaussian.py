"""The exact discrete Gaussian sampler (CKS20) and its random sources, against the exact pmf."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from trellis.crypto import discrete_gaussian as dg
from trellis.crypto.discrete_gaussian import (
    VECTOR_MAX_SIGMA2,
    DiscreteGaussian,
    discrete_gaussian_pmf,
    sample_discrete_gaussian,
)
from trellis.crypto.errors import EncodingError
from trellis.crypto.randomness import OsRandomSource, SeededRandomSource

# Seeded sources make every statistical test below deterministic: a pass never flakes. The
# threshold is the p-value a correct sampler must exceed; the negative control (a continuous
# Gaussian, sigma 10 % too large, rounded) must fall below P_FAIL at the same sample size.
P_PASS = 1e-3
P_FAIL = 1e-12
N = 200_000


def chi_square_p(samples: np.ndarray, sigma2: Fraction | int) -> float:
    """Chi-square p-value of integer samples against N_Z(0, sigma2), every bin >= ~25 expected."""
    sigma = float(sigma2) ** 0.5
    width = max(1, int(sigma / 8))  # ~50 bins over +-3 sigma whatever sigma is
    # The tails beyond 3 sigma are one bin each, ~67 expected in 50,000 samples. Reaching 5 sigma
    # left ~0.03 expected there, so one sample out there (6 % of runs) added ~30 to the statistic.
    reach = int(3 * sigma) + 1
    inner = np.arange(-reach, reach + 1, width)
    support = np.arange(-int(40 * sigma) - 2, int(40 * sigma) + 3)
    pmf = discrete_gaussian_pmf(support, sigma2)
    # Bin i holds [inner[i-1], inner[i]); the two outer bins take both tails.
    expected = np.bincount(np.searchsorted(inner, support, side="right"), weights=pmf,
                           minlength=inner.size + 1) * samples.size
    observed = np.bincount(np.searchsorted(inner, samples, side="right"),
                           minlength=inner.size + 1)
    keep = expected > 0
    stat = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    return float(stats.chi2.sf(stat, int(keep.sum()) - 1))


def exact_moments(sigma2: Fraction | int) -> tuple[float, float]:
    """Mean and variance of N_Z(0, sigma2) from its pmf."""
    sigma = float(sigma2) ** 0.5
    support = np.arange(-int(40 * sigma) - 2, int(40 * sigma) + 3)
    pmf = discrete_gaussian_pmf(support, sigma2)
    mean = float((support * pmf).sum())
    return mean, float(((support - mean) ** 2 * pmf).sum())


@pytest.mark.parametrize("sigma2", [Fraction(9, 4), 400, 3000**2])
def test_goodness_of_fit_and_moments(sigma2: Fraction | int) -> None:
    samples = sample_discrete_gaussian(sigma2, N, SeededRandomSource(b"fit"))
    assert samples.dtype == np.int64 and samples.shape == (N,)
    assert chi_square_p(samples, sigma2) > P_PASS
    mean, var = exact_moments(sigma2)
    # Standard errors: sqrt(var / n) for the mean, var * sqrt(2 / n) for the variance.
    assert abs(samples.mean() - mean) < 5 * (var / N) ** 0.5
    assert abs(samples.var() - var) < 5 * var * (2 / N) ** 0.5


@pytest.mark.parametrize("sigma2", [Fraction(9, 4), 400, 3000**2])
def test_negative_control_rounded_gaussian_with_wrong_sigma_fails(sigma2: Fraction | int) -> None:
    rng = np.random.default_rng(7)
    wrong = np.rint(rng.normal(0.0, 1.1 * float(sigma2) ** 0.5, N)).astype(np.int64)
    assert chi_square_p(wrong, sigma2) < P_FAIL


def test_pure_python_path_fits() -> None:
    # A huge denominator makes D = 2 t^2 p q exceed 2^62: every sample takes the Python path.
    sigma2 = Fraction(10**20 + 1, 10**18)  # about 100
    assert not DiscreteGaussian(sigma2).vectorised
    samples = sample_discrete_gaussian(sigma2, 20_000, SeededRandomSource(b"py"))
    assert chi_square_p(samples, sigma2) > P_PASS


def test_lanes_beyond_int64_finish_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    # Shrink the int64 limit so that most lanes of sigma^2 = 400 take the exact Python branch.
    monkeypatch.setattr(dg, "_A_MAX", 150)
    samples = sample_discrete_gaussian(400, 50_000, SeededRandomSource(b"lanes"))
    assert chi_square_p(samples, 400) > P_PASS


def test_draws_that_fall_short_go_again_and_still_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    # Candidates are drawn in bulk and the first accepted kept; far too few drawn each go makes
    # both rejection loops go many times, and the samples must be the same distribution.
    monkeypatch.setattr(dg, "_candidates", lambda need, acceptance: need // 3 + 1)
    samples = sample_discrete_gaussian(400, 50_000, SeededRandomSource(b"short"))
    assert chi_square_p(samples, 400) > P_PASS


def test_laplace_v_is_geometric_with_ratio_exp_minus_one() -> None:
    # V, drawn one trial and then three at a time, has P(V = m) = exp(-m) (1 - exp(-1)).
    v = dg._exp_one_successes(SeededRandomSource(b"v"), N)
    top = 8  # V >= 8: one bin, ~67 expected
    observed = np.bincount(np.minimum(v, top), minlength=top + 1)
    pmf = np.exp(-np.arange(top)) * (1 - np.exp(-1.0))
    expected = np.append(pmf, np.exp(-float(top))) * N
    stat = float(((observed - expected) ** 2 / expected).sum())
    assert stats.chi2.sf(stat, top) > P_PASS
    # A wrong ratio, exp(-0.9), fails at this size.
    wrong = np.minimum(np.random.default_rng(3).geometric(1 - np.exp(-0.9), N) - 1, top)
    wrong_stat = float(((np.bincount(wrong, minlength=top + 1) - expected) ** 2 / expected).sum())
    assert stats.chi2.sf(wrong_stat, top) < P_FAIL


def test_largest_vectorised_sigma_is_the_boundary() -> None:
    assert DiscreteGaussian(VECTOR_MAX_SIGMA2).vectorised
    assert not DiscreteGaussian(VECTOR_MAX_SIGMA2 + 1).vectorised
    assert 38_000**2 < VECTOR_MAX_SIGMA2 < 39_000**2


def test_seeded_source_reproducible_and_seed_dependent() -> None:
    a = sample_discrete_gaussian(400, 5000, SeededRandomSource(b"seed"))
    b = sample_discrete_gaussian(400, 5000, SeededRandomSource(b"seed"))
    c = sample_discrete_gaussian(400, 5000, SeededRandomSource(b"other"))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_os_source_samples() -> None:
    samples = DiscreteGaussian(400).sample(50_000, OsRandomSource())
    # Unseeded: a correct sampler falls below 1e-9 once in a billion runs.
    assert chi_square_p(samples, 400) > 1e-9


@pytest.mark.parametrize("bad", [0, -3, Fraction(-1, 2), 2.25, True, "4"])
def test_bad_sigma_raises(bad: object) -> None:
    with pytest.raises(EncodingError):
        sample_discrete_gaussian(bad, 10, SeededRandomSource(b"x"))  # type: ignore[arg-type]


def test_bad_count_raises() -> None:
    with pytest.raises(EncodingError):
        DiscreteGaussian(4).sample(-1, SeededRandomSource(b"x"))
    assert DiscreteGaussian(4).sample(0, SeededRandomSource(b"x")).size == 0


@pytest.mark.parametrize("bound", [1, 2, 3, 7, 2**40 + 3])
def test_uniform_below_is_uniform(bound: int) -> None:
    source = SeededRandomSource(b"uniform")
    draws = source.uniform_below(np.full(60_000, bound))
    assert draws.min() >= 0 and draws.max() < bound
    if 1 < bound <= 7:
        counts = np.bincount(draws, minlength=bound)
        assert stats.chisquare(counts).pvalue > P_PASS
    python = [source.randbelow(bound) for _ in range(2000)]
    assert min(python) >= 0 and max(python) < bound


def test_uniform_bounds_checked() -> None:
    source = SeededRandomSource(b"x")
    for bad in (0, 2**63):
        with pytest.raises(EncodingError):
            source.uniform_below(np.array([bad], dtype=np.uint64))
    with pytest.raises(EncodingError):
        source.randbelow(0)
    with pytest.raises(EncodingError):
        SeededRandomSource(b"")
