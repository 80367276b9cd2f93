"""What the parts of bench/gpu.py share: deadlines, child commands run against them, failures.

Every part runs its work as child processes with a deadline; a child that fails or runs out of
time raises ``PartFailed`` with a line to record (and the tail of what it printed), never
takes the whole benchmark down.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
# The shared datasets beside the checkout (or inside it, where a copy of the tree carries them).
TU = next((p for p in (ROOT.parent / "shared" / "data" / "tu", ROOT / "shared" / "data" / "tu")
           if p.is_dir()), ROOT.parent / "shared" / "data" / "tu")
CHEM = ("MUTAG", "BZR", "COX2", "DHFR", "PTC_MR", "AIDS", "NCI1")
TAIL = 1500                    # characters of a failed child's output kept in the record


class PartFailed(RuntimeError):
    """A child command failed or ran out of time; the message is what the record says, and
    ``partial`` what the part had measured before (recorded too)."""

    def __init__(self, message: str, partial: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.partial = partial or {}


class Deadline:
    """A point in time some work must end by (``clock`` passed in for tests)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.seconds = seconds
        self.end = clock() + seconds

    def left(self) -> float:
        """Seconds until the deadline (0 once past it)."""
        return max(0.0, self.end - self.clock())

    def check(self, what: str) -> float:
        """Seconds left, or PartFailed naming ``what`` did not start for want of time."""
        left = self.left()
        if left < 1.0:
            raise PartFailed(f"not started: the part's {self.seconds:.0f} s ran out before "
                             f"{what}")
        return left


def child_env(threads: int | None = None, extra: Mapping[str, str] | None = None
              ) -> dict[str, str]:
    """This environment for a child (CUDA's variables kept), torch held to ``threads``."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    env.update(extra or {})
    return env


def tail(text: str) -> str:
    """The end of a child's output, for a record."""
    text = text.strip()
    return text if len(text) <= TAIL else "..." + text[-TAIL:]


def run_child(args: Sequence[str], deadline: Deadline, what: str, *,
              env: Mapping[str, str] | None = None, cap_s: float | None = None
              ) -> subprocess.CompletedProcess[str]:
    """Run a command to its end within the deadline (and ``cap_s``); PartFailed otherwise."""
    limit = deadline.check(what)
    if cap_s is not None:
        limit = min(limit, cap_s)
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=limit,
                              env=dict(env) if env is not None else child_env(), cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"") + (exc.stderr or b"")
        text = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
        raise PartFailed(f"{what}: timed out after {limit:.0f} s; output: {tail(text)}") from None
    if done.returncode != 0:
        raise PartFailed(f"{what}: exit {done.returncode}: {tail(done.stdout + done.stderr)}")
    return done


def last_json(text: str, what: str) -> dict[str, Any]:
    """The JSON object on the last line a child printed."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    try:
        value = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise PartFailed(f"{what}: no JSON result on its last line: {tail(text)}") from None
    if not isinstance(value, dict):
        raise PartFailed(f"{what}: its last line is not a JSON object")
    return value


def simulate_device(device: str) -> list[str]:
    """`coordinator simulate`'s option for the device: none for cpu, its default (so the CPU
    pipeline runs on a `coordinator simulate` of any age)."""
    return [] if device == "cpu" else ["--device", device]


def python() -> str:
    """The interpreter that runs the benchmark (the project's environment)."""
    return sys.executable
