"""The [privacy] table of a silo's policy file: what differential privacy it demands of a plan.

Checked where the data lives: on joining, against the public plan and the silo's own number of
graphs (silo/privacy/budget.py adds the budget over the plan's rounds), and before every round
against the budget spent so far. Every clause is optional; a policy without the table accepts
plans with or without differential privacy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trellis.protos.fields import check_keys, read_float, read_int, shown
from trellis.protos.plan import PublicPlan
from trellis.protos.privacy_plan import MECHANISMS, UNITS
from trellis.silo.privacy.violations import Violation

ON_EXHAUSTED = ("refuse", "stop")


@dataclass(frozen=True)
class DpPolicy:
    """The DP clauses; None: not set (anything goes)."""

    required: bool = False
    unit: str | None = None
    max_epsilon: float | None = None
    max_delta: float | None = None
    min_noise_multiplier: float | None = None
    min_colluders: int | None = None        # the plan must assume at least this many
    min_threshold: int | None = None        # least secure-aggregation threshold (ddg floor)
    max_clip: float | None = None
    max_rounds: int | None = None
    mechanisms: tuple[str, ...] | None = None
    # "refuse": a plan whose whole run would exceed max_epsilon is refused on joining; "stop":
    # the silo joins and stops before the first round that could exceed it.
    on_exhausted: str = "refuse"


FIELDS = set(DpPolicy.__dataclass_fields__)


def parse_dp_policy(raw: Any, problems: list[str]) -> DpPolicy:
    """The [privacy] table's clauses, every problem collected."""
    if not isinstance(raw, dict):
        problems.append("privacy: must be a table ([privacy])")
        return DpPolicy()
    check_keys(raw, "privacy", FIELDS, problems)
    required = raw.get("required", False)
    if not isinstance(required, bool):
        problems.append(f"privacy.required: must be true or false, got {shown(required)}")
    unit = raw.get("unit")
    if unit is not None and unit not in UNITS:
        problems.append(f"privacy.unit: {shown(unit)} unknown; valid: {', '.join(UNITS)}")
    mechanisms = raw.get("mechanisms")
    if mechanisms is not None:
        if (not isinstance(mechanisms, list) or not mechanisms
                or not all(m in MECHANISMS for m in mechanisms)):
            problems.append("privacy.mechanisms: must be a non-empty list out of "
                            f"{', '.join(MECHANISMS)}, got {shown(mechanisms)}")
        mechanisms = tuple(mechanisms) if isinstance(mechanisms, list) else None
    on_exhausted = raw.get("on_exhausted", "refuse")
    if on_exhausted not in ON_EXHAUSTED:
        problems.append(f"privacy.on_exhausted: must be one of {', '.join(ON_EXHAUSTED)}, "
                        f"got {shown(on_exhausted)}")

    def number(key: str, low: float, high: float | None = None) -> float | None:
        return (read_float(raw, key, f"privacy.{key}", problems, 0.0, low=low, high=high)
                if key in raw else None)

    def integer(key: str, low: int) -> int | None:
        return read_int(raw, key, f"privacy.{key}", problems, None, low=low) if key in raw else None

    return DpPolicy(
        required=required is True, unit=unit if isinstance(unit, str) else None,
        max_epsilon=number("max_epsilon", 1e-6), max_delta=number("max_delta", 0.0, 1.0),
        min_noise_multiplier=number("min_noise_multiplier", 0.0),
        min_colluders=integer("min_colluders", 0), min_threshold=integer("min_threshold", 1),
        max_clip=number("max_clip", 1e-9), max_rounds=integer("max_rounds", 1),
        mechanisms=mechanisms, on_exhausted=str(on_exhausted))


def dp_violations(dp: DpPolicy, plan: PublicPlan) -> list[Violation]:
    """Every DP clause the public plan breaks (its budget: silo/privacy/budget.py)."""
    p = plan.privacy
    broken: list[Violation] = []

    def breaks(clause: str, limit: str, value: str) -> None:
        broken.append(Violation(f"privacy.{clause}", limit, value))

    if not p.enabled:
        if dp.required:
            breaks("required", "plans with differential privacy only", "none")
        return broken
    if dp.mechanisms is not None and p.mechanism not in dp.mechanisms:
        breaks("mechanisms", ", ".join(dp.mechanisms), p.mechanism)
    if dp.unit is not None and p.unit != dp.unit:
        breaks("unit", dp.unit, p.unit)
    if dp.max_delta is not None and p.delta > dp.max_delta:
        breaks("max_delta", f"at most {dp.max_delta:g}", f"{p.delta:g}")
    if dp.min_noise_multiplier is not None and p.noise_multiplier < dp.min_noise_multiplier:
        breaks("min_noise_multiplier", f"at least {dp.min_noise_multiplier:g}",
               f"{p.noise_multiplier:g}")
    if dp.min_colluders is not None and p.mechanism == "ddg" and p.colluders < dp.min_colluders:
        breaks("min_colluders", f"at least {dp.min_colluders} assumed colluders",
               f"{p.colluders}")
    if (dp.min_threshold is not None and p.mechanism == "ddg"
            and plan.aggregation.threshold < dp.min_threshold):
        breaks("min_threshold", f"at least {dp.min_threshold}",
               f"{plan.aggregation.threshold}")
    if dp.max_clip is not None and p.clip > dp.max_clip:
        breaks("max_clip", f"at most {dp.max_clip:g}", f"{p.clip:g}")
    if dp.max_rounds is not None and plan.rounds > dp.max_rounds:
        breaks("max_rounds", f"at most {dp.max_rounds}", f"{plan.rounds} rounds")
    return broken
