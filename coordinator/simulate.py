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
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from trellis.coordinator.progress import Progress
from trellis.coordinator.results import build_alone_results, build_results
from trellis.coordinator.rounds import (
    CLUSTERING_STAGES,
    SECURE_STAGES,
    SETUP_STAGES,
    RoundMachine,
    Stage,
)
from trellis.coordinator.strategies import make_strategy
from trellis.crypto.pki import throwaway_identities
from trellis.protos.algorithms import NODE_TASK, algorithm
from trellis.protos.messages import Instruction, Phase
from trellis.protos.plan import Plan, PublicPlan, load_plan
from trellis.silo.hetero import HeteroFormatError, HeteroGraph
from trellis.silo.session import SiloSession
from trellis.silo.trainer import LocalTrainer
from trellis.silo.tu import DataFormatError, GraphDataset

SiloData = GraphDataset | HeteroGraph
DATA_ERRORS = (DataFormatError, HeteroFormatError)   # a data folder that cannot be read


def run_simulation(plan: Plan, datasets: Mapping[str, SiloData], *,
                   clock: Callable[[], float] = time.monotonic,
                   progress: bool = True,
                   inspect: Callable[[RoundMachine, Mapping[str, SiloSession]], None] | None
                   = None) -> dict[str, Any]:
    """Run every round of the plan in this process; returns the results document.

    ``inspect``, if given, sees the machine and the silo sessions after the last round (tests
    use it to check what the coordinator holds against what the silos hold).
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
        for name, session in sessions.items():
            session.accept_plan(plan.public.to_json())
            _emit(show, machine, machine.join(name, identities[name].cert_pem, clock()))
        while not machine.finished:
            stage = machine.stage
            if stage in SECURE_STAGES or stage in SETUP_STAGES or stage in CLUSTERING_STAGES:
                step = _step if stage in SECURE_STAGES else _other_step
                for name in sorted(machine.waiting_for()):
                    _emit(show, machine, step(sessions[name], machine, clock))
                    if machine.stage is not stage:
                        break
            elif stage is Stage.FINISHING:
                for name, session in sessions.items():
                    ins = machine.instruction(name)
                    session.load_state(machine.state_for(name, ins.envelope))
                    report = session.metrics_report(machine.final_round)
                    if report is not None:
                        _emit(show, machine, machine.report(name, report, clock()))
                    session.finish()
                if not machine.finished:
                    _emit(show, machine, machine.tick(machine.deadline))
            else:
                _emit(show, machine, machine.tick(machine.deadline))
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
        missing = [s for s in loaded.silos if s not in loaded.simulation_data]
        if missing:
            raise ValueError("simulation.data has no folder for: " + ", ".join(missing))
        datasets = load_simulation_data(loaded)
    return run_simulation(loaded, datasets, progress=progress)


def set_threads(threads: int) -> None:
    """Torch's intra-op threads for the silos' training in this process."""
    import torch

    torch.set_num_threads(threads)


def load_simulation_data(plan: Plan) -> dict[str, SiloData]:
    """Each silo's data folder from the plan's [simulation] table (TU or heterogeneous)."""
    from trellis.silo.hgn_setup import load_silo_data

    return {s: load_silo_data(plan.simulation_data[s]) for s in plan.silos}


def _step(session: SiloSession, machine: RoundMachine, clock: Callable[[], float]) -> list:
    """Do what the machine's instruction asks of this silo, as the agent would over gRPC."""
    ins: Instruction = machine.instruction(session.name)
    env, name = ins.envelope, session.name
    if env.phase is Phase.ROUND_OPEN:
        session.open_round(ins)
        session.load_state(machine.state_for(name, env))
        if machine.strategy.exchanges_envelopes:
            session.load_pool(machine.pool_for(name, env))
        events = []
        report = session.metrics_report(env.round - 1)
        if report is not None:
            events += machine.report(name, report, clock())
        return events + machine.advertise(name, session.advert(), clock())
    if env.phase is Phase.KEYS_READY:
        sealed = session.share_keys(machine.key_bundle(name, env))
        events = machine.upload_shares(name, sealed, clock())
        session.train()
        return events
    if env.phase is Phase.SHARES_READY:
        masked = session.masked_input(machine.shares_for(name, env))
        upload = replace(env, phase=Phase.MASKED_INPUT)
        events = []
        if session.sealed_coefficients is not None:
            events += machine.sealed_envelope(name, upload, session.sealed_coefficients,
                                              clock())
        return events + machine.masked_input(name, upload, masked, clock(),
                                             session.update_statistics())
    if env.phase is Phase.CONSISTENCY_CHECK:
        return machine.sign_survivors(name, session.sign_survivors(ins), clock())
    if env.phase is Phase.UNMASK:
        revealed = session.reveal(machine.unmask_request(name, env))
        return machine.reveal_shares(name, revealed.envelope, revealed.shares, clock())
    raise RuntimeError(f"simulation: unexpected instruction {env.describe()} for {name}")


def _other_step(session: SiloSession, machine: RoundMachine,
                clock: Callable[[], float]) -> list:
    """Group-key setup and GCFL similarity steps, as the agent would do them over gRPC."""
    ins: Instruction = machine.instruction(session.name)
    env, name = ins.envelope, session.name
    if env.phase is Phase.GROUP_SETUP:
        return machine.setup_advert(name, env, session.setup_advert(ins), clock())
    if env.phase is Phase.GROUP_SEAL:
        boxes, public = session.seal_group(machine.setup_bundle(name, env))
        return machine.setup_seal(name, env, boxes, public, clock())
    if env.phase is Phase.GROUP_OPEN:
        session.open_group(*machine.setup_box(name, env))
        return machine.setup_opened(name, env, clock())
    if env.phase is Phase.ENCRYPT_UPDATE:
        return machine.encrypted_update(name, env, session.encrypted_update(ins), clock())
    if env.phase is Phase.DECRYPT_SIMILARITY:
        values = session.decrypt_similarities(machine.decrypt_request(name, env))
        return machine.decrypted(name, env, values, clock())
    raise RuntimeError(f"simulation: unexpected instruction {env.describe()} for {name}")


def _trainer_factory(plan: Plan, datasets: Mapping[str, SiloData], name: str
                     ) -> Callable[[PublicPlan], Any]:
    data = datasets[name]
    if isinstance(data, HeteroGraph):
        from trellis.silo.hgn_setup import make_hetero_trainer, union_relations

        relations = None
        if algorithm(plan.public.algorithm).matches_schemas:
            # Schema matching: only a simulation, which sees every silo's graph, can do it.
            graphs = [g for g in datasets.values() if isinstance(g, HeteroGraph)]
            relations = union_relations(graphs)
        return lambda public: make_hetero_trainer(data, public, name, relations)
    return lambda public: LocalTrainer(data, public, name)


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
    (ALGORITHMS.md §5.6); nothing is exchanged, so no round machine is involved."""
    from trellis.silo.hgn_baselines import train_alone
    from trellis.silo.hgn_setup import hgn_config

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
