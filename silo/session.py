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
from crypto.keyagreement import (
    EphemeralKeyPair,
    KeyAdvert,
    RoundContext,
    make_advert,
    verify_advert,
)
from crypto.masking import mask_vector
from crypto.pki import Identity
from protos.messages import (
    Envelope,
    Instruction,
    KeyAdvertisement,
    KeyBundle,
    MetricsReport,
    Phase,
)
from silo.trainer import LocalTrainer

DEFAULT_REPORT = ("val_acc", "test_acc", "train_loss")


class SiloStage(enum.Enum):
    """Where this silo is within a round attempt."""

    IDLE = "idle"
    OPEN = "open"          # state loaded, key advertised
    TRAINED = "trained"
    SUBMITTED = "submitted"
    FINISHED = "finished"


class SiloSession:
    """One silo's participation: keys, training, masking, reporting."""

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
        self._keys: EphemeralKeyPair | None = None
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
        self._keys = EphemeralKeyPair()
        self.stage = SiloStage.OPEN

    def load_state(self, state: np.ndarray | None) -> None:
        """Load the global shared state received for this round (None in round 1)."""
        if state is not None:
            self._trainer().set_shared(state)

    def advert(self) -> KeyAdvertisement:
        """This attempt's signed key advert."""
        if self.stage is not SiloStage.OPEN or self._keys is None:
            raise ProtocolError(f"no key advert outside an open round (stage {self.stage.value})")
        signed = make_advert(self.name, self._keys, self._context(), self.identity.key_pem)
        return KeyAdvertisement(self._envelope(Phase.ADVERTISE_KEY), signed.public_key,
                                signed.signature, self._trainer().layout.length)

    def train(self) -> dict[str, float]:
        """Local training for this round."""
        if self.stage is not SiloStage.OPEN:
            raise ProtocolError(f"training is not due in stage {self.stage.value}")
        self._last_train = self._trainer().train()
        self.stage = SiloStage.TRAINED
        return self._last_train

    def masked_input(self, bundle: KeyBundle) -> np.ndarray:
        """Verify every peer's advert, then encode and mask this silo's shared vector."""
        if self.stage is not SiloStage.TRAINED or self._keys is None:
            raise ProtocolError(f"masked input is not due in stage {self.stage.value}")
        env = bundle.envelope
        if (env.round, env.attempt, env.phase) != (self.round, self.attempt, Phase.KEYS_READY):
            raise ProtocolError(f"key bundle for {env.describe()} does not match round "
                                f"{self.round} attempt {self.attempt}")
        names = [k.silo for k in bundle.keys]
        if sorted(names) != sorted(self.participants) or len(set(names)) != len(names):
            raise ProtocolError("key bundle does not list exactly the round's participants")
        context = self._context()
        ca = self.identity.ca_pem
        peers: dict[str, KeyAdvert] = {}
        for key in bundle.keys:
            advert = KeyAdvert(key.silo, key.public_key, key.signature)
            if key.silo == self.name:
                if key.public_key != self._keys.public_bytes:
                    raise ProtocolError("the coordinator relayed a different key for this silo")
                continue
            verify_advert(advert, key.certificate_pem, ca, context)
            peers[key.silo] = advert
        trainer = self._trainer()
        encoded = self.spec.encode(trainer.get_shared(), trainer.num_train)
        masked = mask_vector(encoded, self.name, self._keys, peers, context)
        self._keys = None            # one mask per key pair: never reuse it
        self.stage = SiloStage.SUBMITTED
        return masked

    def abort(self) -> None:
        """The coordinator aborted the attempt: forget its keys; the snapshot stays for a retry."""
        self._keys = None
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
