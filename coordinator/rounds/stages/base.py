"""What every stage of the round machine shares: where the federation is and what happened.

A stage handler sees the machine's ``Position`` (federation, round, attempt, stage), checks a
message's envelope against it, and returns ``Event`` values for the audit trail and progress
display; the machine keeps one ``RoundRecord`` per completed round.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from trellis.coordinator.rounds.errors import OutOfPhase
from trellis.protos.messages import Envelope, Phase


class Stage(enum.Enum):
    """Where the federation is."""

    WAITING = "waiting"
    ADVERTISE = "advertise"
    SHARE = "share"
    INPUT = "input"
    CONSISTENCY = "consistency"
    UNMASK = "unmask"
    TRAIN = "train"                       # nothing aggregated: silos train and report
    SETUP_ADVERTISE = "setup-advertise"   # silo group key: signed setup keys
    SETUP_SEAL = "setup-seal"             # the leader seals the group secrets for each peer
    SETUP_OPEN = "setup-open"             # every peer opens its box
    SIMILARITY = "similarity"             # GCFL split: CKKS-encrypted normalised updates
    DECRYPT = "decrypt"                   # one silo decrypts blinded inner products
    FINISHING = "finishing"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True)
class Event:
    """Something that happened, for the audit trail and progress display."""

    kind: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class RoundRecord:
    """What the coordinator keeps of a completed round."""

    round: int
    attempts: int
    participants: tuple[str, ...]
    total_weight: int
    started: float
    finished: float
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()


def describe(round: int, attempt: int, stage: Stage) -> str:
    """Human-readable position, as every refusal names it."""
    return f"round {round} attempt {attempt} stage {stage.value}"


@dataclass(frozen=True)
class Position:
    """Where the round machine stands, as a stage handler checks a message against it."""

    federation: str
    round: int
    attempt: int
    stage: Stage

    def describe(self) -> str:
        """Human-readable position."""
        return describe(self.round, self.attempt, self.stage)

    def envelope(self, phase: Phase) -> Envelope:
        """Envelope of this position with the given phase."""
        return Envelope(self.federation, self.round, self.attempt, phase)


@dataclass(frozen=True)
class Step:
    """What a group-key or similarity handler did: its events and where its sub-protocol goes.

    ``enter``: the next stage of the same sub-protocol; ``finished``: the sub-protocol is over
    and the machine takes over again (opens the first round, or completes the round).
    """

    events: list[Event]
    enter: Stage | None = None
    finished: bool = False


def check_envelope(at: Position, env: Envelope, stage: Stage, phase: Phase, *,
                   same_round: bool) -> None:
    """A setup or similarity message must match the stage (and the round, if bound to one)."""
    in_round = not same_round or (env.round, env.attempt) == (at.round, at.attempt)
    if env.federation != at.federation or not in_round or at.stage is not stage:
        raise OutOfPhase(f"{env.describe()} does not match the coordinator's {at.describe()}")
    if env.phase is not phase:
        raise OutOfPhase(f"expected phase {phase.name}, got {env.phase.name}")
