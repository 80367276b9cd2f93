"""Progress lines for the operator: round, silos present, elapsed time, reported metrics."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import TextIO

from trellis.coordinator.rounds import Event, RoundRecord

QUIET_EVENTS = {"key_advertised", "masked_input", "metrics", "shares_received",
                "survivors_signed", "shares_revealed"}


class Progress:
    """Turns round events into one readable line each."""

    def __init__(self, total_rounds: int, clock: Callable[[], float], start: float,
                 stream: TextIO | None = None) -> None:
        self.total = total_rounds
        self.clock = clock
        self.start = start
        self.stream = stream or sys.stderr

    def events(self, events: list[Event], history: list[RoundRecord]) -> None:
        """Print the events worth an operator's attention."""
        for event in events:
            if event.kind in QUIET_EVENTS or (event.kind == "stage_closed"
                                               and not event.fields.get("dropped")):
                continue
            elapsed = self.clock() - self.start
            if event.kind == "round_completed":
                line = (f"round {event.fields['round']}/{self.total} done in "
                        f"{event.fields['seconds']:.2f}s | silos "
                        f"{len(event.fields['participants'])} | elapsed {elapsed:.1f}s")
                if event.fields.get("dropped"):
                    line += (" | recovered from dropped silos: "
                             + ", ".join(event.fields["dropped"]))
                prev = _metric_summary(history, event.fields["round"] - 1)
                if prev:
                    line += f" | round {event.fields['round'] - 1}: {prev}"
            else:
                details = " ".join(f"{k}={v}" for k, v in event.fields.items())
                line = f"[{elapsed:7.1f}s] {event.kind.replace('_', ' ')} {details}"
            print(line, file=self.stream, flush=True)


def _metric_summary(history: list[RoundRecord], round_no: int) -> str:
    record = next((r for r in history if r.round == round_no), None)
    if record is None or not record.metrics:
        return ""
    names = sorted({k for m in record.metrics.values() for k in m})
    parts = []
    for name in names:
        values = [m[name] for m in record.metrics.values() if not math.isnan(m.get(name, math.nan))]
        if values:
            parts.append(f"mean {name} {sum(values) / len(values):.4f}")
    return ", ".join(parts)
