"""The operator's side of a standing coordinator: submit signed plans, follow and collect jobs.

`Deployment` is what `coordinator jobs` uses and what a researcher imports to run a sweep from
a notebook::

    from trellis.coordinator.jobs.client import Deployment
    coordinator = Deployment("coord.example.org:50051", "operator-id/")
    job = coordinator.submit("fedstar.toml")
    done = coordinator.wait(job.job_id)
    coordinator.results(job.job_id, "results/fedstar")
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from trellis.coordinator.jobs.job_plan import parse_job_plan
from trellis.crypto.pki import Identity, load_identity
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos import jobs_codec
from trellis.protos.jobs import JobView
from trellis.protos.submission import new_submission, sign_submission

WAIT_POLL_S = 1.0
MAX_OUTAGE_S = 300.0        # how long `wait` waits for a coordinator that does not answer


class JobRefused(ValueError):
    """The coordinator refused the request (the message says why; retrying will not help)."""


class NotStanding(JobRefused):
    """The service answering runs no jobs (a one-plan coordinator, or another version)."""


class CoordinatorUnreachable(RuntimeError):
    """The coordinator could not be reached or did not answer in time."""


class Deployment:
    """A standing coordinator, reached over mTLS with an operator's identity."""

    def __init__(self, address: str, identity: Identity | str | Path,
                 timeout_s: float = 30.0) -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"coordinator address {address!r}: expected host:port, e.g. "
                             "coord.example.org:50051")
        self.address = address
        self.identity = identity if isinstance(identity, Identity) else load_identity(
            Path(identity))
        self.timeout_s = timeout_s
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.identity.ca_pem, private_key=self.identity.key_pem,
            certificate_chain=self.identity.cert_pem)
        self._channel = grpc.secure_channel(address, credentials)
        self._stub = pb_grpc.AdminStub(self._channel)

    def close(self) -> None:
        """Close the connection."""
        self._channel.close()

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- jobs ---------------------------------------------------------------------------------
    def submit(self, plan: str | Path | bytes) -> JobView:
        """Sign a plan (a file's path, or its bytes) with this operator's key and submit it."""
        data = plan if isinstance(plan, bytes) else Path(plan).read_bytes()
        parsed = parse_job_plan(data, source=str(plan) if not isinstance(plan, bytes)
                                else "plan")
        statement = new_submission(parsed.public.sha256(), data, self.identity.name)
        signature = sign_submission(self.identity.key_pem, statement)
        reply = self._call(self._stub.SubmitJob, jobs_codec.submit_request(
            data, statement.to_json(), signature))
        return jobs_codec.job_from_pb(reply)

    def jobs(self) -> list[JobView]:
        """Every job of the deployment, oldest first."""
        return jobs_codec.jobs_from_pb(self._call(self._stub.ListJobs,
                                                  jobs_codec.list_request()))

    def job(self, job_id: int) -> JobView:
        """One job, with its silos' answers, its history and its federation's status."""
        return jobs_codec.job_from_pb(self._call(self._stub.ShowJob,
                                                 jobs_codec.job_request(job_id)))

    def stop(self, job_id: int) -> JobView:
        """Stop a job (a running one ends now, keeping what it wrote)."""
        return jobs_codec.job_from_pb(self._call(self._stub.StopJob,
                                                 jobs_codec.job_request(job_id)))

    def wait(self, job_id: int, timeout_s: float | None = None,
             outage_s: float = MAX_OUTAGE_S) -> JobView:
        """Wait until a job has ended; the job as it ended (TimeoutError past timeout_s).

        A coordinator that restarts meanwhile is waited for, up to outage_s at a time.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        unreachable_since: float | None = None
        state = "unknown"
        while True:
            try:
                job = self.job(job_id)
                unreachable_since = None
                state = job.state
                if job.terminal:
                    return job
            except CoordinatorUnreachable:
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > outage_s:
                    raise
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {state} after {timeout_s:g} s")
            time.sleep(WAIT_POLL_S)

    def logs(self, job_id: int, follow: bool = False) -> Iterator[str]:
        """The lines of a job's log; with follow, until the job ends."""
        try:
            for reply in self._stub.JobLogs(jobs_codec.job_request(job_id, follow=follow),
                                            timeout=None if follow else self.timeout_s):
                lines, _ = jobs_codec.log_lines_from_pb(reply)
                yield from lines
        except grpc.RpcError as exc:
            raise _translated(exc, self.address, self.timeout_s) from None

    def results(self, job_id: int, out: str | Path) -> list[Path]:
        """Download a job's results (results.json, status.json, its audit log, its log) into
        out; the paths written."""
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        pieces: dict[str, list[bytes]] = {}
        try:
            for reply in self._stub.JobResults(jobs_codec.job_request(job_id),
                                               timeout=self.timeout_s * 4):
                name, data = jobs_codec.result_file_from_pb(reply)
                if "/" in name or name.startswith("."):
                    raise JobRefused(f"the coordinator sent a file named {name!r}")
                pieces.setdefault(name, []).append(data)
        except grpc.RpcError as exc:
            raise _translated(exc, self.address, self.timeout_s) from None
        written = []
        for name, parts in pieces.items():
            path = folder / name
            path.write_bytes(b"".join(parts))
            written.append(path)
        return written

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise _translated(exc, self.address, self.timeout_s) from None


def _translated(exc: grpc.RpcError, address: str, timeout_s: float) -> Exception:
    """A gRPC error as JobRefused (the answer is no) or CoordinatorUnreachable."""
    code, details = exc.code(), exc.details() or ""
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED,
                grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.NOT_FOUND):
        return JobRefused(details)
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return NotStanding(f"the service at {address} runs no jobs: is it a standing Trellis "
                          "coordinator (`coordinator serve --deployment`) of this version?")
    return CoordinatorUnreachable(f"no answer from the coordinator at {address} within "
                                  f"{timeout_s:g} s: {code.name} {details}".rstrip())
