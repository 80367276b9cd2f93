"""Durable files and their locks, for everything either side keeps on disk.

The lowest layer holds them because the audit log and the CA (crypto) need them as much as the
plan, checkpoints and reports above: a file is written whole or not at all, and a file a
process owns is held by an exclusive flock that a probe (`held_exclusively`) can test without
disturbing the owner.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None  # type: ignore[assignment]


def write_atomic(path: Path, write: Callable[[BinaryIO], object], *, mode: int = 0o600) -> None:
    """Write a file through a temporary sibling, fsync it, then rename it into place (and make
    the rename durable): a crash leaves the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        if mode != 0o600:          # mkstemp creates 0600
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def open_append_private(path: Path) -> BinaryIO:
    """Open path for appending, created 0600 when new (an audit log, a wire capture): like
    every file either side keeps, readable by its owner only, not as the umask would have it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    return os.fdopen(fd, "ab")


def fsync_dir(directory: Path) -> None:
    """Make a new or renamed file's directory entry durable too (not possible everywhere)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def lock_exclusive(fd: int, attempts: int = 20) -> bool:
    """Take an exclusive flock on fd; False if another process holds it.

    A probe's shared lock lasts an instant (`held_exclusively`): it is waited out, up to a
    second; an owner holds its lock for as long as it runs and is not.
    """
    if fcntl is None:  # pragma: no cover - not on POSIX
        return True
    for attempt in range(attempts):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if attempt + 1 < attempts:
                time.sleep(0.05)
    return False


def held_exclusively(fd: int) -> bool:
    """Whether some process holds an exclusive flock on fd's file now (probed with a shared,
    non-blocking lock, released at once)."""
    if fcntl is None:  # pragma: no cover - not on POSIX
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


_section = threading.local()     # per thread: how deep in uninterrupted(), what was deferred


@contextmanager
def uninterrupted() -> Iterator[None]:
    """A section a stop request must not cut in two (a record written but not yet chained):
    an interrupt deferred by `defer_interrupt` during it is raised when it ends."""
    depth = getattr(_section, "depth", 0)
    _section.depth = depth + 1
    try:
        yield
    finally:
        _section.depth = depth
        deferred = getattr(_section, "deferred", None)
        if depth == 0 and deferred is not None:
            _section.deferred = None
            raise deferred


def defer_interrupt(interrupt: BaseException) -> bool:
    """For a signal handler (it runs in the main thread): keep interrupt for the end of the
    uninterrupted section this thread is in, if any; False when it should be raised now."""
    if getattr(_section, "depth", 0) > 0:
        _section.deferred = interrupt
        return True
    return False
