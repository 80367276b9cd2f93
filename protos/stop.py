"""A stop request (SIGTERM) ends a silo or coordinator the way Ctrl-C does.

``docker stop``, ``kubectl delete`` and ``systemctl stop`` send SIGTERM. Python's default for it
is to die at once, and as a container's first process (PID 1) it is not even delivered: the
runtime waits out its grace period and kills. Turned into an interrupt, it unwinds the process
instead: the coordinator marks its results interrupted and says how to resume, the silo says
from which round it will go on, and both leave their checkpoints and audit logs as a restart
expects them.
"""

from __future__ import annotations

import signal
from types import FrameType

EXIT_INTERRUPTED = 130   # Ctrl-C, as shells report it
EXIT_TERMINATED = 143    # SIGTERM, as shells report it


class Terminated(KeyboardInterrupt):
    """SIGTERM was received: stop as for Ctrl-C."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def stop_on_sigterm() -> None:
    """From now on, SIGTERM raises Terminated (a KeyboardInterrupt) in the main thread."""
    signal.signal(signal.SIGTERM, _raise_terminated)


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """The exit status for an interrupt: 143 for SIGTERM, 130 for Ctrl-C."""
    return EXIT_TERMINATED if isinstance(interrupt, Terminated) else EXIT_INTERRUPTED
