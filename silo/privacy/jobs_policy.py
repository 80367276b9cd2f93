"""The [jobs] table of a silo's policy file: which signed jobs a standing silo considers.

A standing silo (``silo serve``) is offered jobs that operators submitted to the coordinator,
each a public plan with the operator's signed statement. The ``[accept]`` and ``[privacy]``
clauses decide whether a plan is acceptable at all; this table decides whose jobs count and
whether an acceptable job runs at once (``approve = "auto"``) or waits for the silo's operator
(``"manual"``, the default: nothing runs until ``silo jobs approve``). silo/jobs/approval.py
applies it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from trellis.protos.fields import check_keys, shown, valid_name

APPROVE_MODES = ("auto", "manual")
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


@dataclass(frozen=True)
class JobsPolicy:
    """The [jobs] clauses; None: not set (any operator of the federation, any plan)."""

    approve: str = "manual"
    operators: tuple[str, ...] | None = None     # operator certificate subjects
    plan_hashes: tuple[str, ...] | None = None   # PublicPlan.sha256() values, lower-case hex


FIELDS = set(JobsPolicy.__dataclass_fields__)


def parse_jobs_policy(raw: Any, problems: list[str]) -> JobsPolicy:
    """The [jobs] table's clauses, every problem collected."""
    if not isinstance(raw, dict):
        problems.append("jobs: must be a table ([jobs])")
        return JobsPolicy()
    check_keys(raw, "jobs", FIELDS, problems)
    approve = raw.get("approve", "manual")
    if approve not in APPROVE_MODES:
        problems.append(f'jobs.approve: expected "auto" or "manual", got {shown(approve)}')
        approve = "manual"
    return JobsPolicy(approve=approve, operators=_operators(raw, problems),
                      plan_hashes=_plan_hashes(raw, problems))


def _operators(raw: dict[str, Any], problems: list[str]) -> tuple[str, ...] | None:
    value = _strings(raw, "operators", "operator certificate subjects", problems)
    if value is None:
        return None
    bad = [name for name in value if not valid_name(name)]
    if bad:
        problems.append(f"jobs.operators: {shown(bad[0])} is not a certificate subject "
                        "(letters, digits, '.', '_', '-', at most 64)")
    return value


def _plan_hashes(raw: dict[str, Any], problems: list[str]) -> tuple[str, ...] | None:
    value = _strings(raw, "plan_hashes", "public plan SHA-256s", problems)
    if value is None:
        return None
    bad = [digest for digest in value if not _SHA256.fullmatch(digest)]
    if bad:
        problems.append(f"jobs.plan_hashes: {shown(bad[0])} is not a SHA-256 (64 hex digits, "
                        "as `coordinator jobs` and `silo jobs show` print a plan's hash)")
    return tuple(digest.lower() for digest in value)


def _strings(raw: dict[str, Any], key: str, what: str, problems: list[str]
             ) -> tuple[str, ...] | None:
    if key not in raw:
        return None
    value = raw[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"jobs.{key}: must be a list of {what}, got {shown(value)}")
        return None
    if not value:
        problems.append(f"jobs.{key}: an empty list accepts no job at all; leave the clause "
                        "out to accept any")
    return tuple(value)
