"""Which of a silo's processes this one is (``silo join --nproc N``, or torchrun), read from the
command line and the launcher's variables; imports no torch, so that the thread count can be
set before torch is loaded."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# Set in the environment of the workers `silo join --nproc` starts (not by torchrun).
SPAWNED_BY = "TRELLIS_SPAWNED_BY"


@dataclass(frozen=True)
class Launch:
    """This process's place among the silo's processes."""

    rank: int
    world: int
    local_rank: int
    spawned: bool = False     # a worker started by `silo join --nproc` (not by torchrun)
    torchrun: bool = False    # started by torchrun (or another launcher setting its variables)

    @property
    def parallel(self) -> bool:
        """Whether more than one process trains this silo's model."""
        return self.world > 1


def launch_of(nproc: int | None, environ: Mapping[str, str]) -> Launch:
    """This process's place, from ``--nproc`` and the launcher's variables (ValueError: a bad
    count or a contradiction, said in one line)."""
    if nproc is not None and nproc < 1:
        raise ValueError(f"--nproc {nproc}: expected 1 or more processes")
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return Launch(0, 1 if nproc is None else nproc, 0)
    try:
        rank, world = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        local_rank = int(environ.get("LOCAL_RANK", rank))
    except ValueError:
        raise ValueError(f"RANK={environ.get('RANK')!r}, WORLD_SIZE="
                         f"{environ.get('WORLD_SIZE')!r}: expected whole numbers (as torchrun "
                         "sets them)") from None
    if world < 1 or not 0 <= rank < world or local_rank < 0:
        raise ValueError(f"RANK={rank}, WORLD_SIZE={world}, LOCAL_RANK={local_rank}: expected "
                         "0 <= RANK < WORLD_SIZE and LOCAL_RANK >= 0")
    if nproc is not None and nproc != world:
        raise ValueError(f"--nproc {nproc}, but this process is one of {world} (WORLD_SIZE, set "
                         "by torchrun): leave --nproc out under torchrun, or make them agree")
    spawned = SPAWNED_BY in environ
    if world > 1 and not spawned and environ.get("MASTER_PORT") == "0":
        raise ValueError("MASTER_PORT=0: the processes could not meet; give torchrun a port "
                         "(--master-port) or --standalone")
    return Launch(rank, world, local_rank, spawned=spawned, torchrun=not spawned)


def threads_per_process(launch: Launch) -> int:
    """Torch threads of each process when --threads is not given: the cores, shared out."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:              # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // launch.world)
