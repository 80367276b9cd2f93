"""The coordinator's log for its operator: what happened, when, and whether it needs attention.

One line per event worth reading, timestamped (trellis.protos.logs): a round done, with its
own metrics as soon as its silos have reported them (not the previous round's); expected
events worded as such at INFO (a straggler dropped at a deadline, a silo leaving, a round
recovered without a silo); a retried attempt or a refused silo at WARNING; a failed federation
at ERROR.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TextIO

from trellis.coordinator.rounds.machine import Event, RoundRecord
from trellis.protos.logs import event, make_logger
from trellis.protos.metrics import mean_over_silos
from trellis.protos.metrics_plan import FEDERATION

QUIET_EVENTS = {"key_advertised", "masked_input", "shares_received", "survivors_signed",
                "shares_revealed", "encrypted_update", "setup_key", "group_sealed",
                "group_opened",
                # Routine: unmasking needed only a threshold of reveals (audited and counted).
                "late_reveal"}


class Progress:
    """Turns round events into log lines."""

    def __init__(self, total_rounds: int, clock: Callable[[], float], start: float,
                 stream: TextIO | None = None, logger: logging.Logger | None = None) -> None:
        self.total = total_rounds
        self.clock = clock
        self.start = start
        self.log = logger or make_logger("coordinator", "text", stream)
        self._metrics_shown: set[int] = set()

    def events(self, events: list[Event], history: list[RoundRecord]) -> None:
        """Log the events worth an operator's attention."""
        for ev in events:
            if ev.kind in QUIET_EVENTS:
                continue
            if ev.kind in ("metrics", "metrics_summed"):
                self._metrics_if_complete(ev.fields["round"], history, complete_only=True)
                continue
            line = self._line(ev)
            if line is not None:
                level, message = line
                event(self.log, level, message, event=ev.kind, **_plain(ev.fields))
            if ev.kind == "round_completed":
                # The round before: its metrics, if some silo never reported them.
                self._metrics_if_complete(ev.fields["round"] - 1, history, complete_only=False)

    def refused(self, subject: str, reason: str) -> None:
        """A certificate refused by the service (not admitted, revoked)."""
        event(self.log, logging.WARNING, f"refused {subject}: {reason}", event="refused",
              subject=subject, reason=reason)

    def note(self, message: str, level: int = logging.INFO, **fields: Any) -> None:
        """Any other line the coordinator has for its operator."""
        event(self.log, level, message, **fields)

    def _line(self, ev: Event) -> tuple[int, str] | None:
        f = ev.fields
        elapsed = self.clock() - self.start
        if ev.kind == "round_completed":
            line = (f"round {f['round']}/{self.total} done in {f['seconds']:.2f}s with "
                    f"{len(f['participants'])} silos (elapsed {_duration(elapsed)})")
            if f.get("dropped"):
                line += ("; recovered without " + ", ".join(f["dropped"])
                         + " (dropped out; secure aggregation removed their masks)")
            return logging.INFO, line
        if ev.kind == "round_opened":
            return logging.INFO, (f"round {f.get('round')}/{self.total} attempt "
                                  f"{f.get('attempt')} opened with "
                                  f"{len(f.get('participants', ()))} silos")
        if ev.kind == "stage_closed":
            if not f.get("dropped"):
                return None
            return logging.INFO, (f"round {f.get('round')} {f.get('stage')} stage went on "
                                  f"without {', '.join(f['dropped'])} (expected: a silo that "
                                  "leaves or is too slow drops out)")
        if ev.kind == "deadline_passed":
            silent = f.get("silent") or []
            return logging.INFO, (f"round {f.get('round')} {f.get('stage')} deadline: "
                                  f"straggler(s) {', '.join(silent) or 'none'} dropped")
        if ev.kind == "silo_joined":
            return logging.INFO, f"{f.get('silo')} joined ({f.get('present')} present)"
        if ev.kind == "silo_left":
            return logging.INFO, f"{f.get('silo')} left ({f.get('present')} present)"
        if ev.kind == "round_aborted":
            return logging.WARNING, (f"round {f.get('round')} attempt {f.get('attempt')} "
                                     f"aborted: {f.get('reason')}; it will be retried")
        if ev.kind == "federation_failed":
            return logging.ERROR, f"federation failed: {f.get('reason')}"
        if ev.kind == "federation_done":
            return logging.INFO, f"federation done after {_duration(elapsed)}"
        details = " ".join(f"{k}={v}" for k, v in f.items())
        return logging.INFO, f"{ev.kind.replace('_', ' ')} {details}".rstrip()

    def _metrics_if_complete(self, round_no: int, history: list[RoundRecord],
                             complete_only: bool) -> None:
        record = next((r for r in history if r.round == round_no), None)
        if record is None or round_no in self._metrics_shown or not record.metrics:
            return
        # Summed metrics ([metrics] aggregate): one entry that is the whole federation.
        reported = (len(record.participants) if FEDERATION in record.metrics
                    else len(record.metrics))
        if complete_only and reported < len(record.participants):
            return
        self._metrics_shown.add(round_no)
        means = dict(sorted(mean_over_silos(record.metrics.values()).items()))
        summary = ", ".join(f"mean {name} {value:.4f}" for name, value in means.items())
        of = "" if reported >= len(record.participants) else (
            f" ({reported} of {len(record.participants)} silos reported)")
        event(self.log, logging.INFO, f"round {round_no} metrics: {summary}{of}",
              event="round_metrics", round=round_no, reported=reported,
              **{f"mean_{k}": v for k, v in means.items()})


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else (
        f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s")


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    """Event fields as JSON-ready values (tuples become lists)."""
    return {k: list(v) if isinstance(v, tuple | set | frozenset) else v for k, v in fields.items()}
