"""The one translation seam between domain types and generated protobuf code (STYLE.md 3).

Tensors travel as dtype + shape + bytes, split into chunks of at most ``CHUNK_BYTES`` so that no
single gRPC message approaches the transport's size limit however large the tensor is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

import numpy as np

from crypto.secagg import (
    EncryptedShare,
    RevealedShare,
    ShareKind,
    SurvivorSignature,
    UnmaskRequest,
)
from protos import federation_pb2 as pb
from protos.messages import (
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

CHUNK_BYTES = 1 << 20
ALLOWED_DTYPES = ("float32", "float64", "uint32", "uint64", "int64")


class CodecError(ValueError):
    """A message cannot be decoded: malformed, inconsistent or over its limits."""


# -- envelope ---------------------------------------------------------------------------------
def envelope_to_pb(env: Envelope) -> pb.Envelope:
    """Domain envelope -> protobuf."""
    return pb.Envelope(federation_id=env.federation, round=env.round, attempt=env.attempt,
                       phase=pb.Phase.ValueType(int(env.phase)))


def envelope_from_pb(msg: pb.Envelope) -> Envelope:
    """Protobuf envelope -> domain; an unknown phase number is a CodecError."""
    try:
        phase = Phase(msg.phase)
    except ValueError:
        raise CodecError(f"unknown phase {msg.phase}") from None
    return Envelope(federation=msg.federation_id, round=msg.round, attempt=msg.attempt,
                    phase=phase)


# -- control messages -------------------------------------------------------------------------
def attend_request(env: Envelope, agent_version: str) -> pb.AttendRequest:
    """Build the silo's attend request."""
    return pb.AttendRequest(envelope=envelope_to_pb(env), agent_version=agent_version)


def attend_from_pb(msg: pb.AttendRequest) -> tuple[Envelope, str]:
    """Decode an attend request."""
    return envelope_from_pb(msg.envelope), msg.agent_version


def instruction_to_pb(ins: Instruction) -> pb.Instruction:
    """Domain instruction -> protobuf."""
    return pb.Instruction(envelope=envelope_to_pb(ins.envelope),
                          participants=list(ins.participants),
                          public_plan_json=ins.public_plan_json, message=ins.message,
                          total_rounds=ins.total_rounds)


def instruction_from_pb(msg: pb.Instruction) -> Instruction:
    """Protobuf instruction -> domain."""
    return Instruction(envelope=envelope_from_pb(msg.envelope),
                       participants=tuple(msg.participants),
                       public_plan_json=msg.public_plan_json, message=msg.message,
                       total_rounds=msg.total_rounds)


def advert_to_pb(adv: KeyAdvertisement) -> pb.KeyAdvertisement:
    """Domain key advertisement -> protobuf."""
    return pb.KeyAdvertisement(envelope=envelope_to_pb(adv.envelope),
                               cipher_public_key=adv.cipher_key, mask_public_key=adv.mask_key,
                               signature=adv.signature, shared_length=adv.shared_length)


def advert_from_pb(msg: pb.KeyAdvertisement) -> KeyAdvertisement:
    """Protobuf key advertisement -> domain."""
    return KeyAdvertisement(envelope=envelope_from_pb(msg.envelope),
                            cipher_key=msg.cipher_public_key, mask_key=msg.mask_public_key,
                            signature=msg.signature, shared_length=msg.shared_length)


def stage_request(env: Envelope) -> pb.StageRequest:
    """Build a request for what the coordinator holds for the caller at a stage."""
    return pb.StageRequest(envelope=envelope_to_pb(env))


def request_envelope(msg: pb.StageRequest) -> Envelope:
    """Envelope of a bare request message."""
    return envelope_from_pb(msg.envelope)


def bundle_to_pb(bundle: KeyBundle) -> pb.KeyBundle:
    """Domain key bundle -> protobuf."""
    return pb.KeyBundle(envelope=envelope_to_pb(bundle.envelope), keys=[
        pb.SignedKey(silo=k.silo, cipher_public_key=k.cipher_key, mask_public_key=k.mask_key,
                     signature=k.signature, certificate_pem=k.certificate_pem)
        for k in bundle.keys])


def bundle_from_pb(msg: pb.KeyBundle) -> KeyBundle:
    """Protobuf key bundle -> domain."""
    return KeyBundle(envelope=envelope_from_pb(msg.envelope), keys=tuple(
        SignedKey(silo=k.silo, cipher_key=k.cipher_public_key, mask_key=k.mask_public_key,
                  signature=k.signature, certificate_pem=k.certificate_pem) for k in msg.keys))


# -- secure aggregation stages ----------------------------------------------------------------
def shares_to_pb(sealed: SealedShares) -> pb.SealedShares:
    """Domain sealed shares -> protobuf."""
    return pb.SealedShares(envelope=envelope_to_pb(sealed.envelope), shares=[
        pb.EncryptedShare(sender=s.sender, receiver=s.receiver, box=s.box)
        for s in sealed.shares])


def shares_from_pb(msg: pb.SealedShares) -> SealedShares:
    """Protobuf sealed shares -> domain."""
    return SealedShares(envelope_from_pb(msg.envelope), tuple(
        EncryptedShare(s.sender, s.receiver, s.box) for s in msg.shares))


def signed_survivors_to_pb(signed: SignedSurvivors) -> pb.SurvivorSignature:
    """Domain survivor signature (upload) -> protobuf."""
    return pb.SurvivorSignature(envelope=envelope_to_pb(signed.envelope),
                                signature=signed.signature)


def signed_survivors_from_pb(msg: pb.SurvivorSignature) -> SignedSurvivors:
    """Protobuf survivor signature (upload) -> domain; the signer is the caller."""
    return SignedSurvivors(envelope_from_pb(msg.envelope), msg.signature)


def unmask_to_pb(ins: UnmaskInstruction) -> pb.UnmaskRequest:
    """Domain unmask request -> protobuf."""
    req = ins.request
    return pb.UnmaskRequest(
        envelope=envelope_to_pb(ins.envelope), survivors=list(req.survivors),
        seed_shares_of=list(req.seed_shares_of), key_shares_of=list(req.key_shares_of),
        signatures=[pb.SurvivorSignature(silo=s.silo, signature=s.signature)
                    for s in req.signatures])


def unmask_from_pb(msg: pb.UnmaskRequest) -> UnmaskInstruction:
    """Protobuf unmask request -> domain."""
    return UnmaskInstruction(envelope_from_pb(msg.envelope), UnmaskRequest(
        survivors=tuple(msg.survivors), seed_shares_of=tuple(msg.seed_shares_of),
        key_shares_of=tuple(msg.key_shares_of),
        signatures=tuple(SurvivorSignature(s.silo, s.signature) for s in msg.signatures)))


_KINDS = {ShareKind.MASK_KEY: pb.MASK_KEY, ShareKind.MASK_SEED: pb.MASK_SEED}


def revealed_to_pb(revealed: RevealedShares) -> pb.RevealedShares:
    """Domain revealed shares -> protobuf."""
    return pb.RevealedShares(envelope=envelope_to_pb(revealed.envelope), shares=[
        pb.RevealedShare(owner=r.owner, kind=_KINDS[r.kind], share=r.share)
        for r in revealed.shares])


def revealed_from_pb(msg: pb.RevealedShares) -> RevealedShares:
    """Protobuf revealed shares -> domain; an unknown share kind is a CodecError."""
    kinds = {v: k for k, v in _KINDS.items()}
    shares = []
    for r in msg.shares:
        if r.kind not in kinds:
            raise CodecError(f"unknown share kind {r.kind}")
        shares.append(RevealedShare(r.owner, kinds[r.kind], r.share))
    return RevealedShares(envelope_from_pb(msg.envelope), tuple(shares))


def metrics_to_pb(report: MetricsReport) -> pb.MetricsReport:
    """Domain metrics report -> protobuf."""
    return pb.MetricsReport(envelope=envelope_to_pb(report.envelope), metrics=[
        pb.Metric(name=k, value=float(v)) for k, v in sorted(report.metrics.items())])


def metrics_from_pb(msg: pb.MetricsReport) -> MetricsReport:
    """Protobuf metrics report -> domain; duplicate names are a CodecError."""
    metrics: dict[str, float] = {}
    for m in msg.metrics:
        if m.name in metrics:
            raise CodecError(f"metric {m.name!r} reported twice")
        metrics[m.name] = m.value
    return MetricsReport(envelope=envelope_from_pb(msg.envelope), metrics=metrics)


def ack(env: Envelope, message: str = "") -> pb.Ack:
    """Build an acknowledgement."""
    return pb.Ack(envelope=envelope_to_pb(env), message=message)


def ack_from_pb(msg: pb.Ack) -> tuple[Envelope, str]:
    """Decode an acknowledgement."""
    return envelope_from_pb(msg.envelope), msg.message


# -- tensors ----------------------------------------------------------------------------------
def tensor_to_chunks(name: str, array: np.ndarray, env: Envelope,
                     chunk_bytes: int = CHUNK_BYTES) -> Iterator[pb.TensorChunk]:
    """Stream one tensor as a header chunk followed by bounded data chunks."""
    array = np.asarray(array)
    if array.dtype.name not in ALLOWED_DTYPES:
        raise CodecError(f"dtype {array.dtype.name} cannot travel; allowed: {ALLOWED_DTYPES}")
    # ascontiguousarray alone would turn a 0-d tensor into 1-d: flatten first, keep the shape.
    raw = memoryview(np.ascontiguousarray(array.reshape(-1)).view(np.uint8).data)
    header = pb.TensorHeader(name=name, dtype=array.dtype.name, shape=list(array.shape),
                             total_bytes=raw.nbytes, sha256=hashlib.sha256(raw).digest())
    env_pb = envelope_to_pb(env)
    if raw.nbytes == 0:
        yield pb.TensorChunk(envelope=env_pb, header=header, data=b"", last=True)
        return
    for start in range(0, raw.nbytes, chunk_bytes):
        stop = min(start + chunk_bytes, raw.nbytes)
        yield pb.TensorChunk(envelope=env_pb, header=header if start == 0 else None,
                             data=bytes(raw[start:stop]), last=stop == raw.nbytes)


def chunks_to_tensor(chunks: Iterable[pb.TensorChunk], *, max_bytes: int,
                     chunk_bytes: int = CHUNK_BYTES) -> tuple[Envelope, str, np.ndarray]:
    """Reassemble one streamed tensor, checking header, sizes, envelope and digest."""
    iterator = iter(chunks)
    first = next(iterator, None)
    if first is None:
        raise CodecError("empty tensor stream")
    if not first.HasField("header"):
        raise CodecError("first chunk carries no tensor header")
    env = envelope_from_pb(first.envelope)
    header = first.header
    if header.dtype not in ALLOWED_DTYPES:
        raise CodecError(f"dtype {header.dtype!r} not allowed")
    dtype = np.dtype(header.dtype)
    shape = tuple(int(s) for s in header.shape)
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize if shape else dtype.itemsize
    if header.total_bytes != expected:
        raise CodecError(f"header says {header.total_bytes} bytes but shape {shape} of "
                         f"{dtype.name} needs {expected}")
    if header.total_bytes > max_bytes:
        raise CodecError(f"tensor of {header.total_bytes} bytes exceeds the limit of {max_bytes}")
    buffer = bytearray(header.total_bytes)
    digest = hashlib.sha256()
    offset = 0
    chunk: pb.TensorChunk | None = first
    while chunk is not None:
        if chunk is not first:
            if chunk.HasField("header"):
                raise CodecError("tensor header repeated inside a stream")
            if envelope_from_pb(chunk.envelope) != env:
                raise CodecError("envelope changed inside a tensor stream")
        if len(chunk.data) > chunk_bytes:
            raise CodecError(f"chunk of {len(chunk.data)} bytes exceeds {chunk_bytes}")
        if offset + len(chunk.data) > header.total_bytes:
            raise CodecError("tensor stream longer than its header says")
        buffer[offset:offset + len(chunk.data)] = chunk.data
        digest.update(chunk.data)
        offset += len(chunk.data)
        if chunk.last:
            break
        chunk = next(iterator, None)
        if chunk is None:
            raise CodecError("tensor stream ended before its last chunk")
    if next(iterator, None) is not None:
        raise CodecError("data after the last chunk of a tensor")
    if offset != header.total_bytes:
        raise CodecError(f"received {offset} of {header.total_bytes} bytes")
    if digest.digest() != header.sha256:
        raise CodecError("tensor digest does not match its header")
    # frombuffer over the bytearray shares its memory: no second copy of a large tensor.
    return env, header.name, np.frombuffer(buffer, dtype=dtype).reshape(shape)
