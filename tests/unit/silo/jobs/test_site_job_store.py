"""The site's job store (silo/jobs/store.py) on a real SQLite file: offers, answers, what is
left to send, and the files it refuses."""

from __future__ import annotations

import sqlite3
import stat
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.jobs import DATASET, JobFederation, public_plan, signed_offer
from trellis.crypto.pki import Identity
from trellis.silo.jobs.approval import Decision, Offer, evaluate_offer
from trellis.silo.jobs.store import (
    JobNotFound,
    NotPending,
    SiteJob,
    SiteJobError,
    SiteJobStore,
    store_path,
)
from trellis.silo.privacy.jobs_policy import JobsPolicy
from trellis.silo.privacy.policy import Policy

NOW = 1_800_000_000.0
MANUAL = Policy()
AUTO = Policy(jobs=JobsPolicy(approve="auto"))


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> JobFederation:
    return JobFederation.create(tmp_path_factory.mktemp("job-store"))


@pytest.fixture(scope="module")
def alice(federation: JobFederation) -> Identity:
    return federation.operator("alice")


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[SiteJobStore]:
    opened = SiteJobStore.open(store_path(tmp_path / "state"))
    yield opened
    opened.close()


def _offered(store: SiteJobStore, federation: JobFederation, offer: Offer,
             policy: Policy = MANUAL, now: float = NOW) -> SiteJob:
    decision = evaluate_offer(offer, policy=policy, ca_pem=federation.ca_pem,
                              datasets={DATASET: Path("/data")}, seen=store.seen_submission)
    return store.record_offer(offer, decision, now=now)


def test_a_new_store_is_the_operators_alone_in_wal_mode(tmp_path: Path) -> None:
    path = store_path(tmp_path / "state")
    SiteJobStore.open(path).close()
    assert path == tmp_path / "state" / "jobs.sqlite"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    other = sqlite3.connect(path)
    try:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert other.execute("PRAGMA user_version").fetchone()[0] == 1
    finally:
        other.close()


def test_a_held_job_waits_for_the_operator_then_is_approved(
        store: SiteJobStore, federation: JobFederation, alice: Identity) -> None:
    offer = signed_offer(alice, job_id=3)
    job = _offered(store, federation, offer)
    assert (job.decision, job.answer, job.answered_by, job.pending) == ("hold", None, "", True)
    assert job.reason == "awaiting `silo jobs approve 3`"
    assert (job.federation, job.algorithm, job.dataset, job.operator) == (
        "demo", "fedstar", DATASET, "alice")
    assert job.public_sha256 == public_plan().sha256()
    assert job.signature == offer.signature and job.received_at == NOW
    assert store.get(3) == job and store.jobs() == [job]
    assert store.unsent() == []
    approved = store.approve(3, now=NOW + 60)
    assert (approved.answer, approved.answered_by, approved.answered_at, approved.sent) == (
        "approved", "operator", NOW + 60, False)
    assert approved.decision == "hold"          # what the policy said is kept
    assert store.unsent() == [approved]
    store.mark_sent(3)
    assert store.unsent() == [] and store.get(3).sent


def test_the_operator_refuses_a_held_job_with_a_reason(
        store: SiteJobStore, federation: JobFederation, alice: Identity) -> None:
    _offered(store, federation, signed_offer(alice, job_id=4))
    with pytest.raises(SiteJobError, match="a refusal needs a reason"):
        store.refuse(4, "  \n ", now=NOW)
    refused = store.refuse(4, "not during\nthe audit", now=NOW + 5)
    assert (refused.answer, refused.answered_by, refused.reason) == (
        "refused", "operator", "not during the audit")
    assert store.unsent() == [refused]


def test_the_policys_answers_are_given_at_once(store: SiteJobStore, federation: JobFederation,
                                               alice: Identity) -> None:
    approved = _offered(store, federation, signed_offer(alice, job_id=1), AUTO)
    refused = _offered(store, federation, signed_offer(alice, public_plan(dataset="x"),
                                                       job_id=2), AUTO)
    assert (approved.answer, approved.answered_by, approved.answered_at) == (
        "approved", "policy", NOW)
    assert (refused.answer, refused.answered_by) == ("refused", "policy")
    assert "this silo holds no dataset named 'x'" in refused.reason
    assert [job.job_id for job in store.unsent()] == [1, 2]


def test_only_a_pending_job_can_be_answered_by_hand(
        store: SiteJobStore, federation: JobFederation, alice: Identity) -> None:
    _offered(store, federation, signed_offer(alice, job_id=1), AUTO)
    _offered(store, federation, signed_offer(alice, public_plan(dataset="x"), job_id=2), AUTO)
    _offered(store, federation, signed_offer(alice, job_id=3))
    store.refuse(3, "no", now=NOW)
    with pytest.raises(NotPending, match=r"^job 1 was approved automatically on 2027-01-15 "
                                         r"08:00:00 UTC: policy approves it \(jobs.approve"):
        store.refuse(1, "changed my mind", now=NOW)
    with pytest.raises(NotPending, match="^job 2 was refused automatically: this silo holds "
                                         "no dataset named 'x'"):
        store.approve(2, now=NOW)
    with pytest.raises(NotPending, match="^job 3 was refused on 2027-01-15 08:00:00 UTC by "
                                         "this silo's operator: no$"):
        store.approve(3, now=NOW)
    with pytest.raises(NotPending, match="job 4 has no answer to send"):
        _offered(store, federation, signed_offer(alice, job_id=4))
        store.mark_sent(4)


def test_an_offer_recorded_again_changes_nothing(store: SiteJobStore,
                                                 federation: JobFederation,
                                                 alice: Identity) -> None:
    offer = signed_offer(alice, job_id=7)
    first = _offered(store, federation, offer)
    again = store.record_offer(offer, Decision("approve", "other"), now=NOW + 100)
    assert again == first and store.jobs() == [first]


def test_a_job_never_offered_is_named(store: SiteJobStore) -> None:
    for call in (lambda: store.get(9), lambda: store.approve(9, now=NOW),
                 lambda: store.refuse(9, "x", now=NOW), lambda: store.mark_sent(9),
                 lambda: store.note_state(9, "running")):
        with pytest.raises(JobNotFound, match="^no job 9 in .*jobs.sqlite: it was never "
                                              "offered to this silo"):
            call()


def test_the_coordinators_state_is_noted(store: SiteJobStore, federation: JobFederation,
                                         alice: Identity) -> None:
    _offered(store, federation, signed_offer(alice, job_id=1), AUTO)
    assert store.get(1).state == ""
    store.note_state(1, "running")
    assert store.get(1).state == "running"


def test_a_verified_statement_is_seen_under_its_first_job(
        store: SiteJobStore, federation: JobFederation, alice: Identity) -> None:
    offer = signed_offer(alice, job_id=5)
    job = _offered(store, federation, offer)
    assert store.seen_submission(job.submission_sha256) == 5
    assert store.seen_submission("") is None and store.seen_submission("ab" * 32) is None
    replayed = _offered(store, federation, replace(offer, job_id=6))
    assert replayed.answer == "refused"
    assert replayed.reason == "the signed submission of job 5, offered again as job 6"
    assert store.seen_submission(job.submission_sha256) == 5
    # A statement whose signature does not verify is kept, but never counts as seen.
    forged = _offered(store, federation, replace(signed_offer(alice, job_id=8), signature=b""))
    assert forged.submission_sha256 == "" and forged.operator == ""


def test_the_record_survives_a_restart(tmp_path: Path, federation: JobFederation,
                                       alice: Identity) -> None:
    path = store_path(tmp_path)
    with SiteJobStore.open(path) as first:
        _offered(first, federation, signed_offer(alice, job_id=1))
        first.approve(1, now=NOW)
        before = first.jobs()
    with SiteJobStore.open(path) as second:
        assert second.jobs() == before and second.unsent() == before


def test_two_processes_share_the_file(tmp_path: Path, federation: JobFederation,
                                      alice: Identity) -> None:
    path = store_path(tmp_path)
    with SiteJobStore.open(path) as serving, SiteJobStore.open(path) as command:
        _offered(serving, federation, signed_offer(alice, job_id=1))
        command.approve(1, now=NOW)
        assert [job.job_id for job in serving.unsent()] == [1]


def test_threads_share_one_store(store: SiteJobStore, federation: JobFederation,
                                 alice: Identity) -> None:
    offers = [signed_offer(alice, job_id=n) for n in range(1, 25)]
    decision = evaluate_offer(offers[0], policy=MANUAL, ca_pem=federation.ca_pem,
                              datasets={DATASET: Path("/data")})
    errors: list[BaseException] = []

    def record(offer: Offer) -> None:
        try:
            store.record_offer(offer, decision, now=NOW)
            store.note_state(offer.job_id, "offered")
        except BaseException as exc:       # collected: a thread's exception is otherwise lost
            errors.append(exc)

    threads = [threading.Thread(target=record, args=(offer,)) for offer in offers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [job.job_id for job in store.jobs()] == list(range(1, 25))


def test_an_unknown_verdict_is_not_recorded(store: SiteJobStore, federation: JobFederation,
                                            alice: Identity) -> None:
    with pytest.raises(SiteJobError, match="decision 'maybe': expected one of approve, "
                                           "refuse, hold"):
        store.record_offer(signed_offer(alice), Decision("maybe", "?"), now=NOW)
    assert store.jobs() == []


def test_a_store_of_another_schema_version_is_refused(tmp_path: Path) -> None:
    path = store_path(tmp_path)
    SiteJobStore.open(path).close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 7")
    with pytest.raises(SiteJobError) as info:
        SiteJobStore.open(path)
    assert str(info.value) == (f"{path} is a job store of schema version 7; this silo reads "
                               "version 1 (use the silo version that wrote it)")


def test_a_file_that_is_not_a_job_store_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "jobs.sqlite"
    text.write_text("these are my notes, not a database\n" * 40)
    with pytest.raises(SiteJobError, match=r"cannot be read as a job store: file is not a "
                                           r"database"):
        SiteJobStore.open(text)
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE notes (line TEXT)")
    with pytest.raises(SiteJobError, match="is an SQLite file but not a job store"):
        SiteJobStore.open(other)
    assert text.read_text().startswith("these are my notes")


def test_a_store_that_cannot_be_created_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(SiteJobError, match="cannot open the job store .*file/jobs.sqlite"):
        SiteJobStore.open(store_path(tmp_path / "file"))
