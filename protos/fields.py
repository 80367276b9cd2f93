"""Readers of a parsed TOML table that collect problems instead of raising (protos/plan.py).

Each reader appends "dotted.path: what is wrong" to `problems` and returns a usable default, so
one pass over a plan reports every bad field at once (STYLE.md principle 11).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def read_table(raw: dict[str, Any], name: str, problems: list[str]) -> dict[str, Any]:
    """The sub-table `name` of `raw` ({} if absent; a problem if not a table)."""
    value = raw.get(name, {})
    if not isinstance(value, dict):
        problems.append(f"{name}: must be a table")
        return {}
    return value


def check_keys(table: dict[str, Any], path: str, allowed: set[str], problems: list[str]) -> None:
    """Report every key of `table` that is not `allowed`, with its dotted path."""
    for key in table:
        if key not in allowed:
            where = f"{path}.{key}" if path else key
            problems.append(f"{where}: unknown field; expected one of "
                            + ", ".join(sorted(allowed)))


def read_int(table: dict[str, Any], key: str, path: str, problems: list[str],
             default: int | None, low: int | None = None, high: int | None = None) -> int:
    """An integer field within bounds (`default` if absent; None: required)."""
    if key not in table:
        if default is None:
            problems.append(f"{path}: required")
            return 0
        return default
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{path}: must be an integer, got {value!r}")
        return default or 0
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"between {low} and {high}"
        problems.append(f"{path}: must be {bounds}, got {value}")
    return value


def read_float(table: dict[str, Any], key: str, path: str, problems: list[str], default: float,
               low: float | None = None, high: float | None = None) -> float:
    """A finite number within bounds (`default` if absent)."""
    if key not in table:
        return default
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        problems.append(f"{path}: must be a number, got {value!r}")
        return default
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        problems.append(f"{path}: must be finite, got {value}")
    elif (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"between {low} and {high}"
        problems.append(f"{path}: must be {bounds}, got {value}")
    return value


def read_path(table: dict[str, Any], key: str, section: str, base: Path, default: Path,
              problems: list[str]) -> Path:
    """A path field resolved against the plan's folder."""
    value = table.get(key, str(default))
    if not isinstance(value, str) or not value:
        problems.append(f"{section}.{key}: must be a path string, got {value!r}")
        return base / default
    return (base / value).resolve()


def valid_name(name: Any) -> bool:
    """Whether a silo or federation name is letters, digits, '.', '_', '-' (max 64)."""
    return (isinstance(name, str) and 0 < len(name) <= 64 and name[0].isalnum()
            and set(name) <= NAME_CHARS)


def valid_address(address: str) -> bool:
    """Whether an address is host:port with a port number."""
    host, sep, port = address.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 <= int(port) <= 65535)
