"""One attempt of secure aggregation with dropout recovery (Bonawitz et al. 2017; crypto/secagg.py).

ADVERTISE: silos fetch the state and advertise signed keys -> SHARE: they fetch the adverts,
send sealed key shares, then train -> INPUT: they fetch their shares and upload masked vectors
(FedHGN silos first send a sealed coefficient envelope; GCFL silos add their plain update norms)
-> CONSISTENCY: survivors sign the survivor list -> UNMASK: they reveal shares, and the
aggregate is unmasked and decoded. A stage closes as soon as every silo it waits for has
answered or vanished, or at its deadline; silos that drop are recovered from. Fewer than the
threshold at any stage aborts the attempt. GCFL runs one aggregation per cluster in lockstep
(coordinator/rounds/secagg_groups.py), so the coordinator learns one sum per cluster and nothing
else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trellis.coordinator.rounds.errors import Duplicate, InvalidPayload, NotParticipant, OutOfPhase
from trellis.coordinator.rounds.secagg_groups import SecAggGroups
from trellis.coordinator.rounds.stages.base import Event, Position, Stage, describe
from trellis.coordinator.rounds.stages.late_reveals import UnmaskedAttempt
from trellis.coordinator.rounds.strategies import AggregateResult
from trellis.crypto.dp_encoding import from_ring
from trellis.crypto.errors import EncodingError, ProtocolError
from trellis.crypto.fixedpoint import FixedPointSpec
from trellis.crypto.keyagreement import KeyAdvert, RoundContext
from trellis.crypto.secagg import RevealedShare, SecAggConfig, TooFewSurvivors
from trellis.crypto.secagg_server import SecAggServer, ServerStage
from trellis.protos.algorithms import MIN_SPLIT_SIZE
from trellis.protos.messages import (
    Envelope,
    Instruction,
    KeyAdvertisement,
    KeyBundle,
    Phase,
    SealedShares,
    SignedKey,
    SignedSurvivors,
    UnmaskInstruction,
)
from trellis.protos.metrics_plan import MetricsConfig, decode_sums, metric_slots
from trellis.protos.plan import default_threshold

# What the coordinator tells the silos a stage waits for, and the phase they answer with.
INSTRUCTS = {Stage.ADVERTISE: Phase.ROUND_OPEN, Stage.SHARE: Phase.KEYS_READY,
             Stage.INPUT: Phase.SHARES_READY, Stage.CONSISTENCY: Phase.CONSISTENCY_CHECK,
             Stage.UNMASK: Phase.UNMASK}
SECURE_STAGES = tuple(INSTRUCTS)
STATISTICS = ("update_norm", "grad_norm")
_FROM_SERVER = {ServerStage.ADVERTISE: Stage.ADVERTISE, ServerStage.SHARE: Stage.SHARE,
                ServerStage.INPUT: Stage.INPUT, ServerStage.CONSISTENCY: Stage.CONSISTENCY,
                ServerStage.UNMASK: Stage.UNMASK}


@dataclass(frozen=True)
class Rules:
    """What the plan and the algorithm fix for every attempt of a federation."""

    algorithm: str
    spec: FixedPointSpec
    config: SecAggConfig
    clustered: bool          # one aggregation per cluster; update norms beside each input
    unweighted_sum: bool     # each input carries its unweighted sum too (GCFL's split test)
    envelope_bytes: int      # size of each sealed coefficient envelope (0: none exchanged)
    # Differential privacy: integer units per value of the noisy sums (0: not private). A
    # private input carries no weight or count coordinate: either would depend on the data.
    noise_scale: float = 0.0
    # [metrics] aggregate: the evaluation counts' slots after the vector (protos/metrics_plan.py).
    metrics: MetricsConfig = MetricsConfig()

    @property
    def metric_slots(self) -> int:
        """Ring elements of evaluation counts at the end of every masked input (0: none)."""
        return len(metric_slots(self.metrics))

    def upload_length(self, shared_length: int) -> int:
        """Ring elements per masked input: the encoded vector and its weight, twice for GCFL;
        a private input is the noisy vector alone; then the summed metrics' slots, if any."""
        if self.noise_scale:
            return shared_length + self.metric_slots
        copies = 2 if self.unweighted_sum else 1
        return copies * (shared_length + 1) + self.metric_slots


def check_envelope(at: Position, env: Envelope, stage: Stage, phase: Phase) -> None:
    """A secure-aggregation message must carry this federation, the phase and the attempt."""
    if env.federation != at.federation:
        raise OutOfPhase(f"message for federation {env.federation!r}; this is "
                         f"{at.federation!r}")
    if env.phase is not phase:
        raise OutOfPhase(f"expected phase {phase.name}, got {env.phase.name}")
    if (env.round, env.attempt) != (at.round, at.attempt) or at.stage is not stage:
        raise OutOfPhase(f"{env.describe()} does not match the coordinator's {at.describe()}")


@dataclass(frozen=True)
class Aggregate:
    """What an attempt revealed: each group's result, who survived, what they sent beside."""

    results: dict[tuple[str, ...], AggregateResult]
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    statistics: dict[str, dict[str, float]]    # GCFL's update norms, of the survivors only
    envelopes: dict[str, bytes]                # FedHGN's sealed envelopes, of the survivors only
    # [metrics] aggregate: the survivors' summed evaluation counts (examples, nats), else None.
    metric_sums: dict[str, float] | None = None

    @property
    def total_weight(self) -> int:
        """The survivors' summed sample counts."""
        return sum(r.total_weight for r in self.results.values())


@dataclass
class Closing:
    """What closing stages did: its events, how many stages closed, the last stage entered,
    and how the attempt ended if it did (a reason to abort, or the aggregate)."""

    events: list[Event] = field(default_factory=list)
    closed: int = 0
    entered: Stage | None = None
    abort: str | None = None
    aggregate: Aggregate | None = None


class SecureAggregation:
    """One attempt: its groups' aggregation servers and what the silos sent beside them."""

    def __init__(self, context: RoundContext, participants: tuple[str, ...],
                 group_members: Sequence[tuple[str, ...]], rules: Rules,
                 shared_length: int | None) -> None:
        self.context = context
        self.participants = participants
        self.rules = rules
        self.shared_length = shared_length      # learned from the first advert if unknown
        configs = [rules.config if not rules.clustered else
                   SecAggConfig(default_threshold(len(g)), 0, rules.config.graph_seed)
                   for g in group_members]
        length = None if shared_length is None else rules.upload_length(shared_length)
        self.groups = SecAggGroups(context, configs, group_members, length, rules.spec.dtype)
        self.late: set[str] = set()                          # missed a deadline
        self.statistics: dict[str, dict[str, float]] = {}    # GCFL: this round's update norms
        self.pending_envelopes: dict[str, bytes] = {}        # FedHGN: kept if the silo survives

    @property
    def stage(self) -> Stage:
        """The stage the attempt is in (that of its servers, which move in lockstep); the
        machine drops an attempt as soon as it is unmasked, so never one past UNMASK."""
        return _FROM_SERVER[self.groups.stage]

    def describe(self) -> str:
        """Human-readable position."""
        return describe(self.context.round, self.context.attempt, self.stage)

    def envelope(self, phase: Phase) -> Envelope:
        """Envelope of this attempt with the given phase."""
        c = self.context
        return Envelope(c.federation, c.round, c.attempt, phase)

    def instruction(self, silo: str, total_rounds: int) -> Instruction | None:
        """What this silo should do now (None: the stage waits for nothing from it)."""
        if silo not in self.groups.expected() or silo in self.groups.dropped:
            return None
        own = self.groups.server_of(silo)
        listed = own.survivors if self.stage is Stage.CONSISTENCY else own.participants
        return Instruction(self.envelope(INSTRUCTS[self.stage]), listed,
                           total_rounds=total_rounds)

    def waiting_for(self) -> set[str]:
        """Silos the current stage still waits for."""
        return self.groups.waiting_for()

    def drop(self, silo: str) -> None:
        """A participant's process vanished with its keys: it is out of this attempt for good."""
        self.groups.drop(silo)

    def expire(self) -> list[Event]:
        """The stage's deadline passed: its silent silos drop out and sit out a retry."""
        late = sorted(self.groups.waiting_for())
        for silo in late:
            self.groups.drop(silo)
        self.late.update(late)
        return [Event("deadline_passed", {"round": self.context.round,
                                          "attempt": self.context.attempt,
                                          "stage": self.stage.value, "silent": late})]

    # -- relayed to the silos -----------------------------------------------------------------
    def key_bundle(self, silo: str) -> KeyBundle:
        """The adverts of every silo that advertised keys in this attempt (U1)."""
        server = self._sender(silo, Stage.SHARE, answering=False)
        keys = tuple(SignedKey(r.advert.silo, r.advert.cipher_key, r.advert.mask_key,
                               r.advert.signature, r.certificate_pem)
                     for r in server.relayed_adverts())
        return KeyBundle(self.envelope(Phase.KEYS_READY), keys)

    def shares_for(self, silo: str) -> SealedShares:
        """The sealed shares addressed to this silo by the silos that shared keys (U2)."""
        server = self._sender(silo, Stage.INPUT, answering=False)
        return SealedShares(self.envelope(Phase.SHARES_READY), tuple(server.shares_for(silo)))

    def unmask_request(self, silo: str) -> UnmaskInstruction:
        """What this silo must reveal, with the survivors' consistency signatures."""
        server = self._sender(silo, Stage.UNMASK, answering=False)
        return UnmaskInstruction(self.envelope(Phase.UNMASK), server.unmask_request(silo))

    # -- inputs -------------------------------------------------------------------------------
    def advertise(self, silo: str, advert: KeyAdvertisement, certificate_pem: bytes
                  ) -> list[Event]:
        """A participant's signed keys (signatures are checked by its peers)."""
        server = self._sender(silo, Stage.ADVERTISE)
        if self.shared_length is not None and advert.shared_length != self.shared_length:
            raise InvalidPayload(f"{silo} declares a shared vector of {advert.shared_length} "
                                 f"values; this federation uses {self.shared_length}")
        keys = KeyAdvert(silo, advert.cipher_key, advert.mask_key, advert.signature)
        _apply(server.add_advert, silo, keys, certificate_pem)
        if self.shared_length is None:
            self.shared_length = advert.shared_length
            self.groups.length = self.rules.upload_length(advert.shared_length)
        return [self._event("key_advertised", silo)]

    def upload_shares(self, silo: str, sealed: SealedShares) -> list[Event]:
        """A silo's sealed key shares, one per other holder (opaque to the coordinator)."""
        server = self._sender(silo, Stage.SHARE)
        _apply(server.add_shares, silo, sealed.shares)
        return [self._event("shares_received", silo, count=len(sealed.shares))]

    def sealed_envelope(self, silo: str, envelope: bytes) -> list[Event]:
        """FedHGN: a silo's sealed coefficient envelope, sent just before its masked input.

        Opaque and of the plan's fixed size; it joins the pool only if the silo survives the
        round. Re-sending within the attempt replaces it.
        """
        self._sender(silo, Stage.INPUT)
        size = self.rules.envelope_bytes
        if not size:
            raise InvalidPayload(f"{silo} sent a sealed envelope; "
                                 f"{self.rules.algorithm} exchanges none")
        if not isinstance(envelope, bytes) or len(envelope) != size:
            got = len(envelope) if isinstance(envelope, bytes) else type(envelope).__name__
            raise InvalidPayload(f"{silo}'s sealed envelope must be exactly {size} bytes "
                                 f"(set by fedhgn.coefficient_slots); got {got}")
        self.pending_envelopes[silo] = envelope
        return [self._event("envelope_received", silo, bytes=len(envelope))]

    def masked_input(self, silo: str, vector: np.ndarray,
                     statistics: Mapping[str, float] | None) -> list[Event]:
        """A silo's masked vector (and, for GCFL, its plain update norms: a documented leak)."""
        server = self._sender(silo, Stage.INPUT)
        stats = self._check_statistics(silo, statistics)
        if self.rules.envelope_bytes and silo not in self.pending_envelopes:
            raise OutOfPhase(f"{silo} must send its sealed coefficient envelope before its "
                             "masked input")
        _apply(server.add_masked_input, silo, vector)
        if stats:
            self.statistics[silo] = stats
        return [self._event("masked_input", silo, values=int(vector.size))]

    def sign_survivors(self, silo: str, signed: SignedSurvivors) -> list[Event]:
        """A survivor's signature over the survivor list (checked against its certificate)."""
        server = self._sender(silo, Stage.CONSISTENCY)
        _apply(server.add_signature, silo, signed.signature)
        return [self._event("survivors_signed", silo)]

    def reveal_shares(self, silo: str, shares: tuple[RevealedShare, ...]) -> list[Event]:
        """A silo's revealed shares (the last needed ones let the aggregate be unmasked)."""
        server = self._sender(silo, Stage.UNMASK)
        _apply(server.add_reveal, silo, shares)
        kinds = sorted({r.kind.value for r in shares})
        return [self._event("shares_revealed", silo, count=len(shares), kinds=kinds)]

    # -- closing stages -----------------------------------------------------------------------
    def advance(self, deadline_passed: bool = False) -> Closing:
        """Close every stage that can close; give up below the threshold; unmask at the end."""
        out = Closing()
        groups = self.groups
        hopeless = groups.hopeless()
        if hopeless is not None:
            out.abort = str(hopeless)
            return out
        while groups.stage_complete() or deadline_passed:
            deadline_passed = False
            closing, expected = self.stage, set(groups.expected())
            try:
                stage = groups.close_stage()
            except TooFewSurvivors as exc:
                out.abort = str(exc)
                return out
            if stage is ServerStage.DONE:
                # Unmasking closes as soon as every secret has t shares: silos still working
                # on theirs are not needed, only those that vanished count as dropped.
                answered, gone = set(groups.reveals), expected & groups.dropped
            else:
                answered = set(groups.expected())
                gone = expected - answered
            out.events.append(Event("stage_closed", {
                "round": self.context.round, "attempt": self.context.attempt,
                "stage": closing.value, "silos": len(answered), "dropped": sorted(gone)}))
            out.closed += 1
            if stage is ServerStage.DONE:
                try:
                    out.aggregate = self._unmask()
                except (EncodingError, ProtocolError) as exc:
                    out.abort = f"aggregate could not be unmasked or decoded: {exc}"
                return out
            out.entered = _FROM_SERVER[stage]
        return out

    def _unmask(self) -> Aggregate:
        """Unmask and decode each group's sum (EncodingError, ProtocolError if it cannot)."""
        groups, spec, slots = self.groups, self.rules.spec, self.rules.metric_slots
        results: dict[tuple[str, ...], AggregateResult] = {}
        sums: dict[str, float] | None = None
        for group, total in groups.unmask().items():
            members = tuple(s for s in group if s in groups.survivors)
            if slots:      # one group: a plan that sums metrics does not cluster
                sums = decode_sums(from_ring(total[-slots:]), self.rules.metrics)
                total = total[:-slots]
            if self.rules.noise_scale:
                results[group] = AggregateResult(
                    self.context.round, members, np.zeros(0), 0,
                    noisy_sum=from_ring(total).astype(np.float64) / self.rules.noise_scale)
            elif self.rules.unweighted_sum:
                mean, weight, plain, count = spec.decode_both(total)
                if count != len(members):
                    raise EncodingError(f"group {', '.join(group)} counted {count} "
                                        f"updates for {len(members)} survivors")
                # Groups too small to split send zeros instead of their unweighted sum.
                useful = plain if len(group) >= MIN_SPLIT_SIZE else None
                results[group] = AggregateResult(self.context.round, members, mean, weight,
                                                 useful)
            else:
                mean, weight = spec.decode_mean(total)
                results[group] = AggregateResult(self.context.round, members, mean, weight)
        survivors = groups.survivors
        return Aggregate(
            results, survivors, tuple(s for s in self.participants if s not in survivors),
            {s: v for s, v in self.statistics.items() if s in survivors},
            {s: e for s, e in self.pending_envelopes.items() if s in survivors}, sums)

    def unmasked(self) -> UnmaskedAttempt:
        """Once unmasked: the survivors whose reveals had not arrived, and what they were asked
        (their reveals may still come, late; stages/late_reveals.py)."""
        groups = self.groups
        pending = sorted(set().union(*(s.signers for s in groups.servers))
                         - set(groups.reveals) - groups.dropped)
        return UnmaskedAttempt(self.context, {s: groups.server_of(s).unmask_request(s)
                                              for s in pending})

    # -- internals ----------------------------------------------------------------------------
    def _sender(self, silo: str, stage: Stage, *, answering: bool = True) -> SecAggServer:
        """The sender's own group server, once it may send this message (envelope checked)."""
        groups = self.groups
        if silo not in groups.expected() or silo in groups.dropped:
            raise NotParticipant(f"{silo} does not take part in stage {stage.value} of "
                                 f"{self.describe()}")
        if answering and silo in groups.answered():
            raise Duplicate(f"{silo} already answered stage {stage.value} of {self.describe()}")
        return groups.server_of(silo)

    def _check_statistics(self, silo: str, statistics: Mapping[str, float] | None
                          ) -> dict[str, float]:
        if not self.rules.clustered:
            if statistics:
                raise InvalidPayload(f"{silo} sent update statistics; "
                                     f"{self.rules.algorithm} does not use any")
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

    def _event(self, kind: str, silo: str, **extra: Any) -> Event:
        return Event(kind, {"silo": silo, "round": self.context.round,
                            "attempt": self.context.attempt, **extra})


def _apply(method: Callable[..., None], *args: Any) -> None:
    """Run a server update; a protocol violation is the sender's invalid payload."""
    try:
        method(*args)
    except ProtocolError as exc:
        raise InvalidPayload(str(exc)) from None
