"""The standing coordinator's server: one mTLS port for the Admin service (operators), the Site
service (standing silos) and the Federation service of every running job (routed by job).

It stays up, SERVING, with no job at all, until it is stopped; a stop leaves running jobs
recorded as running, and the next start resumes them from their checkpoints.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from trellis.coordinator.jobs.admin_servicer import JobsAdminServicer
from trellis.coordinator.jobs.callers import Callers
from trellis.coordinator.jobs.deployment import DeploymentConfig
from trellis.coordinator.jobs.host import JobHost
from trellis.coordinator.jobs.routing import JobRouter
from trellis.coordinator.jobs.runtime import SharedServing
from trellis.coordinator.jobs.site_servicer import SiteServicer
from trellis.coordinator.jobs.store import JobStore
from trellis.coordinator.serving.aio_edge import CorePool
from trellis.coordinator.serving.crl_watch import CrlWatch
from trellis.coordinator.serving.health import FederationHealth
from trellis.coordinator.serving.metrics import CoordinatorMetrics
from trellis.coordinator.serving.service import EventLoopThread
from trellis.coordinator.serving.undecodable import RefuseUndecodable
from trellis.coordinator.serving.upload_budget import UploadBudget, stream_window_options
from trellis.coordinator.state.exclusive import PortInUse, StateDirLock, check_port_free
from trellis.crypto.audit import AuditLog
from trellis.crypto.errors import CryptoError
from trellis.crypto.pki import load_identity_files
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos import keepalive
from trellis.protos.logs import make_logger

JOBS_DB = "jobs.sqlite"
CRL_POLL_S = 5.0


@dataclass
class StandingServer:
    """A started standing coordinator."""

    deployment: DeploymentConfig
    host: JobHost
    server: grpc.aio.Server
    port: int
    events: EventLoopThread
    pool: CorePool
    lock: StateDirLock
    store: JobStore
    audit: AuditLog
    health: FederationHealth | None = None
    crl_watch: concurrent.futures.Future[None] | None = None

    def stop(self, grace: float = 2.0) -> None:
        """Stop serving; running jobs stay recorded as running (a restart resumes them)."""
        if self.health is not None:
            self.health.ended()
        if self.crl_watch is not None:
            self.crl_watch.cancel()
        self.host.close()
        if not self.events.loop.is_closed():
            self.events.run(self.server.stop(grace))
            self.events.close()
        self.pool.shutdown()
        self.audit.append("stopped")
        self.audit.close()
        self.store.close()
        self.lock.release()


def start_standing(deployment: DeploymentConfig, *, health: FederationHealth | None = None,
                   metrics: CoordinatorMetrics | None = None, log_format: str = "text",
                   echo: bool = True, clock: Callable[[], float] = time.monotonic,
                   wall: Callable[[], float] = time.time) -> StandingServer:
    """Start a standing coordinator for a deployment and resume its running jobs."""
    if metrics is not None and not metrics.per_job:
        raise ValueError("a standing coordinator's metrics label each job's series: make "
                         "them with CoordinatorMetrics(per_job=True)")
    root = deployment.state_root
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = StateDirLock.acquire(root)
    try:
        check_port_free(deployment.listen)
        for field, path in (("server.server_key", deployment.server_key),
                            ("server.server_cert", deployment.server_cert),
                            ("server.ca_cert", deployment.ca_cert)):
            if not path.is_file():
                raise FileNotFoundError(f"{field}: cannot read {path}: no such file")
        try:
            identity = load_identity_files(deployment.server_key, deployment.server_cert,
                                           deployment.ca_cert)
        except CryptoError as exc:
            raise ValueError(f"server identity: {exc}") from None
        store = JobStore.open(root / JOBS_DB)
    except BaseException:
        lock.release()
        raise
    audit = AuditLog(root / "audit.jsonl", writer="coordinator",
                     signing_key_pem=identity.key_pem)
    log = make_logger("coordinator", log_format)
    crl = CrlWatch(deployment.crl if deployment.crl is not None
                   else deployment.ca_cert.parent / "crl.pem", identity.ca_pem)
    crl.refresh()
    pool = CorePool()
    budget = UploadBudget(deployment.upload_memory_mb << 20)
    if metrics is not None:
        metrics.watch_uploads(budget)
        metrics.watch_jobs(lambda: Counter(job.state for job in store.jobs()))
    events = EventLoopThread()
    shared = SharedServing(key_pem=identity.key_pem, pool=pool, budget=budget, crl=crl,
                           metrics=metrics, log_format=log_format, echo=echo, clock=clock,
                           loop=events.loop)
    host = JobHost(deployment, store, audit, shared, wall=wall, log=log)
    callers = Callers(deployment, audit, crl)
    site = SiteServicer(host, callers, pool)
    site.listen(events.loop)
    audit.append("serve_deployment", deployment=deployment.name,
                 admitted=list(deployment.silos), operators=list(deployment.operators),
                 max_concurrent_jobs=deployment.max_concurrent_jobs)
    host.start()               # running jobs resume before any silo can call them
    credentials = grpc.ssl_server_credentials(
        [(identity.key_pem, identity.cert_pem)], root_certificates=identity.ca_pem,
        require_client_auth=True)
    interceptors: list[grpc.aio.ServerInterceptor] = [RefuseUndecodable()]
    if metrics is not None:
        interceptors.insert(0, metrics.call_metrics())

    async def bind() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server(
            interceptors=interceptors,
            options=[("grpc.max_receive_message_length", 8 << 20), ("grpc.so_reuseport", 0),
                     *keepalive.server_options(),
                     *stream_window_options(deployment.stream_window_kb)])
        server.add_generic_rpc_handlers((JobRouter(host),))
        pb_grpc.add_AdminServicer_to_server(JobsAdminServicer(host, callers, pool), server)
        pb_grpc.add_SiteServicer_to_server(site, server)
        if health is not None:
            health.add_to_aio(server)
        try:
            port = server.add_secure_port(deployment.listen, credentials)
        except RuntimeError:
            port = 0
        if port != 0:
            await server.start()
        return server, port

    try:
        server, port = events.run(bind())
        if port == 0:
            raise PortInUse(f"cannot listen on {deployment.listen}: the port is in use or "
                            "not available")
    except BaseException:
        host.close()
        events.close()
        pool.shutdown()
        audit.close()
        store.close()
        lock.release()
        raise
    watch = asyncio.run_coroutine_threadsafe(_watch_crl(crl, audit, log), events.loop)
    if health is not None:
        health.serving()
    return StandingServer(deployment, host, server, port, events, pool, lock, store, audit,
                          health, watch)


async def _watch_crl(crl: CrlWatch, audit: AuditLog, log: logging.Logger) -> None:
    """Note changes of the revocation list in the deployment's audit log, while serving."""
    while True:
        await asyncio.sleep(CRL_POLL_S)
        change = crl.refresh()
        if change is not None:
            audit.append("revocation_list", change=change)
            log.warning(change) if change.startswith("ignored") else log.info(change)
