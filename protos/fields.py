"""Readers of a parsed TOML table that collect problems instead of raising (protos/plan.py).

Each reader appends "dotted.path: what is wrong" to `problems` and returns a usable default, so
one pass over a plan reports every bad field at once (STYLE.md principle 11). A value is echoed
only through `shown`, so a hostile file of megabytes yields a message of a line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
MAX_NAME = 64          # characters of a silo or federation name
MAX_SHOWN = 60         # characters of a user's value an error message repeats


def shown(value: Any) -> str:
    """`value` as an error message repeats it: its repr, cut to MAX_SHOWN with an ellipsis."""
    text = repr(value) if not isinstance(value, str) or len(value) <= 2 * MAX_SHOWN else (
        repr(value[:2 * MAX_SHOWN]))     # never repr a huge string whole just to cut it
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN - 1] + "…"


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
            where = f"{path}.{shown(key)[1:-1]}" if path else shown(key)[1:-1]
            problems.append(f"{where}: unknown field; expected one of "
                            + ", ".join(sorted(allowed)))


def read_int(table: dict[str, Any], key: str, path: str, problems: list[str],
             default: int | None, low: int | None = None, high: int | None = None) -> int:
    """An integer field within bounds (`default` if absent; None: required)."""
    # A null (a JSON wire plan, or a dict built from .get()) is a field left out, not a value.
    if table.get(key) is None:
        if default is None:
            problems.append(f"{path}: required")
            return 0
        return default
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{path}: must be an integer, got {shown(value)}")
        return default or 0
    bound = _bound_broken(value, low, high)
    if bound:
        problems.append(f"{path}: must be {bound}, got {value}")
    return value


def read_float(table: dict[str, Any], key: str, path: str, problems: list[str], default: float,
               low: float | None = None, high: float | None = None) -> float:
    """A finite number within bounds (`default` if absent)."""
    if table.get(key) is None:
        return default
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        problems.append(f"{path}: must be a number, got {shown(value)}")
        return default
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        problems.append(f"{path}: must be finite, got {value}")
    elif _bound_broken(value, low, high):
        problems.append(f"{path}: must be {_bound_broken(value, low, high)}, got {value}")
    return value


def _bound_broken(value: float, low: float | None, high: float | None) -> str | None:
    """The bound `value` breaks, as the message says it ("<= 4096"), or None."""
    if low is not None and value < low:
        return f">= {low}"
    if high is not None and value > high:
        return f"<= {high}"
    return None


def read_path(table: dict[str, Any], key: str, section: str, base: Path, default: Path,
              problems: list[str]) -> Path:
    """A path field resolved against the plan's folder."""
    value = table.get(key, str(default))
    problem = path_problem(value)
    if problem:
        problems.append(f"{section}.{key}: {problem}")
        return base / default
    return (base / value).resolve()


def path_problem(value: Any) -> str | None:
    """What makes `value` unusable as a path (None: nothing); no file name can hold a NUL."""
    if not isinstance(value, str) or not value:
        return f"must be a path string, got {shown(value)}"
    if "\x00" in value:
        return f"contains a NUL byte, which no file name can hold: {shown(value)}"
    return None


def valid_name(name: Any) -> bool:
    """Whether a silo or federation name is letters, digits, '.', '_', '-' (max 64)."""
    return (isinstance(name, str) and 0 < len(name) <= MAX_NAME and name[0].isalnum()
            and set(name) <= NAME_CHARS)


def valid_address(address: str) -> bool:
    """Whether an address is host:port with a port number."""
    host, sep, port = address.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 <= int(port) <= 65535)
