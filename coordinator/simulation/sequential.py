"""One-process simulation: the same round machine, strategies, silo sessions and trainers as a
real federation, with messages handed over in memory instead of over gRPC.

Identities come from a throwaway certificate authority, so key adverts are signed and vectors
are masked exactly as in a real run; with the same plan and seeds the results match.

This module is the sequential engine: every silo takes its turn in this process. The Ray engine
(coordinator/simulation/ray_engine.py, ``engine="ray"``) runs the same silo sessions and drivers as
Ray actors, in parallel, against the same round machine; its results are the same, seed for seed.
Silos one after another is by design, on a GPU too (one silo's kernels at a time): several silos
train on one GPU at once on the Ray engine, each actor with its share of it (options.RayOptions).

With the simulated silos (silos.py), the round machine's side (machine.py, torch-free) and the Ray
engine's modules, this is the only code above both the coordinator and the silo (DESIGN.md §3): it
needs the silo extra (torch), and only `coordinator simulate` imports it. For researchers it is
also the Python API, as in a notebook::

    from trellis.coordinator.simulation.sequential import simulate
    from trellis.protos.plan import load_plan

    results = simulate(load_plan("plan.toml"))      # data folders from the plan's [simulation]
    results["final_mean"]["test_acc"], results["rounds"][-1]["metrics"]
"""

from __future__ import annotations

import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from trellis.coordinator.operations.progress import Progress
from trellis.coordinator.rounds.machine import RoundMachine, Stage
from trellis.coordinator.rounds.strategies import make_strategy
from trellis.coordinator.simulation.machine import (
    SILO_STAGES,
    InProcessLink,
    simulation_results,
)
from trellis.coordinator.simulation.options import RayOptions, check_engine
from trellis.coordinator.simulation.silos import (
    SiloData,
    check_data_kinds,
    silo_session,
    train_silo_alone,
)
from trellis.coordinator.state.results import build_alone_results
from trellis.crypto.pki import throwaway_identities
from trellis.protos.algorithms import algorithm
from trellis.protos.plan import Plan, load_plan
from trellis.silo.data.hetero import HeteroFormatError, HeteroGraph
from trellis.silo.data.tu import DataFormatError
from trellis.silo.federation.driver import SiloDriver
from trellis.silo.federation.link import CoordinatorLink
from trellis.silo.federation.session import SiloSession, SiloStage
from trellis.silo.training.devices import DeviceFailed as DeviceFailed  # for the CLI to catch
from trellis.silo.training.devices import resolve_device
from trellis.silo.training.trainers import load_silo_data, union_relations

DATA_ERRORS = (DataFormatError, HeteroFormatError)   # a data folder that cannot be read


def run_simulation(plan: Plan, datasets: Mapping[str, SiloData], *,
                   clock: Callable[[], float] = time.monotonic,
                   progress: bool = True,
                   inspect: Callable[[RoundMachine, Mapping[str, SiloSession]], None] | None
                   = None,
                   observe: Callable[[str, CoordinatorLink], CoordinatorLink] | None = None,
                   device: str = "cpu") -> dict[str, Any]:
    """Run every round of the plan in this process, every silo training on ``device``; returns
    the results document.

    ``inspect``, if given, sees the machine and the silo sessions after the last round (tests
    use it to check what the coordinator holds against what the silos hold). ``observe``, if
    given, wraps each silo's link (tests record the calls a silo's driver makes).
    """
    missing = [s for s in plan.silos if s not in datasets]
    if missing:
        raise ValueError("no data for silos: " + ", ".join(missing))
    check_data_kinds(plan, {s: isinstance(datasets[s], HeteroGraph) for s in plan.silos})
    if not algorithm(plan.public.algorithm).rounds:
        return {**_train_alone(plan, datasets, clock, device), "engine": "sequential"}
    start = clock()
    strategy = make_strategy(plan.public.algorithm, plan.clustering, plan.silos,
                             plan.public.hetero, privacy=plan.public.privacy,
                             metric=plan.public.training.validation_metric)
    machine = RoundMachine(plan, strategy, start)
    show = Progress(plan.public.rounds, clock, start) if progress else None
    with tempfile.TemporaryDirectory(prefix="trellis-sim-") as tmp:
        identities = throwaway_identities(list(plan.silos), Path(tmp))
        relations = schema_relations(plan, datasets.values())
        sessions = {name: silo_session(identities[name], datasets[name], relations, device,
                                       initial=plan.simulation_init)
                    for name in plan.silos}
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
    return simulation_results(plan, machine, clock() - start, "sequential")


def simulate(plan: Plan | str | Path, datasets: Mapping[str, SiloData] | None = None, *,
             threads: int | None = None, progress: bool = False, engine: str = "sequential",
             ray: RayOptions | None = None, device: str | None = None) -> dict[str, Any]:
    """Run a plan and return its results document (the Python API).

    ``plan`` is a loaded plan or the path of a plan file; ``datasets`` maps each silo to its
    loaded data, or else the plan's ``[simulation]`` folders are read. The document is the one
    `coordinator simulate` writes: ``final_metrics`` per silo, ``final_mean``, ``rounds`` with
    each round's reported metrics, and the algorithm's extras (``clustering``,
    ``early_stopping``). ``engine="ray"`` runs each silo as a Ray actor (``ray`` says where and
    with what resources; coordinator/simulation/ray_engine.py), with the same results.
    ``device`` is where the silos train (cpu, cuda, cuda:N or auto; default cpu, and with Ray:
    the GPU share of ``ray``).
    """
    loaded = plan if isinstance(plan, Plan) else load_plan(Path(plan))
    if check_engine(engine) == "ray":
        from trellis.coordinator.simulation.ray_engine import run_ray_simulation

        options = ray or RayOptions()
        if threads:
            options = replace(options, threads=threads)
        if device is not None:
            options = replace(options, requested_device=device)
        if datasets is None:
            # Folders, not loaded graphs: each actor reads its own silo's data where it runs.
            if loaded.silos_without_data:
                raise ValueError("simulation.data has no folder for: "
                                 + ", ".join(loaded.silos_without_data))
            return run_ray_simulation(loaded, dict(loaded.simulation_data), options,
                                      progress=progress)
        return run_ray_simulation(loaded, datasets, options, progress=progress)
    if ray is not None:
        raise ValueError("ray options are for engine='ray'")
    resolved = simulation_device(device or "cpu")
    if threads:
        set_threads(threads)
    if datasets is None:
        datasets = load_simulation_data(loaded)
    return run_simulation(loaded, datasets, progress=progress, device=resolved)


def simulation_device(spec: str) -> str:
    """Where every silo of a sequential run trains, as ``--device spec`` names it (auto: this
    machine's first GPU, else its CPU); ValueError if this machine has no such device."""
    return str(resolve_device(spec))


def set_threads(threads: int) -> None:
    """Torch's intra-op threads for the silos' training in this process."""
    import torch

    torch.set_num_threads(threads)


def load_simulation_data(plan: Plan) -> dict[str, SiloData]:
    """Each silo's data folder from the plan's [simulation] table (TU or heterogeneous)."""
    if plan.silos_without_data:
        raise ValueError("simulation.data has no folder for: "
                         + ", ".join(plan.silos_without_data))
    return {s: load_silo_data(plan.simulation_data[s]) for s in plan.silos}


def schema_relations(plan: Plan, datasets: Iterable[SiloData]) -> tuple[str, ...] | None:
    """The relation names every silo's model covers when the algorithm matches schemas (the
    union over all silos' graphs), else None."""
    if not algorithm(plan.public.algorithm).matches_schemas:
        return None
    # Schema matching: only a simulation, which sees every silo's graph, can do it.
    return union_relations([g for g in datasets if isinstance(g, HeteroGraph)])


def _train_alone(plan: Plan, datasets: Mapping[str, SiloData],
                 clock: Callable[[], float], device: str) -> dict[str, Any]:
    """hgn-local / hgn-central: each silo trains its own full-weight RGCN with early stopping
    (docs/algorithms.md §5.6); nothing is exchanged, so no round machine is involved."""
    start = clock()
    per_silo = {name: train_silo_alone(plan.public, name, datasets[name], device)
                for name in plan.silos}
    return build_alone_results(plan, per_silo, elapsed_s=clock() - start)


def _emit(show: Progress | None, machine: RoundMachine, events: list) -> None:
    if show is not None:
        show.events(events, machine.history)
