"""The one translation seam between domain types and generated protobuf code (STYLE.md 3).

Tensors travel as dtype + shape + bytes, split into chunks of at most ``CHUNK_BYTES`` so that no
single gRPC message approaches the transport's size limit however large the tensor is.

Over 400 lines because it is the only module that touches generated code (an import-linter
contract holds the others to that), so every message's conversion, each with its round-trip
test, lives here.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator, Mapping

import numpy as np

from trellis.crypto.secagg import (
    EncryptedShare,
    RevealedShare,
    ShareKind,
    SurvivorSignature,
    UnmaskRequest,
)
from trellis.protos import federation_pb2 as pb
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
from trellis.protos.status import FederationStatus, RefusedCaller

CHUNK_BYTES = 1 << 20
ALLOWED_DTYPES = ("float32", "float64", "uint32", "uint64", "int64", "uint8")
MAX_DIMENSIONS = 32     # numpy's own limit is 64; no tensor of ours has more than a few


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
                          total_rounds=ins.total_rounds, run_id=ins.run_id)


def instruction_from_pb(msg: pb.Instruction) -> Instruction:
    """Protobuf instruction -> domain."""
    return Instruction(envelope=envelope_from_pb(msg.envelope),
                       participants=tuple(msg.participants),
                       public_plan_json=msg.public_plan_json, message=msg.message,
                       total_rounds=msg.total_rounds, run_id=msg.run_id)


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
                     chunk_bytes: int = CHUNK_BYTES,
                     statistics: Mapping[str, float] | None = None) -> Iterator[pb.TensorChunk]:
    """Stream one tensor as a header chunk (with any statistics) followed by data chunks.

    A tensor of more than one chunk sends its header alone, so a receiver learns the size,
    and can wait until it has room for it, before any data is in its memory
    (coordinator/serving/upload_budget.py); a smaller one travels whole in one chunk.
    """
    array = np.asarray(array)
    if array.dtype.name not in ALLOWED_DTYPES:
        raise CodecError(f"dtype {array.dtype.name} cannot travel; allowed: {ALLOWED_DTYPES}")
    # ascontiguousarray alone would turn a 0-d tensor into 1-d: flatten first, keep the shape.
    raw = memoryview(np.ascontiguousarray(array.reshape(-1)).view(np.uint8).data)
    header = pb.TensorHeader(name=name, dtype=array.dtype.name, shape=list(array.shape),
                             total_bytes=raw.nbytes, sha256=hashlib.sha256(raw).digest())
    stats = [pb.Metric(name=k, value=float(v)) for k, v in sorted((statistics or {}).items())]
    env_pb = envelope_to_pb(env)
    if raw.nbytes <= chunk_bytes:
        yield pb.TensorChunk(envelope=env_pb, header=header, data=bytes(raw), last=True,
                             statistics=stats)
        return
    yield pb.TensorChunk(envelope=env_pb, header=header, data=b"", last=False,
                         statistics=stats)
    for start in range(0, raw.nbytes, chunk_bytes):
        stop = min(start + chunk_bytes, raw.nbytes)
        yield pb.TensorChunk(envelope=env_pb, data=bytes(raw[start:stop]),
                             last=stop == raw.nbytes)


def chunks_to_tensor(chunks: Iterable[pb.TensorChunk], *, max_bytes: int,
                     chunk_bytes: int = CHUNK_BYTES) -> tuple[Envelope, str, np.ndarray]:
    """Reassemble one streamed tensor, checking header, sizes, envelope and digest."""
    env, name, array, _ = chunks_to_masked_input(chunks, max_bytes=max_bytes,
                                                 chunk_bytes=chunk_bytes)
    return env, name, array


def chunks_to_masked_input(chunks: Iterable[pb.TensorChunk], *, max_bytes: int,
                           chunk_bytes: int = CHUNK_BYTES
                           ) -> tuple[Envelope, str, np.ndarray, dict[str, float]]:
    """Reassemble one streamed tensor and the statistics its first chunk carries."""
    reader = MaskedInputReader(max_bytes=max_bytes, chunk_bytes=chunk_bytes)
    for chunk in chunks:
        reader.feed(chunk)
    return reader.finish()


class MaskedInputReader:
    """chunks_to_masked_input one chunk at a time, for a receiver that is handed chunks (an
    asyncio server) instead of pulling them from an iterator; same checks, same errors."""

    def __init__(self, *, max_bytes: int, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.max_bytes = max_bytes
        self.chunk_bytes = chunk_bytes
        self._tensor: _TensorReader | None = None
        self._first: pb.TensorChunk | None = None

    def feed(self, chunk: pb.TensorChunk) -> None:
        """Take the stream's next chunk; raises CodecError as soon as the stream is wrong."""
        if self._tensor is None:
            self._first = chunk
            self._tensor = _TensorReader(chunk, self.max_bytes, self.chunk_bytes)
        elif self._tensor.done:
            raise CodecError("data after the last chunk of a tensor")
        else:
            self._tensor.add(chunk)
        if self._tensor.done:
            self._tensor.result()      # sizes and digest, checked before any further chunk

    def finish(self) -> tuple[Envelope, str, np.ndarray, dict[str, float]]:
        """The stream ended: the tensor and its statistics."""
        if self._tensor is None or self._first is None:
            raise CodecError("empty tensor stream")
        env, name, array = self._tensor.result()
        statistics: dict[str, float] = {}
        for m in self._first.statistics:
            if m.name in statistics:
                raise CodecError(f"statistic {m.name!r} sent twice")
            statistics[m.name] = m.value
        return env, name, array, statistics


def blobs_to_chunks(blobs: Mapping[str, bytes], env: Envelope,
                    chunk_bytes: int = CHUNK_BYTES) -> Iterator[pb.TensorChunk]:
    """Stream named byte strings (sealed boxes, CKKS contexts, ciphertexts) as uint8 tensors."""
    for name, blob in blobs.items():
        yield from tensor_to_chunks(name, np.frombuffer(blob, np.uint8), env, chunk_bytes)


def blobs_digest(blobs: Mapping[str, bytes]) -> str:
    """One SHA-256 over names and contents, for both sides' audit trails."""
    digest = hashlib.sha256()
    for name, blob in blobs.items():
        digest.update(name.encode() + b"\0" + hashlib.sha256(blob).digest())
    return digest.hexdigest()


def chunks_to_blobs(chunks: Iterable[pb.TensorChunk], *, max_bytes: int,
                    chunk_bytes: int = CHUNK_BYTES) -> tuple[Envelope, dict[str, bytes]]:
    """Reassemble a stream of named byte strings; one envelope, unique names, bounded total."""
    reader = BlobsReader(max_bytes=max_bytes, chunk_bytes=chunk_bytes)
    for chunk in chunks:
        reader.feed(chunk)
    return reader.finish()


class BlobsReader:
    """chunks_to_blobs one chunk at a time (see MaskedInputReader)."""

    def __init__(self, *, max_bytes: int, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.max_bytes = max_bytes
        self.chunk_bytes = chunk_bytes
        self.blobs: dict[str, bytes] = {}
        self._env: Envelope | None = None
        self._total = 0
        self._tensor: _TensorReader | None = None

    def feed(self, chunk: pb.TensorChunk) -> None:
        """Take the stream's next chunk; raises CodecError as soon as the stream is wrong."""
        if self._tensor is None or self._tensor.done:
            self._tensor = _TensorReader(chunk, self.max_bytes - self._total, self.chunk_bytes)
        else:
            self._tensor.add(chunk)
        if not self._tensor.done:
            return
        this_env, name, array = self._tensor.result()
        if array.dtype != np.uint8 or array.ndim != 1:
            raise CodecError(f"{name!r} is not a byte string")
        if self._env is not None and this_env != self._env:
            raise CodecError("envelope changed inside a stream")
        if name in self.blobs:
            raise CodecError(f"{name!r} sent twice in one stream")
        self._env = this_env
        self.blobs[name] = array.tobytes()
        self._total += array.nbytes

    def finish(self) -> tuple[Envelope, dict[str, bytes]]:
        """The stream ended: its envelope and byte strings."""
        if self._tensor is not None and not self._tensor.done:
            raise CodecError("tensor stream ended before its last chunk")
        if self._env is None:
            raise CodecError("empty stream")
        return self._env, self.blobs


def declared_bytes(first: pb.TensorChunk | None) -> int:
    """The size a tensor stream's first chunk declares (0 if it declares none); unchecked:
    reading the stream checks it against the shape and the data."""
    if first is None or not first.HasField("header"):
        return 0
    return int(first.header.total_bytes)


class _TensorReader:
    """One tensor being read, starting at its first chunk, up to and including its last."""

    def __init__(self, first: pb.TensorChunk, max_bytes: int, chunk_bytes: int) -> None:
        if not first.HasField("header"):
            raise CodecError("first chunk carries no tensor header")
        self.env = envelope_from_pb(first.envelope)
        header = self.header = first.header
        if header.dtype not in ALLOWED_DTYPES:
            raise CodecError(f"dtype {header.dtype!r} not allowed")
        self.dtype = np.dtype(header.dtype)
        self.shape = tuple(int(s) for s in header.shape)
        if len(self.shape) > MAX_DIMENSIONS:
            raise CodecError(f"tensor of {len(self.shape)} dimensions; at most "
                             f"{MAX_DIMENSIONS} travel")
        # Python integers: a hostile shape must not wrap around in int64 to a small product.
        expected = math.prod(self.shape) * self.dtype.itemsize
        if header.total_bytes != expected:
            raise CodecError(f"header says {header.total_bytes} bytes but shape {self.shape} "
                             f"of {self.dtype.name} needs {expected}")
        if header.total_bytes > max_bytes:
            raise CodecError(f"tensor of {header.total_bytes} bytes exceeds the limit of "
                             f"{max_bytes}")
        if any(s > max_bytes for s in self.shape):
            # Only an empty tensor could have such an extent: refused, numpy cannot shape it.
            raise CodecError(f"shape {self.shape} has an extent above the limit of {max_bytes}")
        self.chunk_bytes = chunk_bytes
        self.buffer = bytearray(header.total_bytes)
        self.digest = hashlib.sha256()
        self.offset = 0
        self.done = False
        self._take(first)

    def add(self, chunk: pb.TensorChunk) -> None:
        """The tensor's next chunk."""
        if chunk.HasField("header"):
            raise CodecError("tensor header repeated inside a stream")
        if envelope_from_pb(chunk.envelope) != self.env:
            raise CodecError("envelope changed inside a tensor stream")
        self._take(chunk)

    def _take(self, chunk: pb.TensorChunk) -> None:
        if len(chunk.data) > self.chunk_bytes:
            raise CodecError(f"chunk of {len(chunk.data)} bytes exceeds {self.chunk_bytes}")
        if self.offset + len(chunk.data) > self.header.total_bytes:
            raise CodecError("tensor stream longer than its header says")
        self.buffer[self.offset:self.offset + len(chunk.data)] = chunk.data
        self.digest.update(chunk.data)
        self.offset += len(chunk.data)
        self.done = chunk.last

    def result(self) -> tuple[Envelope, str, np.ndarray]:
        """The tensor, once its last chunk is in: sizes and digest checked."""
        if not self.done:
            raise CodecError("tensor stream ended before its last chunk")
        if self.offset != self.header.total_bytes:
            raise CodecError(f"received {self.offset} of {self.header.total_bytes} bytes")
        if self.digest.digest() != self.header.sha256:
            raise CodecError("tensor digest does not match its header")
        # frombuffer over the bytearray shares its memory: no second copy of a large tensor.
        return self.env, self.header.name, np.frombuffer(self.buffer, dtype=self.dtype
                                                         ).reshape(self.shape)


# -- silo group key and GCFL similarity -------------------------------------------------------
def setup_key_to_pb(env: Envelope, advert: bytes) -> pb.SetupKey:
    """A silo's signed setup advert."""
    return pb.SetupKey(envelope=envelope_to_pb(env), advert=advert)


def setup_key_from_pb(msg: pb.SetupKey) -> tuple[Envelope, bytes]:
    """Decode a setup advert."""
    return envelope_from_pb(msg.envelope), msg.advert


def setup_bundle_to_pb(env: Envelope, bundle: Mapping[str, tuple[bytes, bytes]]
                       ) -> pb.SetupBundle:
    """Every silo's setup advert and certificate, for the leader."""
    return pb.SetupBundle(envelope=envelope_to_pb(env), entries=[
        pb.SetupEntry(silo=s, advert=a, certificate_pem=c) for s, (a, c) in sorted(bundle.items())])


def setup_bundle_from_pb(msg: pb.SetupBundle) -> tuple[Envelope, dict[str, tuple[bytes, bytes]]]:
    """Decode a setup bundle; a silo listed twice is a CodecError."""
    bundle: dict[str, tuple[bytes, bytes]] = {}
    for e in msg.entries:
        if e.silo in bundle:
            raise CodecError(f"setup advert of {e.silo!r} listed twice")
        bundle[e.silo] = (e.advert, e.certificate_pem)
    return envelope_from_pb(msg.envelope), bundle


def group_box_to_pb(env: Envelope, box: bytes, leader_advert: bytes,
                    leader_certificate: bytes) -> pb.GroupBox:
    """A peer's sealed group secrets with the leader's advert and certificate."""
    return pb.GroupBox(envelope=envelope_to_pb(env), box=box, leader_advert=leader_advert,
                       leader_certificate_pem=leader_certificate)


def group_box_from_pb(msg: pb.GroupBox) -> tuple[Envelope, bytes, bytes, bytes]:
    """Decode a group box."""
    return (envelope_from_pb(msg.envelope), msg.box, msg.leader_advert,
            msg.leader_certificate_pem)


def numbered_blobs(prefix: str, values: Iterable[bytes]) -> dict[str, bytes]:
    """A list of byte strings as blobs named "<prefix>/0", "<prefix>/1", ... in order."""
    return {f"{prefix}/{i}": v for i, v in enumerate(values)}


def numbered_values(prefix: str, blobs: Mapping[str, bytes]) -> list[bytes] | None:
    """The list `numbered_blobs` encoded, or None if the names are not exactly those, in order."""
    if list(blobs) != [f"{prefix}/{i}" for i in range(len(blobs))]:
        return None
    return list(blobs.values())


def pair_name(first: str, second: str) -> str:
    """Stream name of one blinded inner product (silo names cannot contain '/')."""
    return f"pair/{first}/{second}"


def pair_of(name: str) -> tuple[str, str]:
    """The silo pair a blinded product's stream name refers to."""
    parts = name.split("/")
    if len(parts) != 3 or parts[0] != "pair" or not parts[1] or not parts[2]:
        raise CodecError(f"{name!r} is not a pair name")
    return parts[1], parts[2]


def similarities_to_pb(env: Envelope, values: Mapping[tuple[str, str], float]
                       ) -> pb.Similarities:
    """Decrypted blinded inner products."""
    return pb.Similarities(envelope=envelope_to_pb(env), values=[
        pb.PairValue(first=a, second=b, value=float(v)) for (a, b), v in sorted(values.items())])


def similarities_from_pb(msg: pb.Similarities) -> tuple[Envelope, dict[tuple[str, str], float]]:
    """Decode decrypted values; a pair listed twice is a CodecError."""
    values: dict[tuple[str, str], float] = {}
    for v in msg.values:
        if (v.first, v.second) in values:
            raise CodecError(f"pair ({v.first}, {v.second}) listed twice")
        values[(v.first, v.second)] = v.value
    return envelope_from_pb(msg.envelope), values


# -- operators (Admin service) ----------------------------------------------------------------
def status_request() -> pb.StatusRequest:
    """The Admin service's Status request (it carries nothing: the caller is its certificate)."""
    return pb.StatusRequest()


def status_to_pb(status: FederationStatus) -> pb.FederationStatus:
    """Domain federation status -> protobuf."""
    return pb.FederationStatus(
        federation_id=status.federation, algorithm=status.algorithm, run_id=status.run_id,
        round=status.round, rounds=status.rounds, rounds_completed=status.rounds_completed,
        stage=status.stage, connected=list(status.connected), dropped=list(status.dropped),
        refused=[pb.RefusedCaller(subject=r.subject, reason=r.reason) for r in status.refused],
        metrics_round=status.metrics_round, reported=status.reported,
        metrics=[pb.Metric(name=k, value=float(v)) for k, v in sorted(status.metrics.items())],
        started_at=status.started_at, updated_at=status.updated_at,
        elapsed_s=status.elapsed_s, round_mean_s=status.round_mean_s, pid=status.pid,
        failure=status.failure, plan=status.plan)


def status_from_pb(msg: pb.FederationStatus) -> FederationStatus:
    """Protobuf federation status -> domain; a metric named twice is a CodecError."""
    metrics: dict[str, float] = {}
    for m in msg.metrics:
        if m.name in metrics:
            raise CodecError(f"metric {m.name!r} listed twice")
        metrics[m.name] = m.value
    return FederationStatus(
        federation=msg.federation_id, algorithm=msg.algorithm, run_id=msg.run_id,
        round=msg.round, rounds=msg.rounds, rounds_completed=msg.rounds_completed,
        stage=msg.stage, connected=tuple(msg.connected), dropped=tuple(msg.dropped),
        refused=tuple(RefusedCaller(r.subject, r.reason) for r in msg.refused),
        metrics_round=msg.metrics_round, reported=msg.reported, metrics=metrics,
        started_at=msg.started_at, updated_at=msg.updated_at, elapsed_s=msg.elapsed_s,
        round_mean_s=msg.round_mean_s, pid=msg.pid, failure=msg.failure, plan=msg.plan)
