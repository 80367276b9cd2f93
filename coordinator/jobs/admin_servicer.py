"""gRPC transport of the Admin service on a standing coordinator: operators submit, list,
follow, stop and collect jobs.

Only operator certificates of the deployment's CA are answered (coordinator/jobs/callers.py);
submitting also needs the operator's signature over the plan (protos/submission.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from trellis.coordinator.jobs.callers import Callers
from trellis.coordinator.jobs.host import JobHost, JobRejected
from trellis.coordinator.serving.aio_edge import CorePool, Refused
from trellis.protos import codec, jobs_codec
from trellis.protos import federation_pb2_grpc as pb_grpc

FOLLOW_POLL_S = 0.5
FILE_PIECE_BYTES = 1 << 20


class JobsAdminServicer(pb_grpc.AdminServicer):
    """Each method: check the operator, ask the host, encode."""

    def __init__(self, host: JobHost, callers: Callers, pool: CorePool) -> None:
        self.host = host
        self.callers = callers
        self.pool = pool

    async def _operator(self, context: grpc.aio.ServicerContext) -> tuple[str, bytes]:
        return await self.pool.call(context, self.callers.operator, context.auth_context())

    async def _ask(self, context: grpc.aio.ServicerContext, fn: Any, *args: Any) -> Any:
        return await self.pool.call(context, _refusing, fn, *args)

    async def Status(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._operator(context)
        running = [j for j in await self._ask(context, self.host.views)
                   if j.state == "running" and j.status is not None]
        if len(running) != 1:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"this coordinator runs the jobs of deployment "
                                f"{self.host.deployment.name} ({len(running)} running): see "
                                "`coordinator jobs list` and `coordinator jobs show ID`")
        return codec.status_to_pb(running[0].status)

    async def SubmitJob(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        operator, cert = await self._operator(context)
        plan_toml, statement, signature = jobs_codec.submit_from_pb(request)
        job = await self._ask(context, self.host.submit, operator, cert, plan_toml, statement,
                              signature)
        return jobs_codec.job_to_pb(job)

    async def ListJobs(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._operator(context)
        return jobs_codec.jobs_to_pb(await self._ask(context, self.host.views))

    async def ShowJob(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._operator(context)
        job_id, _, _ = jobs_codec.job_request_from_pb(request)
        return jobs_codec.job_to_pb(await self._ask(context, self.host.view, job_id))

    async def StopJob(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        operator, _ = await self._operator(context)
        job_id, _, _ = jobs_codec.job_request_from_pb(request)
        return jobs_codec.job_to_pb(await self._ask(context, self.host.stop, job_id, operator))

    async def JobLogs(self, request: Any, context: grpc.aio.ServicerContext
                      ) -> AsyncIterator[Any]:
        await self._operator(context)
        job_id, follow, offset = jobs_codec.job_request_from_pb(request)
        while True:
            lines, offset, ended = await self._ask(context, self.host.log_lines, job_id, offset)
            if lines:
                yield jobs_codec.log_lines(lines, offset)
                continue
            if not follow or ended:
                return
            # On the loop, not the core's threads: a follower must never hold one of those.
            await asyncio.sleep(FOLLOW_POLL_S)

    async def JobResults(self, request: Any, context: grpc.aio.ServicerContext
                         ) -> AsyncIterator[Any]:
        await self._operator(context)
        job_id, _, _ = jobs_codec.job_request_from_pb(request)
        files = await self._ask(context, lambda: list(self.host.result_files(job_id)))
        for name, data in files:
            # In pieces under gRPC's default message limit; the client joins a name's pieces.
            for start in range(0, max(len(data), 1), FILE_PIECE_BYTES):
                yield jobs_codec.result_file(name, data[start:start + FILE_PIECE_BYTES])


def _refusing(fn: Any, *args: Any) -> Any:
    """fn(*args), its JobRejected a FAILED_PRECONDITION refusal."""
    try:
        return fn(*args)
    except JobRejected as exc:
        raise Refused(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
