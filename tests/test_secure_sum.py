"""Fixed-point encoding, PRG masks and pairwise masking: the masked sum equals the plain sum."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crypto.errors import EncodingError, ProtocolError
from crypto.fixedpoint import FixedPointSpec
from crypto.keyagreement import EphemeralKeyPair, RoundContext, make_advert, verify_advert
from crypto.masking import mask_vector, sum_vectors
from crypto.pki import init_ca, load_identity, request_identity, sign_request
from crypto.prg import expand_mask

CTX = RoundContext("fed", 3, 1)


def _masked_round(inputs: list[np.ndarray], weights: list[int], spec: FixedPointSpec
                  ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    names = [f"silo-{i}" for i in range(len(inputs))]
    keys = {n: EphemeralKeyPair() for n in names}
    from crypto.keyagreement import KeyAdvert

    adverts = {n: KeyAdvert(n, keys[n].public_bytes, b"sig") for n in names}
    encoded = [spec.encode(v, w) for v, w in zip(inputs, weights, strict=True)]
    masked = [mask_vector(e, n, keys[n], adverts, CTX) for e, n in zip(encoded, names,
                                                                       strict=True)]
    return encoded, masked


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 6), d=st.integers(0, 300), seed=st.integers(0, 2**32 - 1),
       ring=st.sampled_from([32, 64]))
def test_masked_sum_equals_plain_weighted_mean(n: int, d: int, seed: int, ring: int) -> None:
    rng = np.random.default_rng(seed)
    spec = FixedPointSpec(clip=4.0, fraction_bits=16 if ring == 64 else 8, ring_bits=ring,
                          max_weight=1000 if ring == 64 else 100)
    inputs = [rng.uniform(-5, 5, d).astype(np.float32) for _ in range(n)]
    weights = [int(w) for w in rng.integers(1, spec.max_weight, n)]
    encoded, masked = _masked_round(inputs, weights, spec)
    total = sum_vectors(masked, spec)
    assert np.array_equal(total, sum_vectors(encoded, spec))  # masks cancel exactly
    mean, total_weight = spec.decode_mean(total)
    clipped = [np.clip(v.astype(np.float64), -4, 4) for v in inputs]
    plain = sum(w * v for w, v in zip(weights, clipped, strict=True)) / sum(weights)
    assert total_weight == sum(weights)
    assert np.all(np.abs(mean - plain) <= spec.error_bound(n, total_weight) + 1e-12)


def test_single_masked_vector_reveals_nothing_recognisable() -> None:
    spec = FixedPointSpec(clip=4.0, fraction_bits=20)
    inputs = [np.full(1000, 0.5, np.float32), np.full(1000, -0.25, np.float32)]
    encoded, masked = _masked_round(inputs, [10, 20], spec)
    for e, m in zip(encoded, masked, strict=True):
        assert np.count_nonzero(e == m) <= 2  # only chance collisions in 64-bit values


def test_encode_rejects_nan_and_bad_weights() -> None:
    spec = FixedPointSpec(clip=1.0, fraction_bits=10, max_weight=50)
    with pytest.raises(EncodingError, match="NaN"):
        spec.encode(np.array([0.1, np.nan]), 3)
    with pytest.raises(EncodingError, match="weight"):
        spec.encode(np.zeros(3), 51)
    with pytest.raises(EncodingError, match="weight"):
        spec.encode(np.zeros(3), 0)


def test_capacity_check_refuses_overflowing_rings() -> None:
    FixedPointSpec(clip=64.0, fraction_bits=24, ring_bits=64, max_weight=10**6).check_capacity(10)
    with pytest.raises(EncodingError, match="ring"):
        FixedPointSpec(clip=64.0, fraction_bits=24, ring_bits=32, max_weight=10**6
                       ).check_capacity(10)
    with pytest.raises(EncodingError, match="2\\^53"):
        FixedPointSpec(clip=1e6, fraction_bits=40, ring_bits=64).check_capacity(2)


def test_prg_is_deterministic_and_key_dependent() -> None:
    a = expand_mask(bytes(32), 1000, np.uint64)
    assert np.array_equal(a, expand_mask(bytes(32), 1000, np.uint64))
    assert not np.array_equal(a, expand_mask(b"\x01" + bytes(31), 1000, np.uint64))
    assert expand_mask(bytes(32), 0, np.uint32).size == 0
    with pytest.raises(EncodingError):
        expand_mask(bytes(16), 10, np.uint64)


def test_mismatched_vectors_cannot_be_summed() -> None:
    spec = FixedPointSpec(clip=1.0, fraction_bits=10)
    with pytest.raises(EncodingError):
        sum_vectors([np.zeros(3, np.uint64), np.zeros(4, np.uint64)], spec)
    with pytest.raises(EncodingError):
        sum_vectors([np.zeros(3, np.uint32)], spec)


@pytest.fixture(scope="module")
def two_identities(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("pki")
    init_ca(root / "ca", ["localhost"])
    out = {}
    for name in ("alice", "bob"):
        sign_request(request_identity(name, root / name), root / "ca")
        out[name] = load_identity(root / name)
    init_ca(root / "other-ca", ["localhost"])
    sign_request(request_identity("alice", root / "mallory"), root / "other-ca")
    out["foreign-alice"] = load_identity(root / "mallory")
    return out


def test_signed_advert_verifies_and_binds_context(two_identities) -> None:
    alice, bob = two_identities["alice"], two_identities["bob"]
    keys = EphemeralKeyPair()
    advert = make_advert("alice", keys, CTX, alice.key_pem)
    verify_advert(advert, alice.cert_pem, alice.ca_pem, CTX)
    with pytest.raises(ProtocolError, match="signature"):
        verify_advert(advert, alice.cert_pem, alice.ca_pem, RoundContext("fed", 3, 2))
    with pytest.raises(ProtocolError, match="certificate is 'bob'"):
        verify_advert(advert, bob.cert_pem, bob.ca_pem, CTX)
    swapped = type(advert)("alice", EphemeralKeyPair().public_bytes, advert.signature)
    with pytest.raises(ProtocolError, match="signature"):
        verify_advert(swapped, alice.cert_pem, alice.ca_pem, CTX)
    foreign = two_identities["foreign-alice"]
    forged = make_advert("alice", keys, CTX, foreign.key_pem)
    with pytest.raises(ProtocolError, match="not valid"):
        verify_advert(forged, foreign.cert_pem, alice.ca_pem, CTX)
    assert "secret" in repr(keys)
