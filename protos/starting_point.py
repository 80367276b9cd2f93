"""The plan's public starting point and frozen groups: [model] init_sha256 and [model] frozen.

`init_sha256` names a public initial model by the SHA-256 of its file (docs/configuration.md);
every silo is given that file locally, checks its hash before anything is sent and starts from
it instead of the plan seed's random start. `frozen` lists parameter groups that no step ever
changes (kept at their starting values), chosen among those the algorithm's row declares
freezable (protos/algorithms.py); a frozen group is trained by no silo, so it leaves no silo
either: the shared vector holds the shared groups that train. Both are left off the plan's wire
form at their defaults, so a plan without them keeps the hash it always had.
"""

from __future__ import annotations

import re
from typing import Any

from trellis.protos.algorithms import ALGORITHMS, GRAPH_TASK
from trellis.protos.fields import shown

SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def read_init_sha256(raw: dict[str, Any], path: str, algorithm_name: Any,
                     problems: list[str]) -> str:
    """The `init_sha256` field: "" (the seeded random start) or 64 lowercase hex digits, for a
    graph-classification algorithm."""
    value = raw.get("init_sha256", "")
    if value != "" and not (isinstance(value, str) and SHA256_HEX.fullmatch(value)):
        problems.append(f"{path}.init_sha256: the SHA-256 of the initial model file in 64 "
                        "lowercase hex digits, as `bench/pretrain_public.py` prints it (got "
                        f"{shown(value)})")
        return ""
    row = ALGORITHMS.get(algorithm_name) if isinstance(algorithm_name, str) else None
    if value and row is not None and row.task != GRAPH_TASK:
        problems.append(f"{path}.init_sha256: {row.name} starts from the plan's seed; a public "
                        "initial model is for the graph-classification algorithms")
    return str(value)


def read_frozen(raw: dict[str, Any], path: str, algorithm_name: Any,
                problems: list[str]) -> tuple[str, ...]:
    """The `frozen` field: groups the algorithm's row declares freezable, sorted, each once;
    an aggregating algorithm must still share at least one group that trains."""
    value = raw.get("frozen", [])
    if not isinstance(value, list | tuple) or not all(isinstance(g, str) for g in value):
        problems.append(f"{path}.frozen: a list of parameter group names (got {shown(value)})")
        return ()
    if len(set(value)) != len(value):
        problems.append(f"{path}.frozen: each group at most once (got {shown(list(value))})")
    groups = tuple(sorted(set(value)))
    row = ALGORITHMS.get(algorithm_name) if isinstance(algorithm_name, str) else None
    if row is None or not groups:
        return groups
    unknown = [g for g in groups if g not in row.freezable]
    if unknown:
        allowed = ", ".join(row.freezable) if row.freezable else "none"
        problems.append(f"{path}.frozen: {', '.join(map(shown, unknown))} may not be frozen "
                        f"with {row.name}; its freezable groups: {allowed}")
    elif set(row.freezable) <= set(groups):
        problems.append(f"{path}.frozen: every group of {row.name}'s model is frozen: nothing "
                        "would train")
    elif row.aggregates and set(row.shares) <= set(groups):
        problems.append(f"{path}.frozen: every shared group of {row.name} "
                        f"({', '.join(row.shares)}) is frozen: nothing would be aggregated; "
                        "train one of them, or choose the algorithm local")
    return groups
