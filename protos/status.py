"""A federation's status as the coordinator reports it: in state_dir/status.json and over the
Admin service's Status RPC (the codec maps it to protobuf)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class RefusedCaller:
    """A certificate the coordinator refused, and why."""

    subject: str
    reason: str


@dataclass(frozen=True)
class FederationStatus:
    """Where a federation stands; what `coordinator status` shows."""

    federation: str
    algorithm: str
    run_id: str
    round: int                     # the round under way (the last one once finished)
    rounds: int                    # planned
    rounds_completed: int
    stage: str
    connected: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()  # silos the last completed round recovered from
    refused: tuple[RefusedCaller, ...] = ()
    metrics_round: int = 0         # the round the metrics are of (0: none reported yet)
    reported: int = 0              # silos that reported for it
    metrics: dict[str, float] = field(default_factory=dict)   # means over those silos
    started_at: float = 0.0        # Unix time this coordinator process started serving
    updated_at: float = 0.0        # Unix time of this snapshot
    elapsed_s: float = 0.0
    round_mean_s: float = 0.0      # mean duration of the completed rounds (0: none yet)
    pid: int = 0
    failure: str = ""
    plan: str = ""                 # the plan file the coordinator serves

    @property
    def eta_s(self) -> float | None:
        """Estimated seconds left: mean round duration x rounds left (None before a round)."""
        if self.round_mean_s <= 0:
            return None
        return self.round_mean_s * max(0, self.rounds - self.rounds_completed)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready document (status.json, `coordinator status --json`)."""
        doc = asdict(self)
        doc["connected"], doc["dropped"] = list(self.connected), list(self.dropped)
        doc["refused"] = [asdict(r) for r in self.refused]
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> FederationStatus:
        """Read back to_json's document; a missing or mistyped field is a ValueError."""
        try:
            return cls(**{**doc, "connected": tuple(doc["connected"]),
                          "dropped": tuple(doc["dropped"]),
                          "refused": tuple(RefusedCaller(**r) for r in doc["refused"]),
                          "metrics": {str(k): float(v) for k, v in doc["metrics"].items()}})
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a status document ({type(exc).__name__}: {exc})") from None
