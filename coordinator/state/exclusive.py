"""One coordinator per state directory and per port: a second one is refused, not merged.

gRPC's servers share a port by default (SO_REUSEPORT), so a second `coordinator serve` on a
taken port would start and silos would be split between the two without a word; two servers
on one state directory would interleave their checkpoints and audit lines. Both are refused at
start with one line that names what is taken and by whom.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from trellis.crypto.durable import held_exclusively, lock_exclusive

LOCK_FILE = "coordinator.lock"


class StateDirBusy(ValueError):
    """Another coordinator process is serving this state directory."""


class PortInUse(OSError):
    """The address to listen on is taken by another process."""


class StateDirLock:
    """An exclusive lock on a state directory for the life of a server (released by the
    kernel if the process dies, so a crash never leaves a stale lock)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, state_dir: Path) -> StateDirLock:
        """Take the lock or say which process holds it."""
        path = state_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if not lock_exclusive(fd):        # waits out a `coordinator status` probe
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StateDirBusy(
                f"another coordinator (pid {holder}) is serving {state_dir}; stop it first, "
                "or give this plan another server.state_dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        """Let another coordinator serve this state directory."""
        if self._fd is not None:
            os.close(self._fd)          # closing the descriptor drops the flock
            self._fd = None


def lock_holder(state_dir: Path) -> int | None:
    """The pid of the coordinator serving state_dir, or None when none holds its lock."""
    path = state_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        pid = int(text) if text.isdigit() else 0
        if pid and not _alive(pid):
            return None           # the pid is gone: no need to touch the lock at all
        return pid if held_exclusively(fd) else None
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True               # someone else's process: alive
    return True


def check_port_free(address: str) -> None:
    """Refuse an address another process listens on (port 0, any free port, always passes)."""
    host, _, port_text = address.rpartition(":")
    port = int(port_text)
    if port == 0:
        return
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise PortInUse(f"cannot listen on {address}: the host name does not resolve "
                        f"({exc.strerror})") from None
    family, kind, proto, _, where = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(where)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(f"cannot listen on {address}: port {port} is already in use "
                                "(another coordinator?); stop that process or choose another "
                                "address with server.listen or --listen") from None
            raise PortInUse(f"cannot listen on {address}: {exc.strerror}") from None
