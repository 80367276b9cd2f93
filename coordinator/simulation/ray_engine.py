"""The Ray engine of `coordinator simulate --engine ray`: each silo a Ray actor, in parallel.

Each silo's actor (ray_actors.SiloHost) reserves the resources it is given
(``--cpus-per-silo``, ``--gpus-per-silo``; on cuda without a GPU share, an equal share of one GPU,
options.equal_gpu_share: several silos train on one GPU at once), reads its own data where it
runs, and holds the
session and driver that `silo join` runs. One more actor, with no CPU reserved, holds the round
machine, the run's single source of truth (machine.MachineHost, which needs no torch);
the silos call it through a link with the in-process link's checks and refusals. This process
only sequences the run, as the sequential engine does: in a stage that waits for silos it hands
every one of them its instruction at once (so local training, between key sharing and the masked
input, runs in parallel) and waits for all of them; in the other stages it passes the deadline.
It never waits on a silo while holding the machine, and a silo's call on the machine never waits
for another silo, so the run cannot deadlock; a stage where no silo could act is reported as
stuck, as in the sequential engine.

Results equal the sequential engine's seed for seed: each trainer draws from its own seeded
random streams, secure-aggregation sums are exact (integers mod 2^k) whatever the order of
arrival, and the machine's decisions do not depend on which silo came first. (On a GPU, or on
Ray nodes whose processors take another dense-layer path, training itself rounds differently.)

Ray is an optional extra, imported only here. A local Ray is started for the run and stopped at
its end, also on an error or Ctrl-C; a cluster given by address is only disconnected from.

Over 400 lines because one Ray run is one lifecycle (start Ray, place the actors, sequence
every stage, stop Ray on any exit) whose clean-up paths must be read together.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from trellis.coordinator.operations.progress import Progress
from trellis.coordinator.rounds.machine import Stage
from trellis.coordinator.simulation.machine import SILO_STAGES, MachineHost, MachineView
from trellis.coordinator.simulation.options import RayOptions, capacity_problem
from trellis.coordinator.simulation.ray_actors import DataSummary, SiloHost
from trellis.coordinator.simulation.silos import SiloData, check_data_kinds
from trellis.coordinator.state.results import build_alone_results
from trellis.crypto.pki import Identity, throwaway_identities
from trellis.protos.algorithms import algorithm
from trellis.protos.messages import Instruction
from trellis.protos.plan import Plan

RAY_EXTRA = "install the ray extra: pip install 'trellis-fgl[ray]'"


class RayMissing(ImportError):
    """Ray is not installed: the message says which extra to install."""


class RayRunFailed(RuntimeError):
    """The run could not go on: a silo's actor died or could not start in time."""


def import_ray() -> Any:
    """The ray module, or RayMissing naming the extra to install."""
    try:
        import ray
    except ImportError as exc:
        raise RayMissing(f"the ray engine needs Ray ({exc}); {RAY_EXTRA}") from None
    return ray


def run_ray_simulation(plan: Plan, data: Mapping[str, SiloData | Path], options: RayOptions,
                       *, progress: bool = True,
                       clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Run every round of the plan with each silo as a Ray actor; returns the results document.

    ``data`` maps each silo to its data folder (read by its actor, where it runs) or to data
    already loaded here (sent through Ray's object store).
    """
    missing = [s for s in plan.silos if s not in data]
    if missing:
        raise ValueError("no data for silos: " + ", ".join(missing))
    with ray_runtime(options) as ray:
        problem = capacity_problem(ray.cluster_resources(), len(plan.silos), options)
        if problem is not None:
            raise ValueError(problem)
        return _RayRun(ray, plan, options, progress, clock).run(data)


@contextmanager
def ray_runtime(options: RayOptions) -> Iterator[Any]:
    """Ray for one run: the one this process is already connected to (a notebook's, a test's;
    left as it is), else a local Ray started for the run or the cluster at ``options.address``;
    stopped (local) or disconnected from (cluster) at the end, whatever the ending."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    temp = tempfile.mkdtemp(prefix="trellis-ray-") if options.local else None
    handler = signal.getsignal(signal.SIGTERM)
    try:
        if temp is not None:
            _start_local(ray, options, temp)
        else:
            check_address(options.address)
            try:
                ray.init(address=options.address, log_to_driver=False,
                         logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ValueError(f"cannot join the Ray cluster at --ray-address "
                                 f"{options.address}: {_root_cause(exc)}") from None
        _restore_sigterm(handler)
        yield ray
    finally:
        # The workers are the raylet's children, so ours only while it lives: taken now, they
        # can be stopped after the shutdown, which waits for the raylet but not for them (a
        # worker still importing torch on a loaded machine notices its raylet gone much later).
        workers = _ray_processes(_descendants(), temp, ray) if temp is not None else set()
        ray.shutdown(wait_for_processes=temp is not None)
        if temp is not None:
            _stop_processes({w for w in workers if w.is_running()})
            shutil.rmtree(temp, ignore_errors=True)


# Ray gives its GCS 30 s to publish its port and its raylet a fixed 30 s to register; on a loaded
# 2-core CI machine each has missed that once in a run of the suite. The GCS gets 120 s here
# through Ray's own variable (unless the operator set it), which Ray also reads as the number of
# one-second tries to connect to the GCS, and which the processes started by ray.init inherit.
# The raylet's wait cannot be changed, so a start that still times out is tried once more,
# after the failed node's processes are stopped.
#
# Ray also starts its workers at niceness 15, to keep its own daemons responsive on a shared
# node. On a local run the silo actors are the work itself: beside anything else busy on the
# machine they got a few percent of a core (a six-silo run of two rounds beside six busy
# processes on 2 cores: 420 s, against 62 s at niceness 0; bench/ray_niceness.py).
# So a local Ray's workers run at the run's own priority, as the sequential engine's silos do,
# unless the operator set Ray's variable; a cluster's workers are its own to set.
_LOCAL_START_TRIES = 2
_SLOW_STARTS = ("timed out during startup", "Timed out waiting for file")
_LOCAL_DEFAULTS = {"RAY_gcs_server_port_wait_time_s": "120", "RAY_worker_niceness": "0"}


def _start_local(ray: Any, options: RayOptions, temp: str) -> None:
    """Start a local Ray for the run, trying once more if its node is slow to start; a failed
    or interrupted start leaves none of its processes behind."""
    for attempt in range(1, _LOCAL_START_TRIES + 1):
        before = _descendants()
        try:
            with _environ_defaults(_LOCAL_DEFAULTS):
                # Small on purpose: silos exchange kilobytes to megabytes per round, and a laptop
                # or a CI runner has little shared memory to spare.
                ray.init(address="local", num_cpus=options.num_cpus or os.cpu_count() or 1,
                         object_store_memory=options.object_store_mb * 2**20,
                         include_dashboard=False, log_to_driver=False,
                         logging_level=logging.WARNING, _temp_dir=temp)
            return
        except BaseException as exc:   # Ray raises a bare Exception for a slow node
            try:
                ray.shutdown(wait_for_processes=True)
            finally:
                # A node that failed inside ray.init is not Ray's to shut down: its GCS, raylet
                # and reaper were started but never handed over.
                _stop_processes(_ray_processes(_descendants() - before, temp, ray))
            if (attempt == _LOCAL_START_TRIES or not isinstance(exc, Exception)
                    or not any(s in str(exc) for s in _SLOW_STARTS)):
                raise


@contextmanager
def _environ_defaults(defaults: dict[str, str]) -> Iterator[None]:
    """Each of ``defaults`` set in this process's environment for the block, unless it is set."""
    added = {name: value for name, value in defaults.items() if name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _descendants() -> set[Any]:
    """This process's descendants, as psutil processes (which know their start time, so a
    reused process id is never taken for one of them)."""
    # Ray ships psutil (ray/thirdparty_files, on sys.path once ray is imported, as it is here).
    import psutil

    return set(psutil.Process().children(recursive=True))


def _ray_processes(processes: set[Any], temp: str, ray: Any) -> set[Any]:
    """Those of ``processes`` that are this run's Ray: their command line names the run's Ray
    folder or Ray's installation (its GCS, raylet, workers and reaper all do)."""
    import psutil

    marks = [temp, *([os.path.dirname(ray.__file__)] if getattr(ray, "__file__", None) else [])]
    found = set()
    for process in processes:
        with suppress(psutil.Error):
            if any(mark in arg for arg in process.cmdline() for mark in marks):
                found.add(process)
    return found


def _stop_processes(processes: set[Any], grace_s: float = 5.0) -> None:
    """Terminate ``processes`` (Ray's reaper among them exits quietly on SIGTERM), then kill
    what is left after ``grace_s``."""
    import psutil

    for process in processes:
        with suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for process in alive:
        with suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(alive, timeout=grace_s)


def check_address(address: str, timeout_s: float = 10.0) -> None:
    """ValueError at once if a host:port address (or ray://host:port) does not accept a
    connection: ray.init would retry it for many minutes. ``auto`` is Ray's to find."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ValueError(f"cannot join the Ray cluster at --ray-address {address}: nothing "
                         f"answers there ({exc})") from None


def _root_cause(exc: BaseException) -> str:
    """Ray's innermost reason (a refused token, an unknown host), on one line."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc)
    if "Traceback (most recent call last)" in text:
        # Ray put a remote traceback in the message: its last line is the reason.
        text = [line for line in text.splitlines() if line.strip()][-1]
    return " ".join(text.split())


def _restore_sigterm(handler: Any) -> None:
    """Put back the caller's own SIGTERM handler (`coordinator simulate` turns SIGTERM into an
    interrupt): ray.init replaces it with sys.exit. Python's default stays replaced, so that a
    stop still shuts a local Ray down."""
    if callable(handler) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


class _MachineCall:
    """A silo actor's way to the machine's actor: MachineHost.call, waited for. Picklable (it
    carries the actor handle), so it travels to the silo's actor."""

    def __init__(self, machine: Any, silo: str) -> None:
        self.machine = machine
        self.silo = silo

    def __call__(self, method: str, *args: Any) -> Any:
        import ray

        try:
            return ray.get(self.machine.call.remote(self.silo, method, *args))
        except ray.exceptions.RayTaskError as exc:
            raise _cause(exc) from None


def _cause(exc: Any) -> BaseException:
    """The exception a Ray task raised, unwrapped (a ValueError stays a ValueError)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


class _RayRun:
    """One run: the silos' actors, the machine's actor, and the loop that sequences them."""

    def __init__(self, ray: Any, plan: Plan, options: RayOptions, progress: bool,
                 clock: Callable[[], float]) -> None:
        self.ray = ray
        self.plan = plan
        self.options = options
        self.clock = clock
        self.show = Progress(plan.public.rounds, clock, clock()) if progress else None
        self.silos: dict[str, Any] = {}
        self.actors: list[Any] = []           # every actor of the run, silos' and machine's
        self.finished: set[str] = set()       # silos whose driver heard the end
        self.said = ""                        # the last line a silo would have printed
        # What each silo's actor asks Ray for (on cuda, its share of the cluster's GPUs).
        self.resources = options.actor_resources(
            len(plan.silos), float(ray.cluster_resources().get("GPU", 0.0)))

    def run(self, data: Mapping[str, SiloData | Path]) -> dict[str, Any]:
        """Start the actors, run the rounds, return the results document."""
        start = self.clock()
        self._note()
        with tempfile.TemporaryDirectory(prefix="trellis-sim-") as tmp:
            identities = throwaway_identities(list(self.plan.silos), Path(tmp))
        try:
            results = self._run(data, identities)
        finally:
            # Actors hold their resources until they end: on a Ray that stays up after the run
            # (a notebook's, a test's), they end now, not whenever their handles are collected.
            for actor in self.actors:
                with suppress(Exception):   # never hide why the run ended
                    self.ray.kill(actor, no_restart=True)
        return {**results, "elapsed_s": round(self.clock() - start, 3)}

    def _run(self, data: Mapping[str, SiloData | Path],
             identities: Mapping[str, Identity]) -> dict[str, Any]:
        ray, plan, options = self.ray, self.plan, self.options
        silo_actor = ray.remote(SiloHost).options(**self.resources)
        self.silos = {name: silo_actor.remote(identities[name], options.silo_threads,
                                              options.device)
                      for name in plan.silos}
        self.actors += self.silos.values()
        summaries: dict[str, DataSummary] = self._set_up(
            "load its data", {name: actor.load.remote(self._shipped(data[name]))
                              for name, actor in self.silos.items()})
        check_data_kinds(plan, {s: summaries[s].hetero for s in plan.silos})
        row = algorithm(plan.public.algorithm)
        if not row.rounds:
            per_silo = self._get({name: actor.train_alone.remote(plan.public)
                                  for name, actor in self.silos.items()})
            return {**build_alone_results(plan, per_silo), "engine": "ray"}
        relations = (tuple(sorted(set().union(*(s.relations for s in summaries.values()))))
                     if row.matches_schemas else None)
        machine = ray.remote(MachineHost).options(num_cpus=0).remote(plan)
        self.actors.append(machine)
        public = plan.public.to_json()
        self._set_up("accept the plan", {
            name: actor.start.remote(public, relations, _MachineCall(machine, name),
                                     None if plan.simulation_init is None
                                     else str(plan.simulation_init))
            for name, actor in self.silos.items()})
        # In the plan's order, as the sequential engine joins them (an actor runs one caller's
        # calls in the order they were made).
        self._get({name: machine.join.remote(name, identities[name].cert_pem)
                   for name in plan.silos})
        self._rounds(machine)
        return self._get({"results": machine.results.remote(0.0, "ray")})["results"]

    def _rounds(self, machine: Any) -> None:
        view = self._view(machine.view.remote())
        while not view.finished:
            if view.stage in SILO_STAGES:
                self._act(view.due)
                before, view = view, self._view(machine.view.remote())
                if view.at == before.at and view.waiting == before.waiting:
                    raise RuntimeError(f"simulation stuck at {view.at}: no silo of "
                                       f"{list(view.waiting)} could act; last silo message: "
                                       f"{self.said or 'none'}")
            elif view.stage is Stage.FINISHING:
                self._act(view.due)
                view = self._view(machine.view.remote())
                if not view.finished:
                    view = self._view(machine.pass_deadline.remote())
            else:
                view = self._view(machine.pass_deadline.remote())
        if view.stage is Stage.DONE:
            # Silos not yet told (their last reports ended the federation at once) hear the end
            # now, as their streams would tell them.
            self._act({s: i for s, i in view.due.items() if s not in self.finished})

    def _act(self, due: Mapping[str, Instruction]) -> None:
        """Every silo due acts on its instruction at once; returns when all have."""
        answers = self._get({name: self.silos[name].handle.remote(instruction)
                             for name, instruction in due.items()})
        for name, (finished, said) in sorted(answers.items()):
            if finished:
                self.finished.add(name)
            if said:
                self.said = f"{name}: {said}"

    def _view(self, ref: Any) -> MachineView:
        view: MachineView = self._get({"machine": ref})["machine"]
        if self.show is not None and view.events:
            self.show.events(view.events, view.history)
        return view

    def _set_up(self, what: str, refs: Mapping[str, Any]) -> dict[str, Any]:
        """Wait for a set-up step of every silo, at most the plan's join_s: a silo whose actor
        cannot be placed would otherwise be waited for forever."""
        limit = self.plan.timeouts.join_s
        _, pending = self.ray.wait(list(refs.values()), num_returns=len(refs), timeout=limit)
        if pending:
            late = sorted(name for name, ref in refs.items() if ref in pending)
            raise RayRunFailed(
                f"silos {', '.join(late)} did not {what} within {limit:g} s (timeouts.join_s): "
                f"the Ray cluster may have no free room for their actors "
                f"({self.resources['num_cpus']:g} CPU, {self.resources['num_gpus']:g} GPU each), "
                "or their data is slow to load")
        return self._get(refs, naming=True)

    def _get(self, refs: Mapping[str, Any], *, naming: bool = False) -> dict[str, Any]:
        """Each reference's value, or the error its actor raised, unwrapped (``naming``: a
        ValueError, such as a bad data folder, says which silo it came from)."""
        ray = self.ray
        values = {}
        for name, ref in refs.items():
            try:
                values[name] = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                cause = _cause(exc)
                if cause is exc:
                    raise
                if naming and isinstance(cause, ValueError):
                    # The silo's data was read by its actor, maybe on another machine.
                    raise ValueError(f"silo {name}: {cause}") from exc
                raise cause from exc      # the chain keeps the actor's traceback
            except ray.exceptions.RayActorError as exc:
                raise RayRunFailed(f"the Ray actor of {name} died: {exc}") from None
        return values

    def _shipped(self, data: SiloData | Path) -> Any:
        # A folder travels as its path (the actor reads it where it runs); loaded data through
        # the object store.
        if isinstance(data, (str, Path)):
            return str(data)
        return self.ray.put(data)

    def _note(self) -> None:
        if self.show is None:
            return
        resources = self.ray.cluster_resources()
        where = (f"a local Ray with {resources.get('CPU', 0):g} CPUs" if self.options.local
                 else f"the Ray cluster at {self.options.address} "
                      f"({resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs)")
        share = self.resources["num_gpus"]
        gpus = f" and {share:g} GPU" if share else ""
        self.show.note(f"ray engine: {len(self.plan.silos)} silo actors with "
                       f"{self.options.cpus_per_silo:g} CPU{gpus} each on {where}",
                       event="engine")
