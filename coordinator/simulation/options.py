"""The engines of `coordinator simulate` and the Ray engine's settings, checked (no torch, no Ray).

``sequential`` runs every silo in this process, one after another; ``ray`` runs each silo as a
Ray actor (coordinator/simulation/ray_engine.py). Both run the same round machine and silo driver,
so a plan gives the same results on either: the engine is how a plan runs, not what it computes, and
so it is chosen on the command line (or by ``simulate(engine=...)``), not in the plan. The CLI
checks these settings here before it loads torch, so a typo fails in a moment.

Where the silos train, ``--device``, means the same on both engines and in ``silo join``: cpu,
cuda (or cuda:N) or auto (a GPU where the silo has one). The sequential engine trains every silo
on this machine's device (default cpu); a Ray silo trains on the GPU share its actor reserves
(``--gpus-per-silo``), so there cuda needs a share, cpu refuses one and auto follows it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trellis.protos.devices import check_device_spec

ENGINES = ("sequential", "ray")
MIN_OBJECT_STORE_MB = 80        # Ray refuses less than 75 MiB


@dataclass(frozen=True)
class RayOptions:
    """Where the Ray engine runs and what each silo's actor reserves there.

    ``address``: empty starts a local Ray for the run (stopped at its end); ``auto``, a
    ``host:port`` or a ``ray://host:port`` address joins an existing cluster, which is left
    running. ``cpus_per_silo`` and ``gpus_per_silo`` are each actor's Ray resources, held for
    the whole run (every silo keeps its keys and model between stages); fractions let several
    silos share a CPU or a GPU. ``requested_device`` is the ``--device`` asked for: with
    ``cuda`` and ``gpus_per_silo`` 0, each actor reserves an equal share of the cluster's GPUs
    (``equal_gpu_share``), so that all the silos train on one GPU at once, not in turn.
    ``threads`` is each silo's torch intra-op threads (default: its whole CPUs, at least one).
    ``num_cpus`` and ``object_store_mb`` size a local Ray only.
    """

    address: str = ""
    cpus_per_silo: float = 1.0
    gpus_per_silo: float = 0.0
    threads: int | None = None
    num_cpus: int | None = None
    object_store_mb: int = 200
    requested_device: str = "auto"

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))

    def problems(self) -> list[str]:
        """Every bad setting, each as one line naming its command-line option."""
        found = []
        if not math.isfinite(self.cpus_per_silo) or self.cpus_per_silo <= 0:
            found.append(f"--cpus-per-silo {self.cpus_per_silo:g}: must be above 0 (a fraction "
                         "such as 0.5 lets two silos share a CPU)")
        if not math.isfinite(self.gpus_per_silo) or self.gpus_per_silo < 0:
            found.append(f"--gpus-per-silo {self.gpus_per_silo:g}: must be 0 or more")
        elif self.gpus_per_silo > 1 and not float(self.gpus_per_silo).is_integer():
            # Ray's own rule: a fraction of one GPU, or whole GPUs.
            found.append(f"--gpus-per-silo {self.gpus_per_silo:g}: above 1 it must be a whole "
                         "number of GPUs")
        if self.threads is not None and self.threads < 1:
            found.append(f"--threads {self.threads}: must be 1 or more")
        if self.num_cpus is not None and self.num_cpus < 1:
            found.append(f"--ray-cpus {self.num_cpus}: must be 1 or more")
        if self.num_cpus is not None and self.address:
            found.append("--ray-cpus sizes a local Ray; a cluster at --ray-address has its own "
                         "CPUs")
        if self.object_store_mb < MIN_OBJECT_STORE_MB:
            found.append(f"object store of {self.object_store_mb} MB: Ray needs at least "
                         f"{MIN_OBJECT_STORE_MB} MB")
        return found + self._device_problems()

    def _device_problems(self) -> list[str]:
        wanted, gpus = self.requested_device, self.gpus_per_silo
        try:
            check_device_spec(wanted)
        except ValueError as exc:
            return [str(exc)]
        has_share = math.isfinite(gpus) and gpus > 0
        if wanted.startswith("cuda:"):
            return [f"--device {wanted}: with --engine ray each silo's actor trains on the GPU "
                    "Ray gives it; give --device cuda with --gpus-per-silo"]
        if wanted == "cpu" and has_share:
            return [f"--device cpu with --gpus-per-silo {gpus:g}: the silos would hold GPUs they "
                    "do not use; leave --gpus-per-silo out"]
        return []

    @property
    def local(self) -> bool:
        """Whether the engine starts (and stops) its own Ray."""
        return not self.address

    @property
    def silo_threads(self) -> int:
        """Torch threads in each silo's actor: as many as its whole CPUs, at least one."""
        return self.threads or max(1, int(self.cpus_per_silo))

    @property
    def device(self) -> str:
        """Where each silo trains: on its GPU share if it has one (or cuda was asked for)."""
        return "cuda" if self.wants_cuda or self.gpus_per_silo > 0 else "cpu"

    @property
    def wants_cuda(self) -> bool:
        """Whether cuda was asked for by name (auto follows ``gpus_per_silo``)."""
        return self.requested_device == "cuda"

    def gpu_share(self, silos: int, cluster_gpus: float) -> float:
        """GPUs each silo's actor reserves: ``gpus_per_silo`` if set, else on cuda an equal
        share of the cluster's GPUs (of one GPU if it reports none), else none."""
        if self.gpus_per_silo > 0 or not self.wants_cuda:
            return self.gpus_per_silo
        return equal_gpu_share(silos, cluster_gpus)

    def actor_resources(self, silos: int, cluster_gpus: float) -> dict[str, float]:
        """What each of ``silos`` silo actors asks Ray for (its ``.options(...)``), on a
        cluster with ``cluster_gpus`` GPUs."""
        return {"num_cpus": self.cpus_per_silo,
                "num_gpus": self.gpu_share(silos, cluster_gpus)}


def equal_gpu_share(silos: int, gpus: float = 1.0) -> float:
    """The largest fraction of a GPU that lets ``silos`` actors all live on ``gpus`` GPUs at
    once: 1/7 for 7 silos on one GPU, 1/4 for 7 on two (Ray places a fraction within one GPU,
    so the silos are split as evenly as whole GPUs allow); rounded down to Ray's units of
    1/10000, so that the shares never add up to more than a GPU."""
    if silos < 1:
        raise ValueError(f"{silos} silos: a simulation needs at least one")
    per_gpu = math.ceil(silos / max(1, int(gpus)))
    return math.floor(10_000 / per_gpu) / 10_000


def check_engine(engine: str) -> str:
    """The engine's name, or ValueError naming the valid choices."""
    if engine not in ENGINES:
        raise ValueError(f"unknown simulation engine {engine!r}: expected one of "
                         f"{', '.join(ENGINES)}")
    return engine


def capacity_problem(resources: dict[str, float], silos: int, options: RayOptions) -> str | None:
    """Why a Ray cluster with these total resources cannot hold every silo's actor at once
    (None if it can). All silos live for the whole run, so they must all fit together."""
    gpus = options.gpu_share(silos, float(resources.get("GPU", 0.0)))
    for kind, flag, each in (("CPU", "--cpus-per-silo", options.cpus_per_silo),
                             ("GPU", "--gpus-per-silo", gpus)):
        have = float(resources.get(kind, 0.0))
        need = silos * each
        # Ray counts resources in units of 1/10000.
        if each <= 0 or round(need * 10_000) <= round(have * 10_000):
            continue
        problem = (f"{silos} silos x {each:g} {kind} need {need:g} {kind}s but the Ray cluster "
                   f"has {have:g}")
        fits = math.floor(have / silos * 100) / 100
        if fits > 0:
            # Every silo's actor lives for the whole run: they cannot take turns.
            problem += f": let the silos share with {flag} {fits:g}"
        elif kind == "GPU":
            problem += (": train on CPUs with --device cpu" if options.wants_cuda and not
                        options.gpus_per_silo else f": train on CPUs with {flag} 0")
        if kind == "CPU" and options.local:
            problem += ", or give the local Ray more with --ray-cpus"
        return problem
    return None
