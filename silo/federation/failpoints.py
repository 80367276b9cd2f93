"""Fault injection for integration tests, off unless the environment asks for it.

``TRELLIS_FAILPOINT=point:round`` makes the silo process SIGKILL itself at a named point of the
secure-aggregation protocol in that round -- a crash or pre-emption at a moment a test can
choose exactly, which an external kill cannot. ``TRELLIS_DUMP_SHARED=1`` makes the agent keep
the plain shared vector it is about to mask in its own state folder, so a test can check the
coordinator's aggregate against the sum of the right silos' inputs. Neither sends anything.
"""

from __future__ import annotations

import os
import signal

POINTS = ("after_shares", "after_masked_input", "during_unmask")


def reached(point: str, round_no: int) -> None:
    """Kill this process here if TRELLIS_FAILPOINT names this point and round."""
    spec = os.environ.get("TRELLIS_FAILPOINT", "")
    name, _, at = spec.partition(":")
    if name == point and at == str(round_no):
        os.kill(os.getpid(), signal.SIGKILL)


def dump_shared_wanted() -> bool:
    """Whether the test asked the agent to keep its plain shared vectors."""
    return os.environ.get("TRELLIS_DUMP_SHARED") == "1"
