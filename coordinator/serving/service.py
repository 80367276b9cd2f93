"""The coordinator's gRPC server: built from a plan, started, served until the federation ends.

The server is gRPC's asyncio server on one event loop thread: a silo's open streams cost no
thread, and the core's work runs on a small fixed pool (coordinator/serving/aio_edge.py). Here
are its TLS credentials (mTLS: every caller shows a certificate of the federation's CA), its
interceptors and options, the resumption from a checkpoint, and the orderly stop; the
Federation service's handlers are in coordinator/serving/federation_servicer.py.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from trellis.coordinator.operations.progress import Progress
from trellis.coordinator.rounds.machine import RoundMachine, Stage
from trellis.coordinator.rounds.privacy_report import privacy_summary
from trellis.coordinator.rounds.strategies import make_strategy
from trellis.coordinator.serving.admin import AdminServicer
from trellis.coordinator.serving.aio_edge import CorePool
from trellis.coordinator.serving.capture import WireCapture
from trellis.coordinator.serving.core import CoordinatorCore
from trellis.coordinator.serving.crl_watch import CrlWatch
from trellis.coordinator.serving.federation_servicer import MAX_TENSOR_BYTES, FederationServicer
from trellis.coordinator.serving.health import FederationHealth
from trellis.coordinator.serving.live_files import LiveFiles
from trellis.coordinator.serving.metrics import CoordinatorMetrics, FederationMetrics
from trellis.coordinator.serving.undecodable import RefuseUndecodable
from trellis.coordinator.serving.upload_budget import UploadBudget, stream_window_options
from trellis.coordinator.state.checkpoint import (
    RESULTS,
    discard_state_files,
    extended_from,
    keep_earlier_results,
    load_checkpoint,
)
from trellis.coordinator.state.exclusive import PortInUse, StateDirLock, check_port_free
from trellis.coordinator.state.results import build_results
from trellis.crypto.audit import AuditLog
from trellis.crypto.errors import CryptoError
from trellis.crypto.pki import load_identity_files
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos import keepalive
from trellis.protos.algorithms import algorithm
from trellis.protos.files import write_json_atomic
from trellis.protos.logs import make_logger
from trellis.protos.plan import Plan

T = TypeVar("T")

ENDING_GRACE_S = 5.0    # the longest the server waits for silos' streams to take the ending


class EventLoopThread:
    """One thread running an asyncio event loop: the whole gRPC server lives on it."""

    def __init__(self, name: str = "grpc-aio") -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run coroutine on the loop and wait for its result here."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        """Finish the loop's async generators, stop it and end its thread."""
        if self.loop.is_closed():
            return
        self.run(self.loop.shutdown_asyncgens())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


@dataclass
class RunningServer:
    """A started coordinator: its gRPC server, core and bound port."""

    server: grpc.aio.Server
    core: CoordinatorCore
    port: int
    ticker: threading.Thread
    capture: WireCapture | None = None
    lock: StateDirLock | None = None
    health: FederationHealth | None = None
    live: LiveFiles | None = None
    events: EventLoopThread | None = None
    pool: CorePool | None = None
    budget: UploadBudget | None = None

    def stop(self, grace: float = 2.0) -> None:
        """Stop accepting calls, end the streams, close the audit log and capture."""
        if self.health is not None:
            self.health.ended()
        self.core.stop()
        if self.events is not None and not self.events.loop.is_closed():
            self.events.run(self.server.stop(grace))
            self.events.close()
        if self.pool is not None:
            self.pool.shutdown()       # what the handlers handed over is done
        self.core.audit.close()
        if self.capture is not None:
            self.capture.close()
        if self.lock is not None:
            self.lock.release()


def start_server(plan: Plan, *, clock: Callable[[], float] = time.monotonic,
                 progress: bool = True, listen: str | None = None,
                 capture: Path | None = None, health: FederationHealth | None = None,
                 metrics: CoordinatorMetrics | None = None,
                 log_format: str = "text") -> RunningServer:
    """Start serving a plan over mTLS; resumes from the state directory's checkpoint if any.

    health turns SERVING once the federation service is up; metrics observe the audit records
    and the calls.
    """
    if algorithm(plan.public.algorithm).simulation_only:
        raise ValueError(f"{plan.public.algorithm} cannot run as a real federation: it needs "
                         "schema matching (every silo's relation names, to build a union "
                         "model or to compare silos), which would reveal each silo's schema. It "
                         "is a research baseline: run it with `coordinator simulate`; a real "
                         "federation over heterogeneous graphs uses fedhgn")
    state_dir = plan.server.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    lock = StateDirLock.acquire(state_dir)
    try:
        return _start(plan, lock, clock=clock, progress=progress, listen=listen,
                      capture=capture, health=health, metrics=metrics,
                      log_format=log_format)
    except BaseException:
        lock.release()
        raise


def _start(plan: Plan, lock: StateDirLock, *, clock: Callable[[], float], progress: bool,
           listen: str | None, capture: Path | None, health: FederationHealth | None,
           metrics: CoordinatorMetrics | None, log_format: str) -> RunningServer:
    """start_server once this process holds the state directory."""
    address = listen or plan.server.listen
    check_port_free(address)
    for field, path in (("server.server_key", plan.server.server_key),
                        ("server.server_cert", plan.server.server_cert),
                        ("server.ca_cert", plan.server.ca_cert)):
        if not path.is_file():
            raise FileNotFoundError(f"{field}: cannot read {path}: no such file")
    try:
        server_identity = load_identity_files(plan.server.server_key, plan.server.server_cert,
                                              plan.server.ca_cert)
    except CryptoError as exc:
        raise ValueError(f"server identity: {exc}") from None
    key_pem, cert_pem, ca_pem = (server_identity.key_pem, server_identity.cert_pem,
                                 server_identity.ca_pem)
    core = open_federation(plan, key_pem, clock=clock, metrics=metrics,
                           logger=make_logger("coordinator", log_format) if progress else None)
    audit = core.audit
    wire = WireCapture(capture) if capture is not None else None
    # Unparsable bytes are refused first, so neither the capture nor a handler sees them.
    interceptors: list[grpc.aio.ServerInterceptor] = [RefuseUndecodable()]
    if metrics is not None:
        interceptors.insert(0, metrics.call_metrics())    # outermost: sees every refusal
    if wire is not None:
        interceptors.append(wire)
    budget = UploadBudget(plan.server.upload_memory_mb << 20)
    if metrics is not None:
        metrics.watch_uploads(budget)
    crl = CrlWatch(plan.server.crl_path, ca_pem)
    _note_crl(core, crl.refresh())
    credentials = grpc.ssl_server_credentials([(key_pem, cert_pem)], root_certificates=ca_pem,
                                              require_client_auth=True)
    # One event loop serves every silo's streams; the core's work runs on a few fixed
    # threads. Neither grows with the number of silos.
    pool = CorePool()
    servicer = FederationServicer(core, max_tensor_bytes=MAX_TENSOR_BYTES, crl=crl,
                                  budget=budget, pool=pool)
    events = EventLoopThread()

    async def bind() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server(
            interceptors=interceptors,
            options=[("grpc.max_receive_message_length", 8 << 20),
                     # Never share the port with another server (gRPC's default).
                     ("grpc.so_reuseport", 0), *keepalive.server_options(),
                     *stream_window_options(plan.server.stream_window_kb)])
        pb_grpc.add_FederationServicer_to_server(servicer, server)
        if health is not None:
            health.add_to_aio(server)
        pb_grpc.add_AdminServicer_to_server(AdminServicer(core, crl, pool), server)
        try:
            port = server.add_secure_port(address, credentials)
        except RuntimeError:
            port = 0             # taken between the check and the bind
        if port != 0:
            servicer.listen(asyncio.get_running_loop())
            await server.start()
        return server, port

    try:
        server, port = events.run(bind())
    except BaseException:
        events.close()
        pool.shutdown()
        audit.close()
        raise
    if port == 0:
        events.close()
        pool.shutdown()
        audit.close()
        raise PortInUse(f"cannot listen on {address}: the port is in use or not available")
    live = LiveFiles(core)
    ticker = start_ticker(core, live, crl)
    if health is not None:
        health.serving()
    return RunningServer(server, core, port, ticker, wire, lock, health=health, live=live,
                         events=events, pool=pool, budget=budget)


def open_federation(plan: Plan, signing_key_pem: bytes, *, clock: Callable[[], float],
                    metrics: CoordinatorMetrics | FederationMetrics | None = None,
                    logger: logging.Logger | None = None,
                    participants: tuple[str, ...] | None = None) -> CoordinatorCore:
    """Start a plan's round machine, or resume it from its state folder's checkpoint; open its
    audit log and record that it is served (the caller holds the state folder's lock).

    signing_key_pem: the coordinator's key, which signs the audit log's heads; logger: where
    progress lines go (None: no progress lines); participants: a job's approvers, the only
    silos it waits for and admits (None: the plan's silos); metrics: what observes its audit
    records (a standing coordinator's job: CoordinatorMetrics.for_job).
    """
    state_dir = plan.server.state_dir
    now = clock()
    extended = extended_from(state_dir, plan)
    resume = load_checkpoint(state_dir, plan)
    strategy = make_strategy(plan.public.algorithm, plan.clustering, plan.silos,
                             plan.public.hetero, privacy=plan.public.privacy,
                             metric=plan.public.training.validation_metric)
    if resume is None:
        discard_state_files(state_dir)
        machine = RoundMachine(plan, strategy, now, run_id=secrets.token_hex(8))
    else:
        if resume.durable is None and (strategy.clustered or strategy.needs_group_key):
            raise ValueError(f"{state_dir / 'checkpoint.json'}: the {plan.public.algorithm} "
                             "clusters, silo group or envelopes of this checkpoint are missing "
                             "(written by an older version?); move the state directory away "
                             "to start again")
        machine = RoundMachine(plan, strategy, now, start_round=resume.next_round,
                               global_state=resume.global_state, history=resume.history,
                               attempts_before=resume.attempts_opened,
                               run_id=resume.run_id or secrets.token_hex(8))
        try:
            machine.restore_durable_state(resume.durable or {}, resume.durable_arrays,
                                          resume.setup_generation, now)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{state_dir}: the durable state does not match its checkpoint "
                             f"({type(exc).__name__}: {exc}); move the state directory away "
                             "to start again") from None
    if participants is not None:
        machine.expect_only(participants)
    audit = AuditLog(state_dir / "audit.jsonl", writer="coordinator",
                     signing_key_pem=signing_key_pem)
    if metrics is not None:
        audit.observe(metrics.observe)
    shown = Progress(plan.public.rounds, clock, now,
                     logger=logger) if logger is not None else None
    core = CoordinatorCore(plan, machine, audit, clock, shown)
    audit.append("serve", federation=plan.federation, algorithm=plan.public.algorithm,
                 rounds=plan.public.rounds, resumed_at_round=machine.round,
                 admitted=sorted(machine.expected) if participants else list(plan.silos),
                 plan_sha256=plan.public.sha256(),
                 **privacy_summary(plan))
    if resume is not None and extended is None and shown is not None:
        # After a stop, a crash or a rescheduled pod: the operator sees where it goes on.
        shown.note(f"resuming federation {plan.federation} at round {resume.next_round} of "
                   f"{plan.public.rounds} from {state_dir / 'checkpoint.json'}")
    if extended is not None:
        kept = keep_earlier_results(state_dir, extended)
        audit.append("extended", from_rounds=extended, to_rounds=plan.public.rounds,
                      earlier_results=str(kept) if kept else None)
        if shown is not None:
            shown.note(f"extending federation {plan.federation} from {extended} to "
                       f"{plan.public.rounds} rounds" + (f"; the results of the first "
                                                         f"{extended} are kept in {kept}"
                                                         if kept else ""))
    return core


def start_ticker(core: CoordinatorCore, live: LiveFiles, crl: CrlWatch | None = None,
                 name: str = "deadlines") -> threading.Thread:
    """A thread that passes time to the machine (deadlines), refreshes the live files and,
    given crl, notes changes of the revocation list, until the federation ends."""

    def tick() -> None:
        while not core.stopping:
            core.tick()
            if crl is not None:
                _note_crl(core, crl.refresh())
            live.refresh()       # status.json and results.json, off the handlers' path
            if core.wait_finished(0.2):
                break

    ticker = threading.Thread(target=tick, name=name, daemon=True)
    ticker.start()
    return ticker


def _note_crl(core: CoordinatorCore, change: str | None) -> None:
    """Say and record that the revocation list changed (or could not be read)."""
    if change is None or core.stopping:
        return
    if core.progress is not None:
        core.progress.note(change, logging.WARNING if change.startswith("ignored") else
                           logging.INFO, event="revocation_list")
    core.audit.append("revocation_list", change=change)


def serve_until_done(running: RunningServer, *, announce: Callable[[], None] | None = None,
                     clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Wait for the federation to end, write results.json, close the audit log, stop.

    ``announce`` (the "listening" line) runs inside: a stop request that arrives as soon as it
    is told ends the federation as any later one does, results and all."""
    core = running.core
    started = clock()
    try:
        if announce is not None:
            announce()
        while not core.wait_finished(1.0):
            pass
    finally:
        if running.health is not None:
            running.health.ended()       # ended, failed or interrupted: probes see it now
        results = finish_federation(core, running.live, clock() - started)
        running.stop()
    return results


def finish_federation(core: CoordinatorCore, live: LiveFiles | None, elapsed_s: float,
                      status: str | None = None) -> dict[str, Any]:
    """Write a federation's results once it has ended or is being stopped, record them in its
    audit log and let its silos hear the ending.

    status: what the results call the ending (by default completed, failed or interrupted, as
    the machine stands; a job an operator stopped says stopped).
    """
    machine = core.machine
    if not machine.finished:
        core.stop()          # interrupted: nothing may move the machine past the results
    if status is None:
        status = "completed" if machine.stage is Stage.DONE else (
            "failed" if machine.stage is Stage.FAILED else "interrupted")
    results = build_results(core.plan, machine.history, mode="federation", status=status,
                            failure=machine.failure, elapsed_s=elapsed_s,
                            strategy=machine.strategy)
    if live is not None:
        live.finish(results)
    else:
        write_json_atomic(core.plan.server.state_dir / RESULTS, results)
    core.audit.append("results_written", status=status, rounds_completed=len(machine.history))
    if machine.finished:
        # Silos must hear that the federation ended before their streams close.
        core.wait_ending_delivered(ENDING_GRACE_S)
    return results

