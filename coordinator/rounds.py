"""The coordinator's round state machine: pure logic, fed by the gRPC service or the simulator.

Per round attempt it runs the stages of secure aggregation with dropout recovery (Bonawitz et
al. 2017; crypto/secagg.py): ADVERTISE (silos fetch the state and advertise signed keys) ->
SHARE (silos fetch the adverts, send sealed key shares, then train) -> INPUT (silos fetch their
shares and upload masked vectors) -> CONSISTENCY (survivors sign the survivor list) -> UNMASK
(they reveal shares) -> aggregate -> strategy -> next round. A stage closes as soon as every
silo it waits for has answered or vanished, or at its deadline; silos that drop are recovered
from. Fewer than the threshold at any stage aborts the attempt, and the round is retried with
the silos still present. Time is passed in; every input returns the events it caused, which the
caller turns into audit records and progress lines.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trellis.coordinator.errors import Duplicate, InvalidPayload, NotParticipant, OutOfPhase
from trellis.coordinator.secagg_groups import SecAggGroups
from trellis.coordinator.strategies import AggregateResult, ClusteredStrategy, Strategy
from trellis.crypto import ckks
from trellis.crypto.envelopes import sealed_size
from trellis.crypto.errors import EncodingError, ProtocolError
from trellis.crypto.fixedpoint import FixedPointSpec
from trellis.crypto.groupkey import SETUP_ROUND, leader_of
from trellis.crypto.keyagreement import KeyAdvert, RoundContext
from trellis.crypto.secagg import RevealedShare, SecAggConfig, TooFewSurvivors
from trellis.crypto.secagg_server import SecAggServer, ServerStage
from trellis.protos.algorithms import MIN_SPLIT_SIZE
from trellis.protos.messages import (
    Envelope,
    Instruction,
    KeyAdvertisement,
    KeyBundle,
    MetricsReport,
    Phase,
    SealedShares,
    SignedKey,
    SignedSurvivors,
    UnmaskInstruction,
)
from trellis.protos.plan import Plan, default_threshold


class Stage(enum.Enum):
    """Where the federation is."""

    WAITING = "waiting"
    ADVERTISE = "advertise"
    SHARE = "share"
    INPUT = "input"
    CONSISTENCY = "consistency"
    UNMASK = "unmask"
    SETUP_ADVERTISE = "setup-advertise"   # silo group key: signed setup keys
    SETUP_SEAL = "setup-seal"             # the leader seals the group secrets for each peer
    SETUP_OPEN = "setup-open"             # every peer opens its box
    SIMILARITY = "similarity"             # GCFL split: CKKS-encrypted normalised updates
    DECRYPT = "decrypt"                   # one silo decrypts blinded inner products
    FINISHING = "finishing"
    DONE = "done"
    FAILED = "failed"


_FROM_SERVER = {ServerStage.ADVERTISE: Stage.ADVERTISE, ServerStage.SHARE: Stage.SHARE,
                ServerStage.INPUT: Stage.INPUT, ServerStage.CONSISTENCY: Stage.CONSISTENCY,
                ServerStage.UNMASK: Stage.UNMASK}
# What the coordinator tells the silos a stage waits for, and the phase they answer with.
_INSTRUCTS = {Stage.ADVERTISE: Phase.ROUND_OPEN, Stage.SHARE: Phase.KEYS_READY,
              Stage.INPUT: Phase.SHARES_READY, Stage.CONSISTENCY: Phase.CONSISTENCY_CHECK,
              Stage.UNMASK: Phase.UNMASK}
SECURE_STAGES = tuple(_INSTRUCTS)
SETUP_STAGES = (Stage.SETUP_ADVERTISE, Stage.SETUP_SEAL, Stage.SETUP_OPEN)
CLUSTERING_STAGES = (Stage.SIMILARITY, Stage.DECRYPT)
_OTHER_INSTRUCTS = {Stage.SETUP_ADVERTISE: Phase.GROUP_SETUP, Stage.SETUP_SEAL: Phase.GROUP_SEAL,
                    Stage.SETUP_OPEN: Phase.GROUP_OPEN, Stage.SIMILARITY: Phase.ENCRYPT_UPDATE,
                    Stage.DECRYPT: Phase.DECRYPT_SIMILARITY}
STATISTICS = ("update_norm", "grad_norm")


@dataclass
class GroupSetup:
    """The relayed, opaque material of the silo group key (crypto/groupkey.py)."""

    silos: tuple[str, ...]
    leader: str
    adverts: dict[str, bytes] = field(default_factory=dict)
    boxes: dict[str, bytes] = field(default_factory=dict)
    opened: set[str] = field(default_factory=set)
    public_context: bytes = b""      # CKKS evaluation keys, never the secret key


@dataclass
class SimilarityStep:
    """A GCFL split in progress: encrypted updates in, blinded inner products out."""

    clusters: list[tuple[str, ...]]
    ciphertexts: dict[str, list[bytes]] = field(default_factory=dict)
    blinded: dict[tuple[str, str], bytes] = field(default_factory=dict)
    offsets: dict[tuple[str, str], float] = field(default_factory=dict)
    decryptor: str = ""

    def members(self) -> set[str]:
        """Every silo asked for an encrypted update."""
        return {m for c in self.clusters for m in c}


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


class RoundMachine:
    """Drives rounds for one federation; holds only what secure aggregation lets it see."""

    def __init__(self, plan: Plan, strategy: Strategy, now: float, *, start_round: int = 1,
                 global_state: np.ndarray | None = None,
                 history: list[RoundRecord] | None = None, attempts_before: int = 0,
                 run_id: str = "") -> None:
        self.plan = plan
        self.strategy = strategy
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
        self.participants: tuple[str, ...] = ()
        self.secagg: SecAggGroups | None = None
        self.late: set[str] = set()               # missed a deadline in this attempt
        self.statistics: dict[str, dict[str, float]] = {}   # GCFL: this round's update norms
        self.group_setup: GroupSetup | None = None
        # Each group-key setup run has its own number: after a restart mid-setup the silos must
        # see a new run, not an instruction they already followed.
        self.setup_generation = 0
        self.similarity: SimilarityStep | None = None
        # FedHGN: each silo's latest sealed coefficient envelope (opaque, fixed size), and
        # those of the attempt in progress (kept only if the silo survives the round).
        self.envelopes: dict[str, bytes] = {}
        self.pending_envelopes: dict[str, bytes] = {}
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

    def context(self) -> RoundContext:
        """What this attempt's keys, shares and masks are bound to."""
        return RoundContext(self.plan.federation, self.round, self.attempt)

    def instruction(self, silo: str) -> Instruction:
        """What this silo should do now."""
        total = self.plan.public.rounds
        if self.stage in SECURE_STAGES and self.secagg is not None:
            server = self.secagg
            if silo in server.expected() and silo not in server.dropped:
                own = server.server_of(silo)
                listed = own.survivors if self.stage is Stage.CONSISTENCY else own.participants
                return Instruction(self.envelope(_INSTRUCTS[self.stage]), listed,
                                   total_rounds=total)
        if silo in self._other_waiting():
            listed = self.group_setup.silos if self.group_setup is not None else ()
            if self.stage is Stage.SIMILARITY and self.similarity is not None:
                listed = next(c for c in self.similarity.clusters if silo in c)
            phase = _OTHER_INSTRUCTS[self.stage]
            env = (Envelope(self.plan.federation, SETUP_ROUND, self.setup_generation, phase)
                   if self.stage in SETUP_STAGES else self.envelope(phase))
            return Instruction(env, listed, total_rounds=total)
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

    def key_bundle(self, silo: str, env: Envelope) -> KeyBundle:
        """The adverts of every silo that advertised keys in this attempt (U1)."""
        server = self._check(silo, env, Stage.SHARE, Phase.KEYS_READY, answering=False)
        keys = tuple(SignedKey(r.advert.silo, r.advert.cipher_key, r.advert.mask_key,
                               r.advert.signature, r.certificate_pem)
                     for r in server.relayed_adverts())
        return KeyBundle(self.envelope(Phase.KEYS_READY), keys)

    def shares_for(self, silo: str, env: Envelope) -> SealedShares:
        """The sealed shares addressed to this silo by the silos that shared keys (U2)."""
        server = self._check(silo, env, Stage.INPUT, Phase.SHARES_READY, answering=False)
        return SealedShares(self.envelope(Phase.SHARES_READY), tuple(server.shares_for(silo)))

    def unmask_request(self, silo: str, env: Envelope) -> UnmaskInstruction:
        """What this silo must reveal, with the survivors' consistency signatures."""
        server = self._check(silo, env, Stage.UNMASK, Phase.UNMASK, answering=False)
        return UnmaskInstruction(self.envelope(Phase.UNMASK), server.unmask_request(silo))

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

    def pool_for(self, silo: str, env: Envelope) -> list[bytes]:
        """The other silos' latest sealed envelopes, shuffled so no position names a sender."""
        self.state_for(silo, env)      # the same checks as fetching the state
        pool = [e for s, e in self.envelopes.items() if s != silo]
        random.SystemRandom().shuffle(pool)
        return pool

    def _state_of(self, silo: str) -> np.ndarray | None:
        if self.strategy.clustered:
            return self._clusters().state_for(silo)
        return self.global_state

    def describe(self) -> str:
        """Human-readable position."""
        return f"round {self.round} attempt {self.attempt} stage {self.stage.value}"

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
        if setup is not None and setup.opened == set(setup.silos):
            doc["group"] = {"silos": list(setup.silos), "leader": setup.leader}
            arrays["group/public_context"] = np.frombuffer(setup.public_context, np.uint8)
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
            silos = tuple(str(s) for s in group["silos"])
            self.group_setup = GroupSetup(silos, str(group["leader"]), opened=set(silos),
                                          public_context=arrays["group/public_context"]
                                          .tobytes())
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

    # -- inputs -------------------------------------------------------------------------------
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

    def _start(self, now: float) -> list[Event]:
        """Open the next round, after establishing the silo group key if the algorithm needs it."""
        if self.strategy.needs_group_key and self.group_setup is None:
            silos = tuple(sorted(self.present))
            self.group_setup = GroupSetup(silos, leader_of(silos))
            self.setup_generation += 1
            self.stage = Stage.SETUP_ADVERTISE
            self.deadline = now + self.plan.timeouts.stage_s
            self.version += 1
            return [Event("group_setup_started", {"silos": list(silos),
                                                  "leader": self.group_setup.leader,
                                                  "generation": self.setup_generation})]
        return self._open_round(now, set(self.present))

    def leave(self, silo: str, now: float) -> list[Event]:
        """A silo's control stream ended: it is gone until it attends again."""
        if self.present.pop(silo, None) is None:
            return []
        events = [Event("silo_left", {"silo": silo, "present": len(self.present)})]
        self.version += 1
        if self.stage in SECURE_STAGES and self.secagg is not None and (
                silo in self.participants):
            # A reconnecting process has lost its keys: it is out of this attempt for good.
            self.secagg.drop(silo)
            events += self._advance(now)
        return events + self._done_if_reported()

    def advertise(self, silo: str, advert: KeyAdvertisement, now: float) -> list[Event]:
        """A participant's signed keys for this attempt (signatures are checked by its peers)."""
        server = self._check(silo, advert.envelope, Stage.ADVERTISE, Phase.ADVERTISE_KEY)
        if self.shared_length is not None and advert.shared_length != self.shared_length:
            raise InvalidPayload(f"{silo} declares a shared vector of {advert.shared_length} "
                                 f"values; this federation uses {self.shared_length}")
        keys = KeyAdvert(silo, advert.cipher_key, advert.mask_key, advert.signature)
        self._apply(server.add_advert, silo, keys, self.present.get(silo, b""))
        if self.shared_length is None:
            self.shared_length = advert.shared_length
            assert self.secagg is not None
            self.secagg.length = self._upload_length()
        return [Event("key_advertised", {"silo": silo, "round": self.round,
                                         "attempt": self.attempt})] + self._advance(now)

    def upload_shares(self, silo: str, sealed: SealedShares, now: float) -> list[Event]:
        """A silo's sealed key shares, one per other holder (opaque to the coordinator)."""
        server = self._check(silo, sealed.envelope, Stage.SHARE, Phase.SHARE_KEYS)
        self._apply(server.add_shares, silo, sealed.shares)
        return [Event("shares_received", {"silo": silo, "round": self.round,
                                          "attempt": self.attempt,
                                          "count": len(sealed.shares)})] + self._advance(now)

    def sealed_envelope(self, silo: str, env: Envelope, envelope: bytes,
                        now: float) -> list[Event]:
        """FedHGN: a silo's sealed coefficient envelope, sent just before its masked input.

        Opaque and of the plan's fixed size; it joins the pool only if the silo survives the
        round. Re-sending within the attempt replaces it.
        """
        self._check(silo, env, Stage.INPUT, Phase.MASKED_INPUT)
        size = self.envelope_bytes
        if not size:
            raise InvalidPayload(f"{silo} sent a sealed envelope; "
                                 f"{self.plan.public.algorithm} exchanges none")
        if not isinstance(envelope, bytes) or len(envelope) != size:
            got = len(envelope) if isinstance(envelope, bytes) else type(envelope).__name__
            raise InvalidPayload(f"{silo}'s sealed envelope must be exactly {size} bytes "
                                 f"(set by fedhgn.coefficient_slots); got {got}")
        self.pending_envelopes[silo] = envelope
        return [Event("envelope_received", {"silo": silo, "round": self.round,
                                            "attempt": self.attempt, "bytes": len(envelope)})]

    def masked_input(self, silo: str, env: Envelope, vector: np.ndarray, now: float,
                     statistics: Mapping[str, float] | None = None) -> list[Event]:
        """A silo's masked vector (and, for GCFL, its plain update norms: a documented leak)."""
        server = self._check(silo, env, Stage.INPUT, Phase.MASKED_INPUT)
        stats = self._check_statistics(silo, statistics)
        if self.envelope_bytes and silo not in self.pending_envelopes:
            raise OutOfPhase(f"{silo} must send its sealed coefficient envelope before its "
                             "masked input")
        self._apply(server.add_masked_input, silo, vector)
        if stats:
            self.statistics[silo] = stats
        return [Event("masked_input", {"silo": silo, "round": self.round,
                                       "attempt": self.attempt, "values": int(vector.size)})
                ] + self._advance(now)

    def _check_statistics(self, silo: str, statistics: Mapping[str, float] | None
                          ) -> dict[str, float]:
        if not self.strategy.clustered:
            if statistics:
                raise InvalidPayload(f"{silo} sent update statistics; "
                                     f"{self.plan.public.algorithm} does not use any")
            return {}
        stats = dict(statistics or {})
        if set(stats) != set(STATISTICS):
            raise InvalidPayload(f"{silo} must send exactly the statistics "
                                 f"{', '.join(STATISTICS)}; got {sorted(stats) or 'none'}")
        bad = {k: v for k, v in stats.items() if not np.isfinite(v) or v < 0}
        if bad:
            raise InvalidPayload(f"{silo} sent invalid update statistics {bad}: norms must "
                                 "be finite and non-negative")
        return {k: float(v) for k, v in stats.items()}

    def sign_survivors(self, silo: str, signed: SignedSurvivors, now: float) -> list[Event]:
        """A survivor's signature over the survivor list (checked against its certificate)."""
        server = self._check(silo, signed.envelope, Stage.CONSISTENCY, Phase.SIGN_SURVIVORS)
        self._apply(server.add_signature, silo, signed.signature)
        return [Event("survivors_signed", {"silo": silo, "round": self.round,
                                           "attempt": self.attempt})] + self._advance(now)

    def reveal_shares(self, silo: str, env: Envelope, shares: tuple[RevealedShare, ...],
                      now: float) -> list[Event]:
        """A silo's revealed shares; the last needed ones trigger unmasking and aggregation."""
        server = self._check(silo, env, Stage.UNMASK, Phase.REVEAL_SHARES)
        self._apply(server.add_reveal, silo, shares)
        kinds = sorted({r.kind.value for r in shares})
        return [Event("shares_revealed", {"silo": silo, "round": self.round,
                                          "attempt": self.attempt, "count": len(shares),
                                          "kinds": kinds})] + self._advance(now)

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
        if self.stage in SECURE_STAGES and self.secagg is not None:
            late = sorted(self.secagg.waiting_for())
            for silo in late:
                self.secagg.drop(silo)
            self.late.update(late)
            events = [Event("deadline_passed", {"round": self.round, "attempt": self.attempt,
                                                "stage": self.stage.value, "silent": late})]
            return events + self._advance(now, deadline_passed=True)
        if self.stage in SETUP_STAGES:
            return self._fail(f"silo group key setup did not complete in stage "
                              f"{self.stage.value}; silent: {sorted(self._other_waiting())}")
        if self.stage in CLUSTERING_STAGES:
            silent = sorted(self._other_waiting())
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

    # -- silo group key (relayed blind) --------------------------------------------------------
    def setup_advert(self, silo: str, env: Envelope, advert: bytes, now: float) -> list[Event]:
        """A silo's signed setup key (crypto/groupkey.py), relayed to the leader unread."""
        setup = self._setup_check(silo, env, Stage.SETUP_ADVERTISE)
        if silo in setup.adverts:
            raise Duplicate(f"{silo} already sent its setup key")
        if not advert:
            raise InvalidPayload(f"{silo} sent an empty setup key")
        setup.adverts[silo] = advert
        events = [Event("setup_key", {"silo": silo})]
        if set(setup.adverts) == set(setup.silos):
            events += self._setup_next(Stage.SETUP_SEAL, now)
        return events

    def setup_bundle(self, silo: str, env: Envelope) -> dict[str, tuple[bytes, bytes]]:
        """For the leader: every silo's setup advert with its certificate."""
        setup = self._setup_check(silo, env, Stage.SETUP_SEAL)
        if silo != setup.leader:
            raise NotParticipant(f"{silo} is not the group-key leader ({setup.leader})")
        return {s: (a, self.present.get(s, b"")) for s, a in setup.adverts.items()}

    def setup_seal(self, silo: str, env: Envelope, boxes: Mapping[str, bytes],
                   public_context: bytes, now: float) -> list[Event]:
        """The leader's sealed boxes (one per peer) and the CKKS public context."""
        setup = self._setup_check(silo, env, Stage.SETUP_SEAL)
        if silo != setup.leader:
            raise NotParticipant(f"{silo} is not the group-key leader ({setup.leader})")
        peers = set(setup.silos) - {silo}
        if set(boxes) != peers:
            raise InvalidPayload(f"the leader must seal one box for each of {sorted(peers)}; "
                                 f"got {sorted(boxes)}")
        if self.strategy.needs_ckks:
            try:
                ckks.check_public_context(public_context)
            except ProtocolError as exc:
                raise InvalidPayload(f"CKKS context from {silo} refused: {exc}") from None
        setup.boxes, setup.public_context = dict(boxes), public_context
        setup.opened.add(silo)
        return [Event("group_sealed", {"leader": silo, "boxes": len(boxes),
                                       "context_bytes": len(public_context)})] + (
            self._setup_next(Stage.SETUP_OPEN, now))

    def setup_box(self, silo: str, env: Envelope) -> tuple[bytes, bytes, bytes]:
        """For a peer: its sealed box, the leader's advert and the leader's certificate."""
        setup = self._setup_check(silo, env, Stage.SETUP_OPEN)
        if silo not in setup.boxes:
            raise NotParticipant(f"no sealed group secrets for {silo}")
        return setup.boxes[silo], setup.adverts[setup.leader], self.present.get(setup.leader,
                                                                                b"")

    def setup_opened(self, silo: str, env: Envelope, now: float) -> list[Event]:
        """A peer opened its box; when all have, the first round opens."""
        setup = self._setup_check(silo, env, Stage.SETUP_OPEN)
        if silo in setup.opened:
            raise Duplicate(f"{silo} already opened its group secrets")
        setup.opened.add(silo)
        events = [Event("group_opened", {"silo": silo})]
        if setup.opened == set(setup.silos):
            self.version += 1
            events += [Event("group_ready", {"silos": list(setup.silos)})]
            events += self._open_round(now, set(self.present))
        return events

    def _check_other(self, env: Envelope, stage: Stage, *, same_round: bool) -> None:
        """A setup or similarity message must match the stage (and the round, if bound to one)."""
        in_round = not same_round or (env.round, env.attempt) == (self.round, self.attempt)
        if env.federation != self.plan.federation or not in_round or self.stage is not stage:
            raise OutOfPhase(f"{env.describe()} does not match the coordinator's "
                             f"{self.describe()}")
        if env.phase is not _OTHER_INSTRUCTS[stage]:
            raise OutOfPhase(f"expected phase {_OTHER_INSTRUCTS[stage].name}, got "
                             f"{env.phase.name}")

    def _setup_check(self, silo: str, env: Envelope, stage: Stage) -> GroupSetup:
        self._check_other(env, stage, same_round=False)
        if (env.round, env.attempt) != (SETUP_ROUND, self.setup_generation):
            raise OutOfPhase(f"{env.describe()} is not from group-key setup run "
                             f"{self.setup_generation}")
        setup = self.group_setup
        assert setup is not None
        if silo not in setup.silos:
            raise NotParticipant(f"{silo} is not part of the group-key setup")
        return setup

    def _setup_next(self, stage: Stage, now: float) -> list[Event]:
        self.stage = stage
        self.deadline = now + self.plan.timeouts.stage_s
        self.version += 1
        return [Event("stage_closed", {"round": 0, "stage": stage.value})]

    # -- GCFL similarity under CKKS --------------------------------------------------------------
    def _ask_similarity(self, clusters: list[tuple[str, ...]], now: float) -> list[Event]:
        present = [tuple(m for m in c if m in self.present) for c in clusters]
        self.similarity = SimilarityStep([c for c in present if len(c) >= 2])
        if not self.similarity.clusters:
            self.similarity = None
            return self._round_done(now)
        self.stage = Stage.SIMILARITY
        self.deadline = now + self.plan.timeouts.stage_s
        self.version += 1
        return [Event("similarity_requested", {"round": self.round,
                                               "clusters": [list(c) for c in
                                                            self.similarity.clusters]})]

    def encrypted_update(self, silo: str, env: Envelope, chunks: list[bytes],
                         now: float) -> list[Event]:
        """A member's CKKS-encrypted normalised update (unreadable without the group key)."""
        step = self._similarity_check(silo, env, Stage.SIMILARITY)
        if silo not in step.members():
            raise NotParticipant(f"{silo} is in no cluster being split")
        if silo in step.ciphertexts:
            raise Duplicate(f"{silo} already sent its encrypted update")
        if not chunks:
            raise InvalidPayload(f"{silo} sent an empty encrypted update")
        step.ciphertexts[silo] = list(chunks)
        events = [Event("encrypted_update", {"silo": silo, "round": self.round,
                                             "chunks": len(chunks)})]
        if step.members() <= set(step.ciphertexts):
            events += self._blind(now)
        return events

    def _blind(self, now: float) -> list[Event]:
        step = self.similarity
        setup = self.group_setup
        assert step is not None and setup is not None
        try:
            for cluster in step.clusters:
                blinded, offsets = ckks.blinded_inner_products(
                    setup.public_context, {m: step.ciphertexts[m] for m in cluster})
                step.blinded.update(blinded)
                step.offsets.update(offsets)
        except ProtocolError as exc:
            self.similarity = None
            return [Event("split_skipped", {"round": self.round, "reason": str(exc)})] + (
                self._round_done(now))
        step.ciphertexts.clear()
        step.decryptor = leader_of(self.present)
        self.stage = Stage.DECRYPT
        self.deadline = now + self.plan.timeouts.stage_s
        self.version += 1
        return [Event("stage_closed", {"round": self.round, "stage": Stage.SIMILARITY.value,
                                       "decryptor": step.decryptor})]

    def decrypt_request(self, silo: str, env: Envelope) -> dict[tuple[str, str], bytes]:
        """For the decrypting silo: the blinded inner products."""
        step = self._similarity_check(silo, env, Stage.DECRYPT)
        if silo != step.decryptor:
            raise NotParticipant(f"{silo} is not the decrypting silo ({step.decryptor})")
        return dict(step.blinded)

    def decrypted(self, silo: str, env: Envelope, values: Mapping[tuple[str, str], float],
                  now: float) -> list[Event]:
        """The decrypted blinded values: unblind, cut each cluster, finish the round."""
        step = self._similarity_check(silo, env, Stage.DECRYPT)
        if silo != step.decryptor:
            raise NotParticipant(f"{silo} is not the decrypting silo ({step.decryptor})")
        if set(values) != set(step.offsets):
            raise InvalidPayload(f"expected {len(step.offsets)} decrypted values for the "
                                 f"requested pairs, got {len(values)}")
        events: list[Event] = []
        try:
            for cluster in step.clusters:
                pairs = {p: v for p, v in values.items() if p[0] in cluster}
                matrix = ckks.similarity_matrix(list(cluster), pairs, step.offsets)
                self._clusters().apply_similarity(cluster, matrix)
        except (ProtocolError, ValueError) as exc:
            raise InvalidPayload(f"decrypted similarities refused: {exc}") from None
        events += [Event("clusters", {"round": self.round, **e})
                   for e in self._clusters().drain_events()]
        self.similarity = None
        return events + self._round_done(now)

    def _similarity_check(self, silo: str, env: Envelope, stage: Stage) -> SimilarityStep:
        self._check_other(env, stage, same_round=True)
        assert self.similarity is not None
        return self.similarity

    def _clusters(self) -> ClusteredStrategy:
        if not isinstance(self.strategy, ClusteredStrategy):
            raise TypeError(f"{self.strategy.name} does not cluster silos")
        return self.strategy

    def _other_waiting(self) -> set[str]:
        """Silos the setup or similarity stage still waits for."""
        setup, step = self.group_setup, self.similarity
        if self.stage is Stage.SETUP_ADVERTISE and setup is not None:
            return set(setup.silos) - set(setup.adverts)
        if self.stage is Stage.SETUP_SEAL and setup is not None:
            return {setup.leader}
        if self.stage is Stage.SETUP_OPEN and setup is not None:
            return set(setup.silos) - setup.opened
        if self.stage is Stage.SIMILARITY and step is not None:
            return step.members() - set(step.ciphertexts)
        if self.stage is Stage.DECRYPT and step is not None:
            return {step.decryptor}
        return set()

    def waiting_for(self) -> set[str]:
        """Silos the current stage still waits for (any kind of stage)."""
        if self.stage in SECURE_STAGES and self.secagg is not None:
            return self.secagg.waiting_for()
        return self._other_waiting()

    # -- internals ----------------------------------------------------------------------------
    def _check(self, silo: str, env: Envelope, stage: Stage, phase: Phase, *,
               answering: bool = True) -> SecAggServer:
        """Validate a secure-aggregation message; returns the sender's own group server."""
        if env.federation != self.plan.federation:
            raise OutOfPhase(f"message for federation {env.federation!r}; this is "
                             f"{self.plan.federation!r}")
        if env.phase is not phase:
            raise OutOfPhase(f"expected phase {phase.name}, got {env.phase.name}")
        if (env.round, env.attempt) != (self.round, self.attempt) or self.stage is not stage:
            raise OutOfPhase(f"{env.describe()} does not match the coordinator's "
                             f"{self.describe()}")
        server = self.secagg
        assert server is not None
        if silo not in server.expected() or silo in server.dropped:
            raise NotParticipant(f"{silo} does not take part in stage {stage.value} of "
                                 f"{self.describe()}")
        if answering and silo in server.answered():
            raise Duplicate(f"{silo} already answered stage {stage.value} of {self.describe()}")
        return server.server_of(silo)

    @staticmethod
    def _apply(method: Any, *args: Any) -> None:
        try:
            method(*args)
        except ProtocolError as exc:
            raise InvalidPayload(str(exc)) from None

    def _advance(self, now: float, deadline_passed: bool = False) -> list[Event]:
        """Close every stage that can close; abort below the threshold; aggregate at the end."""
        server = self.secagg
        events: list[Event] = []
        hopeless = server.hopeless() if server is not None else None
        if hopeless is not None:
            return self._abort(str(hopeless), now)
        while server is not None and self.stage in SECURE_STAGES and (
                server.stage_complete() or deadline_passed):
            deadline_passed = False
            closing, expected = self.stage, set(server.expected())
            try:
                stage = server.close_stage()
            except TooFewSurvivors as exc:
                return events + self._abort(str(exc), now)
            if stage is ServerStage.DONE:
                # Unmasking closes as soon as every secret has t shares: silos still working
                # on theirs are not needed, only those that vanished count as dropped.
                answered, gone = set(server.reveals), expected & server.dropped
            else:
                answered = set(server.expected())
                gone = expected - answered
            events.append(Event("stage_closed", {
                "round": self.round, "attempt": self.attempt, "stage": closing.value,
                "silos": len(answered), "dropped": sorted(gone)}))
            self.version += 1
            if stage is ServerStage.DONE:
                return events + self._aggregate(now)
            self.stage = _FROM_SERVER[stage]
            self.deadline = now + (self.plan.timeouts.round_s if self.stage is Stage.INPUT
                                   else self.plan.timeouts.stage_s)
        return events

    def _open_round(self, now: float, participants: set[str]) -> list[Event]:
        self.attempt += 1
        self.participants = tuple(sorted(participants))
        length = None if self.shared_length is None else self._upload_length()
        groups = self.strategy.groups(self.participants)
        configs = [self.secagg_config if not self.strategy.clustered else
                   SecAggConfig(default_threshold(len(g)), 0, self.plan.public.seed)
                   for g in groups]
        self.secagg = SecAggGroups(self.context(), configs, groups, length, self.spec.dtype)
        self.statistics = {}
        self.pending_envelopes = {}
        self.late = set()
        self.stage = Stage.ADVERTISE
        self.deadline = now + self.plan.timeouts.stage_s
        if self.attempt == self._attempt_base + 1:
            self.round_started = now
        self.version += 1
        return [Event("round_opened", {"round": self.round, "attempt": self.attempt,
                                       "participants": list(self.participants)})]

    def _upload_length(self) -> int:
        """Ring elements per masked input: the encoded vector and its weight, twice for GCFL."""
        assert self.shared_length is not None
        copies = 2 if self.plan.public.aggregation.unweighted_sum else 1
        return copies * (self.shared_length + 1)

    def _abort(self, reason: str, now: float) -> list[Event]:
        events = [Event("round_aborted", {"round": self.round, "attempt": self.attempt,
                                          "reason": reason})]
        late = self.late
        self.secagg, self.participants = None, ()   # whatever it held is useless now
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

    def _aggregate(self, now: float) -> list[Event]:
        server = self.secagg
        assert server is not None
        results: dict[tuple[str, ...], AggregateResult] = {}
        try:
            for group, total in server.unmask().items():
                members = tuple(s for s in group if s in server.survivors)
                if self.plan.public.aggregation.unweighted_sum:
                    mean, weight, plain, count = self.spec.decode_both(total)
                    if count != len(members):
                        raise EncodingError(f"group {', '.join(group)} counted {count} "
                                            f"updates for {len(members)} survivors")
                    # Groups too small to split send zeros instead of their unweighted sum.
                    useful = plain if len(group) >= MIN_SPLIT_SIZE else None
                    results[group] = AggregateResult(self.round, members, mean, weight, useful)
                else:
                    mean, weight = self.spec.decode_mean(total)
                    results[group] = AggregateResult(self.round, members, mean, weight)
        except (EncodingError, ProtocolError) as exc:
            return self._abort(f"aggregate could not be unmasked or decoded: {exc}", now)
        survivors = server.survivors
        dropped = tuple(s for s in self.participants if s not in survivors)
        self.secagg = None
        self.envelopes.update({s: e for s, e in self.pending_envelopes.items()
                               if s in survivors})
        self.pending_envelopes = {}
        total_weight = sum(r.total_weight for r in results.values())
        events: list[Event] = []
        if self.strategy.clustered:
            stats = {s: v for s, v in self.statistics.items() if s in survivors}
            due = self._clusters().complete_round(self.round, results, stats)
            events += [Event("clusters", {"round": self.round, **e})
                       for e in self._clusters().drain_events()]
        else:
            due = []
            new_state = self.strategy.next_global(next(iter(results.values())))
            if new_state is not None:
                self.global_state = new_state
        self.history.append(RoundRecord(self.round, self.attempt, survivors,
                                        total_weight, self.round_started, now,
                                        dropped=dropped))
        if due:
            return events + self._ask_similarity(due, now)
        return events + self._round_done(now)

    def _round_done(self, now: float) -> list[Event]:
        """The round's strategy step is over: report it and open the next round (or finish)."""
        record = self.history[-1]
        if self.strategy.clustered:
            self._clusters().close_round(self.round)
        survivors, dropped = record.participants, record.dropped
        total_weight = record.total_weight
        events = [Event("round_completed", {"round": self.round, "attempt": self.attempt,
                                            "participants": list(survivors),
                                            "dropped": list(dropped),
                                            "total_weight": total_weight,
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


def per_silo_final_metrics(history: list[RoundRecord]) -> Mapping[str, dict[str, float]]:
    """The last metrics each silo reported."""
    latest: dict[str, dict[str, float]] = {}
    for record in history:
        latest.update(record.metrics)
    return latest
