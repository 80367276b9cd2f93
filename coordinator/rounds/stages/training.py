"""A round attempt of an algorithm that aggregates nothing (`local`): silos train and report.

Nothing is shared, so there is no secure aggregation, no key and no mask: the round's
instruction tells the silos to train, and each silo's metrics report for the round is its
answer. The coordinator learns only what silos choose to report, and not even the sum of their
training-set sizes. A silo that leaves or misses the deadline is dropped from the round, which
completes with those that reported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from trellis.coordinator.rounds.errors import Duplicate, InvalidPayload, NotParticipant
from trellis.coordinator.rounds.stages.base import Event, Position, Stage
from trellis.protos.messages import Instruction, Phase

TRAINING_STAGES = (Stage.TRAIN,)


class TrainingAttempt:
    """The silos of one attempt, and the metrics of those that have trained."""

    def __init__(self, participants: tuple[str, ...]) -> None:
        self.participants = participants
        self.metrics: dict[str, dict[str, float]] = {}
        self.dropped: set[str] = set()

    def waiting_for(self) -> set[str]:
        """Participants that have neither reported nor left."""
        return set(self.participants) - set(self.metrics) - self.dropped

    def instruction(self, at: Position, silo: str, total_rounds: int) -> Instruction | None:
        """Train this round (None: nothing more is asked of this silo)."""
        if silo not in self.waiting_for():
            return None
        return Instruction(at.envelope(Phase.ROUND_OPEN), self.participants,
                           total_rounds=total_rounds)

    def trained(self, round_no: int, silo: str, metrics: Mapping[str, float]) -> list[Event]:
        """A participant's report for this round: it has trained. A participant dropped when
        its stream broke may still report while the round is open (it holds no keys to lose)."""
        if silo not in self.participants:
            raise NotParticipant(f"{silo} does not take part in this round")
        self.dropped.discard(silo)
        if silo in self.metrics:
            raise Duplicate(f"metrics of {silo} for this round already received")
        bad = [k for k, v in metrics.items() if math.isinf(v)]
        if bad:
            raise InvalidPayload(f"metrics {bad} are infinite")
        self.metrics[silo] = dict(metrics)
        return [Event("metrics", {"silo": silo, "round": round_no, "names": sorted(metrics)})]

    def drop(self, silo: str) -> None:
        """A participant left before reporting: the round goes on without it."""
        if silo in self.participants and silo not in self.metrics:
            self.dropped.add(silo)

    def expire(self, round_no: int, attempt: int) -> list[Event]:
        """The deadline passed: silent silos are dropped."""
        silent = sorted(self.waiting_for())
        self.dropped.update(silent)
        return [Event("deadline_passed", {"round": round_no, "attempt": attempt,
                                          "stage": Stage.TRAIN.value, "silent": silent})]

    @property
    def complete(self) -> bool:
        """Every participant has reported or gone."""
        return not self.waiting_for()

    @property
    def reporters(self) -> tuple[str, ...]:
        """The silos that trained and reported, in rank order."""
        return tuple(s for s in self.participants if s in self.metrics)
