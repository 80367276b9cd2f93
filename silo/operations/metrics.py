"""The silo's Prometheus metrics (`silo join --metrics-listen`), observed, never steering.

Byte counts come from the silo's own audit records after they are written, so the metrics
say exactly what the audit log says left the silo (masked vectors, sealed shares, envelopes,
group seals, encrypted updates) and reached it (shared states, envelope pools). Training time
and completed rounds come from the driver (silo/federation/driver.py's RoundObserver).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "trellis_silo_"
# The audit records of what left the silo, and of what reached it, with a `bytes` field.
SENT_RECORDS = frozenset({"sent_tensor", "sent_shares", "sent_envelope", "sealed_group_secrets",
                          "sent_encrypted_update"})
RECEIVED_RECORDS = frozenset({"received_tensor", "received_envelopes"})
_TRAINING_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class SiloMetrics:
    """Every silo metric, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.training_seconds = Histogram(
            PREFIX + "training_seconds", "Seconds of local training per round (each retried "
            "attempt trains again)", buckets=_TRAINING_BUCKETS, registry=r)
        self.sent_bytes = Counter(
            PREFIX + "sent_bytes", "Payload bytes this silo sent (masked vectors, sealed shares, "
            "envelopes, group seals, encrypted updates), as its audit log's records count them",
            registry=r)
        self.received_bytes = Counter(
            PREFIX + "received_bytes", "Payload bytes of the shared states and envelope pools "
            "this silo received, as its audit log's records count them", registry=r)
        self.rounds_completed = Gauge(
            PREFIX + "rounds_completed", "The last round whose result reached this silo",
            registry=r)
        self._last_round = 0
        self._warned = False

    def observe(self, record: Mapping[str, Any]) -> None:
        """Count the bytes of one audit record (never raises)."""
        try:
            event = record.get("event")
            if event in SENT_RECORDS:
                self.sent_bytes.inc(record["bytes"])
            elif event in RECEIVED_RECORDS:
                self.received_bytes.inc(record["bytes"])
        except Exception as exc:  # noqa: BLE001 -- reported once, then training goes on
            if not self._warned:
                self._warned = True
                print(f"warning: metrics: cannot count audit record {record.get('event')!r} "
                      f"({type(exc).__name__}: {exc}); metrics may be incomplete",
                      file=sys.stderr, flush=True)

    def trained(self, round: int, seconds: float) -> None:
        """One round's local training took seconds."""
        self.training_seconds.observe(seconds)

    def round_completed(self, round: int) -> None:
        """The result of round reached the silo."""
        self._last_round = max(round, self._last_round)
        self.rounds_completed.set(self._last_round)
