"""DDG encoding: sensitivity, unbiased bounded rounding, noise-share variance, ring round trip."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trellis.crypto.dp_encoding import DdgEncoding
from trellis.crypto.errors import EncodingError
from trellis.crypto.randomness import SeededRandomSource

SPEC = DdgEncoding(clip=1.0, bits=10, dim=4000, noise_multiplier=1.2, threshold=3, colluders=1)


def test_sensitivity_and_scale() -> None:
    assert SPEC.scale == 1024.0
    assert SPEC.l2_sensitivity == pytest.approx(1024 + math.sqrt(4000))
    assert SPEC.l1_sensitivity == pytest.approx(SPEC.l2_sensitivity * math.sqrt(4000))
    conditional = replace(SPEC, beta=math.exp(-0.5))
    # Kairouz Thm 1: sqrt(C^2 s^2 + d/4 + sqrt(2 ln(1/beta)) (C s + sqrt(d)/2)), smaller here.
    expected = math.sqrt(1024**2 + 1000 + 1.0 * (1024 + math.sqrt(4000) / 2))
    assert conditional.l2_sensitivity == pytest.approx(expected)
    assert conditional.l2_sensitivity < SPEC.l2_sensitivity


@settings(max_examples=60, deadline=None)
@given(z=st.floats(0.01, 50), bits=st.integers(1, 30), dim=st.integers(1, 10**7),
       t=st.integers(2, 200), c=st.integers(0, 100))
def test_noise_floor_holds_and_is_tight(z: float, bits: int, dim: int, t: int, c: int) -> None:
    spec = DdgEncoding(1.0, bits, dim, z, threshold=max(t, c + 1), colluders=c)
    target = (z * spec.l2_sensitivity) ** 2
    floor = (spec.threshold - spec.colluders) * spec.local_sigma2
    # Exact rational against the float target: never less noise, at most 2^-19 more.
    assert floor >= target and floor <= target * (1 + 2**-19)


def test_noise_shares_sum_variance_and_a_dropout() -> None:
    spec = replace(SPEC, dim=40_000)
    source = SeededRandomSource(b"shares")
    shares = [spec.noise_share(source) for _ in range(5)]
    sigma2 = float(spec.local_sigma2)
    full, dropped = np.sum(shares, axis=0), np.sum(shares[:4], axis=0)
    # Standard error of a sample variance: var * sqrt(2 / n); 5 of them as tolerance.
    tolerance = 5 * math.sqrt(2 / spec.dim)
    assert full.var() == pytest.approx(5 * sigma2, rel=tolerance)
    assert dropped.var() == pytest.approx(4 * sigma2, rel=tolerance)
    # The accounted noise falls by exactly one share's parameter when one silo drops.
    assert spec.central_sigma2(5) - spec.central_sigma2(4) == spec.local_sigma2
    assert float(spec.central_sigma2(2)) >= (spec.noise_multiplier * spec.l2_sensitivity) ** 2


def test_rounding_is_unbiased_and_within_the_bound() -> None:
    spec = DdgEncoding(clip=2.0, bits=4, dim=50, noise_multiplier=0.0, threshold=1)
    rng = np.random.default_rng(3)
    vector = rng.normal(size=50)
    vector *= 1.5 / np.linalg.norm(vector)  # inside the clip: no clipping bias
    m = 20_000
    total = spec.encode(np.tile(vector, (m, 1)), SeededRandomSource(b"round"))
    exact = vector * spec.scale
    # Each coordinate's rounding is Bernoulli(frac): the mean of m has std <= 0.5 / sqrt(m).
    assert np.all(np.abs(total / m - exact) < 5 * 0.5 / math.sqrt(m))
    one = spec.encode(vector, SeededRandomSource(b"one"))
    assert np.all(np.abs(one - exact) < 1)
    assert np.linalg.norm(one) <= spec.l2_sensitivity


def test_conditional_rounding_respects_the_tighter_bound() -> None:
    spec = DdgEncoding(clip=1.0, bits=3, dim=400, noise_multiplier=0.0, threshold=1, beta=0.01)
    rng = np.random.default_rng(4)
    source = SeededRandomSource(b"conditional")
    for _ in range(50):
        vector = rng.normal(size=400)
        one = spec.encode(vector * 10, source)  # clipped to norm 1 first
        assert np.linalg.norm(one) <= spec.l2_sensitivity < 8 + math.sqrt(400)


@pytest.mark.parametrize("ring_bits", [32, 64])
def test_ring_round_trip_of_a_sum_is_exact(ring_bits: int) -> None:
    spec = replace(SPEC, dim=1000, ring_bits=ring_bits)
    source = SeededRandomSource(b"ring")
    rng = np.random.default_rng(5)
    silos = [spec.encode(rng.normal(size=(3, 1000)), source) + spec.noise_share(source)
             for _ in range(4)]
    ring_sum = np.zeros(1000, dtype=spec.dtype)
    for ints in silos:
        ring_sum += spec.to_ring(ints)  # wraps: negatives are two's complement
    assert np.array_equal(spec.from_ring(ring_sum), np.sum(silos, axis=0))
    assert np.allclose(spec.decode(ring_sum), np.sum(silos, axis=0) / spec.scale)
    extreme = np.zeros(1000, dtype=np.int64)
    extreme[:2] = [-(2 ** (ring_bits - 1)), 2 ** (ring_bits - 1) - 1]
    assert np.array_equal(spec.from_ring(spec.to_ring(extreme)), extreme)


def test_decoded_sum_approximates_the_clipped_sum() -> None:
    spec = DdgEncoding(clip=1.0, bits=16, dim=100, noise_multiplier=0.0, threshold=1)
    rng = np.random.default_rng(6)
    rows = rng.normal(size=(10, 100)) * 0.05
    ring = spec.to_ring(spec.encode(rows, SeededRandomSource(b"d")))
    assert np.allclose(spec.decode(ring), rows.sum(axis=0), atol=10 / spec.scale)


def test_capacity() -> None:
    spec = replace(SPEC, bits=16, ring_bits=32)
    spec.check_capacity(contributions=30_000, silos=5)
    with pytest.raises(EncodingError, match="32-bit ring"):
        spec.check_capacity(contributions=40_000, silos=5)
    replace(spec, ring_bits=64).check_capacity(contributions=10**9, silos=5)
    with pytest.raises(EncodingError):
        replace(spec, ring_bits=32).to_ring(np.full(4000, 2**31, dtype=np.int64))


@pytest.mark.parametrize("change", [
    {"threshold": 2, "colluders": 2}, {"colluders": -1}, {"noise_multiplier": -0.1},
    {"noise_multiplier": float("nan")}, {"clip": 0.0}, {"bits": 0}, {"bits": 41},
    {"ring_bits": 16}, {"beta": 1.0}, {"dim": 0},
])
def test_bad_parameters_raise(change: dict[str, object]) -> None:
    with pytest.raises(EncodingError):
        replace(SPEC, **change)


def test_bad_vectors_raise() -> None:
    source = SeededRandomSource(b"bad")
    with pytest.raises(EncodingError, match="NaN"):
        SPEC.encode(np.full(4000, np.nan), source)
    with pytest.raises(EncodingError, match="length"):
        SPEC.encode(np.zeros(3999), source)
    with pytest.raises(EncodingError):
        SPEC.to_ring(np.zeros(4000, dtype=np.int32))
    with pytest.raises(EncodingError):
        SPEC.from_ring(np.zeros(4000, dtype=np.uint32))
