"""The coordinator's Prometheus metrics, observed from its audit records and its gRPC calls.

Nothing here steers a round: `CoordinatorMetrics.observe` reads each audit record after the
log wrote it (rounds, stages, uploads, dropouts, refusals, connections), and `CallMetrics`, a
server interceptor, counts the bytes of the messages sent to each silo and the calls refused
with a status the audit log does not record. Served by `coordinator serve --metrics-listen`.

A standing coordinator (`coordinator serve --deployment`) runs many federations, one per job,
into one registry: its metrics are made with ``per_job=True``, every federation's series carry
the job's number in the label ``job_id`` (not ``job``: Prometheus sets that label itself, to
the scrape job), and each job's audit log feeds its own `FederationMetrics`
(`CoordinatorMetrics.for_job`). The one-plan coordinator's series have no such label, exactly
as before. Deployment-wide: the jobs by state and the silos watching the Site service.
"""

from __future__ import annotations

import sys
import time
from collections import Counter as Multiset
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trellis.coordinator.serving.attend_rate import ATTEND_RATE_REASON
from trellis.coordinator.serving.holders import NAME_IN_USE
from trellis.coordinator.serving.upload_budget import UploadBudget
from trellis.protos.jobs import JOB_METADATA_KEY, STATES

PREFIX = "trellis_coordinator_"
FEDERATION_METHODS = "/trellis.v1.Federation/"
SITE_WATCH = "/trellis.v1.Site/WatchJobs"
JOB_LABEL = "job_id"
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
    """Every coordinator metric, in a registry of its own (per_job: a standing coordinator's,
    whose federations' series carry the label job_id)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *,
                 per_job: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.clock = clock
        self.per_job = per_job
        r = self.registry
        job = [JOB_LABEL] if per_job else []
        self.rounds_completed = Gauge(
            PREFIX + "rounds_completed", "Rounds of the federation completed (its last "
            "completed round; survives a restart from the checkpoint)", job, registry=r)
        self.round = Gauge(PREFIX + "round", "The round in progress (last opened)", job,
                           registry=r)
        self.round_seconds = Histogram(
            PREFIX + "round_duration_seconds", "Seconds from a round's opening to its "
            "completion", job, buckets=_STAGE_BUCKETS, registry=r)
        self.stage_seconds = Histogram(
            PREFIX + "stage_duration_seconds", "Seconds each secure-aggregation stage of an "
            "attempt took, by the stage that closed", ["stage", *job], buckets=_STAGE_BUCKETS,
            registry=r)
        self.received_bytes = Counter(
            PREFIX + "received_bytes", "Payload bytes of the uploads accepted from each silo "
            "(masked vectors, sealed envelopes, group seals, encrypted updates), as the audit "
            "log's received_tensor and received_blobs records count them", ["silo", *job],
            registry=r)
        self.sent_bytes = Counter(
            PREFIX + "sent_bytes", "Bytes of the protobuf messages sent to each silo "
            "(instructions, states, relayed keys and shares)", ["silo", *job], registry=r)
        self.dropouts = Counter(
            PREFIX + "dropouts", "Times a silo was dropped from a secure-aggregation attempt "
            "(it did not answer a stage in time, left, or was revoked)", ["silo", *job],
            registry=r)
        self.refusals = Counter(
            PREFIX + "refusals", "Calls refused, by reason: not_admitted, revoked, name_in_use (by "
            "certificate), out_of_phase, duplicate, invalid, unauthenticated, attend_rate "
            "(control streams opened too often), tls_handshake", ["reason", *job],
            registry=r)
        self.late = Counter(
            PREFIX + "late_messages", "Messages accepted after the step they belong to had "
            "closed without needing them, by message: reveal_shares (a survivor's share reveal "
            "after unmasking, routine for the slowest silos; audit record late_reveal). Not "
            "refusals", ["message", *job], registry=r)
        self.aborted = Counter(
            PREFIX + "aborted_attempts", "Round attempts aborted (too few silos, a failed "
            "unmasking); each is retried or fails the federation", job, registry=r)
        self.connected = Gauge(
            PREFIX + "connected_silos", "Silos whose control stream is open", job, registry=r)
        self.upload_memory = Gauge(
            PREFIX + "upload_memory_bytes", "Bytes reserved now by masked inputs being "
            "received ([server] upload_memory_mb bounds it)", registry=r)
        self.upload_memory_limit = Gauge(
            PREFIX + "upload_memory_limit_bytes", "The plan's upload memory budget",
            registry=r)
        self.upload_waits = Counter(
            PREFIX + "upload_waits", "Masked inputs that waited for the upload memory budget "
            "(many: a larger budget would take them at once, if memory allows)", registry=r)
        self.site_silos = Gauge(
            PREFIX + "site_silos", "Standing silos watching the coordinator's jobs now (an "
            "open Site WatchJobs stream; 0 on a one-plan coordinator)", registry=r)
        self.jobs = _JobsByState()
        r.register(self.jobs)
        self._watching: Multiset[str] = Multiset()
        self._federations: dict[str, FederationMetrics] = {}
        self._warned = False
        self._one_plan = self.for_job("")

    def for_job(self, job_id: int | str) -> FederationMetrics:
        """The metrics of one job's federation (the same object for the same job)."""
        key = str(job_id)
        if key not in self._federations:
            self._federations[key] = FederationMetrics(self, key)
        return self._federations[key]

    def observe(self, record: Mapping[str, Any]) -> None:
        """Update the metrics from one audit record of the one-plan coordinator's federation
        (never raises: metrics must not stop a federation)."""
        self._one_plan.observe(record)

    def count_refusal(self, reason: str, job_id: str = "") -> None:
        """Count one refused call (a reason of the refusals metric's help)."""
        self._labelled(self.refusals, reason, job_id=job_id).inc()

    def watch_uploads(self, budget: UploadBudget) -> None:
        """Export the upload budget: its limit, what it holds now, and the uploads it held up."""
        self.upload_memory_limit.set(budget.limit)
        self.upload_memory.set_function(lambda: budget.used)
        budget.on_wait = self.upload_waits.inc

    def watch_jobs(self, counts: Callable[[], Mapping[str, int]]) -> None:
        """Export the jobs by state, from counts() (the job table, read at each scrape)."""
        self.jobs.counts = counts

    def call_metrics(self) -> CallMetrics:
        """The server interceptor that feeds sent_bytes, the status refusals and site_silos."""
        return CallMetrics(self)

    def _labelled(self, family: Any, *values: str, job_id: str) -> Any:
        """family's series for values (and the job, per job); the family if it has no label."""
        labels = (*values, job_id) if self.per_job else values
        return family.labels(*labels) if labels else family

    def _warn_once(self, record: Mapping[str, Any], exc: Exception) -> None:
        if not self._warned:
            self._warned = True
            print(f"warning: metrics: cannot count audit record {record.get('event')!r} "
                  f"({type(exc).__name__}: {exc}); metrics may be incomplete",
                  file=sys.stderr, flush=True)

    def _watch_opened(self, silo: str) -> None:
        self._watching[silo] += 1
        self.site_silos.set(len(self._watching))

    def _watch_closed(self, silo: str) -> None:
        self._watching[silo] -= 1
        if self._watching[silo] <= 0:
            del self._watching[silo]
        self.site_silos.set(len(self._watching))


class FederationMetrics:
    """One federation's metrics: its audit records counted under its job (of a standing
    coordinator; "" for the one-plan coordinator)."""

    def __init__(self, metrics: CoordinatorMetrics, job_id: str) -> None:
        self.metrics = metrics
        self.job_id = job_id
        self._streams: set[str] = set()
        self._stage_started: dict[tuple[int, int], float] = {}

    def observe(self, record: Mapping[str, Any]) -> None:
        """Update the metrics from one audit record of this federation's log (never raises:
        metrics must not stop a federation)."""
        try:
            self._observe(record)
        except Exception as exc:  # noqa: BLE001 -- reported once, then the federation goes on
            self.metrics._warn_once(record, exc)

    def _of(self, family: Any, *values: str) -> Any:
        return self.metrics._labelled(family, *values, job_id=self.job_id)

    def _observe(self, record: Mapping[str, Any]) -> None:
        m, of = self.metrics, self._of
        event = record.get("event")
        if event in ("received_tensor", "received_blobs"):
            of(m.received_bytes, record["silo"]).inc(record["bytes"])
        elif event == "round_opened":
            of(m.round).set(record["round"])
            self._stage_started = {(record["round"], record["attempt"]): m.clock()}
        elif event == "stage_closed" and "attempt" in record:
            key = (record["round"], record["attempt"])
            started = self._stage_started.get(key)
            now = m.clock()
            if started is not None:
                of(m.stage_seconds, record["stage"]).observe(now - started)
            self._stage_started = {key: now}    # the next stage starts as this one closes
            for silo in record.get("dropped", ()):
                of(m.dropouts, silo).inc()
        elif event == "round_completed":
            of(m.rounds_completed).set(record["round"])
            of(m.round_seconds).observe(record["seconds"])
        elif event == "round_aborted":
            of(m.aborted).inc()
        elif event == "late_reveal":
            of(m.late, "reveal_shares").inc()
        elif event == "refused" and not _counted_elsewhere(record["reason"]):
            of(m.refusals, _AUDITED_REFUSALS.get(record["reason"], "other")).inc()
        elif event == "connected":
            self._streams.add(record["silo"])
            of(m.connected).set(len(self._streams))
        elif event == "disconnected":
            self._streams.discard(record["silo"])
            of(m.connected).set(len(self._streams))
        elif event == "serve":
            # Resumed from a checkpoint: the rounds before it are complete.
            of(m.rounds_completed).set(max(0, record["resumed_at_round"] - 1))


class _JobsByState(Collector):
    """trellis_coordinator_jobs{state}: read from the job table at each scrape (no series on
    a one-plan coordinator, which has none)."""

    def __init__(self) -> None:
        self.counts: Callable[[], Mapping[str, int]] | None = None

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(PREFIX + "jobs", "Jobs of the deployment by state "
                                   "(submitted, awaiting_approval, queued, running, completed, "
                                   "failed, stopped)", labels=["state"])
        try:
            counts = self.counts() if self.counts is not None else None
        except Exception:  # noqa: BLE001 -- a closed job table: a scrape must still answer
            counts = None
        if counts is not None:
            for state in STATES:
                family.add_metric([state], counts.get(state, 0))
        yield family


def _job_of(details: grpc.HandlerCallDetails) -> str:
    """The job a call names in its metadata, if a number ("" otherwise: no series for junk)."""
    for key, value in details.invocation_metadata or ():
        if key == JOB_METADATA_KEY:
            named = value if isinstance(value, str) else value.decode("ascii", "replace")
            return named if named.isdigit() and len(named) <= 18 else ""
    return ""


class CallMetrics(grpc.aio.ServerInterceptor):
    """Counts what each federation call sent to its caller, and the calls refused; and the
    silos watching the Site service (asyncio)."""

    def __init__(self, metrics: CoordinatorMetrics) -> None:
        self.metrics = metrics

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is not None and method == SITE_WATCH:
            return self._watched(handler)
        if handler is None or not method.startswith(FEDERATION_METHODS):
            return handler
        job = _job_of(handler_call_details) if self.metrics.per_job else ""
        ser, des = handler.response_serializer, handler.request_deserializer
        if handler.response_streaming:
            inner = handler.unary_stream or handler.stream_stream

            async def streamed(request: Any, context: grpc.aio.ServicerContext
                               ) -> AsyncIterator[Any]:
                try:
                    async for message in inner(request, context):
                        self._sent(context, message, job)
                        yield message
                        del message
                except Exception:
                    self._refused(context, job)
                    raise

            factory = (grpc.unary_stream_rpc_method_handler if handler.unary_stream
                       else grpc.stream_stream_rpc_method_handler)
            return factory(streamed, request_deserializer=des, response_serializer=ser)
        single = handler.unary_unary or handler.stream_unary

        async def answered(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                reply = await single(request, context)
            except Exception:
                self._refused(context, job)
                raise
            self._sent(context, reply, job)
            return reply

        factory = (grpc.unary_unary_rpc_method_handler if handler.unary_unary
                   else grpc.stream_unary_rpc_method_handler)
        return factory(answered, request_deserializer=des, response_serializer=ser)

    def _watched(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """The WatchJobs handler, counting its caller as watching from its first message (it
        was admitted) until the stream ends."""
        inner = handler.unary_stream

        async def watching(request: Any, context: grpc.aio.ServicerContext
                           ) -> AsyncIterator[Any]:
            silo = None
            try:
                async for message in inner(request, context):
                    if silo is None:
                        silo = _caller(context)
                        self.metrics._watch_opened(silo)
                    yield message
                    del message
            finally:
                if silo is not None:
                    self.metrics._watch_closed(silo)

        return grpc.unary_stream_rpc_method_handler(
            watching, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)

    def _sent(self, context: grpc.aio.ServicerContext, message: Any, job: str) -> None:
        self.metrics._labelled(self.metrics.sent_bytes, _caller(context),
                               job_id=job).inc(message.ByteSize())

    def _refused(self, context: grpc.aio.ServicerContext, job: str) -> None:
        reason = _REFUSED_STATUS.get(context.code())  # type: ignore[attr-defined]
        if reason is not None:
            self.metrics.count_refusal(reason, job)


def _caller(context: grpc.aio.ServicerContext) -> str:
    names = context.auth_context().get("x509_common_name") or [b"?"]
    return names[0].decode(errors="replace")
