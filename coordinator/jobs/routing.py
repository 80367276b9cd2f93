"""Routes each Federation call on a standing coordinator's port to its job's federation.

A standing silo's `silo join` for a job sends the job's id in the call metadata
(protos/jobs.py JOB_METADATA_KEY) on every call; the router hands the call to that job's
servicer. A call without it, or for a job that is not running, is refused with a status that
says which.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from trellis.coordinator.jobs.host import JobHost
from trellis.protos.jobs import JOB_METADATA_KEY

SERVICE = "/trellis.v1.Federation/"
_SERVER_STREAMING = {"Attend", "FetchState", "FetchPool", "FetchBlinded"}
_CLIENT_STREAMING = {"UploadMasked", "UploadGroupSeal", "UploadEncryptedUpdate",
                     "UploadEnvelope"}


def job_of(metadata: Any) -> str | None:
    """The job id a call's metadata names (None: it names none)."""
    for key, value in metadata or ():
        if key == JOB_METADATA_KEY:
            return value if isinstance(value, str) else value.decode("ascii", "replace")
    return None


class JobRouter(grpc.GenericRpcHandler):
    """The Federation service of a standing coordinator: one federation per running job."""

    def __init__(self, host: JobHost) -> None:
        self.host = host

    def service(self, handler_call_details: grpc.HandlerCallDetails
                ) -> grpc.RpcMethodHandler | None:
        """The handler of the named job's federation, or one that refuses the call."""
        method = handler_call_details.method
        if not method.startswith(SERVICE):
            return None
        named = job_of(handler_call_details.invocation_metadata)
        if named is None:
            return _refusal(method, grpc.StatusCode.FAILED_PRECONDITION,
                            f"this coordinator runs the jobs of deployment "
                            f"{self.host.deployment.name}: a silo takes part with `silo serve`, "
                            "which joins each job it approved")
        if not named.isdigit() or len(named) > 18:
            return _refusal(method, grpc.StatusCode.INVALID_ARGUMENT,
                            f"job id {named[:40]!r} in the call metadata is not a number")
        runtime = self.host.runtime(int(named))
        if runtime is None:
            state = self.host.state_of(int(named))
            return _refusal(method, grpc.StatusCode.NOT_FOUND,
                            f"job {named} is not running here" +
                            (f" (it is {state.replace('_', ' ')})" if state else
                             " (there is no such job)"))
        return runtime.service(handler_call_details)


def _refusal(method: str, code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler:
    """A handler of the method's kind that refuses every call with code and details."""
    name = method[len(SERVICE):]

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, details)

    async def refuse_stream(request: Any, context: grpc.aio.ServicerContext
                            ) -> AsyncIterator[Any]:
        await context.abort(code, details)
        yield None              # never reached: abort raises

    if name in _SERVER_STREAMING:
        return grpc.unary_stream_rpc_method_handler(refuse_stream)
    if name in _CLIENT_STREAMING:
        return grpc.stream_unary_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)
