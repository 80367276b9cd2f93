"""The round machine's state and its moves from stage to stage (coordinator/rounds/machine.py adds
the inputs the service and the simulator call).

The machine owns where the federation is (stage, round, attempt, deadline) and moves it on when
a stage handler of coordinator/rounds/stages/ says its sub-protocol goes on or is over: it enters
the next stage of a sub-protocol, starts the silo group key before round 1, opens a round attempt,
aborts it (fewer than the threshold at any stage: the round is retried with the silos still
present, up to max_attempts), completes it with the strategy's step, asks for GCFL's similarity
when a cluster must be cut, and finishes. Time is passed in; every move returns its events.

With [metrics] aggregate = true, each round's aggregate also carries the previous round's summed
evaluation counts (stages/metric_sums.py), and the last round is followed by one evaluation
attempt: secure aggregation as usual, announced with total_rounds one below its round so that
silos train nothing and send only the counts of the final state; no strategy step follows it.

Over 400 lines because every move between stages (open, abort, complete, evaluate, finish)
reads and writes the same position, and split apart they would share it through back
references.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trellis.coordinator.rounds.errors import OutOfPhase
from trellis.coordinator.rounds.privacy_report import round_privacy
from trellis.coordinator.rounds.secagg_groups import SecAggGroups
from trellis.coordinator.rounds.stages.base import Event, Position, RoundRecord, Stage, Step
from trellis.coordinator.rounds.stages.group_key import GroupSetup, check_setup_envelope
from trellis.coordinator.rounds.stages.late_reveals import UnmaskedAttempt
from trellis.coordinator.rounds.stages.metric_sums import attach_sums
from trellis.coordinator.rounds.stages.secure_aggregation import (
    Aggregate,
    Rules,
    SecureAggregation,
    check_envelope,
)
from trellis.coordinator.rounds.stages.similarity import (
    SimilarityStep,
    check_similarity_envelope,
    cluster_events,
)
from trellis.coordinator.rounds.stages.training import TrainingAttempt
from trellis.coordinator.rounds.strategies import ClusteredStrategy, Strategy
from trellis.crypto.envelopes import sealed_size
from trellis.crypto.fixedpoint import FixedPointSpec
from trellis.crypto.keyagreement import RoundContext
from trellis.crypto.secagg import SecAggConfig
from trellis.protos.messages import Envelope, Phase
from trellis.protos.plan import Plan


class Sequencer:
    """What the round machine holds, and its moves between the stages of its sub-protocols."""

    def __init__(self, plan: Plan, strategy: Strategy, now: float, *, start_round: int = 1,
                 global_state: np.ndarray | None = None,
                 history: list[RoundRecord] | None = None, attempts_before: int = 0,
                 run_id: str = "") -> None:
        self.plan = plan
        self.strategy = strategy
        # GCFL's cluster hooks, reached through a typed reference rather than a down-cast.
        self.clusters: ClusteredStrategy | None = strategy.clustering()
        if (self.clusters is not None) != strategy.clustered:
            raise TypeError(f"{strategy.name}: its algorithm row and its strategy "
                            f"{type(strategy).__name__} disagree on clustering silos")
        # Told to silos on joining: their saved state must match it, and every key advert,
        # survivor list and group-key box of this run is bound to it (RoundContext).
        self.run_id = run_id
        agg = plan.public.aggregation
        self.spec = FixedPointSpec(agg.clip, agg.fraction_bits, agg.ring_bits,
                                   agg.max_sample_count)
        self.secagg_config = SecAggConfig(agg.threshold, agg.neighbours, plan.public.seed)
        self.present: dict[str, bytes] = {}      # silo -> certificate PEM
        # Who takes part: the plan's silos, or those of a job's that approved it
        # (`expect_only`); round 1 starts once all of them are present.
        self.expected: frozenset[str] = frozenset(plan.silos)
        self.stage = Stage.WAITING
        self.round = start_round
        # A coordinator restarted in the middle of a round numbers its attempts after those it
        # opened before: a silo still holding an old attempt's keys and state then sees a new
        # attempt and starts it from its pre-round snapshot. Only this run's attempts count
        # towards max_attempts.
        self.attempt = attempts_before
        self._attempt_base = attempts_before
        self.aggregation: SecureAggregation | None = None    # the attempt in progress
        # The last attempt unmasked, whose slowest survivors' reveals may still come (late).
        self.unmasked: UnmaskedAttempt | None = None
        self.training: TrainingAttempt | None = None      # ... when nothing is aggregated
        self.group_setup: GroupSetup | None = None
        # Each group-key setup run has its own number: after a restart mid-setup the silos must
        # see a new run, not an instruction they already followed.
        self.setup_generation = 0
        self.similarity: SimilarityStep | None = None
        # FedHGN: each silo's latest sealed coefficient envelope (opaque, fixed size); those of
        # the attempt in progress wait in it, kept only if the silo survives the round.
        self.envelopes: dict[str, bytes] = {}
        self.global_state = global_state
        self.shared_length: int | None = None if global_state is None else global_state.size
        self.history: list[RoundRecord] = list(history or [])
        self.deadline = now + plan.timeouts.join_s
        self.round_started = now
        self.failure = ""
        self.version = 0                            # bumps whenever instructions change
        self._rules = Rules(plan.public.algorithm, self.spec, self.secagg_config,
                            strategy.clustered, agg.unweighted_sum, self.envelope_bytes,
                            plan.public.privacy.scale if plan.public.privacy.enabled else 0.0,
                            plan.public.metrics)
        # [metrics] aggregate: the attempt in progress only sums the final state's counts
        # (and whether the rounds before it stopped early).
        self.evaluating = False
        self._stopped_early = False
        if start_round > plan.public.rounds:
            self.stage = Stage.FINISHING
            self.deadline = now + plan.timeouts.report_s

    # -- position -----------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """Whether the federation has ended (successfully or not)."""
        return self.stage in (Stage.DONE, Stage.FAILED)

    @property
    def secagg(self) -> SecAggGroups | None:
        """The aggregation servers of the attempt in progress (None between attempts)."""
        return self.aggregation.groups if self.aggregation is not None else None

    @property
    def participants(self) -> tuple[str, ...]:
        """The silos the attempt in progress opened with (none between attempts)."""
        if self.training is not None:
            return self.training.participants
        return self.aggregation.participants if self.aggregation is not None else ()

    @property
    def pending_envelopes(self) -> dict[str, bytes]:
        """FedHGN: the sealed envelopes of the attempt in progress."""
        return self.aggregation.pending_envelopes if self.aggregation is not None else {}

    def envelope(self, phase: Phase) -> Envelope:
        """Envelope of the coordinator's current position with the given phase."""
        return self._at().envelope(phase)

    def context(self) -> RoundContext:
        """What this attempt's keys, shares and masks are bound to."""
        return RoundContext(self.plan.federation, self.round, self.attempt, run=self.run_id)

    def describe(self) -> str:
        """Human-readable position."""
        return self._at().describe()

    @property
    def final_round(self) -> int:
        """The round the federation ends with: the plan's last, or the last run if it stopped
        early."""
        if self.stage in (Stage.FINISHING, Stage.DONE) and self.history:
            return self.history[-1].round
        return self.plan.public.rounds

    @property
    def sums_metrics(self) -> bool:
        """Whether silos' figures arrive only as sums inside the masked vectors."""
        return self.plan.public.metrics.aggregate

    @property
    def total_rounds(self) -> int:
        """What instructions tell silos the federation's rounds are: in the evaluation attempt,
        the round before it, so that silos know it trains nothing."""
        return self.round - 1 if self.evaluating else self.plan.public.rounds

    @property
    def envelope_bytes(self) -> int:
        """The length every sealed coefficient envelope must have (0: none are exchanged)."""
        if not self.strategy.exchanges_envelopes:
            return 0
        hetero = self.plan.public.hetero
        return sealed_size(hetero.coefficient_slots, 4 * hetero.bases)

    # -- sequencing -----------------------------------------------------------------------------
    def _at(self) -> Position:
        """Where the machine stands, for a stage handler to check a message against."""
        return Position(self.plan.federation, self.round, self.attempt, self.stage)

    def _enter(self, stage: Stage, now: float, timeout: float) -> None:
        """Move to a stage of the same sub-protocol; its deadline runs from now."""
        self.stage = stage
        self.deadline = now + timeout
        self.version += 1

    def _start(self, now: float) -> list[Event]:
        """Open the next round, after establishing the silo group key if the algorithm needs it."""
        if self.strategy.needs_group_key and self.group_setup is None:
            self.group_setup = GroupSetup.among(self.present)
            self.setup_generation += 1
            self._enter(Stage.SETUP_ADVERTISE, now, self.plan.timeouts.stage_s)
            return [self.group_setup.started(self.setup_generation)]
        return self._open_round(now, set(self.present))

    def _after_setup(self, step: Step, now: float) -> list[Event]:
        """Follow a group-key handler: its next stage, or the first round once all hold the key."""
        if step.enter is not None:
            self._enter(step.enter, now, self.plan.timeouts.stage_s)
        if not step.finished:
            return step.events
        self.version += 1
        return step.events + self._open_round(now, set(self.present))

    def _open_round(self, now: float, participants: set[str]) -> list[Event]:
        """Open an attempt of the round: secure aggregation among these silos, or only their
        training when the algorithm aggregates nothing."""
        self.attempt += 1
        ranked = tuple(sorted(participants))
        if self.strategy.algorithm.aggregates:
            self.aggregation = SecureAggregation(self.context(), ranked,
                                                 self.strategy.groups(ranked), self._rules,
                                                 self.shared_length)
            self.stage = Stage.ADVERTISE
            self.deadline = now + self.plan.timeouts.stage_s
        else:
            self.training = TrainingAttempt(ranked)
            self.stage = Stage.TRAIN
            self.deadline = now + self.plan.timeouts.round_s
        if self.attempt == self._attempt_base + 1:
            self.round_started = now
        self.version += 1
        return [Event("round_opened", {"round": self.round, "attempt": self.attempt,
                                       "participants": list(ranked)})]

    def _advance(self, attempt: SecureAggregation, now: float, *,
                 deadline_passed: bool = False) -> list[Event]:
        """Close every stage that can close; abort below the threshold; complete the round once
        the aggregate is unmasked."""
        closing = attempt.advance(deadline_passed)
        self.version += closing.closed
        if closing.entered is not None:
            self.stage = closing.entered
            self.deadline = now + (self.plan.timeouts.round_s if closing.entered is Stage.INPUT
                                   else self.plan.timeouts.stage_s)
        if closing.abort is not None:
            if self.evaluating:
                return closing.events + self._skip_evaluation(closing.abort, attempt.late, now)
            return closing.events + self._abort(closing.abort, attempt.late, now)
        if closing.aggregate is not None:
            self.unmasked = attempt.unmasked()
            return closing.events + self._complete(closing.aggregate, now)
        return closing.events

    def _abort(self, reason: str, late: set[str], now: float) -> list[Event]:
        """Give up the attempt: retry without the late silos, wait for more, or fail."""
        events = [Event("round_aborted", {"round": self.round, "attempt": self.attempt,
                                          "reason": reason})]
        self.aggregation = self.training = None     # whatever it held is useless now
        tried = self.attempt - self._attempt_base
        if tried >= self.plan.timeouts.max_attempts:
            return events + self._fail(f"round {self.round} failed {tried} attempts; "
                                       f"last: {reason}")
        # Silos that missed a deadline sit out the retry; they may attend the next round.
        eligible = set(self.present) - late
        if len(eligible) >= self._silos_needed():
            return events + self._open_round(now, eligible)
        self.stage = Stage.WAITING
        self.deadline = now + self.plan.timeouts.join_s
        self.version += 1
        return events

    def _complete(self, aggregate: Aggregate, now: float) -> list[Event]:
        """The attempt's aggregate is in: the strategy's step, then the similarity or the end."""
        self.aggregation = None
        events = attach_sums(self.history, self.round - 1, aggregate.metric_sums,
                             self.plan.public.metrics, aggregate.survivors)
        if self.evaluating:
            self.evaluating = False
            self.round -= 1
            return events + self._finish_rounds(now)
        self.envelopes.update(aggregate.envelopes)
        due: list[tuple[str, ...]] = []
        if self.clusters is not None:
            due = self.clusters.complete_round(self.round, aggregate.results,
                                               aggregate.statistics)
            events += cluster_events(self.round, self.clusters)
        else:
            new_state = self.strategy.next_global(next(iter(aggregate.results.values())))
            if new_state is not None:
                self.global_state = new_state
        self.history.append(RoundRecord(self.round, self.attempt, aggregate.survivors,
                                        aggregate.total_weight, self.round_started, now,
                                        dropped=aggregate.dropped))
        step = SimilarityStep.among(due, self.present) if due else None
        if step is None:
            return events + self._round_done(now)
        self.similarity = step
        self._enter(Stage.SIMILARITY, now, self.plan.timeouts.stage_s)
        return events + [step.requested(self.round)]

    def _trained(self, attempt: TrainingAttempt, now: float) -> list[Event]:
        """A round that aggregates nothing is over once every silo has reported or gone."""
        if not attempt.complete:
            return []
        if not attempt.metrics:
            return self._abort("no silo trained and reported in time", attempt.dropped, now)
        self.training = None
        self.history.append(RoundRecord(self.round, self.attempt, attempt.reporters, 0,
                                        self.round_started, now, dict(attempt.metrics),
                                        tuple(sorted(attempt.dropped))))
        return self._round_done(now)

    def _after_similarity(self, step: Step, now: float) -> list[Event]:
        """Follow a similarity handler: decrypting next, or the round is over."""
        if step.enter is not None:
            self._enter(step.enter, now, self.plan.timeouts.stage_s)
        if not step.finished:
            return step.events
        self.similarity = None
        return step.events + self._round_done(now)

    def _round_privacy(self, survivors: Sequence[str]) -> dict[str, Any]:
        """A private plan's round record: its noise floor and the design silo's epsilon."""
        return round_privacy(self.plan, self.round, len(survivors))

    def _round_done(self, now: float) -> list[Event]:
        """The round's strategy step is over: report it and open the next round (or finish)."""
        record = self.history[-1]
        if self.clusters is not None:
            self.clusters.close_round(self.round)
        events = [Event("round_completed", {"round": self.round, "attempt": self.attempt,
                                            "participants": list(record.participants),
                                            "dropped": list(record.dropped),
                                            "total_weight": record.total_weight,
                                            "seconds": round(now - self.round_started, 3),
                                            **self._round_privacy(record.participants)})]
        stop_early = self.strategy.stops_early and self.strategy.should_stop(self.history)
        last = self.round >= self.plan.public.rounds or stop_early
        self._stopped_early = stop_early
        if last and not self.sums_metrics:
            return events + self._finish_rounds(now)
        self.round += 1
        self.attempt = self._attempt_base = 0
        if last:
            # One more attempt, that trains nothing, sums the final state's counts.
            self.evaluating = True
            if len(self.present) < self._silos_needed():
                return events + self._skip_evaluation(
                    f"{len(self.present)} silos present, {self._silos_needed()} needed",
                    set(), now)
            return events + self._open_round(now, set(self.present))
        if len(self.present) < self._silos_needed():
            self.stage = Stage.WAITING
            self.deadline = now + self.plan.timeouts.join_s
            return events
        return events + self._open_round(now, set(self.present))

    def _finish_rounds(self, now: float) -> list[Event]:
        """No more rounds: wait for the last round's reports, if any are due."""
        self.stage = Stage.FINISHING
        self.deadline = now + self.plan.timeouts.report_s
        self.version += 1
        extra = {"early_stop": True} if self._stopped_early else {}
        events = [Event("finishing", {"rounds": self.round, **extra})]
        if not self.strategy.algorithm.aggregates or self.sums_metrics:
            # The last round's reports came in with the round itself, or none are sent.
            events += self._done_if_reported()
        return events

    def _skip_evaluation(self, reason: str, late: set[str], now: float) -> list[Event]:
        """The evaluation attempt could not be summed: finish without the last round's
        federation-wide figures (the model is complete; only they are missing)."""
        events = [Event("round_aborted", {"round": self.round, "attempt": self.attempt,
                                          "reason": reason})] if self.aggregation else []
        self.aggregation = None
        self.evaluating = False
        self.round -= 1
        events.append(Event("final_metrics_skipped", {"round": self.round, "reason": reason,
                                                      "late": sorted(late)}))
        return events + self._finish_rounds(now)

    def _done_if_reported(self) -> list[Event]:
        """End the federation once every last-round participant still here has reported."""
        if self.stage is not Stage.FINISHING or not self.history:
            return []
        record = self.history[-1]
        # Summed metrics: silos send no report, so none is waited for.
        reported = set(record.participants) if self.sums_metrics else set(record.metrics)
        waiting = (set(record.participants) & set(self.present)) - reported
        if waiting:
            return []
        self.stage = Stage.DONE
        self.version += 1
        missing = sorted(set(record.participants) - reported)
        return [Event("federation_done", {"rounds": record.round,
                                          **({"unreported": missing} if missing else {})})]

    def _silos_needed(self) -> int:
        """The fewest silos a round opens with: the plan's minimum, and the secure-aggregation
        threshold when anything is aggregated."""
        if not self.strategy.algorithm.aggregates:
            return self.plan.min_silos
        return max(self.plan.min_silos, self.secagg_config.threshold)

    def _fail(self, reason: str) -> list[Event]:
        """The federation fails here, for this reason."""
        self.stage = Stage.FAILED
        self.failure = reason
        self.version += 1
        return [Event("federation_failed", {"reason": reason})]

    # -- typed access to the sub-protocol in progress -------------------------------------------
    def _attempt(self, env: Envelope, stage: Stage, phase: Phase) -> SecureAggregation:
        """The attempt a secure-aggregation message belongs to (its envelope checked)."""
        check_envelope(self._at(), env, stage, phase)
        if self.aggregation is None:
            raise OutOfPhase(f"no secure aggregation in progress at {self.describe()}")
        return self.aggregation

    def _setup(self, env: Envelope, stage: Stage) -> GroupSetup:
        """The group-key setup run a setup message belongs to (its envelope checked)."""
        check_setup_envelope(self._at(), env, stage, self.setup_generation)
        return self._group()

    def _group(self) -> GroupSetup:
        """The silo group (GCFL's similarity needs its CKKS public context)."""
        if self.group_setup is None:
            raise OutOfPhase(f"no silo group key at {self.describe()}")
        return self.group_setup

    def _similarity(self, env: Envelope, stage: Stage) -> SimilarityStep:
        """The GCFL split a similarity message belongs to (its envelope checked)."""
        check_similarity_envelope(self._at(), env, stage)
        if self.similarity is None:
            raise OutOfPhase(f"no cluster split in progress at {self.describe()}")
        return self.similarity

    def _clusters(self) -> ClusteredStrategy:
        """The clustering strategy, for a similarity step (which only a clustered one opens)."""
        if self.clusters is None:
            raise TypeError(f"{self.strategy.name} does not cluster silos")
        return self.clusters

    def _state_of(self, silo: str) -> np.ndarray | None:
        if self.clusters is not None:
            return self.clusters.state_for(silo)
        return self.global_state
