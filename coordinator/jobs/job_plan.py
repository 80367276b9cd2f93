"""A job's plan: a plan file without its deployment sections, read from submitted bytes.

An operator submits the plan of one job; the deployment (coordinator/jobs/deployment.py) says
where the coordinator listens and keeps state, so a job plan has no [server] table, and it names
the dataset each standing silo trains on (``federation.dataset``). Admitting a parsed plan
checks it against the deployment (its silos admitted, its algorithm one a real federation may
run) and gives it the deployment's [server] with the job's own state folder.
"""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

from trellis.coordinator.jobs.deployment import DeploymentConfig
from trellis.protos.algorithms import ALGORITHMS, algorithm
from trellis.protos.plan import Plan, PlanError, parse_plan
from trellis.protos.user_text import NotText, decode_user_text

NO_SERVER = ("a job plan has no [server] table: the deployment says where the coordinator "
             "listens and keeps state")
NEEDS_DATASET = ("federation.dataset: a job plan names the dataset each silo trains on: "
                 'federation.dataset = "NAME"')


class JobPlanError(PlanError):
    """A job plan that cannot run: `problems` lists them, the message is one line."""


def parse_job_plan(data: bytes, *, source: str = "plan") -> Plan:
    """Validate a submitted job plan's bytes into a Plan (its [server] the defaults, until
    `admit_job_plan` gives it the deployment's)."""
    try:
        raw = tomllib.loads(decode_user_text(data))
    except NotText as exc:
        raise JobPlanError([str(exc)], source) from None
    except tomllib.TOMLDecodeError as exc:
        raise JobPlanError([f"not valid TOML: {exc}"], source) from None
    problems: list[str] = []
    if "server" in raw:
        problems.append(NO_SERVER)
        raw = {key: value for key, value in raw.items() if key != "server"}
    federation = raw.get("federation")
    if isinstance(federation, dict) and federation.get("dataset", "") == "":
        problems.append(NEEDS_DATASET)
    try:
        plan = parse_plan(raw, base_dir=Path("."))
    except PlanError as exc:
        problems.extend(exc.problems)
    if problems:
        raise JobPlanError(problems, source)
    return plan


def admit_job_plan(plan: Plan, deployment: DeploymentConfig, job_id: int) -> Plan:
    """`plan` as job `job_id` of `deployment` runs it: its silos admitted, its algorithm one a
    real federation may run, its [server] the deployment's with the job's own state folder."""
    problems: list[str] = []
    outsiders = [silo for silo in plan.silos if silo not in deployment.silos]
    if outsiders:
        problems.append(f"federation.silos: {', '.join(outsiders)} "
                        f"{'is' if len(outsiders) == 1 else 'are'} not admitted by deployment "
                        f"{deployment.name} (it admits {', '.join(deployment.silos)})")
    if algorithm(plan.public.algorithm).simulation_only:
        runnable = ", ".join(name for name, row in ALGORITHMS.items() if not row.simulation_only)
        problems.append(f"federation.algorithm: {plan.public.algorithm} is a research "
                        "baseline for `coordinator simulate` only (it would see every silo's "
                        f"data or schema); a job runs one of {runnable}")
    if problems:
        raise JobPlanError(problems, f"job {job_id}")
    return replace(plan, server=deployment.server_config(deployment.job_folder(job_id)))
