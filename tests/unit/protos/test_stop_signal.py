"""SIGTERM as Ctrl-C, and a stop that cannot be held up by a thread that never ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from trellis.protos.stop import Terminated, exit_code, stop_on_sigterm

STUCK = """
import sys, threading, time
from trellis.protos.stop import exit_within
threading.Thread(target=time.sleep, args=(120,), name="stuck-stream").start()
exit_within(0.5, 143)
sys.exit(143)
"""

CLEAN = """
import sys
from trellis.protos.stop import exit_within
exit_within(30, 143)
sys.exit(130)
"""


def test_sigterm_raises_an_interrupt_that_says_it_was_a_stop_request() -> None:
    before = signal.getsignal(signal.SIGTERM)
    try:
        stop_on_sigterm()
        with pytest.raises(Terminated) as caught:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)        # the handler runs at the next bytecode; never gets here
        assert isinstance(caught.value, KeyboardInterrupt)
        assert exit_code(caught.value) == 143
        assert exit_code(KeyboardInterrupt()) == 130
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_thread_that_never_ends_cannot_hold_up_the_exit() -> None:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", STUCK], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 143
    assert time.monotonic() - began < 30           # not the thread's 120 s
    assert "still running after 0.5 s (stuck-stream); exiting with 143" in done.stderr


def test_an_exit_that_is_not_held_up_keeps_its_own_code_and_says_nothing() -> None:
    done = subprocess.run([sys.executable, "-c", CLEAN], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stderr) == (130, "")


def test_a_stop_inside_an_uninterrupted_section_waits_for_its_end() -> None:
    """SIGTERM during an audit record's write: the record is finished and chained first."""
    from trellis.crypto.durable import uninterrupted

    before = signal.getsignal(signal.SIGTERM)
    done: list[str] = []
    try:
        stop_on_sigterm()
        with pytest.raises(Terminated):
            with uninterrupted():
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):        # the handler has run by now: it did not raise
                    pass
                done.append("section completed")
            done.append("after the section")  # never: the deferred stop is raised here
    finally:
        signal.signal(signal.SIGTERM, before)
    assert done == ["section completed"]


HUNG_TEARDOWN = """
import sys, threading, time
from trellis.coordinator.cli.app import main
threading.Thread(target=time.sleep, args=(120,), name="grpc-like-leftover").start()
sys.argv = ["coordinator", "--version"]
main()
"""


def test_the_commands_end_even_if_the_teardown_would_hang() -> None:
    """The console scripts' entry point: whatever the command, once it has returned the process
    ends with its code, its output flushed, without waiting for a thread that would hold the
    interpreter's teardown (here for 120 s; the subprocess timeout would fire)."""
    done = subprocess.run([sys.executable, "-c", HUNG_TEARDOWN], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("coordinator ")
    assert "Traceback" not in done.stderr


EXIT_FUNCTION = """
import atexit, sys
from trellis.coordinator.cli.app import main
atexit.register(lambda: print("exit function ran", flush=True))
sys.argv = ["coordinator", "serve"]
main()
"""


def test_a_command_that_fails_still_runs_its_exit_functions_and_keeps_its_code() -> None:
    """Ray's shutdown is an exit function: skipping the teardown must not skip those."""
    done = subprocess.run([sys.executable, "-c", EXIT_FUNCTION], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "exit function ran" in done.stdout
    assert "error: give --plan PLAN" in done.stderr
