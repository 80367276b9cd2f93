"""One-process simulation: the same round machine, strategies, silo sessions and trainers as a
real federation, with messages handed over in memory instead of over gRPC.

Identities come from a throwaway certificate authority, so key adverts are signed and vectors
are masked exactly as in a real run; with the same plan and seeds the results match.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from coordinator.plan import Plan, PublicPlan
from coordinator.progress import Progress
from coordinator.results import build_results
from coordinator.rounds import RoundMachine, Stage
from coordinator.strategies import make_strategy
from crypto.pki import Identity, init_ca, load_identity, request_identity, sign_request
from protos.messages import Instruction, Phase
from silo.session import SiloSession
from silo.trainer import LocalTrainer
from silo.tu import GraphDataset


def throwaway_identities(names: list[str], folder: Path) -> dict[str, Identity]:
    """Create a CA and one signed identity per silo under folder (for simulations and demos)."""
    ca_dir = folder / "ca"
    init_ca(ca_dir, ["localhost", "127.0.0.1"])
    identities = {}
    for name in names:
        id_dir = folder / "silos" / name
        csr = request_identity(name, id_dir)
        sign_request(csr, ca_dir)
        identities[name] = load_identity(id_dir)
    return identities


def run_simulation(plan: Plan, datasets: Mapping[str, GraphDataset], *,
                   clock: Callable[[], float] = time.monotonic,
                   progress: bool = True) -> dict[str, Any]:
    """Run every round of the plan in this process; returns the results document."""
    missing = [s for s in plan.silos if s not in datasets]
    if missing:
        raise ValueError("no data for silos: " + ", ".join(missing))
    start = clock()
    machine = RoundMachine(plan, make_strategy(plan.public.algorithm), start)
    show = Progress(plan.public.rounds, clock, start) if progress else None
    with tempfile.TemporaryDirectory(prefix="trellis-sim-") as tmp:
        identities = throwaway_identities(list(plan.silos), Path(tmp))
        sessions = {
            name: SiloSession(identities[name], _trainer_factory(datasets[name], name))
            for name in plan.silos
        }
        for name, session in sessions.items():
            session.accept_plan(plan.public.to_json())
            _emit(show, machine, machine.join(name, identities[name].cert_pem, clock()))
        while not machine.finished:
            if machine.stage is Stage.KEYS:
                for name in machine.participants:
                    _open_and_train(sessions[name], machine, clock, show)
            elif machine.stage is Stage.INPUTS:
                for name in machine.participants:
                    ins = machine.instruction(name)
                    bundle = machine.key_bundle(name, ins.envelope)
                    masked = sessions[name].masked_input(bundle)
                    upload_env = replace(ins.envelope, phase=Phase.MASKED_INPUT)
                    _emit(show, machine, machine.masked_input(name, upload_env, masked, clock()))
            elif machine.stage is Stage.FINISHING:
                for name, session in sessions.items():
                    ins = machine.instruction(name)
                    session.load_state(machine.state_for(name, ins.envelope))
                    report = session.metrics_report(plan.public.rounds)
                    if report is not None:
                        _emit(show, machine, machine.report(name, report, clock()))
                    session.finish()
                if not machine.finished:
                    _emit(show, machine, machine.tick(machine.deadline))
            else:
                _emit(show, machine, machine.tick(machine.deadline))
    status = "completed" if machine.stage is Stage.DONE else "failed"
    return build_results(plan, machine.history, mode="simulation", status=status,
                         failure=machine.failure, elapsed_s=clock() - start)


def _open_and_train(session: SiloSession, machine: RoundMachine,
                    clock: Callable[[], float], show: Progress | None) -> None:
    ins: Instruction = machine.instruction(session.name)
    session.open_round(ins)
    session.load_state(machine.state_for(session.name, ins.envelope))
    report = session.metrics_report(ins.envelope.round - 1)
    if report is not None:
        _emit(show, machine, machine.report(session.name, report, clock()))
    _emit(show, machine, machine.advertise(session.name, session.advert(), clock()))
    session.train()


def _trainer_factory(dataset: GraphDataset, name: str) -> Callable[[PublicPlan], LocalTrainer]:
    return lambda public: LocalTrainer(dataset, public, name)


def _emit(show: Progress | None, machine: RoundMachine, events: list) -> None:
    if show is not None:
        show.events(events, machine.history)
