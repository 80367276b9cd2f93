"""How often one silo may open its control stream (Attend): a small token bucket per silo.

A silo opens one stream when it joins and one more when it reconnects; each writes four audit
records (connected and joined, then disconnected and left for the stream it replaces), so a
silo re-attending in a loop would fill the audit log (600 Attends wrote 2,400 records). Each
silo holds `burst` tokens, an Attend takes one, and one comes back every `refill_s` seconds:
restarts and reconnects with backoff never run out, a loop does. Time is passed in (STYLE.md 7).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

BURST = 10          # streams a silo may open at once (a join, restarts, reconnects)
REFILL_S = 6.0      # then one more every 6 s: ten a minute, sustained
# The audited reason of a run of refused Attends: one record for the run (metrics count calls).
ATTEND_RATE_REASON = "too many reconnects"


@dataclass(frozen=True)
class Admission:
    """Whether an Attend may go on; a refusal says whether it opens a run of refusals (the one
    the audit log records) and in how many seconds the next Attend is taken."""

    admitted: bool
    first_refusal: bool = False
    wait_s: float = 0.0


class AttendRate:
    """Per-silo token buckets for Attend."""

    def __init__(self, clock: Callable[[], float], burst: int = BURST,
                 refill_s: float = REFILL_S) -> None:
        if burst < 1 or refill_s <= 0:
            raise ValueError(f"attend rate: burst must be >= 1 and refill_s > 0, got {burst}, "
                             f"{refill_s}")
        self.clock = clock
        self.burst = burst
        self.refill_s = refill_s
        self._tokens: dict[str, tuple[float, float]] = {}   # silo -> (tokens, when counted)
        self._refusing: set[str] = set()                     # silos whose last Attend was refused
        self._lock = threading.Lock()

    def admit(self, silo: str) -> Admission:
        """Take a token for silo's Attend, or say why not."""
        now = self.clock()
        with self._lock:
            tokens, then = self._tokens.get(silo, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + max(0.0, now - then) / self.refill_s)
            if tokens >= 1.0:
                self._tokens[silo] = (tokens - 1.0, now)
                self._refusing.discard(silo)
                return Admission(True)
            self._tokens[silo] = (tokens, now)
            first = silo not in self._refusing
            self._refusing.add(silo)
            return Admission(False, first, (1.0 - tokens) * self.refill_s)

    def message(self, silo: str, admission: Admission) -> str:
        """The refusal as the silo's operator reads it."""
        return (f"{silo!r} opened its control stream (Attend) more than {self.burst} times in "
                f"quick succession; the coordinator takes one more every {self.refill_s:g} s: "
                f"attend again in {max(1.0, admission.wait_s):.0f} s (is a second process "
                "running with this silo's certificate?)")
