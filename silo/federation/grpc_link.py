"""The silo's link to a coordinator over gRPC (mTLS): each call encodes, calls, decodes.

The channel and its stub belong to the agent (silo/federation/agent.py); this class only translates
the link's calls into the service's RPCs through the codec (the one seam with generated code) and
the coordinator's "this attempt is over" refusals into ``RoundMovedOn``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import grpc
import numpy as np

from trellis.protos import codec
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos.messages import (
    Envelope,
    KeyAdvertisement,
    KeyBundle,
    MetricsReport,
    RevealedShares,
    SealedShares,
    SignedSurvivors,
    UnmaskInstruction,
)
from trellis.silo.federation.link import RoundMovedOn

CALL_TIMEOUT_S = 600.0
MAX_FETCH_BYTES = 1 << 31
# Refusals of a data call that mean "this attempt is over", not "you are not welcome".
ROUND_MOVED_ON = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS)


class GrpcLink:
    """CoordinatorLink over one gRPC channel's stub."""

    def __init__(self, stub: pb_grpc.FederationStub | None,
                 log: Callable[[str], None] = print) -> None:
        self.stub: Any = stub      # set anew by the agent on every (re)connection
        self.log = log

    def _call(self, method: Callable[..., Any], request: object) -> Any:
        try:
            return method(request, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise _translated(exc) from None

    def _fetch(self, method: Callable[..., Any], request: object,
               timeout: float | None = CALL_TIMEOUT_S) -> Iterator[Any]:
        """A server-streaming call, read as it arrives (its errors come while reading)."""
        try:
            yield from method(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise _translated(exc) from None

    # -- a round ------------------------------------------------------------------------------
    def fetch_state(self, env: Envelope) -> np.ndarray | None:
        """The shared state to load ("none" on the wire: keep the current values)."""
        # No deadline: a large state takes as long as it takes, within the size bound.
        chunks = self._fetch(self.stub.FetchState, codec.stage_request(env), timeout=None)
        _, name, tensor = codec.chunks_to_tensor(chunks, max_bytes=MAX_FETCH_BYTES)
        return None if name == "none" else tensor

    def fetch_pool(self, env: Envelope) -> list[bytes]:
        """The other silos' sealed envelopes ("envelope/<i>"; empty before anyone sealed)."""
        chunks = list(self._fetch(self.stub.FetchPool, codec.stage_request(env)))
        blobs = codec.chunks_to_blobs(chunks, max_bytes=MAX_FETCH_BYTES)[1] if chunks else {}
        envelopes = codec.numbered_values("envelope", blobs)
        if envelopes is None:
            raise codec.CodecError(f"the coordinator's envelope pool has entries "
                                   f"{list(blobs)[:3]}")
        return envelopes

    def advertise(self, advert: KeyAdvertisement) -> None:
        """AdvertiseKey."""
        self._call(self.stub.AdvertiseKey, codec.advert_to_pb(advert))

    def fetch_keys(self, env: Envelope) -> KeyBundle:
        """FetchKeys."""
        return codec.bundle_from_pb(self._call(self.stub.FetchKeys, codec.stage_request(env)))

    def upload_shares(self, sealed: SealedShares) -> None:
        """UploadShares."""
        self._call(self.stub.UploadShares, codec.shares_to_pb(sealed))

    def fetch_shares(self, env: Envelope) -> SealedShares:
        """FetchShares."""
        return codec.shares_from_pb(self._call(self.stub.FetchShares,
                                               codec.stage_request(env)))

    def upload_envelope(self, env: Envelope, envelope: bytes) -> None:
        """UploadEnvelope (one entry named "envelope")."""
        self._call(self.stub.UploadEnvelope, codec.blobs_to_chunks({"envelope": envelope}, env))

    def upload_masked(self, env: Envelope, masked: np.ndarray,
                      statistics: Mapping[str, float]) -> None:
        """UploadMasked, streamed in chunks."""
        self._call(self.stub.UploadMasked, codec.tensor_to_chunks(
            "masked_input", masked, env, statistics=dict(statistics)))

    def sign_survivors(self, signed: SignedSurvivors) -> None:
        """SignSurvivors."""
        self._call(self.stub.SignSurvivors, codec.signed_survivors_to_pb(signed))

    def fetch_unmask(self, env: Envelope) -> UnmaskInstruction:
        """FetchUnmaskRequest."""
        return codec.unmask_from_pb(self._call(self.stub.FetchUnmaskRequest,
                                               codec.stage_request(env)))

    def reveal(self, revealed: RevealedShares) -> None:
        """RevealShares."""
        self._call(self.stub.RevealShares, codec.revealed_to_pb(revealed))

    def report(self, report: MetricsReport) -> bool:
        """ReportMetrics; metrics are optional, so a refusal is logged and training goes on."""
        try:
            self.stub.ReportMetrics(codec.metrics_to_pb(report), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            if exc.code() is not grpc.StatusCode.ALREADY_EXISTS:
                self.log(f"metrics for round {report.envelope.round} not accepted: "
                         f"{exc.details()}")
            return False
        return True

    # -- silo group key and GCFL's split ------------------------------------------------------
    def setup_advert(self, env: Envelope, advert: bytes) -> None:
        """AdvertiseSetup."""
        self._call(self.stub.AdvertiseSetup, codec.setup_key_to_pb(env, advert))

    def setup_bundle(self, env: Envelope) -> dict[str, tuple[bytes, bytes]]:
        """FetchSetupBundle."""
        _, bundle = codec.setup_bundle_from_pb(self._call(self.stub.FetchSetupBundle,
                                                          codec.stage_request(env)))
        return bundle

    def upload_group_seal(self, env: Envelope, boxes: Mapping[str, bytes],
                          public_context: bytes) -> None:
        """UploadGroupSeal ("box/<peer>"..., "ckks_public")."""
        blobs = {**{f"box/{peer}": box for peer, box in boxes.items()},
                 "ckks_public": public_context}
        self._call(self.stub.UploadGroupSeal, codec.blobs_to_chunks(blobs, env))

    def fetch_group_box(self, env: Envelope) -> tuple[bytes, bytes, bytes]:
        """FetchGroupBox."""
        _, box, leader_advert, leader_cert = codec.group_box_from_pb(
            self._call(self.stub.FetchGroupBox, codec.stage_request(env)))
        return box, leader_advert, leader_cert

    def confirm_group_open(self, env: Envelope) -> None:
        """ConfirmGroupOpen."""
        self._call(self.stub.ConfirmGroupOpen, codec.stage_request(env))

    def upload_encrypted_update(self, env: Envelope, ciphertexts: Sequence[bytes]) -> None:
        """UploadEncryptedUpdate ("ciphertext/<i>"...)."""
        self._call(self.stub.UploadEncryptedUpdate, codec.blobs_to_chunks(
            codec.numbered_blobs("ciphertext", ciphertexts), env))

    def fetch_blinded(self, env: Envelope) -> dict[tuple[str, str], bytes]:
        """FetchBlinded ("pair/<a>/<b>"...)."""
        chunks = self._fetch(self.stub.FetchBlinded, codec.stage_request(env))
        _, blobs = codec.chunks_to_blobs(chunks, max_bytes=MAX_FETCH_BYTES)
        return {codec.pair_of(name): blob for name, blob in blobs.items()}

    def upload_similarities(self, env: Envelope,
                            values: Mapping[tuple[str, str], float]) -> None:
        """UploadSimilarities."""
        self._call(self.stub.UploadSimilarities, codec.similarities_to_pb(env, values))


def _translated(exc: grpc.RpcError) -> Exception:
    """"This attempt is over" becomes RoundMovedOn; anything else stays the gRPC error."""
    if exc.code() in ROUND_MOVED_ON:
        return RoundMovedOn(exc.details())
    return exc
