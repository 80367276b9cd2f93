"""The job messages of the Admin and Site services: protobuf <-> protos/jobs.py values.

With protos/codec.py, the only modules that touch the generated job messages.
"""

from __future__ import annotations

from collections.abc import Iterable

from trellis.protos import federation_pb2 as pb
from trellis.protos.codec import status_from_pb, status_to_pb
from trellis.protos.jobs import JobEventView, JobOfferView, JobView, SiloAnswerView


def job_to_pb(job: JobView) -> pb.JobSummary:
    """A job for an operator -> protobuf."""
    msg = pb.JobSummary(
        job_id=job.job_id, federation_id=job.federation, algorithm=job.algorithm,
        dataset=job.dataset, operator=job.operator, state=job.state, reason=job.reason,
        submitted_at=job.submitted_at, updated_at=job.updated_at, silos=list(job.silos),
        min_silos=job.min_silos, rounds=job.rounds, public_sha256=job.public_sha256,
        answers=[pb.SiloAnswer(silo=a.silo, answer=a.answer, reason=a.reason, at=a.at)
                 for a in job.answers],
        events=[pb.JobEvent(at=e.at, state=e.state, reason=e.reason) for e in job.events])
    if job.status is not None:
        msg.status.CopyFrom(status_to_pb(job.status))
        msg.has_status = True
    return msg


def job_from_pb(msg: pb.JobSummary) -> JobView:
    """Protobuf -> a job for an operator."""
    return JobView(
        job_id=msg.job_id, federation=msg.federation_id, algorithm=msg.algorithm,
        dataset=msg.dataset, operator=msg.operator, state=msg.state, reason=msg.reason,
        submitted_at=msg.submitted_at, updated_at=msg.updated_at, silos=tuple(msg.silos),
        min_silos=msg.min_silos, rounds=msg.rounds, public_sha256=msg.public_sha256,
        answers=tuple(SiloAnswerView(a.silo, a.answer, a.reason, a.at) for a in msg.answers),
        events=tuple(JobEventView(e.at, e.state, e.reason) for e in msg.events),
        status=status_from_pb(msg.status) if msg.has_status else None)


def jobs_to_pb(jobs: Iterable[JobView]) -> pb.JobList:
    """Jobs for an operator -> protobuf."""
    return pb.JobList(jobs=[job_to_pb(j) for j in jobs])


def jobs_from_pb(msg: pb.JobList) -> list[JobView]:
    """Protobuf -> jobs for an operator."""
    return [job_from_pb(j) for j in msg.jobs]


def submit_request(plan_toml: bytes, submission_json: str, signature: bytes
                   ) -> pb.SubmitJobRequest:
    """An operator's signed submission -> protobuf."""
    return pb.SubmitJobRequest(plan_toml=plan_toml, submission_json=submission_json,
                               signature=signature)


def submit_from_pb(msg: pb.SubmitJobRequest) -> tuple[bytes, str, bytes]:
    """Protobuf -> (plan file bytes, statement, signature)."""
    return msg.plan_toml, msg.submission_json, msg.signature


def job_request(job_id: int, *, follow: bool = False, offset: int = 0) -> pb.JobRequest:
    """Names a job (and, for its log, whether to follow and where to start)."""
    return pb.JobRequest(job_id=job_id, follow=follow, offset=offset)


def job_request_from_pb(msg: pb.JobRequest) -> tuple[int, bool, int]:
    """Protobuf -> (job id, follow, offset)."""
    return msg.job_id, msg.follow, msg.offset


def list_request() -> pb.JobListRequest:
    """ListJobs carries nothing: the caller is its certificate."""
    return pb.JobListRequest()


def log_lines(lines: list[str], offset: int) -> pb.LogLines:
    """Lines of a job's log and where the next start."""
    return pb.LogLines(lines=lines, offset=offset)


def log_lines_from_pb(msg: pb.LogLines) -> tuple[list[str], int]:
    """Protobuf -> (lines, next offset)."""
    return list(msg.lines), msg.offset


def result_file(name: str, data: bytes) -> pb.ResultFile:
    """One file of a job's results."""
    return pb.ResultFile(name=name, data=data)


def result_file_from_pb(msg: pb.ResultFile) -> tuple[str, bytes]:
    """Protobuf -> (name, bytes)."""
    return msg.name, msg.data


def offer_to_pb(offer: JobOfferView) -> pb.JobOffer:
    """A job for a silo -> protobuf."""
    return pb.JobOffer(
        job_id=offer.job_id, state=offer.state, federation_id=offer.federation,
        public_plan_json=offer.public_plan_json, submission_json=offer.submission_json,
        signature=offer.signature, operator_certificate_pem=offer.operator_certificate_pem,
        participants=list(offer.participants), reason=offer.reason, answer=offer.answer)


def offer_from_pb(msg: pb.JobOffer) -> JobOfferView:
    """Protobuf -> a job for a silo."""
    return JobOfferView(
        job_id=msg.job_id, state=msg.state, federation=msg.federation_id,
        public_plan_json=msg.public_plan_json, submission_json=msg.submission_json,
        signature=msg.signature, operator_certificate_pem=msg.operator_certificate_pem,
        participants=tuple(msg.participants), reason=msg.reason, answer=msg.answer)


def site_jobs_to_pb(offers: Iterable[JobOfferView]) -> pb.SiteJobs:
    """Every job a silo is named in -> protobuf."""
    return pb.SiteJobs(jobs=[offer_to_pb(o) for o in offers])


def site_jobs_from_pb(msg: pb.SiteJobs) -> list[JobOfferView]:
    """Protobuf -> every job a silo is named in."""
    return [offer_from_pb(o) for o in msg.jobs]


def watch_request(agent_version: str) -> pb.WatchJobsRequest:
    """A standing silo's request for its jobs."""
    return pb.WatchJobsRequest(agent_version=agent_version)


def answer_to_pb(job_id: int, approve: bool, reason: str) -> pb.JobAnswer:
    """A silo's answer to a job -> protobuf."""
    return pb.JobAnswer(job_id=job_id, approve=approve, reason=reason)


def answer_from_pb(msg: pb.JobAnswer) -> tuple[int, bool, str]:
    """Protobuf -> (job id, approved, reason)."""
    return msg.job_id, msg.approve, msg.reason


def ack(message: str = "") -> pb.Ack:
    """An acknowledgement outside any federation round."""
    return pb.Ack(message=message)
