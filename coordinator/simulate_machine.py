"""The coordinator's side of a simulation: the round machine and the link silos call it by.

``InProcessLink`` stands where the gRPC service stands in a real federation: the sequential
engine (coordinator/simulate.py) hands it to each silo's driver in the same process. Like the
coordinator, this module needs no torch, so the machine can run where torch is not loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from trellis.coordinator.errors import Duplicate, NotParticipant, OutOfPhase
from trellis.coordinator.results import build_results
from trellis.coordinator.rounds import (
    CLUSTERING_STAGES,
    SECURE_STAGES,
    SETUP_STAGES,
    TRAINING_STAGES,
    Event,
    RoundMachine,
    Stage,
)
from trellis.protos.messages import (
    Envelope,
    KeyAdvertisement,
    KeyBundle,
    MetricsReport,
    RevealedShares,
    SealedShares,
    SignedSurvivors,
    UnmaskInstruction,
)
from trellis.protos.plan import Plan
from trellis.silo.link import RoundMovedOn

# The stages in which the machine waits for silos to act (the others pass by deadlines).
SILO_STAGES = SECURE_STAGES + SETUP_STAGES + CLUSTERING_STAGES + TRAINING_STAGES


class InProcessLink:
    """A simulated silo's link to the round machine: the calls of silo/link.py, in memory.

    It stands where the gRPC service and CoordinatorCore stand in a real federation, and
    answers like them: "this attempt is over" refusals become RoundMovedOn; the machine's
    events go to the progress display.
    """

    def __init__(self, silo: str, machine: RoundMachine, clock: Callable[[], float],
                 emit: Callable[[list[Event]], None]) -> None:
        self.silo = silo
        self.machine = machine
        self.clock = clock
        self.emit = emit

    def _ask(self, method: Callable[..., Any], *args: Any) -> Any:
        try:
            return method(self.silo, *args)
        except (OutOfPhase, NotParticipant, Duplicate) as exc:
            raise RoundMovedOn(str(exc)) from None

    def _send(self, method: Callable[..., list[Event]], *args: Any) -> None:
        self.emit(self._ask(method, *args, self.clock()))

    def fetch_state(self, env: Envelope) -> np.ndarray | None:
        """RoundMachine.state_for."""
        return self._ask(self.machine.state_for, env)

    def fetch_pool(self, env: Envelope) -> list[bytes]:
        """RoundMachine.pool_for."""
        return self._ask(self.machine.pool_for, env)

    def advertise(self, advert: KeyAdvertisement) -> None:
        """RoundMachine.advertise."""
        self._send(self.machine.advertise, advert)

    def fetch_keys(self, env: Envelope) -> KeyBundle:
        """RoundMachine.key_bundle."""
        return self._ask(self.machine.key_bundle, env)

    def upload_shares(self, sealed: SealedShares) -> None:
        """RoundMachine.upload_shares."""
        self._send(self.machine.upload_shares, sealed)

    def fetch_shares(self, env: Envelope) -> SealedShares:
        """RoundMachine.shares_for."""
        return self._ask(self.machine.shares_for, env)

    def upload_envelope(self, env: Envelope, envelope: bytes) -> None:
        """RoundMachine.sealed_envelope."""
        self._send(self.machine.sealed_envelope, env, envelope)

    def upload_masked(self, env: Envelope, masked: np.ndarray,
                      statistics: Mapping[str, float]) -> None:
        """RoundMachine.masked_input."""
        self.emit(self._ask(self.machine.masked_input, env, masked, self.clock(), statistics))

    def sign_survivors(self, signed: SignedSurvivors) -> None:
        """RoundMachine.sign_survivors."""
        self._send(self.machine.sign_survivors, signed)

    def fetch_unmask(self, env: Envelope) -> UnmaskInstruction:
        """RoundMachine.unmask_request."""
        return self._ask(self.machine.unmask_request, env)

    def reveal(self, revealed: RevealedShares) -> None:
        """RoundMachine.reveal_shares."""
        self._send(self.machine.reveal_shares, revealed.envelope, revealed.shares)

    def report(self, report: MetricsReport) -> bool:
        """RoundMachine.report; False if the machine already has these metrics."""
        try:
            self._send(self.machine.report, report)
        except RoundMovedOn:
            return False
        return True

    def setup_advert(self, env: Envelope, advert: bytes) -> None:
        """RoundMachine.setup_advert."""
        self._send(self.machine.setup_advert, env, advert)

    def setup_bundle(self, env: Envelope) -> dict[str, tuple[bytes, bytes]]:
        """RoundMachine.setup_bundle."""
        return self._ask(self.machine.setup_bundle, env)

    def upload_group_seal(self, env: Envelope, boxes: Mapping[str, bytes],
                          public_context: bytes) -> None:
        """RoundMachine.setup_seal."""
        self._send(self.machine.setup_seal, env, boxes, public_context)

    def fetch_group_box(self, env: Envelope) -> tuple[bytes, bytes, bytes]:
        """RoundMachine.setup_box."""
        return self._ask(self.machine.setup_box, env)

    def confirm_group_open(self, env: Envelope) -> None:
        """RoundMachine.setup_opened."""
        self._send(self.machine.setup_opened, env)

    def upload_encrypted_update(self, env: Envelope, ciphertexts: Sequence[bytes]) -> None:
        """RoundMachine.encrypted_update."""
        self._send(self.machine.encrypted_update, env, list(ciphertexts))

    def fetch_blinded(self, env: Envelope) -> dict[tuple[str, str], bytes]:
        """RoundMachine.decrypt_request."""
        return self._ask(self.machine.decrypt_request, env)

    def upload_similarities(self, env: Envelope,
                            values: Mapping[tuple[str, str], float]) -> None:
        """RoundMachine.decrypted."""
        self._send(self.machine.decrypted, env, values)


def simulation_results(plan: Plan, machine: RoundMachine, elapsed_s: float,
                       engine: str) -> dict[str, Any]:
    """The results document of a simulation, naming the engine that ran it."""
    status = "completed" if machine.stage is Stage.DONE else "failed"
    results = build_results(plan, machine.history, mode="simulation", status=status,
                            failure=machine.failure, elapsed_s=elapsed_s,
                            strategy=machine.strategy)
    return {**results, "engine": engine}

