"""gRPC transport of the Site service: a standing silo watches the jobs that name it, and
answers them.

WatchJobs sends the whole picture (every job naming the caller that has not ended, and the
last few that did) at once and again on every change; a silo reconnecting after a restart
needs nothing else to catch up. AnswerJob records the silo's approval or refusal.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from trellis.coordinator.jobs.callers import Callers
from trellis.coordinator.jobs.host import JobHost, JobRejected
from trellis.coordinator.serving.aio_edge import ChangeSignal, CorePool, Refused, guarded
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos import jobs_codec
from trellis.protos.messages import AgentTooOld, check_agent_version

WATCH_POLL_S = 1.0          # a watch looks again at least this often, change or not


class SiteServicer(pb_grpc.SiteServicer):
    """Each method: identify the silo, ask the host, encode (asyncio; the work on the pool)."""

    def __init__(self, host: JobHost, callers: Callers, pool: CorePool) -> None:
        self.host = host
        self.callers = callers
        self.pool = pool
        self._signal = ChangeSignal()

    def listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake the watching streams, on loop, whenever a job may have changed."""
        self.host.on_change(self._signal.listener(loop))

    async def WatchJobs(self, request: Any, context: grpc.aio.ServicerContext
                        ) -> AsyncIterator[Any]:
        silo, _ = await self.pool.call(context, self.callers.silo, context.auth_context())
        try:
            await guarded(context, check_agent_version, request.agent_version)
        except AgentTooOld as exc:          # pragma: no cover - guarded aborts first
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        await self.pool.call(context, self.host.audit.append, "site_watching", silo=silo)
        last: list[Any] | None = None
        while True:
            changed = self._signal.next_change()
            offers = await self.pool.call(context, self.host.offers_for, silo)
            if offers != last:
                last = offers
                yield jobs_codec.site_jobs_to_pb(offers)
                continue
            try:
                await asyncio.wait_for(changed.wait(), WATCH_POLL_S)
            except TimeoutError:
                pass

    async def AnswerJob(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        silo, _ = await self.pool.call(context, self.callers.silo, context.auth_context())
        job_id, approve, reason = jobs_codec.answer_from_pb(request)
        await self.pool.call(context, self._answer, silo, job_id, approve, reason[:1000])
        return jobs_codec.ack("approved" if approve else "refused")

    def _answer(self, silo: str, job_id: int, approve: bool, reason: str) -> None:
        try:
            self.host.answer(silo, job_id, approve, reason)
        except JobRejected as exc:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
