"""The coordinator's round state machine: pure logic, fed by the gRPC service or the simulator.

Per round attempt: ROUND_OPEN (silos fetch state, advertise signed keys, train) -> KEYS_READY
(silos fetch the adverts and upload masked vectors) -> aggregate -> strategy -> next round.
A participant leaving or missing the deadline aborts the attempt; the round is retried with the
silos still present. Time is passed in; every input returns the events it caused, which the
caller turns into audit records and progress lines.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coordinator.errors import Duplicate, InvalidPayload, NotParticipant, OutOfPhase
from coordinator.plan import Plan
from coordinator.strategies import AggregateResult, Strategy
from crypto.errors import EncodingError
from crypto.fixedpoint import FixedPointSpec
from crypto.masking import sum_vectors
from protos.messages import (
    Envelope,
    Instruction,
    KeyAdvertisement,
    KeyBundle,
    MetricsReport,
    Phase,
    SignedKey,
)


class Stage(enum.Enum):
    """Where the federation is."""

    WAITING = "waiting"
    KEYS = "keys"
    INPUTS = "inputs"
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


class RoundMachine:
    """Drives rounds for one federation; holds only masked vectors until their sum is formed."""

    def __init__(self, plan: Plan, strategy: Strategy, now: float, *, start_round: int = 1,
                 global_state: np.ndarray | None = None,
                 history: list[RoundRecord] | None = None) -> None:
        self.plan = plan
        self.strategy = strategy
        self.spec = FixedPointSpec(plan.public.aggregation.clip,
                                   plan.public.aggregation.fraction_bits,
                                   plan.public.aggregation.ring_bits,
                                   plan.public.aggregation.max_sample_count)
        self.present: dict[str, bytes] = {}      # silo -> certificate PEM
        self.stage = Stage.WAITING
        self.round = start_round
        self.attempt = 0
        self.participants: tuple[str, ...] = ()
        self.adverts: dict[str, KeyAdvertisement] = {}
        self.inputs: dict[str, np.ndarray] = {}
        self.global_state = global_state
        self.shared_length: int | None = None if global_state is None else global_state.size
        self.history: list[RoundRecord] = list(history or [])
        self.deadline = now + plan.timeouts.join_s
        self.round_started = now
        self.failure = ""
        self.version = 0                            # bumps whenever instructions change
        if start_round > plan.public.rounds:
            self.stage = Stage.FINISHING
            self.deadline = now + plan.timeouts.report_s

    # -- queries ------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """Whether the federation has ended (successfully or not)."""
        return self.stage in (Stage.DONE, Stage.FAILED)

    def envelope(self, phase: Phase) -> Envelope:
        """Envelope of the coordinator's current position with the given phase."""
        return Envelope(self.plan.federation, self.round, self.attempt, phase)

    def instruction(self, silo: str) -> Instruction:
        """What this silo should do now."""
        total = self.plan.public.rounds
        if self.stage in (Stage.KEYS, Stage.INPUTS) and silo in self.participants:
            phase = Phase.ROUND_OPEN if self.stage is Stage.KEYS else Phase.KEYS_READY
            return Instruction(self.envelope(phase), self.participants, total_rounds=total)
        if self.stage in (Stage.FINISHING, Stage.DONE):
            return Instruction(Envelope(self.plan.federation, self.plan.public.rounds,
                                        self.attempt, Phase.FINISHED), total_rounds=total)
        if self.stage is Stage.FAILED:
            return Instruction(self.envelope(Phase.ROUND_ABORTED), message=self.failure,
                               total_rounds=total)
        waiting = (f"waiting for silos ({len(self.present)} present, "
                   f"{self.plan.min_silos} needed)" if self.stage is Stage.WAITING
                   else "waiting for the next round")
        return Instruction(self.envelope(Phase.WAITING), message=waiting, total_rounds=total)

    def key_bundle(self, silo: str, env: Envelope) -> KeyBundle:
        """All participants' adverts, once every participant has advertised."""
        self._check(silo, env, Stage.INPUTS, Phase.KEYS_READY)
        keys = tuple(SignedKey(s, self.adverts[s].public_key, self.adverts[s].signature,
                               self.present.get(s, b"")) for s in self.participants)
        return KeyBundle(self.envelope(Phase.KEYS_READY), keys)

    def state_for(self, silo: str, env: Envelope) -> np.ndarray | None:
        """The current global shared state (None before the first aggregate)."""
        if silo not in self.present:
            raise NotParticipant(f"{silo} has not joined")
        if env.federation != self.plan.federation:
            raise OutOfPhase(f"federation {env.federation!r} is not {self.plan.federation!r}")
        if self.stage is Stage.FINISHING or self.stage is Stage.DONE:
            return self.global_state
        if env.round != self.round or env.attempt != self.attempt or self.stage not in (
            Stage.KEYS, Stage.INPUTS
        ):
            raise OutOfPhase(f"state asked for round {env.round} attempt {env.attempt}; "
                             f"coordinator is at {self.describe()}")
        return self.global_state

    def describe(self) -> str:
        """Human-readable position."""
        return f"round {self.round} attempt {self.attempt} stage {self.stage.value}"

    # -- inputs -------------------------------------------------------------------------------
    def join(self, silo: str, certificate_pem: bytes, now: float) -> list[Event]:
        """An admitted silo attends (or re-attends after a reconnect)."""
        if silo not in self.plan.silos:
            raise NotParticipant(f"{silo} is not admitted by the plan")
        self.present[silo] = certificate_pem
        events = [Event("silo_joined", {"silo": silo, "present": len(self.present)})]
        self.version += 1
        if self.stage is Stage.WAITING and len(self.present) == len(self.plan.silos):
            events += self._open_round(now)
        return events

    def leave(self, silo: str, now: float) -> list[Event]:
        """A silo's control stream ended: it is gone until it attends again."""
        if self.present.pop(silo, None) is None:
            return []
        events = [Event("silo_left", {"silo": silo, "present": len(self.present)})]
        self.version += 1
        if self.stage in (Stage.KEYS, Stage.INPUTS) and silo in self.participants:
            events += self._abort(f"silo {silo} left during {self.stage.value}", now,
                                  keep=set(self.participants) - {silo})
        return events

    def advertise(self, silo: str, advert: KeyAdvertisement, now: float) -> list[Event]:
        """A participant's signed key for this attempt (signatures are checked by its peers)."""
        self._check(silo, advert.envelope, Stage.KEYS, Phase.ADVERTISE_KEY)
        if silo in self.adverts:
            raise Duplicate(f"key advert from {silo} for {self.describe()} already received")
        if len(advert.public_key) != 32 or not advert.signature:
            raise InvalidPayload("key advert needs a 32-byte public key and a signature")
        if self.shared_length is not None and advert.shared_length != self.shared_length:
            raise InvalidPayload(f"{silo} declares a shared vector of {advert.shared_length} "
                                 f"values; this federation uses {self.shared_length}")
        self.shared_length = advert.shared_length
        self.adverts[silo] = advert
        events = [Event("key_advertised", {"silo": silo, "round": self.round,
                                           "attempt": self.attempt})]
        if len(self.adverts) == len(self.participants):
            self.stage = Stage.INPUTS
            self.version += 1
            events.append(Event("keys_ready", {"round": self.round, "attempt": self.attempt}))
        return events

    def masked_input(self, silo: str, env: Envelope, vector: np.ndarray,
                     now: float) -> list[Event]:
        """A participant's masked vector; the last one triggers aggregation."""
        self._check(silo, env, Stage.INPUTS, Phase.MASKED_INPUT)
        if silo in self.inputs:
            raise Duplicate(f"masked input from {silo} for {self.describe()} already received")
        expected = (self.shared_length or 0) + 1
        if vector.dtype != self.spec.dtype or vector.shape != (expected,):
            raise InvalidPayload(f"masked input must be {np.dtype(self.spec.dtype).name} of "
                                 f"shape ({expected},), got {vector.dtype.name} {vector.shape}")
        self.inputs[silo] = vector
        events = [Event("masked_input", {"silo": silo, "round": self.round,
                                         "attempt": self.attempt, "values": int(vector.size)})]
        if len(self.inputs) == len(self.participants):
            events += self._aggregate(now)
        return events

    def report(self, silo: str, report: MetricsReport, now: float) -> list[Event]:
        """Metrics a silo chose to report for a completed round."""
        env = report.envelope
        if silo not in self.present:
            raise NotParticipant(f"{silo} has not joined")
        if env.federation != self.plan.federation or env.phase is not Phase.REPORT:
            raise OutOfPhase(f"metrics must carry phase REPORT of {self.plan.federation}")
        record = next((r for r in self.history if r.round == env.round), None)
        if record is None:
            raise OutOfPhase(f"round {env.round} has not completed; cannot report on it")
        if silo in record.metrics:
            raise Duplicate(f"metrics of {silo} for round {env.round} already received")
        bad = [k for k, v in report.metrics.items() if not np.isfinite(v) and not np.isnan(v)]
        if bad:
            raise InvalidPayload(f"metrics {bad} are infinite")
        record.metrics[silo] = dict(report.metrics)
        events = [Event("metrics", {"silo": silo, "round": env.round,
                                    "names": sorted(report.metrics)})]
        if self.stage is Stage.FINISHING and env.round == self.plan.public.rounds:
            if set(record.participants) <= set(record.metrics):
                self.stage = Stage.DONE
                self.version += 1
                events.append(Event("federation_done", {"rounds": self.plan.public.rounds}))
        return events

    def tick(self, now: float) -> list[Event]:
        """Handle deadlines: joining, slow participants, final reports."""
        if now < self.deadline or self.finished:
            return []
        if self.stage is Stage.WAITING:
            if len(self.present) >= self.plan.min_silos:
                return self._open_round(now)
            return self._fail(f"only {len(self.present)} of the {self.plan.min_silos} silos "
                              f"needed were present after {self.plan.timeouts.join_s:g} s")
        if self.stage in (Stage.KEYS, Stage.INPUTS):
            received = self.adverts if self.stage is Stage.KEYS else self.inputs
            late = sorted(set(self.participants) - set(received))
            return self._abort(f"deadline passed during {self.stage.value}; no answer from "
                               + ", ".join(late), now, keep=set(received))
        if self.stage is Stage.FINISHING:
            self.stage = Stage.DONE
            self.version += 1
            return [Event("federation_done", {"rounds": self.plan.public.rounds,
                                              "note": "some final reports missing"})]
        return []

    # -- internals ----------------------------------------------------------------------------
    def _check(self, silo: str, env: Envelope, stage: Stage, phase: Phase) -> None:
        if env.federation != self.plan.federation:
            raise OutOfPhase(f"message for federation {env.federation!r}; this is "
                             f"{self.plan.federation!r}")
        if env.phase is not phase:
            raise OutOfPhase(f"expected phase {phase.name}, got {env.phase.name}")
        if (env.round, env.attempt) != (self.round, self.attempt) or self.stage is not stage:
            raise OutOfPhase(f"{env.describe()} does not match the coordinator's "
                             f"{self.describe()}")
        if silo not in self.participants:
            raise NotParticipant(f"{silo} does not take part in {self.describe()}")

    def _open_round(self, now: float, participants: set[str] | None = None) -> list[Event]:
        self.attempt += 1
        self.participants = tuple(sorted(self.present if participants is None else participants))
        self.adverts, self.inputs = {}, {}
        self.stage = Stage.KEYS
        self.deadline = now + self.plan.timeouts.round_s
        if self.attempt == 1:
            self.round_started = now
        self.version += 1
        return [Event("round_opened", {"round": self.round, "attempt": self.attempt,
                                       "participants": list(self.participants)})]

    def _abort(self, reason: str, now: float, keep: set[str]) -> list[Event]:
        events = [Event("round_aborted", {"round": self.round, "attempt": self.attempt,
                                          "reason": reason})]
        self.adverts, self.inputs = {}, {}      # masked vectors of an aborted attempt are useless
        self.participants = ()
        if self.attempt >= self.plan.timeouts.max_attempts:
            return events + self._fail(f"round {self.round} failed {self.attempt} attempts; "
                                       f"last: {reason}")
        # Silos that missed a deadline sit out the retry; they may attend the next round.
        eligible = {s for s in self.present if s in keep}
        if len(eligible) >= self.plan.min_silos:
            return events + self._open_round(now, eligible)
        self.stage = Stage.WAITING
        self.deadline = now + self.plan.timeouts.join_s
        self.version += 1
        return events

    def _aggregate(self, now: float) -> list[Event]:
        try:
            total = sum_vectors((self.inputs[s] for s in self.participants), self.spec)
            mean, total_weight = self.spec.decode_mean(total)
        except EncodingError as exc:
            return self._abort(f"aggregate could not be decoded: {exc}", now, keep=set())
        self.inputs = {}
        result = AggregateResult(self.round, self.participants, mean, total_weight)
        new_state = self.strategy.next_global(result)
        if new_state is not None:
            self.global_state = new_state
        self.history.append(RoundRecord(self.round, self.attempt, self.participants,
                                        total_weight, self.round_started, now))
        events = [Event("round_completed", {"round": self.round, "attempt": self.attempt,
                                            "participants": list(self.participants),
                                            "total_weight": total_weight,
                                            "seconds": round(now - self.round_started, 3)})]
        if self.round >= self.plan.public.rounds:
            self.stage = Stage.FINISHING
            self.deadline = now + self.plan.timeouts.report_s
            self.version += 1
            return events + [Event("finishing", {"rounds": self.round})]
        self.round += 1
        self.attempt = 0
        return events + self._open_round(now)

    def _fail(self, reason: str) -> list[Event]:
        self.stage = Stage.FAILED
        self.failure = reason
        self.version += 1
        return [Event("federation_failed", {"reason": reason})]


def per_silo_final_metrics(history: list[RoundRecord]) -> Mapping[str, dict[str, float]]:
    """The last metrics each silo reported."""
    latest: dict[str, dict[str, float]] = {}
    for record in history:
        latest.update(record.metrics)
    return latest
