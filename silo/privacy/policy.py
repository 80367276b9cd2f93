"""A silo operator's policy: which plans this silo takes part in (``silo join --policy``).

A policy is a local TOML file whose clauses are all optional: ``[accept]`` here, ``[privacy]``
(silo/privacy/dp_policy.py) and, for a standing silo's job offers, ``[jobs]``
(silo/privacy/jobs_policy.py). ``check_plan`` compares the first two with the public plan the
coordinator sends on joining; ``silo join`` refuses a plan that breaks any of them before it
builds its trainer or sends anything.

The silo can check only what the public plan carries. It cannot see the coordinator's
``federation.min_silos``, its list of admitted silos, its timeouts or its GCFL split rule. So
``min_aggregate_silos`` and ``min_threshold`` are checked against the secure-aggregation
threshold t, which the silo's own protocol code enforces: it never signs a survivor list of
fewer than t silos, so no sum holding its vector can be unmasked with fewer than t inputs. GCFL
and GCFL+ ignore the plan's threshold and aggregate each cluster under a majority of its
members; clusters can shrink to two silos (a silo alone in its cluster uploads zeros), so for
them both clauses are checked against 2. Which metrics a silo reports is not in the plan at
all: the silo's own ``--report`` option decides it. ``max_hidden`` and ``max_layers`` bound the
model the silo will build and train, read from the plan as its algorithm's model uses it.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trellis.protos.algorithms import ALGORITHMS, NODE_TASK, algorithm
from trellis.protos.fields import check_keys, read_int, shown
from trellis.protos.plan import PublicPlan
from trellis.protos.user_text import NotText, decode_user_text
from trellis.silo.privacy.dp_policy import DpPolicy, dp_violations, parse_dp_policy
from trellis.silo.privacy.jobs_policy import JobsPolicy, parse_jobs_policy
from trellis.silo.privacy.violations import Violation

# Every parameter group some algorithm may let leave a silo (protos/algorithms.py `shares`).
SHAREABLE_GROUPS = tuple(sorted({g for a in ALGORITHMS.values() for g in a.shares}))
# Clustered algorithms aggregate per cluster; a cluster of two is the smallest that uploads.
SMALLEST_CLUSTER = 2
RING_SIZES = (32, 64)
CLAUSES = ("algorithms", "max_rounds", "shared_tensors", "min_aggregate_silos", "min_threshold",
           "ring_bits", "reveal_unweighted_sum", "reveal_update_norms", "max_hidden",
           "max_layers")
# FedHGN's RGCN and its baselines' have two layers whatever the plan says (silo/models/hgn.py).
RGCN_LAYERS = 2
# Keys an operator may reasonably try that the public plan cannot back: say why, not just "no".
_NOT_IN_PLAN = {
    "reveal_metrics": "the plan does not choose what a silo reports; this silo's --report "
                      "option does (--report none sends no metrics)",
    "min_silos": "the public plan does not carry federation.min_silos; use min_aggregate_silos, "
                 "checked against the secure-aggregation threshold the silo enforces",
    "min_ring_bits": "use ring_bits, the list of accepted ring sizes (32, 64)",
}


class PolicyError(ValueError):
    """A policy file is unreadable or has invalid clauses; `problems` lists them."""

    def __init__(self, problems: list[str], source: str) -> None:
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


@dataclass(frozen=True)
class Policy:
    """The clauses of a policy file; None: the clause is not set (anything goes)."""

    algorithms: tuple[str, ...] | None = None
    max_rounds: int | None = None
    shared_tensors: tuple[str, ...] | None = None
    min_aggregate_silos: int | None = None
    min_threshold: int | None = None
    ring_bits: tuple[int, ...] | None = None
    reveal_unweighted_sum: bool | None = None
    reveal_update_norms: bool | None = None
    max_hidden: int | None = None
    max_layers: int | None = None
    privacy: DpPolicy = field(default_factory=DpPolicy)   # the [privacy] table
    jobs: JobsPolicy = field(default_factory=JobsPolicy)  # the [jobs] table (`silo serve`)
    source: str = "policy"
    sha256: str = ""          # of the file's bytes, for the audit trail


class PlanRefused(Exception):
    """The plan breaks this silo's policy; the silo leaves before sending anything."""

    def __init__(self, plan: PublicPlan, violations: list[Violation], policy: Policy) -> None:
        self.plan = plan
        self.violations = violations
        self.policy = policy
        super().__init__(f"{policy.source} refuses the plan of federation {plan.federation}: "
                         + "; ".join(v.line() for v in violations))


def load_policy(path: Path) -> Policy:
    """Read and validate a policy file, reporting every bad clause at once."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PolicyError([f"cannot read policy file: {exc.strerror}"], str(path)) from None
    try:
        raw = tomllib.loads(decode_user_text(data))
    except NotText as exc:
        raise PolicyError([str(exc)], str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError([f"not valid TOML: {exc}"], str(path)) from None
    return parse_policy(raw, source=str(path), sha256=hashlib.sha256(data).hexdigest())


def parse_policy(raw: dict[str, Any], *, source: str = "policy", sha256: str = "") -> Policy:
    """Validate a parsed TOML document into a Policy, collecting every problem."""
    problems: list[str] = []
    for key in raw:
        if key in CLAUSES:
            problems.append(f"{key}: a clause belongs in the [accept] table")
    check_keys({k: v for k, v in raw.items() if k not in CLAUSES}, "",
               {"accept", "privacy", "jobs"}, problems)
    accept = raw.get("accept", {})
    if not isinstance(accept, dict):
        raise PolicyError(["accept: must be a table ([accept])"], source)
    for key in accept:
        if key in _NOT_IN_PLAN:
            problems.append(f"accept.{key}: not a clause; {_NOT_IN_PLAN[key]}")
    check_keys({k: v for k, v in accept.items() if k not in _NOT_IN_PLAN}, "accept",
               set(CLAUSES), problems)
    policy = Policy(
        algorithms=_names(accept, "algorithms", tuple(ALGORITHMS), problems),
        max_rounds=_int(accept, "max_rounds", 1, problems),
        shared_tensors=_names(accept, "shared_tensors", SHAREABLE_GROUPS, problems,
                              empty_ok=True),
        min_aggregate_silos=_int(accept, "min_aggregate_silos", 1, problems),
        min_threshold=_int(accept, "min_threshold", 1, problems),
        ring_bits=_rings(accept, problems),
        reveal_unweighted_sum=_bool(accept, "reveal_unweighted_sum", problems),
        reveal_update_norms=_bool(accept, "reveal_update_norms", problems),
        max_hidden=_int(accept, "max_hidden", 1, problems),
        max_layers=_int(accept, "max_layers", 1, problems),
        privacy=parse_dp_policy(raw.get("privacy", {}), problems),
        jobs=parse_jobs_policy(raw.get("jobs", {}), problems),
        source=source, sha256=sha256)
    if problems:
        raise PolicyError(problems, source)
    return policy


def check_plan(policy: Policy, plan: PublicPlan) -> list[Violation]:
    """Every clause of the policy the public plan breaks, in clause order (no I/O)."""
    row = algorithm(plan.algorithm)
    agg = plan.aggregation
    broken: list[Violation] = []

    def breaks(clause: str, limit: str, value: str) -> None:
        broken.append(Violation(f"accept.{clause}", limit, value))

    if policy.algorithms is not None and plan.algorithm not in policy.algorithms:
        breaks("algorithms", _list(policy.algorithms), plan.algorithm)
    if policy.max_rounds is not None and plan.rounds > policy.max_rounds:
        breaks("max_rounds", f"at most {policy.max_rounds}", f"{plan.rounds} rounds")
    if policy.shared_tensors is not None and not set(row.shares) <= set(policy.shared_tensors):
        breaks("shared_tensors", _list(policy.shared_tensors),
               f"{_list(row.shares)} ({plan.algorithm})")
    if row.aggregates:
        # What the silo enforces itself: sums of at least t inputs, unmasked by t share holders.
        if row.clustered:
            fewest = SMALLEST_CLUSTER
            smallest = (f"{fewest} ({plan.algorithm} aggregates clusters, which can shrink to "
                        f"{fewest} silos)")
        else:
            fewest = agg.threshold
            smallest = f"{fewest} (the secure-aggregation threshold)"
        if policy.min_aggregate_silos is not None and fewest < policy.min_aggregate_silos:
            breaks("min_aggregate_silos", f"at least {policy.min_aggregate_silos}", smallest)
        if policy.min_threshold is not None and fewest < policy.min_threshold:
            breaks("min_threshold", f"at least {policy.min_threshold}", smallest)
        if policy.ring_bits is not None and agg.ring_bits not in policy.ring_bits:
            breaks("ring_bits", _list(map(str, policy.ring_bits)), f"{agg.ring_bits} bits")
    if policy.reveal_unweighted_sum is False and agg.unweighted_sum:
        breaks("reveal_unweighted_sum", "false",
               "true (the unweighted sum of updates is unmasked too)")
    if policy.reveal_update_norms is False and row.clustered:
        breaks("reveal_update_norms", "false",
               f"true ({plan.algorithm} sends each silo's update and gradient norms in plain)")
    hidden, hidden_field, layers, layers_field = model_size(plan)
    if policy.max_hidden is not None and hidden > policy.max_hidden:
        breaks("max_hidden", f"at most {policy.max_hidden}", f"{hidden} ({hidden_field})")
    if policy.max_layers is not None and layers > policy.max_layers:
        breaks("max_layers", f"at most {policy.max_layers}", f"{layers} ({layers_field})")
    broken += dp_violations(policy.privacy, plan)
    return broken


def model_size(plan: PublicPlan) -> tuple[int, str, int, str]:
    """The width and depth of the model the plan's algorithm builds, each with where it is set."""
    row = algorithm(plan.algorithm)
    if row.task == NODE_TASK:
        return plan.hetero.hidden, "fedhgn.hidden", RGCN_LAYERS, "fedhgn's RGCN, fixed"
    if row.model == "dual_dense_gin":            # FedDense: every layer is `width` wide
        return plan.model.width, "model.width", plan.model.layers, "model.layers"
    return plan.model.hidden, "model.hidden", plan.model.layers, "model.layers"


def _list(items: Any) -> str:
    names = list(items)
    return ", ".join(names) if names else "nothing"


def _names(table: dict[str, Any], key: str, valid: tuple[str, ...], problems: list[str], *,
           empty_ok: bool = False) -> tuple[str, ...] | None:
    if key not in table:
        return None
    value = table[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"accept.{key}: must be a list of names, got {shown(value)}")
        return None
    if not value and not empty_ok:
        problems.append(f"accept.{key}: an empty list accepts no plan at all; leave the clause "
                        "out to accept any")
    unknown = [v for v in value if v not in valid]
    if unknown:
        problems.append(f"accept.{key}: {_list(unknown)} unknown; valid: {_list(valid)}")
    return tuple(value)


def _int(table: dict[str, Any], key: str, low: int, problems: list[str]) -> int | None:
    if key not in table:
        return None
    return read_int(table, key, f"accept.{key}", problems, default=None, low=low)


def _rings(table: dict[str, Any], problems: list[str]) -> tuple[int, ...] | None:
    value = table.get("ring_bits")
    if value is None:
        return None
    if (not isinstance(value, list) or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v in RING_SIZES
                       for v in value)):
        problems.append(f"accept.ring_bits: must be a non-empty list of ring sizes out of "
                        f"{_list(map(str, RING_SIZES))}, got {shown(value)}")
        return None
    return tuple(value)


def _bool(table: dict[str, Any], key: str, problems: list[str]) -> bool | None:
    value = table.get(key)
    if value is not None and not isinstance(value, bool):
        problems.append(f"accept.{key}: must be true or false, got {shown(value)}")
        return None
    return value
