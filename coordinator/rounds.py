"""The coordinator's round machine: pure logic, fed by the gRPC service or the simulator.

It sequences the stages of coordinator/stages/, one module per sub-protocol: the silo group key
(group_key: SETUP_ADVERTISE -> SETUP_SEAL -> SETUP_OPEN) once before round 1 if the algorithm
needs it; per round attempt, secure aggregation with dropout recovery (Bonawitz et al. 2017;
secure_aggregation: ADVERTISE -> SHARE -> INPUT -> CONSISTENCY -> UNMASK) -> aggregate ->
strategy; for a GCFL split, the CKKS similarity (similarity: SIMILARITY -> DECRYPT); then the
next round, or the final reports. A stage handler checks and takes in a silo's message and says
where its sub-protocol goes; this machine alone moves the federation on, opens, aborts (fewer
than the threshold at any stage: the round is retried with the silos still present) and
completes rounds, and keeps the history. Time is passed in; every input returns the events it
caused, which the caller turns into audit records and progress lines.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np

from trellis.coordinator.errors import Duplicate, InvalidPayload, NotParticipant, OutOfPhase
from trellis.coordinator.secagg_groups import SecAggGroups
from trellis.coordinator.stages.base import Event, Position, RoundRecord, Stage, Step
from trellis.coordinator.stages.group_key import SETUP_STAGES, GroupSetup, check_setup_envelope
from trellis.coordinator.stages.secure_aggregation import (
    SECURE_STAGES,
    STATISTICS,
    Aggregate,
    Rules,
    SecureAggregation,
    check_envelope,
)
from trellis.coordinator.stages.similarity import (
    CLUSTERING_STAGES,
    SimilarityStep,
    check_similarity_envelope,
    cluster_events,
)
from trellis.coordinator.strategies import ClusteredStrategy, Strategy
from trellis.crypto.envelopes import sealed_size
from trellis.crypto.fixedpoint import FixedPointSpec
from trellis.crypto.keyagreement import RoundContext
from trellis.crypto.secagg import RevealedShare, SecAggConfig
from trellis.protos.messages import (
    Envelope,
    Instruction,
    KeyAdvertisement,
    KeyBundle,
    MetricsReport,
    Phase,
    SealedShares,
    SignedSurvivors,
    UnmaskInstruction,
)
from trellis.protos.plan import Plan

__all__ = ["CLUSTERING_STAGES", "SECURE_STAGES", "SETUP_STAGES", "STATISTICS", "Event",
           "GroupSetup", "RoundMachine", "RoundRecord", "SimilarityStep", "Stage",
           "per_silo_final_metrics"]


class RoundMachine:
    """Drives rounds for one federation; holds only what secure aggregation lets it see."""

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
        self.run_id = run_id        # told to silos on joining: their saved state must match it
        agg = plan.public.aggregation
        self.spec = FixedPointSpec(agg.clip, agg.fraction_bits, agg.ring_bits,
                                   agg.max_sample_count)
        self.secagg_config = SecAggConfig(agg.threshold, agg.neighbours, plan.public.seed)
        self.present: dict[str, bytes] = {}      # silo -> certificate PEM
        self.stage = Stage.WAITING
        self.round = start_round
        # A coordinator restarted in the middle of a round numbers its attempts after those it
        # opened before: a silo still holding an old attempt's keys and state then sees a new
        # attempt and starts it from its pre-round snapshot. Only this run's attempts count
        # towards max_attempts.
        self.attempt = attempts_before
        self._attempt_base = attempts_before
        self.aggregation: SecureAggregation | None = None    # the attempt in progress
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
                            strategy.clustered, agg.unweighted_sum, self.envelope_bytes)
        if start_round > plan.public.rounds:
            self.stage = Stage.FINISHING
            self.deadline = now + plan.timeouts.report_s

    # -- queries ------------------------------------------------------------------------------
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
        return RoundContext(self.plan.federation, self.round, self.attempt)

    def describe(self) -> str:
        """Human-readable position."""
        return self._at().describe()

    def instruction(self, silo: str) -> Instruction:
        """What this silo should do now."""
        total = self.plan.public.rounds
        attempt, setup, step = self.aggregation, self.group_setup, self.similarity
        if self.stage in SECURE_STAGES and attempt is not None:
            instruction = attempt.instruction(silo, total)
            if instruction is not None:
                return instruction
        if (self.stage in SETUP_STAGES and setup is not None
                and silo in setup.waiting_for(self.stage)):
            return setup.instruction(self.plan.federation, self.setup_generation, self.stage,
                                     total)
        if (self.stage in CLUSTERING_STAGES and step is not None
                and silo in step.waiting_for(self.stage)):
            return step.instruction(self._at(), silo, setup.silos if setup else (), total)
        if self.stage in (Stage.FINISHING, Stage.DONE):
            return Instruction(Envelope(self.plan.federation, self.final_round,
                                        self.attempt, Phase.FINISHED), total_rounds=total)
        if self.stage is Stage.FAILED:
            return Instruction(self.envelope(Phase.ROUND_ABORTED), message=self.failure,
                               total_rounds=total)
        waiting = (f"waiting for silos ({len(self.present)} present, "
                   f"{self.plan.min_silos} needed)" if self.stage is Stage.WAITING
                   else "waiting for the next round")
        return Instruction(self.envelope(Phase.WAITING), message=waiting, total_rounds=total)

    def waiting_for(self) -> set[str]:
        """Silos the current stage still waits for (any kind of stage)."""
        if self.stage in SECURE_STAGES and self.aggregation is not None:
            return self.aggregation.waiting_for()
        if self.stage in SETUP_STAGES and self.group_setup is not None:
            return self.group_setup.waiting_for(self.stage)
        if self.stage in CLUSTERING_STAGES and self.similarity is not None:
            return self.similarity.waiting_for(self.stage)
        return set()

    def state_for(self, silo: str, env: Envelope) -> np.ndarray | None:
        """The current global shared state (None before the first aggregate)."""
        if silo not in self.present:
            raise NotParticipant(f"{silo} has not joined")
        if env.federation != self.plan.federation:
            raise OutOfPhase(f"federation {env.federation!r} is not {self.plan.federation!r}")
        if self.stage is Stage.FINISHING or self.stage is Stage.DONE:
            return self._state_of(silo)
        if env.round != self.round or env.attempt != self.attempt or self.stage not in (
            SECURE_STAGES
        ):
            raise OutOfPhase(f"state asked for round {env.round} attempt {env.attempt}; "
                             f"coordinator is at {self.describe()}")
        return self._state_of(silo)

    def pool_for(self, silo: str, env: Envelope) -> list[bytes]:
        """The other silos' latest sealed envelopes, shuffled so no position names a sender."""
        self.state_for(silo, env)      # the same checks as fetching the state
        pool = [e for s, e in self.envelopes.items() if s != silo]
        random.SystemRandom().shuffle(pool)
        return pool

    @property
    def final_round(self) -> int:
        """The round the federation ends with: the plan's last, or the last run if it stopped
        early."""
        if self.stage in (Stage.FINISHING, Stage.DONE) and self.history:
            return self.history[-1].round
        return self.plan.public.rounds

    @property
    def envelope_bytes(self) -> int:
        """The length every sealed coefficient envelope must have (0: none are exchanged)."""
        if not self.strategy.exchanges_envelopes:
            return 0
        hetero = self.plan.public.hetero
        return sealed_size(hetero.coefficient_slots, 4 * hetero.bases)

    # -- restarts -----------------------------------------------------------------------------
    @property
    def completed_history(self) -> list[RoundRecord]:
        """The rounds whose strategy step is over (a GCFL round waiting for its similarity
        matrix is recorded already, but a restart must run it again)."""
        if self.stage in CLUSTERING_STAGES and self.history:
            return self.history[:-1]
        return self.history

    def durable_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """What a restarted coordinator needs beyond the rounds and the global state: the silo
        group once its key exists (members, leader, CKKS public context), the silos' latest
        sealed envelopes and the strategy's own state. Nothing in it is secret to the
        coordinator: it held all of it already."""
        doc: dict[str, Any] = {}
        arrays: dict[str, np.ndarray] = {}
        setup = self.group_setup
        if setup is not None and setup.complete:
            doc["group"], group_arrays = setup.durable_state()
            arrays |= {f"group/{k}": v for k, v in group_arrays.items()}
        doc["envelopes"] = sorted(self.envelopes)
        arrays |= {f"envelope/{i}": np.frombuffer(self.envelopes[s], np.uint8)
                   for i, s in enumerate(doc["envelopes"])}
        strategy_doc, strategy_arrays = self.strategy.durable_state()
        doc["strategy"] = strategy_doc
        arrays |= {f"strategy/{k}": v for k, v in strategy_arrays.items()}
        return doc, arrays

    def restore_durable_state(self, doc: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                              setup_generation: int, now: float) -> None:
        """Take back `durable_state` after a restart (before any silo attends)."""
        self.setup_generation = setup_generation
        group = doc.get("group")
        if group is not None:
            self.group_setup = GroupSetup.restore(group, arrays["group/public_context"])
        self.envelopes = {str(s): arrays[f"envelope/{i}"].tobytes()
                          for i, s in enumerate(doc.get("envelopes", []))}
        prefix = "strategy/"
        self.strategy.restore_durable_state(
            doc.get("strategy", {}),
            {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)})
        if (self.stage is Stage.WAITING and self.history and self.strategy.stops_early
                and self.strategy.should_stop(self.history)):
            # Stopped early before the restart: only the final reports are left.
            self.stage = Stage.FINISHING
            self.deadline = now + self.plan.timeouts.report_s

    # -- presence, reports and deadlines --------------------------------------------------------
    def join(self, silo: str, certificate_pem: bytes, now: float) -> list[Event]:
        """An admitted silo attends (or re-attends after a reconnect)."""
        if silo not in self.plan.silos:
            raise NotParticipant(f"{silo} is not admitted by the plan")
        self.present[silo] = certificate_pem
        events = [Event("silo_joined", {"silo": silo, "present": len(self.present)})]
        self.version += 1
        if self.stage is Stage.WAITING and len(self.present) == len(self.plan.silos):
            events += self._start(now)
        return events

    def leave(self, silo: str, now: float) -> list[Event]:
        """A silo's control stream ended: it is gone until it attends again."""
        if self.present.pop(silo, None) is None:
            return []
        events = [Event("silo_left", {"silo": silo, "present": len(self.present)})]
        self.version += 1
        attempt = self.aggregation
        if self.stage in SECURE_STAGES and attempt is not None and (
                silo in attempt.participants):
            # A reconnecting process has lost its keys: it is out of this attempt for good.
            attempt.drop(silo)
            events += self._advance(attempt, now)
        return events + self._done_if_reported()

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
        return events + self._done_if_reported()

    def tick(self, now: float) -> list[Event]:
        """Handle deadlines: joining, silent silos in a stage, final reports."""
        if now < self.deadline or self.finished:
            return []
        if self.stage is Stage.WAITING:
            if len(self.present) >= self.plan.min_silos:
                return self._start(now)
            return self._fail(f"only {len(self.present)} of the {self.plan.min_silos} silos "
                              f"needed were present after {self.plan.timeouts.join_s:g} s")
        attempt = self.aggregation
        if self.stage in SECURE_STAGES and attempt is not None:
            return attempt.expire() + self._advance(attempt, now, deadline_passed=True)
        if self.stage in SETUP_STAGES:
            return self._fail(f"silo group key setup did not complete in stage "
                              f"{self.stage.value}; silent: {sorted(self.waiting_for())}")
        if self.stage in CLUSTERING_STAGES:
            silent = sorted(self.waiting_for())
            self.similarity = None
            return [Event("split_skipped", {"round": self.round,
                                            "reason": f"silent silos {silent}"})] + (
                self._round_done(now))
        if self.stage is Stage.FINISHING:
            self.stage = Stage.DONE
            self.version += 1
            return [Event("federation_done", {"rounds": self.final_round,
                                              "note": "some final reports missing"})]
        return []

    # -- secure aggregation (stages/secure_aggregation.py) --------------------------------------
    def advertise(self, silo: str, advert: KeyAdvertisement, now: float) -> list[Event]:
        """A participant's signed keys for this attempt (signatures are checked by its peers)."""
        attempt = self._attempt(advert.envelope, Stage.ADVERTISE, Phase.ADVERTISE_KEY)
        events = attempt.advertise(silo, advert, self.present.get(silo, b""))
        self.shared_length = attempt.shared_length
        return events + self._advance(attempt, now)

    def key_bundle(self, silo: str, env: Envelope) -> KeyBundle:
        """The adverts of every silo that advertised keys in this attempt (U1)."""
        return self._attempt(env, Stage.SHARE, Phase.KEYS_READY).key_bundle(silo)

    def upload_shares(self, silo: str, sealed: SealedShares, now: float) -> list[Event]:
        """A silo's sealed key shares, one per other holder (opaque to the coordinator)."""
        attempt = self._attempt(sealed.envelope, Stage.SHARE, Phase.SHARE_KEYS)
        return attempt.upload_shares(silo, sealed) + self._advance(attempt, now)

    def shares_for(self, silo: str, env: Envelope) -> SealedShares:
        """The sealed shares addressed to this silo by the silos that shared keys (U2)."""
        return self._attempt(env, Stage.INPUT, Phase.SHARES_READY).shares_for(silo)

    def sealed_envelope(self, silo: str, env: Envelope, envelope: bytes,
                        now: float) -> list[Event]:
        """FedHGN: a silo's sealed coefficient envelope, sent just before its masked input."""
        return self._attempt(env, Stage.INPUT, Phase.MASKED_INPUT).sealed_envelope(silo,
                                                                                   envelope)

    def masked_input(self, silo: str, env: Envelope, vector: np.ndarray, now: float,
                     statistics: Mapping[str, float] | None = None) -> list[Event]:
        """A silo's masked vector (and, for GCFL, its plain update norms: a documented leak)."""
        attempt = self._attempt(env, Stage.INPUT, Phase.MASKED_INPUT)
        return attempt.masked_input(silo, vector, statistics) + self._advance(attempt, now)

    def sign_survivors(self, silo: str, signed: SignedSurvivors, now: float) -> list[Event]:
        """A survivor's signature over the survivor list (checked against its certificate)."""
        attempt = self._attempt(signed.envelope, Stage.CONSISTENCY, Phase.SIGN_SURVIVORS)
        return attempt.sign_survivors(silo, signed) + self._advance(attempt, now)

    def unmask_request(self, silo: str, env: Envelope) -> UnmaskInstruction:
        """What this silo must reveal, with the survivors' consistency signatures."""
        return self._attempt(env, Stage.UNMASK, Phase.UNMASK).unmask_request(silo)

    def reveal_shares(self, silo: str, env: Envelope, shares: tuple[RevealedShare, ...],
                      now: float) -> list[Event]:
        """A silo's revealed shares; the last needed ones trigger unmasking and aggregation."""
        attempt = self._attempt(env, Stage.UNMASK, Phase.REVEAL_SHARES)
        return attempt.reveal_shares(silo, shares) + self._advance(attempt, now)

    # -- silo group key, relayed blind (stages/group_key.py) ------------------------------------
    def setup_advert(self, silo: str, env: Envelope, advert: bytes, now: float) -> list[Event]:
        """A silo's signed setup key (crypto/groupkey.py), relayed to the leader unread."""
        return self._after_setup(self._setup(env, Stage.SETUP_ADVERTISE).add_advert(silo, advert),
                                 now)

    def setup_bundle(self, silo: str, env: Envelope) -> dict[str, tuple[bytes, bytes]]:
        """For the leader: every silo's setup advert with its certificate."""
        return self._setup(env, Stage.SETUP_SEAL).bundle(silo, self.present)

    def setup_seal(self, silo: str, env: Envelope, boxes: Mapping[str, bytes],
                   public_context: bytes, now: float) -> list[Event]:
        """The leader's sealed boxes (one per peer) and the CKKS public context."""
        setup = self._setup(env, Stage.SETUP_SEAL)
        step = setup.seal(silo, boxes, public_context, needs_ckks=self.strategy.needs_ckks)
        return self._after_setup(step, now)

    def setup_box(self, silo: str, env: Envelope) -> tuple[bytes, bytes, bytes]:
        """For a peer: its sealed box, the leader's advert and the leader's certificate."""
        return self._setup(env, Stage.SETUP_OPEN).box(silo, self.present)

    def setup_opened(self, silo: str, env: Envelope, now: float) -> list[Event]:
        """A peer opened its box; when all have, the first round opens."""
        return self._after_setup(self._setup(env, Stage.SETUP_OPEN).open(silo), now)

    # -- GCFL similarity under CKKS (stages/similarity.py) --------------------------------------
    def encrypted_update(self, silo: str, env: Envelope, chunks: list[bytes],
                         now: float) -> list[Event]:
        """A member's CKKS-encrypted normalised update (unreadable without the group key)."""
        step = self._similarity(env, Stage.SIMILARITY)
        return self._after_similarity(step.encrypted_update(
            self.round, silo, chunks, self._group().public_context, self.present), now)

    def decrypt_request(self, silo: str, env: Envelope) -> dict[tuple[str, str], bytes]:
        """For the decrypting silo: the blinded inner products."""
        return self._similarity(env, Stage.DECRYPT).decrypt_request(silo)

    def decrypted(self, silo: str, env: Envelope, values: Mapping[tuple[str, str], float],
                  now: float) -> list[Event]:
        """The decrypted blinded values: unblind, cut each cluster, finish the round."""
        step = self._similarity(env, Stage.DECRYPT)
        return self._after_similarity(step.decrypted(self.round, silo, values,
                                                     self._clusters()), now)

    # -- sequencing -----------------------------------------------------------------------------
    def _at(self) -> Position:
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
        self.attempt += 1
        ranked = tuple(sorted(participants))
        self.aggregation = SecureAggregation(self.context(), ranked, self.strategy.groups(ranked),
                                             self._rules, self.shared_length)
        self.stage = Stage.ADVERTISE
        self.deadline = now + self.plan.timeouts.stage_s
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
            return closing.events + self._abort(closing.abort, attempt.late, now)
        if closing.aggregate is not None:
            return closing.events + self._complete(closing.aggregate, now)
        return closing.events

    def _abort(self, reason: str, late: set[str], now: float) -> list[Event]:
        events = [Event("round_aborted", {"round": self.round, "attempt": self.attempt,
                                          "reason": reason})]
        self.aggregation = None                 # whatever it held is useless now
        tried = self.attempt - self._attempt_base
        if tried >= self.plan.timeouts.max_attempts:
            return events + self._fail(f"round {self.round} failed {tried} attempts; "
                                       f"last: {reason}")
        # Silos that missed a deadline sit out the retry; they may attend the next round.
        eligible = set(self.present) - late
        if len(eligible) >= max(self.plan.min_silos, self.secagg_config.threshold):
            return events + self._open_round(now, eligible)
        self.stage = Stage.WAITING
        self.deadline = now + self.plan.timeouts.join_s
        self.version += 1
        return events

    def _complete(self, aggregate: Aggregate, now: float) -> list[Event]:
        """The attempt's aggregate is in: the strategy's step, then the similarity or the end."""
        self.aggregation = None
        self.envelopes.update(aggregate.envelopes)
        events: list[Event] = []
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

    def _after_similarity(self, step: Step, now: float) -> list[Event]:
        """Follow a similarity handler: decrypting next, or the round is over."""
        if step.enter is not None:
            self._enter(step.enter, now, self.plan.timeouts.stage_s)
        if not step.finished:
            return step.events
        self.similarity = None
        return step.events + self._round_done(now)

    def _round_done(self, now: float) -> list[Event]:
        """The round's strategy step is over: report it and open the next round (or finish)."""
        record = self.history[-1]
        if self.clusters is not None:
            self.clusters.close_round(self.round)
        events = [Event("round_completed", {"round": self.round, "attempt": self.attempt,
                                            "participants": list(record.participants),
                                            "dropped": list(record.dropped),
                                            "total_weight": record.total_weight,
                                            "seconds": round(now - self.round_started, 3)})]
        stop_early = self.strategy.stops_early and self.strategy.should_stop(self.history)
        if self.round >= self.plan.public.rounds or stop_early:
            self.stage = Stage.FINISHING
            self.deadline = now + self.plan.timeouts.report_s
            self.version += 1
            extra = {"early_stop": True} if stop_early else {}
            return events + [Event("finishing", {"rounds": self.round, **extra})]
        self.round += 1
        self.attempt = self._attempt_base = 0
        if len(self.present) < max(self.plan.min_silos, self.secagg_config.threshold):
            self.stage = Stage.WAITING
            self.deadline = now + self.plan.timeouts.join_s
            return events
        return events + self._open_round(now, set(self.present))

    def _done_if_reported(self) -> list[Event]:
        """End the federation once every last-round participant still here has reported."""
        if self.stage is not Stage.FINISHING or not self.history:
            return []
        record = self.history[-1]
        waiting = (set(record.participants) & set(self.present)) - set(record.metrics)
        if waiting:
            return []
        self.stage = Stage.DONE
        self.version += 1
        missing = sorted(set(record.participants) - set(record.metrics))
        return [Event("federation_done", {"rounds": record.round,
                                          **({"unreported": missing} if missing else {})})]

    def _fail(self, reason: str) -> list[Event]:
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
        if self.clusters is None:
            raise OutOfPhase(f"{self.strategy.name} does not cluster silos")
        return self.clusters

    def _state_of(self, silo: str) -> np.ndarray | None:
        if self.clusters is not None:
            return self.clusters.state_for(silo)
        return self.global_state


def per_silo_final_metrics(history: list[RoundRecord]) -> Mapping[str, dict[str, float]]:
    """The last metrics each silo reported."""
    latest: dict[str, dict[str, float]] = {}
    for record in history:
        latest.update(record.metrics)
    return latest
