"""Job plans: a plan without [server], naming its dataset; admitted against the deployment, which
gives it the job's own state folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from trellis.coordinator.jobs.deployment import DeploymentConfig, parse_deployment
from trellis.coordinator.jobs.job_plan import (
    NEEDS_DATASET,
    NO_SERVER,
    JobPlanError,
    admit_job_plan,
    parse_job_plan,
)
from trellis.protos.plan import PlanError

JOB = """
[federation]
id = "tox21-fedstar"
algorithm = "fedstar"
rounds = 5
silos = ["a", "b"]
dataset = "tox21"

[timeouts]
join_s = 30
"""


def _deployment(tmp_path: Path, silos: tuple[str, ...] = ("a", "b", "c")) -> DeploymentConfig:
    return parse_deployment({"deployment": {"name": "consortium", "silos": list(silos)},
                             "server": {"listen": "0.0.0.0:50051", "state_root": "state"}},
                            base_dir=tmp_path)


def _problems(data: bytes, source: str = "plan") -> list[str]:
    with pytest.raises(JobPlanError) as caught:
        parse_job_plan(data, source=source)
    assert isinstance(caught.value, PlanError) and "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"{source}: ")
    return caught.value.problems


def test_a_job_plan_parses_with_its_dataset() -> None:
    plan = parse_job_plan(JOB.encode())
    assert plan.public.dataset == "tox21" and plan.silos == ("a", "b")
    assert plan.timeouts.join_s == 30 and plan.source is None


def test_a_simulation_table_is_allowed_and_ignored() -> None:
    plan = parse_job_plan((JOB + '[simulation]\ndata = { a = "x", b = "y" }\n').encode())
    assert plan.public.algorithm == "fedstar"


def test_a_server_table_is_refused() -> None:
    problems = _problems((JOB + '[server]\nstate_dir = "elsewhere"\n').encode(), "job.toml")
    assert problems == [NO_SERVER]


def test_the_dataset_is_required() -> None:
    assert _problems(JOB.replace('dataset = "tox21"', "").encode()) == [NEEDS_DATASET]
    assert _problems(JOB.replace('dataset = "tox21"', 'dataset = ""').encode()) == [
        NEEDS_DATASET]
    bad = _problems(JOB.replace('"tox21"', '"no spaces"').encode())
    assert len(bad) == 1 and bad[0].startswith("federation.dataset: at most 64 letters")


def test_every_problem_is_reported_at_once() -> None:
    text = (JOB.replace('dataset = "tox21"', "").replace('"fedstar"', '"fedstarr"')
            + '[server]\nlisten = "x"\n')
    problems = _problems(text.encode())
    assert problems[:2] == [NO_SERVER, NEEDS_DATASET]
    assert any(p.startswith("federation.algorithm: 'fedstarr' is not an algorithm")
               for p in problems)
    assert not any(p.startswith("server.listen") for p in problems)


def test_bytes_that_are_not_a_plan_are_one_line() -> None:
    assert _problems(b'[federation]\nid = "\xff"\n') == [
        "not UTF-8 text: byte 0xff at line 2, column 7 (save the file as UTF-8)"]
    problems = _problems(b"[federation\n")
    assert len(problems) == 1 and problems[0].startswith("not valid TOML")


def test_admitting_gives_the_deployments_server_with_the_jobs_folder(tmp_path: Path) -> None:
    deployment = _deployment(tmp_path)
    plan = admit_job_plan(parse_job_plan(JOB.encode()), deployment, 7)
    assert plan.server == deployment.server_config(tmp_path.resolve() / "state" / "jobs" / "7")
    assert plan.server.listen == "0.0.0.0:50051"
    assert plan.public == parse_job_plan(JOB.encode()).public


def test_silos_the_deployment_does_not_admit_are_named(tmp_path: Path) -> None:
    plan = parse_job_plan(JOB.replace('["a", "b"]', '["a", "x", "y"]').encode())
    with pytest.raises(JobPlanError) as caught:
        admit_job_plan(plan, _deployment(tmp_path), 3)
    assert str(caught.value) == ("job 3: federation.silos: x, y are not admitted by deployment "
                                 "consortium (it admits a, b, c)")
    one = parse_job_plan(JOB.replace('["a", "b"]', '["a", "x"]').encode())
    with pytest.raises(JobPlanError, match="x is not admitted"):
        admit_job_plan(one, _deployment(tmp_path), 3)


def test_simulation_only_algorithms_are_refused(tmp_path: Path) -> None:
    text = (JOB.replace('"fedstar"', '"hgn-local"')
            + "[fedhgn]\nclasses = 3\n")
    plan = parse_job_plan(text.encode())
    with pytest.raises(JobPlanError) as caught:
        admit_job_plan(plan, _deployment(tmp_path), 4)
    [problem] = caught.value.problems
    assert problem.startswith("federation.algorithm: hgn-local is a research baseline for "
                              "`coordinator simulate` only")
    assert "fedhgn" in problem and "hgn-central" not in problem
