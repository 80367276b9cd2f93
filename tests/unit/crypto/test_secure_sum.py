"""Fixed-point encoding, the mask PRG and signed key adverts."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trellis.crypto.errors import EncodingError, ProtocolError
from trellis.crypto.fixedpoint import FixedPointSpec
from trellis.crypto.keyagreement import EphemeralKeyPair, RoundContext, make_advert, verify_advert
from trellis.crypto.pki import init_ca, load_identity, request_identity, sign_request
from trellis.crypto.prg import apply_masks, expand_mask

CTX = RoundContext("fed", 3, 1, run="run-1")


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 6), d=st.integers(0, 300), seed=st.integers(0, 2**32 - 1),
       ring=st.sampled_from([32, 64]))
def test_ring_sum_of_encodings_decodes_to_weighted_mean(n: int, d: int, seed: int,
                                                         ring: int) -> None:
    rng = np.random.default_rng(seed)
    spec = FixedPointSpec(clip=4.0, fraction_bits=16 if ring == 64 else 8, ring_bits=ring,
                          max_weight=1000 if ring == 64 else 100)
    inputs = [rng.uniform(-5, 5, d).astype(np.float32) for _ in range(n)]
    weights = [int(w) for w in rng.integers(1, spec.max_weight, n)]
    total = np.zeros(d + 1, spec.dtype)
    for v, w in zip(inputs, weights, strict=True):
        total += spec.encode(v, w)
    mean, total_weight = spec.decode_mean(total)
    clipped = [np.clip(v.astype(np.float64), -4, 4) for v in inputs]
    plain = sum(w * v for w, v in zip(weights, clipped, strict=True)) / sum(weights)
    assert total_weight == sum(weights)
    assert np.all(np.abs(mean - plain) <= spec.error_bound(n, total_weight) + 1e-12)


def test_double_encoding_yields_weighted_and_unweighted_means() -> None:
    spec = FixedPointSpec(clip=4.0, fraction_bits=20)
    inputs = [np.array([1.0, -2.0]), np.array([3.0, 0.5]), np.array([-1.0, 1.0])]
    weights = [10, 1, 5]
    total = sum(spec.encode_both(v, w) for v, w in zip(inputs, weights, strict=True))
    weighted, total_weight, plain, count = spec.decode_both(total)
    assert (total_weight, count) == (16, 3)
    assert np.allclose(weighted, [(10 + 3 - 5) / 16, (-20 + 0.5 + 5) / 16], atol=1e-5)
    assert np.allclose(plain, [1.0, -0.5 / 3], atol=1e-5)
    with pytest.raises(EncodingError, match="two equal halves"):
        spec.decode_both(total[:-1])


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


def test_apply_masks_adds_and_subtracts_keystreams_in_place() -> None:
    keys = [bytes([i]) * 32 for i in range(3)]
    for dtype in (np.uint32, np.uint64):
        target = np.arange(5000, dtype=dtype)
        apply_masks(target, add=keys[:2], subtract=keys[2:])
        expected = (np.arange(5000, dtype=dtype) + expand_mask(keys[0], 5000, dtype)
                    + expand_mask(keys[1], 5000, dtype) - expand_mask(keys[2], 5000, dtype))
        assert np.array_equal(target, expected)
        apply_masks(target, add=keys[2:], subtract=keys[:2])
        assert np.array_equal(target, np.arange(5000, dtype=dtype))
    with pytest.raises(EncodingError):
        apply_masks(np.zeros(3, np.int64), [keys[0]], [])


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
    keys, mask_keys = EphemeralKeyPair(), EphemeralKeyPair()
    advert = make_advert("alice", keys, mask_keys, CTX, alice.key_pem)
    verify_advert(advert, alice.cert_pem, alice.ca_pem, CTX)
    with pytest.raises(ProtocolError, match="signature"):
        verify_advert(advert, alice.cert_pem, alice.ca_pem, RoundContext("fed", 3, 2, run="run-1"))
    with pytest.raises(ProtocolError, match="certificate is 'bob'"):
        verify_advert(advert, bob.cert_pem, bob.ca_pem, CTX)
    swapped = replace(advert, mask_key=EphemeralKeyPair().public_bytes)
    with pytest.raises(ProtocolError, match="signature"):
        verify_advert(swapped, alice.cert_pem, alice.ca_pem, CTX)
    with pytest.raises(ProtocolError, match="both purposes"):
        verify_advert(replace(advert, mask_key=advert.cipher_key), alice.cert_pem,
                      alice.ca_pem, CTX)
    foreign = two_identities["foreign-alice"]
    forged = make_advert("alice", keys, mask_keys, CTX, foreign.key_pem)
    with pytest.raises(ProtocolError, match="not valid"):
        verify_advert(forged, foreign.cert_pem, alice.ca_pem, CTX)
    assert "secret" in repr(keys)
