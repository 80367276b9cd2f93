"""The coordinator's Federation service: thin gRPC handlers (decode, call the core, encode).

The handlers are coroutines on the server's event loop (coordinator/serving/service.py builds and
runs the server); the core's work runs on a small fixed pool (coordinator/serving/aio_edge.py).
The caller's identity is the subject of its TLS client certificate (STYLE.md 9); a certificate
the plan does not admit, or the revocation list revokes, is refused before any round logic sees
the request. Errors are mapped to status codes once, here (STYLE.md 10).

Over 400 lines because the Federation service has 21 methods and each is a handler of a few
lines here; the identity and refusal checks they share sit at the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
import numpy as np

from trellis.coordinator.rounds.errors import RoundError
from trellis.coordinator.serving.admin import is_operator
from trellis.coordinator.serving.aio_edge import ChangeSignal, CorePool, Refused, abort, guarded
from trellis.coordinator.serving.allocator import MMAP_THRESHOLD_BYTES
from trellis.coordinator.serving.attend_rate import ATTEND_RATE_REASON, AttendRate
from trellis.coordinator.serving.core import CoordinatorCore
from trellis.coordinator.serving.crl_watch import CrlWatch
from trellis.coordinator.serving.holders import NameInUse
from trellis.coordinator.serving.upload_budget import UploadBudget
from trellis.crypto.certificates import certificate_fingerprint
from trellis.crypto.errors import CryptoError
from trellis.protos import codec
from trellis.protos import federation_pb2 as pb
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos.codec import CodecError
from trellis.protos.messages import (
    AgentTooOld,
    Envelope,
    Instruction,
    Phase,
    check_agent_version,
)

STREAM_POLL_S = 0.5
# The largest masked vector accepted: 1 GiB of ring elements (128 M values in Z_2^64).
MAX_TENSOR_BYTES = 1 << 30
# The global state goes to every silo at once after a round: each stream holds about one chunk
# while its window drains. At glibc's mmap threshold, a sent chunk's buffer still goes back to
# the system when freed.
REPLY_CHUNK_BYTES = MMAP_THRESHOLD_BYTES

class FederationServicer(pb_grpc.FederationServicer):
    """Each method: identify the caller, decode, call the core, encode.

    The methods are coroutines on the server's event loop; what takes the core's lock, writes
    or computes runs on the fixed threads of `pool` (coordinator/serving/aio_edge.py). A silo
    waiting for its next instruction holds no thread: its stream awaits the core's change signal.
    """

    def __init__(self, core: CoordinatorCore, max_tensor_bytes: int,
                 crl: CrlWatch | None = None, budget: UploadBudget | None = None,
                 pool: CorePool | None = None, attend_rate: AttendRate | None = None) -> None:
        self.core = core
        self.attend_rate = attend_rate or AttendRate(core.clock)
        self.max_tensor_bytes = max_tensor_bytes
        self.crl = crl
        self.budget = budget or UploadBudget(core.plan.server.upload_memory_mb << 20)
        self.pool = pool or CorePool()
        self._signal = ChangeSignal()

    def listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake the streams waiting for an instruction, on loop, whenever the core changes."""
        self.core.on_change(self._signal.listener(loop))

    async def Attend(self, request: pb.AttendRequest, context: grpc.aio.ServicerContext
                     ) -> AsyncIterator[pb.Instruction]:
        silo, cert = await self._caller(context)
        env, version = await guarded(context, codec.attend_from_pb, request)
        try:
            check_agent_version(version)
        except AgentTooOld as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        plan = self.core.plan
        if env.phase is not Phase.JOIN or env.federation not in ("", plan.federation):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"attend must carry phase JOIN for federation "
                                f"{plan.federation!r}")
        await self._refuse_if_too_often(context, silo)
        token = await self._connect(context, silo, cert)
        try:
            yield codec.instruction_to_pb(Instruction(
                Envelope(plan.federation, 0, 0, Phase.JOIN),
                public_plan_json=plan.public.to_json(), total_rounds=plan.public.rounds,
                run_id=self.core.machine.run_id))
            last: Instruction | None = None
            while not self.core.stopping:
                # Revoked while attending: the silo leaves now (a dropout for the round).
                await self._refuse_if_revoked(context, silo, cert)
                changed = self._signal.next_change()
                current = self.core.instruction_if_free(silo)
                if current is None:         # another thread is in the core: ask from one
                    current = await self.pool.call(context, self.core.instruction, silo)
                if current != last:
                    last = current
                    yield codec.instruction_to_pb(current)
                    # Resumed when the transport asks for the next message: this one is out.
                    await self.pool.call(context, self.core.delivered, silo, token, current)
                    continue
                try:
                    await asyncio.wait_for(changed.wait(), STREAM_POLL_S)
                except TimeoutError:
                    pass
        finally:
            self.pool.submit(self.core.disconnect, silo, token)

    async def _refuse_if_too_often(self, context: grpc.aio.ServicerContext, silo: str) -> None:
        """Refuse an Attend past the silo's rate; only the first of a run is audited."""
        admission = self.attend_rate.admit(silo)
        if admission.admitted:
            return
        refusal = Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          self.attend_rate.message(silo, admission))
        if admission.first_refusal:
            await self.pool.call(context, self._refuse, silo, refusal, ATTEND_RATE_REASON)
        await context.abort(refusal.code, refusal.details)

    async def _connect(self, context: grpc.aio.ServicerContext, silo: str, cert: bytes) -> int:
        """core.connect; a stream cancelled meanwhile still disconnects once it is in."""
        connecting = asyncio.get_running_loop().run_in_executor(
            self.pool.executor, self.core.connect, silo, cert)
        try:
            token: int = await asyncio.shield(connecting)
        except asyncio.CancelledError:
            def gone(done: asyncio.Future[int]) -> None:
                if not done.cancelled() and done.exception() is None:
                    self.pool.submit(self.core.disconnect, silo, done.result())

            connecting.add_done_callback(gone)
            raise
        except (RoundError, CodecError, CryptoError) as exc:
            await abort(context, exc)
        except NameInUse as exc:       # refused and audited by the core
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        return token

    async def FetchState(self, request: pb.StageRequest, context: grpc.aio.ServicerContext
                         ) -> AsyncIterator[pb.TensorChunk]:
        silo, _ = await self._caller(context)
        env = await guarded(context, codec.request_envelope, request)
        state = await self.pool.call(context, self.core.state_for, silo, env)
        reply_env = Envelope(env.federation, env.round, env.attempt, Phase.FETCH_STATE)
        chunks = (codec.tensor_to_chunks("none", np.zeros(0, np.float32), reply_env)
                  if state is None else codec.tensor_to_chunks("global_state", state, reply_env,
                                                               REPLY_CHUNK_BYTES))
        async for chunk in self._off_loop(chunks):
            yield chunk
            del chunk

    async def AdvertiseKey(self, request: pb.KeyAdvertisement,
                           context: grpc.aio.ServicerContext) -> pb.Ack:
        silo, _ = await self._caller(context)
        advert = await guarded(context, codec.advert_from_pb, request)
        await self.pool.call(context, self.core.advertise, silo, advert)
        return codec.ack(advert.envelope)

    async def FetchKeys(self, request: pb.StageRequest, context: grpc.aio.ServicerContext
                        ) -> pb.KeyBundle:
        silo, _ = await self._caller(context)
        env = await guarded(context, codec.request_envelope, request)
        return codec.bundle_to_pb(await self.pool.call(context, self.core.key_bundle, silo, env))

    async def UploadShares(self, request: pb.SealedShares, context: grpc.aio.ServicerContext
                           ) -> pb.Ack:
        silo, _ = await self._caller(context)
        sealed = await guarded(context, codec.shares_from_pb, request)
        await self.pool.call(context, self.core.upload_shares, silo, sealed)
        return codec.ack(sealed.envelope)

    async def FetchShares(self, request: pb.StageRequest, context: grpc.aio.ServicerContext
                          ) -> pb.SealedShares:
        silo, _ = await self._caller(context)
        env = await guarded(context, codec.request_envelope, request)
        return codec.shares_to_pb(await self.pool.call(context, self.core.shares_for, silo, env))

    async def SignSurvivors(self, request: pb.SurvivorSignature,
                            context: grpc.aio.ServicerContext) -> pb.Ack:
        silo, _ = await self._caller(context)
        signed = await guarded(context, codec.signed_survivors_from_pb, request)
        await self.pool.call(context, self.core.sign_survivors, silo, signed)
        return codec.ack(signed.envelope)

    async def FetchUnmaskRequest(self, request: pb.StageRequest,
                                 context: grpc.aio.ServicerContext) -> pb.UnmaskRequest:
        silo, _ = await self._caller(context)
        env = await guarded(context, codec.request_envelope, request)
        return codec.unmask_to_pb(await self.pool.call(context, self.core.unmask_request, silo,
                                                       env))

    async def RevealShares(self, request: pb.RevealedShares,
                           context: grpc.aio.ServicerContext) -> pb.Ack:
        silo, _ = await self._caller(context)
        revealed = await guarded(context, codec.revealed_from_pb, request)
        await self.pool.call(context, self.core.reveal_shares, silo, revealed.envelope,
                             revealed.shares)
        return codec.ack(revealed.envelope)

    async def UploadMasked(self, request_iterator: AsyncIterator[pb.TensorChunk],
                           context: grpc.aio.ServicerContext) -> pb.Ack:
        silo, _ = await self._caller(context)
        first = await anext(request_iterator, None)
        # The first chunk declares the size; nothing past it is read until the budget has room.
        # A stream being read also holds its current chunk twice (the message and its data).
        size = min(codec.declared_bytes(first), self.max_tensor_bytes) + 2 * codec.CHUNK_BYTES
        async with self.budget.hold_async(
                size, still_wanted=lambda: not self.core.stopping) as granted:
            if not granted:
                await context.abort(grpc.StatusCode.UNAVAILABLE,
                                    "the coordinator is stopping; upload again after "
                                    "reconnecting")
            reader = codec.MaskedInputReader(max_bytes=self.max_tensor_bytes)
            if first is not None:
                await self.pool.call(context, reader.feed, first)
            async for chunk in request_iterator:
                await self.pool.call(context, reader.feed, chunk)
                del chunk
            env, name, vector, statistics = await self.pool.call(context, reader.finish)
            del reader
            await self.pool.call(context, self.core.masked_input, silo, env, name, vector,
                                 statistics)
            del vector          # summed: its memory goes back before the budget does
        return codec.ack(env)

    async def UploadEnvelope(self, request_iterator: AsyncIterator[pb.TensorChunk],
                             context: grpc.aio.ServicerContext) -> pb.Ack:
        return await self._take_blobs(request_iterator, context, self.core.sealed_envelope)

    async def FetchPool(self, request: pb.StageRequest, context: grpc.aio.ServicerContext
                        ) -> AsyncIterator[pb.TensorChunk]:
        silo, _ = await self._caller(context)
        env = await guarded(context, codec.request_envelope, request)
        pool = await self.pool.call(context, self.core.pool_for, silo, env)
        async for chunk in self._off_loop(
                codec.blobs_to_chunks(codec.numbered_blobs("envelope", pool), env)):
            yield chunk
            del chunk

    # -- silo group key and GCFL similarity ----------------------------------------------------
    async def AdvertiseSetup(self, request: pb.SetupKey, context: grpc.aio.ServicerContext
                             ) -> pb.Ack:
        silo, _ = await self._caller(context)
        env, advert = await guarded(context, codec.setup_key_from_pb, request)
        await self.pool.call(context, self.core.setup_advert, silo, env, advert)
        return codec.ack(env)

    async def FetchSetupBundle(self, request: pb.StageRequest,
                               context: grpc.aio.ServicerContext) -> pb.SetupBundle:
        silo, _ = await self._caller(context)
        env = await guarded(context, codec.request_envelope, request)
        return codec.setup_bundle_to_pb(env, await self.pool.call(
            context, self.core.setup_bundle, silo, env))

    async def UploadGroupSeal(self, request_iterator: AsyncIterator[pb.TensorChunk],
                              context: grpc.aio.ServicerContext) -> pb.Ack:
        return await self._take_blobs(request_iterator, context, self.core.setup_seal)

    async def FetchGroupBox(self, request: pb.StageRequest, context: grpc.aio.ServicerContext
                            ) -> pb.GroupBox:
        silo, _ = await self._caller(context)
        env = await guarded(context, codec.request_envelope, request)
        box, advert, certificate = await self.pool.call(context, self.core.setup_box, silo, env)
        return codec.group_box_to_pb(env, box, advert, certificate)

    async def ConfirmGroupOpen(self, request: pb.StageRequest,
                               context: grpc.aio.ServicerContext) -> pb.Ack:
        silo, _ = await self._caller(context)
        env = await guarded(context, codec.request_envelope, request)
        await self.pool.call(context, self.core.setup_opened, silo, env)
        return codec.ack(env)

    async def UploadEncryptedUpdate(self, request_iterator: AsyncIterator[pb.TensorChunk],
                                    context: grpc.aio.ServicerContext) -> pb.Ack:
        return await self._take_blobs(request_iterator, context, self.core.encrypted_update)

    async def FetchBlinded(self, request: pb.StageRequest, context: grpc.aio.ServicerContext
                           ) -> AsyncIterator[pb.TensorChunk]:
        silo, _ = await self._caller(context)
        env = await guarded(context, codec.request_envelope, request)
        blinded = await self.pool.call(context, self.core.decrypt_request, silo, env)
        async for chunk in self._off_loop(codec.blobs_to_chunks(
                {codec.pair_name(a, b): v for (a, b), v in blinded.items()}, env)):
            yield chunk
            del chunk

    async def UploadSimilarities(self, request: pb.Similarities,
                                 context: grpc.aio.ServicerContext) -> pb.Ack:
        silo, _ = await self._caller(context)
        env, values = await guarded(context, codec.similarities_from_pb, request)
        await self.pool.call(context, self.core.decrypted, silo, env, values)
        return codec.ack(env)

    async def ReportMetrics(self, request: pb.MetricsReport,
                            context: grpc.aio.ServicerContext) -> pb.Ack:
        silo, _ = await self._caller(context)
        report = await guarded(context, codec.metrics_from_pb, request)
        await self.pool.call(context, self.core.report, silo, report)
        return codec.ack(report.envelope)

    async def _take_blobs(self, request_iterator: AsyncIterator[pb.TensorChunk],
                          context: grpc.aio.ServicerContext,
                          apply: Callable[[str, Envelope, dict[str, bytes]], None]) -> pb.Ack:
        """Reassemble a stream of named byte strings and hand them to the core."""
        silo, _ = await self._caller(context)
        reader = codec.BlobsReader(max_bytes=self.max_tensor_bytes)
        async for chunk in request_iterator:
            await self.pool.call(context, reader.feed, chunk)
            del chunk
        env, blobs = await self.pool.call(context, reader.finish)
        await self.pool.call(context, apply, silo, env, blobs)
        return codec.ack(env)

    async def _off_loop(self, chunks: Iterator[pb.TensorChunk]
                        ) -> AsyncIterator[pb.TensorChunk]:
        """Each chunk of a reply stream encoded (digests, copies) on the pool, sent from here.

        Here and in the interceptors a chunk is dropped (`del`) as soon as it is passed on, so
        no stream keeps a sent chunk while the next one is made: with every silo fetching the
        global state at once, that would be a MiB more per silo.
        """
        loop = asyncio.get_running_loop()
        while True:
            chunk = await loop.run_in_executor(self.pool.executor, next, chunks, None)
            if chunk is None:
                return
            yield chunk
            del chunk

    async def _caller(self, context: grpc.aio.ServicerContext) -> tuple[str, bytes]:
        """The caller's silo name and certificate; anything else is refused here."""
        auth = context.auth_context()
        names = auth.get("x509_common_name") or []
        certs = auth.get("x509_pem_cert") or []
        if len(names) != 1 or len(certs) != 1:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "a client certificate is required")
        silo = names[0].decode()
        if is_operator(certs[0]):
            # Whatever its name: an operator watches the federation and never takes part.
            await self.pool.call(context, self._refuse, silo, Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{silo!r} holds an operator's certificate, which opens the Admin service only "
                "(coordinator status); a silo joins with the certificate signed for its own "
                "request (`coordinator pki sign`)"), "an operator's certificate, not a silo's")
        if silo not in self.core.plan.silos:
            await self.pool.call(context, self._refuse, silo, Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"certificate subject {silo!r} is not admitted by this federation's plan; ask "
                "the coordinator operator to add it to federation.silos"),
                "not admitted by the plan")
        await self._refuse_if_revoked(context, silo, certs[0])
        if self.core.holds_other(silo, certificate_fingerprint(certs[0])):
            # Not the certificate of the silo connected under this name: it never speaks for it.
            await self.pool.call(context, self._refuse_name_in_use, silo, certs[0])
        return silo, certs[0]

    def _refuse_name_in_use(self, silo: str, cert: bytes) -> None:
        """Refuse the call if, under the core's lock, another certificate still holds the name."""
        try:
            self.core.check_holder(silo, certificate_fingerprint(cert))
        except NameInUse as exc:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, str(exc)) from None

    async def _refuse_if_revoked(self, context: grpc.aio.ServicerContext, silo: str,
                                 cert: bytes) -> None:
        """Abort the call when the CRL in force revokes the caller's certificate."""
        revoked = self.crl.revoked_at(cert) if self.crl is not None else None
        if revoked is None:
            return
        serial, when = revoked
        await self.pool.call(context, self._refuse, silo, Refused(
            grpc.StatusCode.PERMISSION_DENIED,
            f"the certificate of {silo!r} (serial {serial:x}) was revoked on "
            f"{when:%Y-%m-%d %H:%M} UTC by the federation's CA; the silo operator must renew it "
            "(`silo pki renew`) and have the new request signed"),
            "certificate revoked", serial=f"{serial:x}")

    def _refuse(self, silo: str, refusal: Refused, reason: str, **fields: Any) -> None:
        """Record the refusal (audit log, status), then refuse the call."""
        self.core.refused(silo, reason, **fields)
        raise refusal
