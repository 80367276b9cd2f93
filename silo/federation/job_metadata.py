"""Names the job on every call of a standing silo's federation (`silo join --job`).

A standing coordinator runs several jobs' federations on one port and routes each call by
this metadata (coordinator/jobs/routing.py); a one-plan coordinator never sees it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from trellis.protos.jobs import JOB_METADATA_KEY


class _Details(grpc.ClientCallDetails):
    """Call details with the job added to the metadata (grpc's own type is a namedtuple-like
    class without a constructor for this)."""

    def __init__(self, base: grpc.ClientCallDetails, job_id: int) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)
        self.metadata = [*(base.metadata or ()), (JOB_METADATA_KEY, str(job_id))]


class JobMetadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                  grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the job's id to the metadata of every call, whatever its kind."""

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id

    def _go(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails,
            request: Any) -> Any:
        return continuation(_Details(details, self.job_id), request)

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any,
                              request: Any) -> Any:
        return self._go(continuation, client_call_details, request)

    def intercept_unary_stream(self, continuation: Any, client_call_details: Any,
                               request: Any) -> Any:
        return self._go(continuation, client_call_details, request)

    def intercept_stream_unary(self, continuation: Any, client_call_details: Any,
                               request_iterator: Any) -> Any:
        return self._go(continuation, client_call_details, request_iterator)

    def intercept_stream_stream(self, continuation: Any, client_call_details: Any,
                                request_iterator: Any) -> Any:
        return self._go(continuation, client_call_details, request_iterator)


def for_job(channel: grpc.Channel, job_id: int | None) -> grpc.Channel:
    """The channel, naming job_id on every call (unchanged when there is no job)."""
    if job_id is None:
        return channel
    return grpc.intercept_channel(channel, JobMetadata(job_id))
