"""Pairwise cosine similarity under CKKS with blinded decryption (crypto/ckks.py).

One key set and one run of the whole flow are shared by the module: CKKS operations are slow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import tenseal as ts  # type: ignore[import-untyped]

from trellis.crypto import ckks
from trellis.crypto.errors import EncodingError, ProtocolError

D = 24_960
MEMBERS = ["s3", "s1", "s0", "s2"]


@dataclass
class Flow:
    secret: bytes
    public: bytes
    vectors: dict[str, np.ndarray]
    chunks: dict[str, list[bytes]]
    blinded: dict[tuple[str, str], bytes]
    offsets: dict[tuple[str, str], float]
    opened: dict[tuple[str, str], float]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def flow() -> Flow:
    secret, public = ckks.make_ckks_contexts()
    rng = np.random.default_rng(7)
    base = rng.standard_normal((2, D))
    vectors = {
        "s0": base[0],
        "s1": base[1].astype(np.float32),
        "s2": base[0] * 5.0 + rng.standard_normal(D) * 1e-3,   # nearly identical to s0
        "s3": -0.01 * base[1] + 0.004 * rng.standard_normal(D),  # mostly opposed to s1
    }
    chunks = {silo: ckks.encrypt_unit_vector(secret, v) for silo, v in vectors.items()}
    blinded, offsets = ckks.blinded_inner_products(public, chunks)
    opened = ckks.decrypt_blinded(secret, blinded, MEMBERS)
    return Flow(secret, public, vectors, chunks, blinded, offsets, opened)


def test_similarities_match_the_plain_cosines(flow: Flow) -> None:
    matrix = ckks.similarity_matrix(MEMBERS, flow.opened, flow.offsets)
    plain = np.array([[_cosine(flow.vectors[a], flow.vectors[b]) for b in MEMBERS]
                      for a in MEMBERS])
    assert matrix.shape == (4, 4)
    np.testing.assert_allclose(matrix, plain, atol=1e-3)
    np.testing.assert_array_equal(matrix, matrix.T)
    np.testing.assert_array_equal(np.diag(matrix), np.ones(4))
    assert matrix[MEMBERS.index("s0"), MEMBERS.index("s2")] > 0.999
    assert matrix[MEMBERS.index("s1"), MEMBERS.index("s3")] < -0.9


def test_layout_and_unit_norm(flow: Flow) -> None:
    assert all(len(chunks) == ckks.chunk_count(D) == 7 for chunks in flow.chunks.values())
    assert set(flow.blinded) == set(flow.offsets) == set(ckks.pairs_of(MEMBERS))
    assert ckks.pairs_of(MEMBERS)[0] == ("s0", "s1") and len(ckks.pairs_of(MEMBERS)) == 6
    context = ts.context_from(flow.secret)
    decrypted = np.concatenate([ts.ckks_vector_from(context, c).decrypt()
                                for c in flow.chunks["s2"]])
    assert decrypted.shape == (D,)
    assert np.linalg.norm(decrypted) == pytest.approx(1.0, abs=1e-4)


def test_public_context_holds_no_secret_key(flow: Flow) -> None:
    public = ts.context_from(flow.public)
    assert not public.is_private()
    assert public.has_galois_keys() and public.has_relin_keys()
    assert ts.context_from(flow.secret).is_private()
    with pytest.raises(ProtocolError, match="holds a secret key"):
        ckks.blinded_inner_products(flow.secret, flow.chunks)
    with pytest.raises(ProtocolError, match="holds no secret key"):
        ckks.decrypt_blinded(flow.public, flow.blinded)
    with pytest.raises(ProtocolError, match="holds no secret key"):
        ckks.encrypt_unit_vector(flow.public, flow.vectors["s0"])


def test_the_decrypting_silo_sees_only_blinded_values(flow: Flow) -> None:
    for pair, value in flow.opened.items():
        cosine = _cosine(flow.vectors[pair[0]], flow.vectors[pair[1]])
        assert abs(value - cosine) > 1.0        # not the cosine, nor anything near it
        assert value - flow.offsets[pair] == pytest.approx(cosine, abs=1e-3)
        assert abs(flow.offsets[pair]) <= ckks.DEFAULT_BLINDING_BOUND
    assert len(set(flow.offsets.values())) == len(flow.offsets)


def test_every_slot_is_blinded(flow: Flow) -> None:
    """A silo that rewrites the vector size to decrypt all 4096 slots still sees only r + c."""
    pair = ("s0", "s2")
    data = flow.blinded[pair]
    if data[:3] != b"\x0a\x01\x01":   # CKKSVectorProto: sizes = [1]
        pytest.skip("TenSEAL serialisation layout changed")
    forged = b"\x0a\x02\x80\x20" + data[3:]  # sizes = [4096]
    slots = np.array(ts.ckks_vector_from(ts.context_from(flow.secret), forged).decrypt())
    assert slots.shape == (ckks.SLOTS,)
    np.testing.assert_allclose(slots, flow.opened[pair], atol=1e-3)
    with pytest.raises(ProtocolError, match="holds 4096 values, not 1"):
        ckks.decrypt_blinded(flow.secret, {pair: forged})


def test_offsets_come_from_the_given_generator_and_bound(flow: Flow) -> None:
    two = {silo: flow.chunks[silo] for silo in ("s0", "s1")}
    _, first = ckks.blinded_inner_products(flow.public, two, np.random.default_rng(3), bound=8.0)
    blinded, again = ckks.blinded_inner_products(flow.public, two, np.random.default_rng(3),
                                                 bound=8.0)
    assert first == again and abs(first[("s0", "s1")]) <= 8.0
    opened = ckks.decrypt_blinded(flow.secret, blinded)
    matrix = ckks.similarity_matrix(["s1", "s0"], opened, again)
    assert matrix[0, 1] == pytest.approx(_cosine(flow.vectors["s0"], flow.vectors["s1"]),
                                         abs=1e-3)
    for bound in (0.0, -1.0, 2.0**31):
        with pytest.raises(ProtocolError, match="blinding bound"):
            ckks.blinded_inner_products(flow.public, two, bound=bound)


def test_mismatched_chunk_layouts_are_refused(flow: Flow) -> None:
    short = ckks.encrypt_unit_vector(flow.secret, np.ones(ckks.SLOTS))
    with pytest.raises(ProtocolError, match="differ in chunk layout"):
        ckks.blinded_inner_products(flow.public, {"s0": flow.chunks["s0"], "s1": short})
    # Same number of chunks, different length of the last one.
    longer = ckks.encrypt_unit_vector(flow.secret, np.ones(ckks.SLOTS + 10))
    shorter = ckks.encrypt_unit_vector(flow.secret, np.ones(ckks.SLOTS + 5))
    with pytest.raises(ProtocolError, match="2 chunks, 4106 values"):
        ckks.blinded_inner_products(flow.public, {"a": longer, "b": shorter})
    with pytest.raises(ProtocolError, match="at least two silos"):
        ckks.blinded_inner_products(flow.public, {"a": longer})
    with pytest.raises(ProtocolError, match="sent no list"):
        ckks.blinded_inner_products(flow.public, {"a": longer, "b": []})
    with pytest.raises(ProtocolError, match="from 'b' does not load"):
        ckks.blinded_inner_products(flow.public, {"a": longer, "b": [b"junk", b"junk"]})


def test_bad_vectors_and_contexts_are_refused(flow: Flow) -> None:
    for bad, message in [(np.zeros(10), "zero vector"), (np.array([1.0, np.nan]), "NaN"),
                         (np.ones((2, 3)), "1-D"), (np.array([]), "non-empty")]:
        with pytest.raises(EncodingError, match=message):
            ckks.encrypt_unit_vector(flow.secret, bad)
    huge = ckks.encrypt_unit_vector(flow.secret, np.array([1e300, 1e300]))
    tiny = ckks.encrypt_unit_vector(flow.secret, np.array([1e-300, 1e-300]))
    blinded, offsets = ckks.blinded_inner_products(flow.public, {"a": huge, "b": tiny})
    matrix = ckks.similarity_matrix(["a", "b"], ckks.decrypt_blinded(flow.secret, blinded),
                                    offsets)
    assert matrix[0, 1] == pytest.approx(1.0, abs=1e-3)
    with pytest.raises(ProtocolError, match="not a serialized TenSEAL context"):
        ckks.decrypt_blinded(b"junk", {})
    with pytest.raises(ProtocolError, match="not a serialized TenSEAL context"):
        ckks.blinded_inner_products(b"junk", flow.chunks)


def test_the_decrypting_silo_releases_only_expected_pairs(flow: Flow) -> None:
    extra = {**flow.blinded, ("s0", "zz"): flow.blinded[("s0", "s1")]}
    with pytest.raises(ProtocolError, match="unexpected pairs"):
        ckks.decrypt_blinded(flow.secret, extra, MEMBERS)
    missing = dict(list(flow.blinded.items())[1:])
    with pytest.raises(ProtocolError, match="missing"):
        ckks.decrypt_blinded(flow.secret, missing, MEMBERS)
    with pytest.raises(ProtocolError, match="ascending order"):
        ckks.decrypt_blinded(flow.secret, {("s1", "s0"): flow.blinded[("s0", "s1")]})
    # A raw encrypted update is never decrypted, even if the coordinator sends one.
    with pytest.raises(ProtocolError, match="holds 4096 values, not 1"):
        ckks.decrypt_blinded(flow.secret, {("s0", "s1"): flow.chunks["s0"][0]})
    with pytest.raises(ProtocolError, match="does not load"):
        ckks.decrypt_blinded(flow.secret, {("s0", "s1"): b"junk"})


def test_unblinding_checks_pairs_and_offsets(flow: Flow) -> None:
    with pytest.raises(ProtocolError, match="no blinded similarity or offset"):
        ckks.similarity_matrix(MEMBERS + ["s9"], flow.opened, flow.offsets)
    wrong = {pair: offset + 5.0 for pair, offset in flow.offsets.items()}
    with pytest.raises(ProtocolError, match="not a cosine"):
        ckks.similarity_matrix(MEMBERS, flow.opened, wrong)
    with pytest.raises(ProtocolError, match="distinct"):
        ckks.similarity_matrix(["s0", "s0"], flow.opened, flow.offsets)
