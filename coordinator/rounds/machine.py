"""The coordinator's round machine: pure logic, fed by the gRPC service or the simulator.

It sequences the stages of coordinator/rounds/stages/, one module per sub-protocol, each with its
own typed state and handlers: the silo group key (group_key: SETUP_ADVERTISE -> SETUP_SEAL ->
SETUP_OPEN) once before round 1 if the algorithm needs it; per round attempt, secure aggregation
with dropout recovery (Bonawitz et al. 2017; secure_aggregation: ADVERTISE -> SHARE -> INPUT ->
CONSISTENCY -> UNMASK) -> aggregate -> strategy, or, when the algorithm aggregates nothing
(`local`), only training (training: TRAIN, each silo's metrics report is its answer); for a GCFL
split, the CKKS similarity (similarity: SIMILARITY -> DECRYPT); then the next round, or the final
reports. Here are the
machine's inputs and queries: each silo message is checked against the machine's position and
handed to the stage it belongs to, whose answer the machine follows (stages/sequencer.py holds
the machine's state and its moves: opening, aborting and completing rounds). Time is passed in;
every input returns the events it caused, which the caller turns into audit records and
progress lines.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from trellis.coordinator.rounds.errors import Duplicate, InvalidPayload, NotParticipant, OutOfPhase
from trellis.coordinator.rounds.stages.base import Event, RoundRecord, Stage
from trellis.coordinator.rounds.stages.group_key import SETUP_STAGES, GroupSetup
from trellis.coordinator.rounds.stages.secure_aggregation import SECURE_STAGES, STATISTICS
from trellis.coordinator.rounds.stages.sequencer import Sequencer
from trellis.coordinator.rounds.stages.similarity import CLUSTERING_STAGES, SimilarityStep
from trellis.coordinator.rounds.stages.training import TRAINING_STAGES
from trellis.crypto.secagg import RevealedShare
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

__all__ = ["CLUSTERING_STAGES", "SECURE_STAGES", "SETUP_STAGES", "STATISTICS",
           "TRAINING_STAGES", "Event",
           "GroupSetup", "RoundMachine", "RoundRecord", "SimilarityStep", "Stage",
           "per_silo_final_metrics"]


class RoundMachine(Sequencer):
    """Drives rounds for one federation; holds only what secure aggregation lets it see."""

    # -- queries ------------------------------------------------------------------------------
    def instruction(self, silo: str) -> Instruction:
        """What this silo should do now."""
        total = self.total_rounds
        attempt, setup, step = self.aggregation, self.group_setup, self.similarity
        if self.stage in SECURE_STAGES and attempt is not None:
            instruction = attempt.instruction(silo, total)
            if instruction is not None:
                return instruction
        if self.stage in TRAINING_STAGES and self.training is not None:
            instruction = self.training.instruction(self._at(), silo, total)
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
        if self.stage in TRAINING_STAGES and self.training is not None:
            return self.training.waiting_for()
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
        if env.round != self.round or env.attempt != self.attempt or (
                self.stage not in SECURE_STAGES and self.stage not in TRAINING_STAGES):
            raise OutOfPhase(f"state asked for round {env.round} attempt {env.attempt}; "
                             f"coordinator is at {self.describe()}")
        return self._state_of(silo)

    def pool_for(self, silo: str, env: Envelope) -> list[bytes]:
        """The other silos' latest sealed envelopes, shuffled so no position names a sender."""
        self.state_for(silo, env)      # the same checks as fetching the state
        pool = [e for s, e in self.envelopes.items() if s != silo]
        random.SystemRandom().shuffle(pool)
        return pool

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
        if silo not in self.expected:
            raise NotParticipant(f"{silo} did not approve this job: it takes no part in it")
        self.present[silo] = certificate_pem
        events = [Event("silo_joined", {"silo": silo, "present": len(self.present)})]
        self.version += 1
        if self.stage is Stage.WAITING and self.expected <= set(self.present):
            events += self._start(now)
        return events

    def stop(self, reason: str) -> list[Event]:
        """End the federation here, unfinished (an operator stopped its job)."""
        if self.finished:
            return []
        return self._fail(reason)

    def expect_only(self, silos: Iterable[str]) -> None:
        """Take part with these of the plan's silos only (a job's approvers), before any joins."""
        chosen = frozenset(silos)
        if not chosen or not chosen <= set(self.plan.silos):
            raise ValueError(f"participants {sorted(chosen)} must be some of the plan's silos")
        self.expected = chosen

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
        training = self.training
        if self.stage in TRAINING_STAGES and training is not None:
            training.drop(silo)
            events += self._trained(training, now)
        return events + self._done_if_reported()

    def report(self, silo: str, report: MetricsReport, now: float) -> list[Event]:
        """Metrics a silo chose to report for a completed round."""
        env = report.envelope
        if silo not in self.present:
            raise NotParticipant(f"{silo} has not joined")
        if env.federation != self.plan.federation or env.phase is not Phase.REPORT:
            raise OutOfPhase(f"metrics must carry phase REPORT of {self.plan.federation}")
        if self.sums_metrics:
            raise InvalidPayload(f"{silo} sent its own metrics, but this plan sums them inside "
                                 "the masked vectors ([metrics] aggregate = true): a silo's "
                                 "report is refused and not recorded")
        training = self.training
        if (self.stage in TRAINING_STAGES and training is not None
                and env.round == self.round):
            if env.attempt != self.attempt:
                raise OutOfPhase(f"the report of {silo} answers attempt {env.attempt}; "
                                 f"round {self.round} is at attempt {self.attempt}")
            return training.trained(env.round, silo, report.metrics) + self._trained(training,
                                                                                     now)
        record = next((r for r in self.history if r.round == env.round), None)
        if record is None:
            raise OutOfPhase(f"round {env.round} has not completed; cannot report on it")
        if silo not in record.participants:
            # E.g. a silo restarted after the round left it out: its figures describe a round
            # its input was not in, and would pass for the federation's (final_metrics).
            raise NotParticipant(f"{silo} did not take part in round {env.round}; its "
                                 "metrics for that round are not recorded")
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
        training = self.training
        if self.stage in TRAINING_STAGES and training is not None:
            return training.expire(self.round, self.attempt) + self._trained(training, now)
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
        attempt = self._attempt(env, Stage.INPUT, Phase.MASKED_INPUT)
        return attempt.sealed_envelope(silo, envelope)

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
        """What this silo must reveal, with the survivors' consistency signatures (also when
        its attempt was unmasked without it: stages/late_reveals.py)."""
        late = self.unmasked
        if late is not None and env.phase is Phase.UNMASK and late.expects(silo, env):
            return late.unmask_request(silo)
        return self._attempt(env, Stage.UNMASK, Phase.UNMASK).unmask_request(silo)

    def reveal_shares(self, silo: str, env: Envelope, shares: tuple[RevealedShare, ...],
                      now: float) -> list[Event]:
        """A silo's revealed shares; the last needed ones trigger unmasking and aggregation.
        Those that come after unmasking closed are late: recorded, not refused."""
        late = self.unmasked
        if late is not None and env.phase is Phase.REVEAL_SHARES and late.expects(silo, env):
            return late.reveal(silo, shares)
        attempt = self._attempt(env, Stage.UNMASK, Phase.REVEAL_SHARES)
        return attempt.reveal_shares(silo, shares) + self._advance(attempt, now)

    # -- silo group key, relayed blind (stages/group_key.py) ------------------------------------
    def setup_advert(self, silo: str, env: Envelope, advert: bytes, now: float) -> list[Event]:
        """A silo's signed setup key (crypto/groupkey.py), relayed to the leader unread."""
        setup = self._setup(env, Stage.SETUP_ADVERTISE)
        return self._after_setup(setup.add_advert(silo, advert), now)

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


def per_silo_final_metrics(history: list[RoundRecord]) -> Mapping[str, dict[str, float]]:
    """The last metrics each silo reported, in silo-name order: means over silos then add up in
    the same order however the reports arrived (the Ray engine's and a real federation's silos
    report concurrently), so they agree to the last bit."""
    latest: dict[str, dict[str, float]] = {}
    for record in history:
        latest.update(record.metrics)
    return dict(sorted(latest.items()))
