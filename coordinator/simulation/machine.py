"""The coordinator's side of a simulation: the round machine and the link silos call it by.

``InProcessLink`` stands where the gRPC service stands in a real federation: the sequential
engine (coordinator/simulation/sequential.py) hands it to each silo's driver in the same process.
``MachineHost`` holds the machine of a Ray engine's run (coordinator/simulation/ray_engine.py) in
an actor of its own and answers the silos' calls through the same link, so they are checked and
refused exactly as in the sequential engine. Like the coordinator, this module needs no torch: the
machine's actor does not load it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trellis.coordinator.rounds.errors import Duplicate, NotParticipant, OutOfPhase
from trellis.coordinator.rounds.machine import (
    CLUSTERING_STAGES,
    SECURE_STAGES,
    SETUP_STAGES,
    TRAINING_STAGES,
    Event,
    RoundMachine,
    RoundRecord,
    Stage,
)
from trellis.coordinator.rounds.strategies import make_strategy
from trellis.coordinator.state.results import build_results
from trellis.protos.messages import (
    Envelope,
    Instruction,
    KeyAdvertisement,
    KeyBundle,
    MetricsReport,
    RevealedShares,
    SealedShares,
    SignedSurvivors,
    UnmaskInstruction,
)
from trellis.protos.plan import Plan
from trellis.silo.federation.link import CoordinatorLink, RoundMovedOn

# The stages in which the machine waits for silos to act (the others pass by deadlines).
SILO_STAGES = SECURE_STAGES + SETUP_STAGES + CLUSTERING_STAGES + TRAINING_STAGES
# The calls a silo may make on the machine: exactly the link's.
LINK_CALLS = frozenset(name for name in vars(CoordinatorLink) if not name.startswith("_"))


class InProcessLink:
    """A simulated silo's link to the round machine: the calls of silo/federation/link.py, in
    memory.

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


@dataclass(frozen=True)
class Refused:
    """The machine's "this attempt is over" (RoundMovedOn), sent back as a value: an exception
    would come back wrapped in Ray's own."""

    reason: str


@dataclass(frozen=True)
class MachineView:
    """Where the machine is, what each silo due to act now is told, and the events since the
    last view (with the round history, for the progress lines)."""

    stage: Stage
    at: str                              # RoundMachine.describe()
    finished: bool
    waiting: tuple[str, ...]
    due: dict[str, Instruction]
    events: list[Event]
    history: list[RoundRecord]


class MachineHost:
    """The round machine of a run, fed by the silos' calls and by the engine's view and deadline
    passes (the Ray engine's one machine actor)."""

    def __init__(self, plan: Plan, clock: Callable[[], float] = time.monotonic) -> None:
        self.plan = plan
        self.clock = clock
        strategy = make_strategy(plan.public.algorithm, plan.clustering, plan.silos,
                                 plan.public.hetero, privacy=plan.public.privacy,
                                 metric=plan.public.training.validation_metric)
        self.machine = RoundMachine(plan, strategy, clock())
        self._events: list[Event] = []
        self._links = {name: InProcessLink(name, self.machine, clock, self._events.extend)
                       for name in plan.silos}

    def join(self, silo: str, certificate_pem: bytes) -> None:
        """A silo attends (in the plan's order, as in the sequential engine)."""
        self._events += self.machine.join(silo, certificate_pem, self.clock())

    def view(self) -> MachineView:
        """The machine now; the events are handed over once."""
        machine = self.machine
        waiting = tuple(sorted(machine.waiting_for()))
        if machine.stage in SILO_STAGES:
            due = waiting
        elif machine.stage in (Stage.FINISHING, Stage.DONE):
            due = tuple(self.plan.silos)       # every silo hears the end
        else:
            due = ()
        events = list(self._events)
        self._events.clear()          # in place: the links hold this list's extend
        return MachineView(machine.stage, machine.describe(), machine.finished, waiting,
                           {s: machine.instruction(s) for s in due}, events,
                           list(machine.history) if events else [])

    def pass_deadline(self) -> MachineView:
        """Act as if the current stage's deadline has passed (a simulation never waits)."""
        self._events += self.machine.tick(self.machine.deadline)
        return self.view()

    def call(self, silo: str, method: str, *args: Any) -> Any:
        """One of the silo's link calls; a refusal comes back as Refused."""
        if method not in LINK_CALLS:
            raise ValueError(f"{method!r} is not a call of the silo's link")
        if silo not in self._links:
            raise ValueError(f"{silo!r} is not a silo of the plan")
        try:
            return getattr(self._links[silo], method)(*args)
        except RoundMovedOn as exc:
            return Refused(str(exc))

    def results(self, elapsed_s: float, engine: str) -> dict[str, Any]:
        """The results document of the run."""
        return simulation_results(self.plan, self.machine, elapsed_s, engine)
