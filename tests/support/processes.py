"""This machine's processes as /proc lists them, each with its whole command line.

A command line is never cut short here: ``ps`` cuts it to the width of its output, and a cut one
drops whatever comes after a long path (a raylet installed under a checkout at a long path, in
the checkout's .venv, would lose its own name).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Process:
    """One process: its id, its whole command line and its environment (NAME=VALUE each)."""

    pid: int
    argv: tuple[str, ...]
    environ: frozenset[bytes]

    @property
    def command(self) -> str:
        """The command line on one line, its arguments joined by spaces."""
        return " ".join(self.argv)


def processes(proc: Path = PROC) -> Iterator[Process]:
    """Every process that can still be read (one that ends while being read is left out)."""
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        # The command line ends with a NUL, which leaves an empty last argument.
        while argv and not argv[-1]:
            argv.pop()
        yield Process(int(entry.name), tuple(a.decode(errors="replace") for a in argv),
                      frozenset(environ))


def raylets(marker: str, proc: Path = PROC) -> set[int]:
    """The ids of the raylets whose command line names ``marker`` (a Ray's folder)."""
    return {p.pid for p in processes(proc)
            if p.argv and os.path.basename(p.argv[0]) == "raylet" and marker in p.command}


def ray_processes(marker: str, raylets: set[int], proc: Path = PROC) -> list[Process]:
    """The processes whose command line names ``marker`` or whose raylet is one of
    ``raylets``: Ray's workers rename themselves (ray::SiloHost) but keep their raylet's id in
    their environment."""
    raylet_vars = {f"RAY_RAYLET_PID={r}".encode() for r in raylets}
    return [p for p in processes(proc) if marker in p.command or p.environ & raylet_vars]
