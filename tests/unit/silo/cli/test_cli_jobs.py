"""`silo jobs list|show|approve|refuse` (silo/cli/jobs.py) on a real job store: what the
operator reads, the one-line answers, and exit 2 for a missing store or a job not pending."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from tests.support.jobs import DATASET, JobFederation, public_plan, signed_offer
from trellis.crypto.pki import Identity
from trellis.protos.submission import Submission
from trellis.silo.cli.app import app
from trellis.silo.cli.exits import EXIT_BAD_INPUT
from trellis.silo.jobs.approval import Offer, evaluate_offer
from trellis.silo.jobs.store import SiteJobStore, store_path
from trellis.silo.privacy.jobs_policy import JobsPolicy
from trellis.silo.privacy.policy import Policy

NOW = 1_800_000_000.0
AUTO = Policy(jobs=JobsPolicy(approve="auto"))


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> JobFederation:
    return JobFederation.create(tmp_path_factory.mktemp("cli-jobs"))


@pytest.fixture(scope="module")
def alice(federation: JobFederation) -> Identity:
    return federation.operator("alice")


@pytest.fixture()
def state_root(tmp_path: Path, federation: JobFederation, alice: Identity) -> Path:
    """A state root whose store holds job 1 (approved by the policy, sent, running), job 2
    (held), job 3 (refused: no such dataset) and job 4 (refused: a forged signature)."""
    root = tmp_path / "state"
    offers: list[tuple[Offer, Policy]] = [
        (signed_offer(alice, job_id=1), AUTO),
        (signed_offer(alice, job_id=2), Policy()),
        (signed_offer(alice, public_plan(dataset="cora"), job_id=3), Policy()),
        (replace(signed_offer(alice, job_id=4), signature=b"forged"), Policy())]
    with SiteJobStore.open(store_path(root)) as store:
        for offer, policy in offers:
            decision = evaluate_offer(offer, policy=policy, ca_pem=federation.ca_pem,
                                      datasets={DATASET: Path("/data")},
                                      seen=store.seen_submission)
            store.record_offer(offer, decision, now=NOW + offer.job_id)
        store.mark_sent(1)
        store.note_state(1, "running")
    return root


def _silo(*args: str | Path) -> Result:
    return CliRunner().invoke(app, ["jobs", *map(str, args)])


def _failed(result: Result, line: str) -> None:
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.stderr == f"error: {line}\n"
    assert result.stdout == ""


def test_list_shows_every_job_with_its_answer(state_root: Path) -> None:
    result = _silo("list", "--state-root", state_root)
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["JOB", "FEDERATION", "ALGORITHM", "DATASET", "OPERATOR", "ANSWER",
                              "COORDINATOR"]
    cells = [row.split("  ") for row in rows]
    assert [[c.strip() for c in row if c.strip()] for row in cells] == [
        ["1", "demo", "fedstar", "molecules", "alice", "approved by policy",
         "running"],
        ["2", "demo", "fedstar", "molecules", "alice", "pending", "-"],
        ["3", "demo", "fedstar", "cora", "alice", "refused by policy, unsent",
         "-"],
        ["4", "demo", "fedstar", "molecules", "-", "refused by policy, unsent", "-"]]


def test_list_as_json(state_root: Path) -> None:
    result = _silo("list", "--state-root", state_root, "--json")
    assert result.exit_code == 0, result.output
    jobs = json.loads(result.stdout)
    assert [(j["job_id"], j["answer"], j["answered_by"], j["sent"], j["state"]) for j in jobs] == [
        (1, "approved", "policy", True, "running"), (2, None, "", False, ""),
        (3, "refused", "policy", False, ""), (4, "refused", "policy", False, "")]
    assert jobs[1]["reason"] == "awaiting `silo jobs approve 2`"


def test_an_empty_store_says_so(tmp_path: Path) -> None:
    SiteJobStore.open(store_path(tmp_path)).close()
    result = _silo("list", "--state-root", tmp_path)
    assert (result.exit_code, result.stdout) == (
        0, f"no job offered yet ({tmp_path / 'jobs.sqlite'})\n")


def test_show_gives_the_whole_job_and_its_plan(state_root: Path) -> None:
    result = _silo("show", "2", "--state-root", state_root)
    assert result.exit_code == 0, result.output
    text = result.stdout
    plan = public_plan()
    with SiteJobStore.open(store_path(state_root)) as store:
        job = store.get(2)
    statement = Submission.from_json(job.submission_json)
    assert text.startswith("job 2 of federation demo\n"
                           "answer:       pending (awaiting `silo jobs approve 2`)\n"
                           "policy said:  hold\n")
    assert "operator:     alice (signed 2027-01-15 08:00:00 UTC)\n" in text
    assert f"public plan:  sha256 {plan.sha256()}\n" in text
    assert f"plan file:    sha256 {statement.plan_sha256}\n" in text
    assert f"statement:    sha256 {statement.sha256}\n" in text
    assert "certificate:  sha256:" in text
    pretty = text.split("\npublic plan:\n", 1)[1]
    assert json.loads(pretty) == json.loads(plan.to_json())
    assert '\n  "algorithm": "fedstar",\n' in pretty


def test_show_says_what_was_not_verified(state_root: Path) -> None:
    result = _silo("show", "4", "--state-root", state_root)
    assert result.exit_code == 0, result.output
    assert ("answer:       refused automatically on 2027-01-15 08:00:04 UTC (not yet sent to "
            "the coordinator): the signature of operator 'alice' does not "
            "verify over the statement offered\n") in result.stdout
    assert ("operator:     - (the signature did not verify; the statement claims "
            "'alice')\n") in result.stdout
    assert "statement:    sha256 - (not verified)\n" in result.stdout


def test_show_as_json(state_root: Path) -> None:
    result = _silo("show", "1", "--state-root", state_root, "--json")
    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout)
    assert job["public_plan"] == json.loads(public_plan().to_json())
    assert job["statement"]["operator"] == "alice"
    assert job["operator_certificate_pem"].startswith("-----BEGIN CERTIFICATE-----")
    assert (job["answer"], job["state"]) == ("approved", "running")


def test_approve_answers_a_held_job(state_root: Path) -> None:
    result = _silo("approve", "2", "--state-root", state_root)
    assert result.exit_code == 0, result.output
    assert result.stdout == "job 2 approved; `silo serve` sends the answer to the coordinator\n"
    with SiteJobStore.open(store_path(state_root)) as store:
        job = store.get(2)
        assert (job.answer, job.answered_by, job.sent) == ("approved", "operator", False)
        assert [j.job_id for j in store.unsent()] == [2, 3, 4]


def test_refuse_answers_a_held_job_with_the_reason(state_root: Path) -> None:
    result = _silo("refuse", "2", "--reason", "not before the audit", "--state-root",
                   state_root)
    assert result.exit_code == 0, result.output
    assert result.stdout == ("job 2 refused (not before the audit); `silo serve` sends the "
                             "answer to the coordinator\n")
    with SiteJobStore.open(store_path(state_root)) as store:
        assert store.get(2).reason == "not before the audit"


def test_a_job_already_answered_is_refused_in_one_line(state_root: Path) -> None:
    _failed(_silo("approve", "3", "--state-root", state_root),
            "job 3 was refused automatically: this silo holds no dataset named 'cora' "
            "(it serves: molecules)")
    assert _silo("approve", "2", "--state-root", state_root).exit_code == 0
    result = _silo("refuse", "2", "--reason", "no", "--state-root", state_root)
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.stderr.startswith("error: job 2 was approved on ")
    assert result.stderr.endswith(" by this silo's operator; only a job held for a decision "
                                  "can be answered by hand\n")


def test_a_job_never_offered_is_named(state_root: Path) -> None:
    for command in (["show", "9"], ["approve", "9"], ["refuse", "9", "--reason", "x"]):
        _failed(_silo(*command, "--state-root", state_root),
                f"no job 9 in {state_root / 'jobs.sqlite'}: it was never offered to this silo "
                "(`silo jobs list` shows those that were)")


def test_a_refusal_without_a_reason_is_refused(state_root: Path) -> None:
    _failed(_silo("refuse", "2", "--reason", "  ", "--state-root", state_root),
            "a refusal needs a reason: the coordinator and the job's operator are told it")


def test_a_missing_state_root_or_store_is_one_line(tmp_path: Path) -> None:
    _failed(_silo("list", "--state-root", tmp_path / "nope"),
            f"--state-root {tmp_path / 'nope'}: no such folder; give the state root `silo "
            "serve` uses")
    _failed(_silo("approve", "1", "--state-root", tmp_path),
            f"no job store {tmp_path / 'jobs.sqlite'}: `silo serve --state-root {tmp_path}` "
            "keeps one there once it runs")
    assert not (tmp_path / "jobs.sqlite").exists()        # the commands never create one


def test_a_store_of_another_version_is_one_line(tmp_path: Path) -> None:
    import sqlite3

    SiteJobStore.open(store_path(tmp_path)).close()
    with sqlite3.connect(store_path(tmp_path)) as db:
        db.execute("PRAGMA user_version = 2")
    _failed(_silo("list", "--state-root", tmp_path),
            f"{tmp_path / 'jobs.sqlite'} is a job store of schema version 2; this silo reads "
            "version 1 (use the silo version that wrote it)")


def test_the_command_answers_while_silo_serve_holds_the_store(state_root: Path) -> None:
    """A real `silo jobs approve` process beside an open store (as `silo serve` keeps it)."""
    with SiteJobStore.open(store_path(state_root)) as serving:
        done = subprocess.run([sys.executable, "-m", "trellis.silo.cli", "jobs", "approve", "2",
                               "--state-root", str(state_root)], capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout == "job 2 approved; `silo serve` sends the answer to the coordinator\n"
        assert [job.job_id for job in serving.unsent()] == [2, 3, 4]
        again = subprocess.run([sys.executable, "-m", "trellis.silo.cli", "jobs", "approve",
                                "2", "--state-root", str(state_root)], capture_output=True,
                               text=True, timeout=120, check=False)
        assert again.returncode == EXIT_BAD_INPUT
        assert again.stderr.startswith("error: job 2 was approved on ")
        assert "Traceback" not in again.stderr
