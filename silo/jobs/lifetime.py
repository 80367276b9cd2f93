"""A job's `silo join` process ends when the `silo serve` that started it ends, even by kill -9,
so a restarted `silo serve` never meets an orphan holding the job's folder (Linux; elsewhere
the orphan ends with its federation)."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def end_with_parent() -> None:
    """Ask the kernel to send this process SIGTERM when its parent ends."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        # The parent ended before the request took hold: nothing will signal us now.
        os.kill(os.getpid(), signal.SIGTERM)
