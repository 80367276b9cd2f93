"""The [jobs] table of a silo's policy (silo/privacy/jobs_policy.py), read through load_policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from trellis.silo.privacy.jobs_policy import JobsPolicy
from trellis.silo.privacy.policy import Policy, PolicyError, load_policy

DIGEST = "ab" * 32


def _load(tmp_path: Path, text: str) -> Policy:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return load_policy(path)


def test_a_policy_without_the_table_holds_every_job_for_the_operator(tmp_path: Path) -> None:
    assert _load(tmp_path, "[accept]\nmax_rounds = 5\n").jobs == JobsPolicy()
    assert JobsPolicy() == JobsPolicy(approve="manual", operators=None, plan_hashes=None)
    assert Policy().jobs == JobsPolicy()


def test_every_clause_is_read(tmp_path: Path) -> None:
    policy = _load(tmp_path, f'[jobs]\napprove = "auto"\noperators = ["alice", "ops.bob"]\n'
                             f'plan_hashes = ["{DIGEST.upper()}", "{"0" * 64}"]\n')
    assert policy.jobs == JobsPolicy(approve="auto", operators=("alice", "ops.bob"),
                                     plan_hashes=(DIGEST, "0" * 64))


@pytest.mark.parametrize(("text", "problem"), [
    ('[jobs]\napprove = "yes"', 'jobs.approve: expected "auto" or "manual", got \'yes\''),
    ("[jobs]\napprove = true", 'jobs.approve: expected "auto" or "manual", got True'),
    ('[jobs]\noperators = "alice"',
     "jobs.operators: must be a list of operator certificate subjects, got 'alice'"),
    ("[jobs]\noperators = []", "jobs.operators: an empty list accepts no job at all; leave "
                               "the clause out to accept any"),
    ('[jobs]\noperators = ["alice smith"]',
     "jobs.operators: 'alice smith' is not a certificate subject"),
    ('[jobs]\nplan_hashes = ["abc"]', "jobs.plan_hashes: 'abc' is not a SHA-256 (64 hex "
                                      "digits"),
    ("[jobs]\nplan_hashes = [1]", "jobs.plan_hashes: must be a list of public plan SHA-256s"),
    ("[jobs]\nplan_hashes = []", "jobs.plan_hashes: an empty list accepts no job at all"),
    ("[jobs]\napprove_all = true", "jobs.approve_all: unknown field; expected one of approve, "
                                   "operators, plan_hashes"),
    ("jobs = 3", "jobs: must be a table ([jobs])"),
    ("[job]\napprove = \"auto\"", "job: unknown field; expected one of accept, jobs, privacy"),
])
def test_a_bad_clause_is_refused_with_its_path(tmp_path: Path, text: str, problem: str
                                               ) -> None:
    with pytest.raises(PolicyError) as info:
        _load(tmp_path, text)
    assert problem in str(info.value), str(info.value)
    assert str(info.value).startswith(f"{tmp_path / 'policy.toml'}: ")


def test_every_problem_of_the_table_is_reported_at_once(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as info:
        _load(tmp_path, '[jobs]\napprove = "always"\noperators = []\nplan_hashes = ["x"]\n'
                        "[accept]\nmax_rounds = 0\n")
    assert [p.split(":")[0] for p in info.value.problems] == [
        "accept.max_rounds", "jobs.approve", "jobs.operators", "jobs.plan_hashes"]
