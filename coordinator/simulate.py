"""One-process simulation: the same round machine, strategies, silo sessions and trainers as a
real federation, with messages handed over in memory instead of over gRPC.

Identities come from a throwaway certificate authority, so key adverts are signed and vectors
are masked exactly as in a real run; with the same plan and seeds the results match.

This is the one module above both the coordinator and the silo (DESIGN.md §3): it needs the silo
extra (torch), and only `coordinator simulate` imports it. For researchers it is also the Python
API, as in a notebook::

    from trellis.coordinator.simulate import simulate
    from trellis.protos.plan import load_plan

    results = simulate(load_plan("plan.toml"))      # data folders from the plan's [simulation]
    results["final_mean"]["test_acc"], results["rounds"][-1]["metrics"]
"""

from __future__ import annotations

import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trellis.coordinator.errors import Duplicate, NotParticipant, OutOfPhase
from trellis.coordinator.progress import Progress
from trellis.coordinator.results import build_alone_results, build_results
from trellis.coordinator.rounds import (
    CLUSTERING_STAGES,
    SECURE_STAGES,
    SETUP_STAGES,
    TRAINING_STAGES,
    Event,
    RoundMachine,
    Stage,
)
from trellis.coordinator.strategies import make_strategy
from trellis.crypto.pki import throwaway_identities
from trellis.protos.algorithms import NODE_TASK, algorithm
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
from trellis.protos.plan import Plan, PublicPlan, load_plan
from trellis.silo.driver import SiloDriver
from trellis.silo.hetero import HeteroFormatError, HeteroGraph
from trellis.silo.link import CoordinatorLink, RoundMovedOn
from trellis.silo.session import SiloSession, SiloStage
from trellis.silo.trainers import hgn_config, load_silo_data, make_trainer, union_relations
from trellis.silo.tu import DataFormatError, GraphDataset

SiloData = GraphDataset | HeteroGraph
DATA_ERRORS = (DataFormatError, HeteroFormatError)   # a data folder that cannot be read


def run_simulation(plan: Plan, datasets: Mapping[str, SiloData], *,
                   clock: Callable[[], float] = time.monotonic,
                   progress: bool = True,
                   inspect: Callable[[RoundMachine, Mapping[str, SiloSession]], None] | None
                   = None,
                   observe: Callable[[str, CoordinatorLink], CoordinatorLink] | None = None
                   ) -> dict[str, Any]:
    """Run every round of the plan in this process; returns the results document.

    ``inspect``, if given, sees the machine and the silo sessions after the last round (tests
    use it to check what the coordinator holds against what the silos hold). ``observe``, if
    given, wraps each silo's link (tests record the calls a silo's driver makes).
    """
    missing = [s for s in plan.silos if s not in datasets]
    if missing:
        raise ValueError("no data for silos: " + ", ".join(missing))
    _check_data_kinds(plan, datasets)
    if not algorithm(plan.public.algorithm).rounds:
        return _train_alone(plan, datasets, clock)
    start = clock()
    strategy = make_strategy(plan.public.algorithm, plan.clustering, plan.silos,
                             plan.public.hetero)
    machine = RoundMachine(plan, strategy, start)
    show = Progress(plan.public.rounds, clock, start) if progress else None
    with tempfile.TemporaryDirectory(prefix="trellis-sim-") as tmp:
        identities = throwaway_identities(list(plan.silos), Path(tmp))
        sessions = {
            name: SiloSession(identities[name], _trainer_factory(plan, datasets, name))
            for name in plan.silos
        }
        drivers = {}
        said: deque[str] = deque(maxlen=1)     # the last thing a simulated silo would print
        for name, session in sessions.items():
            session.accept_plan(plan.public.to_json())
            link: CoordinatorLink = InProcessLink(name, machine, clock,
                                                  lambda events: _emit(show, machine, events))
            if observe is not None:
                link = observe(name, link)
            drivers[name] = SiloDriver(session, link, log=said.append)
            _emit(show, machine, machine.join(name, identities[name].cert_pem, clock()))
        while not machine.finished:
            stage = machine.stage
            if stage in SILO_STAGES:
                waiting, at = machine.waiting_for(), machine.describe()
                for name in sorted(waiting):
                    drivers[name].handle(machine.instruction(name))
                    if machine.describe() != at:
                        break
                if machine.describe() == at and machine.waiting_for() == waiting:
                    raise RuntimeError(f"simulation stuck at {machine.describe()}: no silo of "
                                       f"{sorted(waiting)} could act; last silo message: "
                                       f"{said[-1] if said else 'none'}")
            elif stage is Stage.FINISHING:
                for name, driver in drivers.items():
                    driver.handle(machine.instruction(name))
                if not machine.finished:
                    _emit(show, machine, machine.tick(machine.deadline))
            else:
                _emit(show, machine, machine.tick(machine.deadline))
        if machine.stage is Stage.DONE:
            # Silos not yet told (their last reports ended the federation at once) hear the
            # end now, as their streams would tell them.
            for name, driver in drivers.items():
                if sessions[name].stage is not SiloStage.FINISHED:
                    driver.handle(machine.instruction(name))
        if inspect is not None:
            inspect(machine, sessions)
    status = "completed" if machine.stage is Stage.DONE else "failed"
    return build_results(plan, machine.history, mode="simulation", status=status,
                         failure=machine.failure, elapsed_s=clock() - start,
                         strategy=machine.strategy)


def simulate(plan: Plan | str | Path, datasets: Mapping[str, SiloData] | None = None, *,
             threads: int | None = None, progress: bool = False) -> dict[str, Any]:
    """Run a plan in this process and return its results document (the Python API).

    ``plan`` is a loaded plan or the path of a plan file; ``datasets`` maps each silo to its
    loaded data, or else the plan's ``[simulation]`` folders are read. The document is the one
    `coordinator simulate` writes: ``final_metrics`` per silo, ``final_mean``, ``rounds`` with
    each round's reported metrics, and the algorithm's extras (``clustering``,
    ``early_stopping``).
    """
    loaded = plan if isinstance(plan, Plan) else load_plan(Path(plan))
    if threads:
        set_threads(threads)
    if datasets is None:
        datasets = load_simulation_data(loaded)
    return run_simulation(loaded, datasets, progress=progress)


def set_threads(threads: int) -> None:
    """Torch's intra-op threads for the silos' training in this process."""
    import torch

    torch.set_num_threads(threads)


# The stages in which the machine waits for silos to act (the others pass by deadlines).
SILO_STAGES = SECURE_STAGES + SETUP_STAGES + CLUSTERING_STAGES + TRAINING_STAGES


def load_simulation_data(plan: Plan) -> dict[str, SiloData]:
    """Each silo's data folder from the plan's [simulation] table (TU or heterogeneous)."""
    if plan.silos_without_data:
        raise ValueError("simulation.data has no folder for: "
                         + ", ".join(plan.silos_without_data))
    return {s: load_silo_data(plan.simulation_data[s]) for s in plan.silos}


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


def _trainer_factory(plan: Plan, datasets: Mapping[str, SiloData], name: str
                     ) -> Callable[[PublicPlan], Any]:
    data = datasets[name]
    relations = None
    if algorithm(plan.public.algorithm).matches_schemas:
        # Schema matching: only a simulation, which sees every silo's graph, can do it.
        relations = union_relations([g for g in datasets.values() if isinstance(g, HeteroGraph)])
    return lambda public: make_trainer(data, public, name, relations=relations)


def _check_data_kinds(plan: Plan, datasets: Mapping[str, SiloData]) -> None:
    hetero = algorithm(plan.public.algorithm).task == NODE_TASK
    wrong = sorted(s for s in plan.silos if isinstance(datasets[s], HeteroGraph) != hetero)
    if wrong:
        want = ("a heterogeneous graph folder (meta.json + arrays.npz)" if hetero
                else "a TU graph-classification dataset")
        raise ValueError(f"{plan.public.algorithm} needs {want} for every silo; not so for: "
                         + ", ".join(wrong))


def _train_alone(plan: Plan, datasets: Mapping[str, SiloData],
                 clock: Callable[[], float]) -> dict[str, Any]:
    """hgn-local / hgn-central: each silo trains its own full-weight RGCN with early stopping
    (docs/algorithms.md §5.6); nothing is exchanged, so no round machine is involved."""
    from trellis.silo.hgn_baselines import train_alone

    start = clock()
    h = plan.public.hetero
    per_silo = {}
    for name in plan.silos:
        graph = datasets[name]
        assert isinstance(graph, HeteroGraph)
        per_silo[name] = train_alone(graph, hgn_config(plan.public), seed=plan.public.seed,
                                     name=name, max_epochs=h.max_epochs, patience=h.patience,
                                     min_delta=h.min_delta)
    return build_alone_results(plan, per_silo, elapsed_s=clock() - start)


def _emit(show: Progress | None, machine: RoundMachine, events: list) -> None:
    if show is not None:
        show.events(events, machine.history)
