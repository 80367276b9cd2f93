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
    silos share a CPU or a GPU. ``threads`` is each silo's torch intra-op threads (default: its
    whole CPUs, at least one). ``num_cpus`` and ``object_store_mb`` size a local Ray only.
    ``requested_device`` is the ``--device`` asked for (auto: cuda with a GPU share, else cpu);
    ``device`` is where the silos train.
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
        if wanted == "cuda" and not has_share:
            return ["--device cuda with --engine ray: give each silo's actor a GPU share with "
                    "--gpus-per-silo (e.g. 0.5: two silos per GPU)"]
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
        """Where each silo trains: on its GPU share if it has one."""
        return "cuda" if self.gpus_per_silo > 0 else "cpu"


def check_engine(engine: str) -> str:
    """The engine's name, or ValueError naming the valid choices."""
    if engine not in ENGINES:
        raise ValueError(f"unknown simulation engine {engine!r}: expected one of "
                         f"{', '.join(ENGINES)}")
    return engine


def capacity_problem(resources: dict[str, float], silos: int, options: RayOptions) -> str | None:
    """Why a Ray cluster with these total resources cannot hold every silo's actor at once
    (None if it can). All silos live for the whole run, so they must all fit together."""
    for kind, flag, each in (("CPU", "--cpus-per-silo", options.cpus_per_silo),
                             ("GPU", "--gpus-per-silo", options.gpus_per_silo)):
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
            problem += f": train on CPUs with {flag} 0"
        if kind == "CPU" and options.local:
            problem += ", or give the local Ray more with --ray-cpus"
        return problem
    return None
