"""One job's federation inside a standing coordinator.

A running job is what `coordinator serve --plan` runs, without a server of its own: its round
machine (resumed from the job folder's checkpoint after a restart), audit log, live status
files, deadline thread and Federation servicer, whose calls the router hands over
(coordinator/jobs/routing.py). Its progress lines go to the job folder's job.log and to the
coordinator's own log, labelled with the job.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from trellis.coordinator.serving.aio_edge import CorePool
from trellis.coordinator.serving.core import CoordinatorCore
from trellis.coordinator.serving.crl_watch import CrlWatch
from trellis.coordinator.serving.federation_servicer import MAX_TENSOR_BYTES, FederationServicer
from trellis.coordinator.serving.live_files import LiveFiles
from trellis.coordinator.serving.metrics import CoordinatorMetrics
from trellis.coordinator.serving.service import (
    finish_federation,
    open_federation,
    start_ticker,
)
from trellis.coordinator.serving.upload_budget import UploadBudget
from trellis.coordinator.state.exclusive import StateDirLock
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos.logs import make_logger
from trellis.protos.plan import Plan

JOB_LOG = "job.log"


@dataclass
class SharedServing:
    """What every job's federation shares with the others on one server."""

    key_pem: bytes                        # the coordinator's key: signs the audit logs' heads
    pool: CorePool
    budget: UploadBudget
    crl: CrlWatch | None = None
    metrics: CoordinatorMetrics | None = None
    log_format: str = "text"
    echo: bool = True                     # progress lines on the coordinator's stderr too
    clock: Callable[[], float] = time.monotonic
    loop: asyncio.AbstractEventLoop | None = None   # the server's: wakes the jobs' streams


class _Collector:
    """Stands in for a server to take the generated code's handlers for one servicer."""

    def __init__(self) -> None:
        self.handlers: list[grpc.GenericRpcHandler] = []

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.handlers.extend(handlers)

    def add_registered_method_handlers(self, name: str, handlers: Any) -> None:
        pass                # the router looks methods up by name, through the generic handler


@dataclass
class JobRuntime:
    """A job's federation while it runs."""

    job_id: int
    plan: Plan
    core: CoordinatorCore
    live: LiveFiles
    handler: grpc.GenericRpcHandler
    lock: StateDirLock
    log_handler: logging.Handler
    started: float
    ticker: threading.Thread | None = None
    ended: dict[str, Any] | None = field(default=None)

    @property
    def finished(self) -> bool:
        """Whether its federation has ended (completed or failed)."""
        return self.core.machine.finished

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        """The Federation method handler for a call routed to this job."""
        return self.handler.service(details)

    def finish(self, clock: Callable[[], float], status: str | None = None) -> dict[str, Any]:
        """Write its results, let its silos hear the end, close its audit log and folder."""
        if self.ended is not None:
            return self.ended
        try:
            self.ended = finish_federation(self.core, self.live, clock() - self.started, status)
        finally:
            self.core.stop()
            self.core.audit.close()
            self.lock.release()
            self.log_handler.close()
        return self.ended


def start_job(job_id: int, plan: Plan, participants: tuple[str, ...], shared: SharedServing,
              ) -> JobRuntime:
    """Start (or, from its folder's checkpoint, resume) a job's federation."""
    state_dir = plan.server.state_dir
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = StateDirLock.acquire(state_dir)
    try:
        logger, handler = _job_logger(job_id, state_dir / JOB_LOG, shared)
        core = open_federation(plan, shared.key_pem, clock=shared.clock,
                               metrics=(shared.metrics.for_job(job_id)
                                        if shared.metrics is not None else None),
                               logger=logger,
                               participants=participants)
    except BaseException:
        lock.release()
        raise
    servicer = FederationServicer(core, max_tensor_bytes=MAX_TENSOR_BYTES, crl=shared.crl,
                                  budget=shared.budget, pool=shared.pool)
    if shared.loop is not None:
        servicer.listen(shared.loop)
    collector = _Collector()
    pb_grpc.add_FederationServicer_to_server(servicer, collector)
    live = LiveFiles(core)
    runtime = JobRuntime(job_id, plan, core, live, collector.handlers[0], lock, handler,
                         started=shared.clock())
    runtime.ticker = start_ticker(core, live, None, name=f"job-{job_id}")
    return runtime


def _job_logger(job_id: int, path: Path, shared: SharedServing
                ) -> tuple[logging.Logger, logging.Handler]:
    """A logger for the job's lines: its job.log (0600), and stderr when echoing."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    stream = os.fdopen(fd, "a", encoding="utf-8", buffering=1)
    logger = make_logger(f"job {job_id}", shared.log_format, stream)
    to_file = logger.handlers[0]
    if shared.echo:
        echo = logging.StreamHandler()
        echo.setFormatter(to_file.formatter)
        logger.addHandler(echo)
    return logger, to_file
