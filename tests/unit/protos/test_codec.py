"""Codec round trips (property-based) and refusal of malformed tensor streams."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trellis.crypto.secagg import (
    EncryptedShare,
    RevealedShare,
    ShareKind,
    SurvivorSignature,
    UnmaskRequest,
)
from trellis.protos import codec
from trellis.protos import federation_pb2 as pb
from trellis.protos.codec import CodecError
from trellis.protos.messages import (
    Envelope,
    Instruction,
    KeyAdvertisement,
    KeyBundle,
    MetricsReport,
    Phase,
    RevealedShares,
    SealedShares,
    SignedKey,
    SignedSurvivors,
    UnmaskInstruction,
)

names = st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=0, max_size=20)
envelopes = st.builds(Envelope, names, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1),
                      st.sampled_from(list(Phase)))


@given(envelopes, st.lists(names, max_size=5), st.text(max_size=50), st.text(max_size=50),
       st.integers(0, 1000))
def test_instruction_round_trip(env, participants, plan, message, total) -> None:
    ins = Instruction(env, tuple(participants), plan, message, total)
    assert codec.instruction_from_pb(codec.instruction_to_pb(ins)) == ins


@given(envelopes, st.binary(max_size=40), st.binary(max_size=40), st.binary(max_size=80),
       st.integers(0, 2**63))
def test_advert_round_trip(env, cipher, mask, sig, length) -> None:
    adv = KeyAdvertisement(env, cipher, mask, sig, length)
    assert codec.advert_from_pb(codec.advert_to_pb(adv)) == adv


@given(envelopes, st.lists(st.tuples(names, st.binary(max_size=32), st.binary(max_size=32),
                                     st.binary(max_size=64), st.binary(max_size=64)),
                           max_size=4))
def test_bundle_round_trip(env, keys) -> None:
    bundle = KeyBundle(env, tuple(SignedKey(*k) for k in keys))
    assert codec.bundle_from_pb(codec.bundle_to_pb(bundle)) == bundle


@given(envelopes, st.lists(st.builds(EncryptedShare, names, names, st.binary(max_size=200)),
                           max_size=5))
def test_sealed_shares_round_trip(env, shares) -> None:
    sealed = SealedShares(env, tuple(shares))
    assert codec.shares_from_pb(codec.shares_to_pb(sealed)) == sealed


@given(envelopes, st.binary(max_size=80))
def test_survivor_signature_round_trip(env, signature) -> None:
    signed = SignedSurvivors(env, signature)
    assert codec.signed_survivors_from_pb(codec.signed_survivors_to_pb(signed)) == signed


@given(envelopes, st.lists(names, max_size=4), st.lists(names, max_size=4),
       st.lists(names, max_size=4),
       st.lists(st.builds(SurvivorSignature, names, st.binary(max_size=80)), max_size=3))
def test_unmask_request_round_trip(env, survivors, seeds, keys, signatures) -> None:
    ins = UnmaskInstruction(env, UnmaskRequest(tuple(survivors), tuple(seeds), tuple(keys),
                                               tuple(signatures)))
    assert codec.unmask_from_pb(codec.unmask_to_pb(ins)) == ins


@given(envelopes, st.lists(st.builds(RevealedShare, names, st.sampled_from(list(ShareKind)),
                                     st.binary(max_size=64)), max_size=5))
def test_revealed_shares_round_trip(env, shares) -> None:
    revealed = RevealedShares(env, tuple(shares))
    assert codec.revealed_from_pb(codec.revealed_to_pb(revealed)) == revealed


def test_unknown_share_kind_is_refused() -> None:
    msg = codec.revealed_to_pb(RevealedShares(Envelope("f", 1, 1, Phase.REVEAL_SHARES), (
        RevealedShare("a", ShareKind.MASK_KEY, b"x"),)))
    msg.shares[0].kind = 0
    with pytest.raises(CodecError, match="share kind"):
        codec.revealed_from_pb(msg)


@given(envelopes, st.dictionaries(names, st.floats(allow_nan=False), max_size=5))
def test_metrics_round_trip(env, metrics) -> None:
    report = MetricsReport(env, metrics)
    assert codec.metrics_from_pb(codec.metrics_to_pb(report)) == report


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(codec.ALLOWED_DTYPES),
       st.lists(st.integers(0, 9), min_size=0, max_size=3), st.integers(1, 64), envelopes)
def test_tensor_round_trip_any_chunking(dtype, shape, chunk, env) -> None:
    rng = np.random.default_rng(len(shape))
    array = (rng.random(tuple(shape)) * 1000).astype(dtype)
    chunks = list(codec.tensor_to_chunks("t", array, env, chunk_bytes=chunk))
    assert all(len(c.data) <= chunk for c in chunks)
    env2, name, out = codec.chunks_to_tensor(chunks, max_bytes=1 << 20, chunk_bytes=chunk)
    assert (env2, name) == (env, "t")
    assert out.dtype == array.dtype and out.shape == array.shape
    assert np.array_equal(out, array)


ENV = Envelope("fed", 2, 1, Phase.MASKED_INPUT)


def _chunks(array: np.ndarray, chunk: int = 16) -> list:
    return list(codec.tensor_to_chunks("x", array, ENV, chunk_bytes=chunk))


def test_corrupted_chunk_fails_digest() -> None:
    chunks = _chunks(np.arange(20, dtype=np.uint64))
    chunks[3].data = bytes(len(chunks[3].data))
    with pytest.raises(CodecError, match="digest"):
        codec.chunks_to_tensor(chunks, max_bytes=1 << 20, chunk_bytes=16)


@pytest.mark.parametrize(("dtype", "shape", "total"), [
    ("uint8", [2**62, 4], 0),            # 2**64 bytes: wraps to 0 in int64
    ("uint64", [2**63, 2], 0),           # beyond numpy's largest dimension
    ("uint8", [2**64 - 1], 2**64 - 1),   # the largest a uint64 field holds
    ("uint8", [0, 2**63], 0),            # empty, but numpy cannot shape it
    ("uint8", [1] * 33, 1),              # more dimensions than numpy allows
])
def test_hostile_shapes_are_codec_errors_not_crashes(dtype, shape, total) -> None:
    """Found by tests/e2e/test_fuzz.py: these reached numpy and crashed the handler."""
    header = pb.TensorHeader(name="x", dtype=dtype, shape=shape, total_bytes=total,
                             sha256=hashlib.sha256(b"").digest())
    chunk = pb.TensorChunk(envelope=codec.envelope_to_pb(ENV), header=header, last=True)
    with pytest.raises(CodecError, match="needs|exceeds|extent|dimensions"):
        codec.chunks_to_tensor([chunk], max_bytes=1 << 30)


def test_truncated_stream_and_extra_data_refused() -> None:
    chunks = _chunks(np.arange(20, dtype=np.uint64))
    with pytest.raises(CodecError, match="before its last"):
        codec.chunks_to_tensor(chunks[:-1], max_bytes=1 << 20, chunk_bytes=16)
    with pytest.raises(CodecError, match="after the last"):
        codec.chunks_to_tensor(chunks + chunks[-1:], max_bytes=1 << 20, chunk_bytes=16)
    with pytest.raises(CodecError, match="empty"):
        codec.chunks_to_tensor([], max_bytes=1 << 20)


def test_oversized_and_inconsistent_streams_refused() -> None:
    with pytest.raises(CodecError, match="exceeds the limit"):
        codec.chunks_to_tensor(_chunks(np.zeros(100, np.uint64)), max_bytes=100, chunk_bytes=16)
    chunks = _chunks(np.zeros(4, np.uint64))
    chunks[0].header.shape[:] = [5]
    with pytest.raises(CodecError, match="needs"):
        codec.chunks_to_tensor(chunks, max_bytes=1 << 20, chunk_bytes=16)
    chunks = _chunks(np.zeros(4, np.uint64))
    chunks[1].envelope.round = 3
    with pytest.raises(CodecError, match="envelope changed"):
        codec.chunks_to_tensor(chunks, max_bytes=1 << 20, chunk_bytes=16)
    big = _chunks(np.zeros(8, np.uint64), chunk=64)
    with pytest.raises(CodecError, match="exceeds 16"):
        codec.chunks_to_tensor(big, max_bytes=1 << 20, chunk_bytes=16)
    with pytest.raises(CodecError, match="dtype"):
        list(codec.tensor_to_chunks("x", np.zeros(2, np.complex64), ENV))


def test_unknown_phase_and_duplicate_metric_refused() -> None:
    msg = codec.envelope_to_pb(ENV)
    msg.phase = 99
    with pytest.raises(CodecError, match="phase"):
        codec.envelope_from_pb(msg)
    report = codec.metrics_to_pb(MetricsReport(ENV, {"a": 1.0}))
    report.metrics.add(name="a", value=2.0)
    with pytest.raises(CodecError, match="twice"):
        codec.metrics_from_pb(report)


def test_named_byte_strings_and_statistics_stream_and_are_checked() -> None:
    env = Envelope("f", 2, 1, Phase.ENCRYPT_UPDATE)
    blobs = {"ciphertext/0": b"\x00" * 3000, "ciphertext/1": b"", "ckks_public": b"abc"}
    out_env, out = codec.chunks_to_blobs(codec.blobs_to_chunks(blobs, env, chunk_bytes=1024),
                                         max_bytes=10_000, chunk_bytes=1024)
    assert out_env == env and out == blobs
    assert codec.blobs_digest(out) == codec.blobs_digest(blobs)
    with pytest.raises(CodecError, match="sent twice"):
        codec.chunks_to_blobs([*codec.blobs_to_chunks({"a": b"1"}, env),
                               *codec.blobs_to_chunks({"a": b"2"}, env)], max_bytes=100)
    with pytest.raises(CodecError, match="envelope changed"):
        codec.chunks_to_blobs([*codec.blobs_to_chunks({"a": b"1"}, env),
                               *codec.blobs_to_chunks({"b": b"2"}, Envelope("f", 3, 1,
                                                                            env.phase))],
                              max_bytes=100)
    with pytest.raises(CodecError, match="exceeds the limit"):
        codec.chunks_to_blobs(codec.blobs_to_chunks({"a": b"1" * 60, "b": b"2" * 60}, env),
                              max_bytes=100)
    with pytest.raises(CodecError, match="not a byte string"):
        codec.chunks_to_blobs(codec.tensor_to_chunks("a", np.zeros(2, np.float32), env),
                              max_bytes=100)
    with pytest.raises(CodecError, match="empty stream"):
        codec.chunks_to_blobs([], max_bytes=100)
    assert codec.pair_of(codec.pair_name("lab-a", "lab.b")) == ("lab-a", "lab.b")
    with pytest.raises(CodecError, match="not a pair name"):
        codec.pair_of("pair/x")
    chunks = list(codec.tensor_to_chunks("masked_input", np.arange(5, dtype=np.uint64), env,
                                         statistics={"update_norm": 0.5, "grad_norm": 2.0}))
    *_, stats = codec.chunks_to_masked_input(chunks, max_bytes=100)
    assert stats == {"update_norm": 0.5, "grad_norm": 2.0}
    chunks[0].statistics.add(name="grad_norm", value=1.0)
    with pytest.raises(CodecError, match="sent twice"):
        codec.chunks_to_masked_input(chunks, max_bytes=100)


def test_readers_fed_one_chunk_at_a_time_match_the_whole_stream_and_fail_early() -> None:
    """MaskedInputReader and BlobsReader (the asyncio server is handed one chunk at a time)
    give what the iterator functions give, and refuse a bad chunk when it arrives."""
    array = np.arange(40, dtype=np.uint64)
    reader = codec.MaskedInputReader(max_bytes=1 << 20, chunk_bytes=16)
    for chunk in _chunks(array):
        reader.feed(chunk)
    env, name, out, stats = reader.finish()
    assert (env, name, stats) == (ENV, "x", {}) and np.array_equal(out, array)
    extra = codec.MaskedInputReader(max_bytes=1 << 20, chunk_bytes=16)
    chunks = _chunks(array)
    for chunk in chunks:
        extra.feed(chunk)
    with pytest.raises(CodecError, match="data after the last chunk"):
        extra.feed(chunks[-1])
    corrupt = _chunks(array)
    corrupt[2].data = b"\xff" * len(corrupt[2].data)
    early = codec.MaskedInputReader(max_bytes=1 << 20, chunk_bytes=16)
    with pytest.raises(CodecError, match="digest"):
        for chunk in corrupt:
            early.feed(chunk)
    cut = codec.MaskedInputReader(max_bytes=1 << 20, chunk_bytes=16)
    cut.feed(chunks[0])
    with pytest.raises(CodecError, match="ended before its last chunk"):
        cut.finish()
    with pytest.raises(CodecError, match="empty tensor stream"):
        codec.MaskedInputReader(max_bytes=1 << 20).finish()
    blobs = {"a": b"1" * 50, "b": b"2" * 7}
    pieces = codec.BlobsReader(max_bytes=100, chunk_bytes=16)
    for chunk in codec.blobs_to_chunks(blobs, ENV, chunk_bytes=16):
        pieces.feed(chunk)
    assert pieces.finish() == (ENV, blobs)
    half = codec.BlobsReader(max_bytes=100, chunk_bytes=16)
    half.feed(next(iter(codec.blobs_to_chunks(blobs, ENV, chunk_bytes=16))))
    with pytest.raises(CodecError, match="ended before its last chunk"):
        half.finish()
