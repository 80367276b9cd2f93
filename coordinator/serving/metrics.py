"""The coordinator's Prometheus metrics, observed from its audit records and its gRPC calls.

Nothing here steers a round: `CoordinatorMetrics.observe` reads each audit record after the
log wrote it (rounds, stages, uploads, dropouts, refusals, connections), and `CallMetrics`, a
server interceptor, counts the bytes of the messages sent to each silo and the calls refused
with a status the audit log does not record. Served by `coordinator serve --metrics-listen`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from trellis.coordinator.serving.attend_rate import ATTEND_RATE_REASON
from trellis.coordinator.serving.holders import NAME_IN_USE
from trellis.coordinator.serving.upload_budget import UploadBudget

PREFIX = "trellis_coordinator_"
FEDERATION_METHODS = "/trellis.v1.Federation/"
# Refusals by gRPC status, for those no audit record names (the audited ones are "refused").
_REFUSED_STATUS = {
    grpc.StatusCode.FAILED_PRECONDITION: "out_of_phase",
    grpc.StatusCode.ALREADY_EXISTS: "duplicate",
    grpc.StatusCode.INVALID_ARGUMENT: "invalid",
    grpc.StatusCode.UNAUTHENTICATED: "unauthenticated",
    # Attends past a silo's rate: every call counts, though one record stands for a run.
    grpc.StatusCode.RESOURCE_EXHAUSTED: "attend_rate",
}
# Audited refusals counted from the calls above instead (their records are coalesced).
_COUNTED_BY_CALL = {ATTEND_RATE_REASON}
# A failed TLS handshake's audited reason starts so (coordinator/serving/handshake_watch.py
# counts every one; its records are coalesced too).
TLS_HANDSHAKE_REASON = "TLS handshake failed"
_AUDITED_REFUSALS = {"not admitted by the plan": "not_admitted",
                     "certificate revoked": "revoked",
                     NAME_IN_USE: "name_in_use"}
# Secure aggregation's stages take from milliseconds (relaying keys) to the training time.
_STAGE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


def _counted_elsewhere(reason: str) -> bool:
    return reason in _COUNTED_BY_CALL or reason.startswith(TLS_HANDSHAKE_REASON)


class CoordinatorMetrics:
    """Every coordinator metric, in a registry of its own."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.clock = clock
        r = self.registry
        self.rounds_completed = Gauge(
            PREFIX + "rounds_completed", "Rounds of the federation completed (its last "
            "completed round; survives a restart from the checkpoint)", registry=r)
        self.round = Gauge(PREFIX + "round", "The round in progress (last opened)", registry=r)
        self.round_seconds = Histogram(
            PREFIX + "round_duration_seconds", "Seconds from a round's opening to its "
            "completion", buckets=_STAGE_BUCKETS, registry=r)
        self.stage_seconds = Histogram(
            PREFIX + "stage_duration_seconds", "Seconds each secure-aggregation stage of an "
            "attempt took, by the stage that closed", ["stage"], buckets=_STAGE_BUCKETS,
            registry=r)
        self.received_bytes = Counter(
            PREFIX + "received_bytes", "Payload bytes of the uploads accepted from each silo "
            "(masked vectors, sealed envelopes, group seals, encrypted updates), as the audit "
            "log's received_tensor and received_blobs records count them", ["silo"], registry=r)
        self.sent_bytes = Counter(
            PREFIX + "sent_bytes", "Bytes of the protobuf messages sent to each silo "
            "(instructions, states, relayed keys and shares)", ["silo"], registry=r)
        self.dropouts = Counter(
            PREFIX + "dropouts", "Times a silo was dropped from a secure-aggregation attempt "
            "(it did not answer a stage in time, left, or was revoked)", ["silo"], registry=r)
        self.refusals = Counter(
            PREFIX + "refusals", "Calls refused, by reason: not_admitted, revoked, name_in_use (by "
            "certificate), out_of_phase, duplicate, invalid, unauthenticated, attend_rate "
            "(control streams opened too often), tls_handshake", ["reason"],
            registry=r)
        self.late = Counter(
            PREFIX + "late_messages", "Messages accepted after the step they belong to had "
            "closed without needing them, by message: reveal_shares (a survivor's share reveal "
            "after unmasking, routine for the slowest silos; audit record late_reveal). Not "
            "refusals", ["message"], registry=r)
        self.aborted = Counter(
            PREFIX + "aborted_attempts", "Round attempts aborted (too few silos, a failed "
            "unmasking); each is retried or fails the federation", registry=r)
        self.connected = Gauge(
            PREFIX + "connected_silos", "Silos whose control stream is open", registry=r)
        self.upload_memory = Gauge(
            PREFIX + "upload_memory_bytes", "Bytes reserved now by masked inputs being "
            "received ([server] upload_memory_mb bounds it)", registry=r)
        self.upload_memory_limit = Gauge(
            PREFIX + "upload_memory_limit_bytes", "The plan's upload memory budget",
            registry=r)
        self.upload_waits = Counter(
            PREFIX + "upload_waits", "Masked inputs that waited for the upload memory budget "
            "(many: a larger budget would take them at once, if memory allows)", registry=r)
        self._streams: set[str] = set()
        self._stage_started: dict[tuple[int, int], float] = {}
        self._warned = False

    def observe(self, record: Mapping[str, Any]) -> None:
        """Update the metrics from one audit record (never raises: metrics must not stop a
        federation)."""
        try:
            self._observe(record)
        except Exception as exc:  # noqa: BLE001 -- reported once, then the federation goes on
            if not self._warned:
                self._warned = True
                print(f"warning: metrics: cannot count audit record {record.get('event')!r} "
                      f"({type(exc).__name__}: {exc}); metrics may be incomplete",
                      file=sys.stderr, flush=True)

    def _observe(self, record: Mapping[str, Any]) -> None:
        event = record.get("event")
        if event in ("received_tensor", "received_blobs"):
            self.received_bytes.labels(record["silo"]).inc(record["bytes"])
        elif event == "round_opened":
            self.round.set(record["round"])
            self._stage_started = {(record["round"], record["attempt"]): self.clock()}
        elif event == "stage_closed" and "attempt" in record:
            key = (record["round"], record["attempt"])
            started = self._stage_started.get(key)
            now = self.clock()
            if started is not None:
                self.stage_seconds.labels(record["stage"]).observe(now - started)
            self._stage_started = {key: now}    # the next stage starts as this one closes
            for silo in record.get("dropped", ()):
                self.dropouts.labels(silo).inc()
        elif event == "round_completed":
            self.rounds_completed.set(record["round"])
            self.round_seconds.observe(record["seconds"])
        elif event == "round_aborted":
            self.aborted.inc()
        elif event == "late_reveal":
            self.late.labels("reveal_shares").inc()
        elif event == "refused" and not _counted_elsewhere(record["reason"]):
            self.refusals.labels(_AUDITED_REFUSALS.get(record["reason"], "other")).inc()
        elif event == "connected":
            self._streams.add(record["silo"])
            self.connected.set(len(self._streams))
        elif event == "disconnected":
            self._streams.discard(record["silo"])
            self.connected.set(len(self._streams))
        elif event == "serve":
            # Resumed from a checkpoint: the rounds before it are complete.
            self.rounds_completed.set(max(0, record["resumed_at_round"] - 1))

    def watch_uploads(self, budget: UploadBudget) -> None:
        """Export the upload budget: its limit, what it holds now, and the uploads it held up."""
        self.upload_memory_limit.set(budget.limit)
        self.upload_memory.set_function(lambda: budget.used)
        budget.on_wait = self.upload_waits.inc

    def call_metrics(self) -> CallMetrics:
        """The server interceptor that feeds sent_bytes and the status refusals."""
        return CallMetrics(self)


class CallMetrics(grpc.aio.ServerInterceptor):
    """Counts what each federation call sent to its caller, and the calls refused (asyncio)."""

    def __init__(self, metrics: CoordinatorMetrics) -> None:
        self.metrics = metrics

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(FEDERATION_METHODS):
            return handler
        ser, des = handler.response_serializer, handler.request_deserializer
        if handler.response_streaming:
            inner = handler.unary_stream or handler.stream_stream

            async def streamed(request: Any, context: grpc.aio.ServicerContext
                               ) -> AsyncIterator[Any]:
                try:
                    async for message in inner(request, context):
                        self._sent(context, message)
                        yield message
                        del message
                except Exception:
                    self._refused(context)
                    raise

            factory = (grpc.unary_stream_rpc_method_handler if handler.unary_stream
                       else grpc.stream_stream_rpc_method_handler)
            return factory(streamed, request_deserializer=des, response_serializer=ser)
        single = handler.unary_unary or handler.stream_unary

        async def answered(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                reply = await single(request, context)
            except Exception:
                self._refused(context)
                raise
            self._sent(context, reply)
            return reply

        factory = (grpc.unary_unary_rpc_method_handler if handler.unary_unary
                   else grpc.stream_unary_rpc_method_handler)
        return factory(answered, request_deserializer=des, response_serializer=ser)

    def _sent(self, context: grpc.aio.ServicerContext, message: Any) -> None:
        names = context.auth_context().get("x509_common_name") or [b"?"]
        self.metrics.sent_bytes.labels(names[0].decode(errors="replace")).inc(
            message.ByteSize())

    def _refused(self, context: grpc.aio.ServicerContext) -> None:
        reason = _REFUSED_STATUS.get(context.code())  # type: ignore[attr-defined]
        if reason is not None:
            self.metrics.refusals.labels(reason).inc()
