"""The silo's side of a federation as a state machine without I/O (STYLE.md 4).

The gRPC agent and the one-process simulator both drive it. It checks every instruction against
its own stage, so it never uploads a key, a masked vector or metrics outside the stage they
belong to, and it restores its pre-round snapshot when a round attempt is retried.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from coordinator.plan import PublicPlan
from crypto.errors import ProtocolError
from crypto.fixedpoint import FixedPointSpec
from crypto.keyagreement import KeyAdvert, RoundContext
from crypto.pki import Identity
from crypto.secagg import RelayedAdvert, SecAggConfig
from crypto.secagg_client import SecAggClient
from protos.messages import (
    Envelope,
    Instruction,
    KeyAdvertisement,
    KeyBundle,
    MetricsReport,
    Phase,
    RevealedShares,
    SealedShares,
    SignedSurvivors,
    UnmaskInstruction,
)
from silo.trainer import LocalTrainer

DEFAULT_REPORT = ("val_acc", "test_acc", "train_loss")


class SiloStage(enum.Enum):
    """Where this silo is within a round attempt (crypto/secagg.py describes the stages)."""

    IDLE = "idle"
    OPEN = "open"              # state loaded, keys advertised
    SHARED = "shared"          # sealed key shares sent
    TRAINED = "trained"
    SUBMITTED = "submitted"    # masked input sent
    SIGNED = "signed"          # survivor list signed
    REVEALED = "revealed"      # shares revealed: this silo's part of the round is over
    FINISHED = "finished"


# Stages in which the silo is inside an attempt that may still need it.
IN_ATTEMPT = (SiloStage.OPEN, SiloStage.SHARED, SiloStage.TRAINED, SiloStage.SUBMITTED,
              SiloStage.SIGNED)


class SiloSession:
    """One silo's participation: keys, shares, training, masking, unmasking, reporting."""

    def __init__(self, identity: Identity, make_trainer: Callable[[PublicPlan], LocalTrainer],
                 report: Sequence[str] = DEFAULT_REPORT) -> None:
        self.identity = identity
        self.name = identity.name
        self._make_trainer = make_trainer
        self.report_names = tuple(report)
        self.plan: PublicPlan | None = None
        self.trainer: LocalTrainer | None = None
        self.stage = SiloStage.IDLE
        self.round = 0
        self.attempt = 0
        self.participants: tuple[str, ...] = ()
        self._secagg: SecAggClient | None = None
        self._snapshot: tuple[int, dict[str, Any]] | None = None
        self._last_train: dict[str, float] = {}
        self.reported: set[int] = set()

    # -- joining ------------------------------------------------------------------------------
    def accept_plan(self, public_plan_json: str) -> PublicPlan:
        """Validate the plan received on joining and build the local trainer."""
        plan = PublicPlan.from_json(public_plan_json)
        if self.plan is not None and plan != self.plan:
            raise ProtocolError("the coordinator sent a different plan on reconnecting")
        if self.trainer is None:
            self.plan = plan
            self.trainer = self._make_trainer(plan)
        return plan

    @property
    def spec(self) -> FixedPointSpec:
        """Fixed-point encoding from the plan."""
        agg = self._plan().aggregation
        return FixedPointSpec(agg.clip, agg.fraction_bits, agg.ring_bits, agg.max_sample_count)

    # -- a round ------------------------------------------------------------------------------
    def open_round(self, instruction: Instruction) -> None:
        """Start (or restart) a round attempt: restore the pre-round state if this is a retry."""
        env = instruction.envelope
        if env.phase is not Phase.ROUND_OPEN:
            raise ProtocolError(f"open_round needs ROUND_OPEN, got {env.phase.name}")
        if (env.round, env.attempt) <= (self.round, self.attempt):
            raise ProtocolError(f"{env.describe()} is not after round {self.round} attempt "
                                f"{self.attempt}")
        if self.name not in instruction.participants:
            raise ProtocolError("this silo is not among the round's participants")
        trainer = self._trainer()
        if self._snapshot is not None and self._snapshot[0] == env.round:
            trainer.restore(self._snapshot[1])
        else:
            self._snapshot = (env.round, trainer.snapshot())
        self.round, self.attempt = env.round, env.attempt
        self.participants = instruction.participants
        agg = self._plan().aggregation
        self._secagg = SecAggClient(self.name, self._context(),
                                    SecAggConfig(agg.threshold, agg.neighbours, self._plan().seed),
                                    self.identity.key_pem, self.identity.ca_pem)
        self.stage = SiloStage.OPEN

    def load_state(self, state: np.ndarray | None) -> None:
        """Load the global shared state received for this round (None in round 1)."""
        if state is not None:
            self._trainer().set_shared(state)

    def advert(self) -> KeyAdvertisement:
        """This attempt's two signed public keys."""
        signed = self._client(SiloStage.OPEN, "a key advert").advert()
        return KeyAdvertisement(self._envelope(Phase.ADVERTISE_KEY), signed.cipher_key,
                                signed.mask_key, signed.signature,
                                self._trainer().layout.length)

    def share_keys(self, bundle: KeyBundle) -> SealedShares:
        """Verify every advert, then seal Shamir shares of this attempt's secrets for peers."""
        client = self._client(SiloStage.OPEN, "key sharing")
        self._check_envelope(bundle.envelope, Phase.KEYS_READY)
        names = {k.silo for k in bundle.keys}
        if not names <= set(self.participants):
            raise ProtocolError("the key bundle lists silos outside the round's participants")
        relayed = [RelayedAdvert(KeyAdvert(k.silo, k.cipher_key, k.mask_key, k.signature),
                                 k.certificate_pem) for k in bundle.keys]
        sealed = client.share_keys(relayed)
        holders = len(client.neighbours) + 1
        if 2 * client.config.threshold <= holders:
            # A coordinator lowering the threshold could unmask a silo from two disjoint groups.
            raise ProtocolError(f"threshold {client.config.threshold} is not a majority of the "
                                f"{holders} holders of this silo's shares; refusing to share")
        self.stage = SiloStage.SHARED
        return SealedShares(self._envelope(Phase.SHARE_KEYS), tuple(sealed))

    def train(self) -> dict[str, float]:
        """Local training for this round (after the key shares are out)."""
        if self.stage is not SiloStage.SHARED:
            raise ProtocolError(f"training is not due in stage {self.stage.value}")
        self._last_train = self._trainer().train()
        self.stage = SiloStage.TRAINED
        return self._last_train

    def masked_input(self, sealed: SealedShares) -> np.ndarray:
        """Keep the shares peers sent, then encode and mask this silo's shared vector."""
        client = self._client(SiloStage.TRAINED, "a masked input")
        self._check_envelope(sealed.envelope, Phase.SHARES_READY)
        trainer = self._trainer()
        encoded = self.spec.encode(trainer.get_shared(), trainer.num_train)
        masked = client.mask_input(encoded, sealed.shares)
        self.stage = SiloStage.SUBMITTED
        return masked

    def sign_survivors(self, instruction: Instruction) -> SignedSurvivors:
        """Sign the list of silos whose masked input the coordinator says it holds."""
        client = self._client(SiloStage.SUBMITTED, "a consistency signature")
        self._check_envelope(instruction.envelope, Phase.CONSISTENCY_CHECK)
        signature = client.sign_survivors(instruction.participants)
        self.stage = SiloStage.SIGNED
        return SignedSurvivors(self._envelope(Phase.SIGN_SURVIVORS), signature)

    def reveal(self, unmask: UnmaskInstruction) -> RevealedShares:
        """Reveal seed shares of survivors and key shares of dropped silos, never both."""
        client = self._client(SiloStage.SIGNED, "revealed shares")
        self._check_envelope(unmask.envelope, Phase.UNMASK)
        shares = client.reveal(unmask.request)
        self._secagg = None
        self.stage = SiloStage.REVEALED
        return RevealedShares(self._envelope(Phase.REVEAL_SHARES), tuple(shares))

    def abort(self) -> None:
        """This attempt is over for this silo: forget its keys; the snapshot stays for a retry."""
        self._secagg = None
        self.stage = SiloStage.IDLE

    def metrics_report(self, round_completed: int) -> MetricsReport | None:
        """Metrics for a completed round after loading its state (None if nothing to report)."""
        if round_completed < 1 or round_completed in self.reported:
            return None
        values = {**self._trainer().metrics(self.report_names), **self._last_train}
        chosen = {k: float(values[k]) for k in self.report_names if k in values}
        self.reported.add(round_completed)
        plan = self._plan()
        return MetricsReport(Envelope(plan.federation, round_completed, 0, Phase.REPORT), chosen)

    def finish(self) -> None:
        """Mark the federation as finished for this silo."""
        self.stage = SiloStage.FINISHED

    # -- helpers ------------------------------------------------------------------------------
    def _client(self, stage: SiloStage, what: str) -> SecAggClient:
        if self.stage is not stage or self._secagg is None:
            raise ProtocolError(f"{what} is not due in stage {self.stage.value}")
        return self._secagg

    def _check_envelope(self, env: Envelope, phase: Phase) -> None:
        if (env.round, env.attempt, env.phase) != (self.round, self.attempt, phase):
            raise ProtocolError(f"{env.describe()} does not match round {self.round} attempt "
                                f"{self.attempt} phase {phase.name}")

    def _context(self) -> RoundContext:
        return RoundContext(self._plan().federation, self.round, self.attempt)

    def _envelope(self, phase: Phase) -> Envelope:
        return Envelope(self._plan().federation, self.round, self.attempt, phase)

    def _plan(self) -> PublicPlan:
        if self.plan is None:
            raise ProtocolError("no plan received yet")
        return self.plan

    def _trainer(self) -> LocalTrainer:
        if self.trainer is None:
            raise ProtocolError("no plan received yet")
        return self.trainer
