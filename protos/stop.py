"""A stop request (SIGTERM) ends a silo or coordinator the way Ctrl-C does.

``docker stop``, ``kubectl delete`` and ``systemctl stop`` send SIGTERM. Python's default for it
is to die at once, and as a container's first process (PID 1) it is not even delivered: the
runtime waits out its grace period and kills. Turned into an interrupt, it unwinds the process
instead: the coordinator marks its results interrupted and says how to resume, the silo says
from which round it will go on, and both leave their checkpoints and audit logs as a restart
expects them.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

from trellis.crypto.durable import defer_interrupt

EXIT_INTERRUPTED = 130   # Ctrl-C, as shells report it
EXIT_TERMINATED = 143    # SIGTERM, as shells report it
EXIT_GRACE_S = 5.0       # after the stop is written down; docker waits 10 s, Kubernetes 30 s


class Terminated(KeyboardInterrupt):
    """SIGTERM was received: stop as for Ctrl-C."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    stop = Terminated()
    if not defer_interrupt(stop):    # inside an audit write: raised when it is complete
        raise stop


def stop_on_sigterm() -> None:
    """From now on, SIGTERM raises Terminated (a KeyboardInterrupt) in the main thread."""
    signal.signal(signal.SIGTERM, _raise_terminated)


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """The exit status for an interrupt: 143 for SIGTERM, 130 for Ctrl-C."""
    return EXIT_TERMINATED if isinstance(interrupt, Terminated) else EXIT_INTERRUPTED


def describe(interrupt: KeyboardInterrupt) -> str:
    """How an interrupt is told in a log line: a stop request or Ctrl-C."""
    return "stopped (SIGTERM)" if isinstance(interrupt, Terminated) else "interrupted"


def exit_within(seconds: float, code: int) -> None:
    """End the process with code if it has not ended by itself within seconds.

    Called once a stop has written what a restart needs (checkpoint, results, closed audit
    log): a library thread that never ends (a server nobody stopped, a stream still open) must
    not turn a clean stop into the runtime's kill at the end of its grace period. The threads
    still running are named on stderr, so the cause can be found.
    """

    def force() -> None:
        alive = sorted(t.name for t in threading.enumerate()
                       if t.is_alive() and not t.daemon and t is not threading.main_thread())
        print(f"stopping: still running after {seconds:g} s ({', '.join(alive) or 'no thread'});"
              f" exiting with {code}", file=sys.stderr, flush=True)
        os._exit(code)

    timer = threading.Timer(seconds, force)
    timer.daemon = True
    timer.start()


def run_command(app: Callable[[], object]) -> None:
    """Run a command line app; once it has returned, end its process at once with its exit code.

    The interpreter's own teardown is skipped (after the exit functions have run and the
    output is flushed): it can hang for good when a gRPC call object is collected while a gRPC
    thread, frozen by the teardown, holds its lock. Seen with a silo that had logged "federation
    finished", and with a `silo join --job` stopped by SIGTERM; a watchdog thread cannot help
    there, as the teardown freezes it too. Everything a command writes is written before it
    returns.
    """
    try:
        app()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    exit_now(code)


def exit_now(code: int) -> NoReturn:
    """Run the exit functions, flush the logs and standard streams, and end the process."""
    for stop in (signal.SIGINT, signal.SIGTERM):
        # A second stop request while leaving would only interrupt the leaving (a traceback).
        try:
            signal.signal(stop, signal.SIG_IGN)
        except ValueError:
            pass            # not the main thread: nothing to guard
    exit_within(EXIT_GRACE_S, code)     # should an exit function itself hang
    try:
        atexit._run_exitfuncs()
        logging.shutdown()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
