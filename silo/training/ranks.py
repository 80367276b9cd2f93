"""The processes of one silo that trains with ``silo join --nproc N``: how they find each other
and the few messages rank 0 sends its workers.

Started by ``silo join --nproc N``, rank 0 is the command's own process: it runs the same command
line N - 1 more times with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT) and a rendezvous on loopback; started by torchrun, every process already has them.
Either way a process whose RANK is above 0 is a worker: it talks only to rank 0, through
torch.distributed.

Training collectives (gloo on CPU, nccl on GPU: DDP's gradients, and batch norm's statistics in
a group of their own) run under ``COLLECTIVE_TIMEOUT_S``, so a worker that hangs stops the
silo. Rank 0's commands go over a gloo control group that workers wait on between rounds for
as long as the federation takes (a round waits on other silos), so its timeout is long. A
process that dies closes its connections: the others' next collective fails at once (gloo:
"Connection closed by peer"), not at the timeout.
"""

from __future__ import annotations

import enum
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from trellis.silo.training.launch import SPAWNED_BY, Launch

COLLECTIVE_TIMEOUT_S = 600.0       # one training collective (ranks are seconds apart at most)
CONTROL_TIMEOUT_S = 30 * 24 * 3600.0   # a worker waiting for rank 0's next command
RENDEZVOUS_TIMEOUT_S = 180.0       # spawned workers starting (imports) and connecting
STOP_WAIT_S = 30.0                 # a spawned worker ending after STOP
LOOPBACK = "127.0.0.1"
_UP_KEY = "trellis/up/{rank}"


class RanksFailed(RuntimeError):
    """A process of this silo's group failed, or the group could not be formed."""


class Command(enum.IntEnum):
    """What rank 0 tells its workers."""

    PLAN = 1      # build the trainer for this plan (payload: JSON)
    TRAIN = 2     # train one local round from this state (payload: trainer snapshot)
    STOP = 3      # the federation is over for this silo: exit


_DOING = {Command.PLAN: "handing the plan to the worker processes",
          Command.TRAIN: "starting local training on the worker processes",
          Command.STOP: "stopping the worker processes"}


class RankGroup:
    """This silo's processes, as rank 0 or a worker sees them."""

    def __init__(self, launch: Launch, device: torch.device, control: Any, stats: Any,
                 workers: Sequence[subprocess.Popen] = ()) -> None:
        self.launch = launch
        self.device = device
        self.control = control     # rank 0's commands and the end-of-round check (gloo)
        self.stats = stats         # batch-norm statistics (silo/models/shards.py), apart from DDP's
        self.workers = list(workers)
        # Whether the workers may be inside a collective (rank 0's STOP would not reach them):
        # until they are ready, while they build the trainer, while they train.
        self.busy = True
        self.broken = False

    @property
    def rank(self) -> int:
        """This process's rank (0 talks to the coordinator)."""
        return self.launch.rank

    @property
    def world(self) -> int:
        """How many processes train this silo's model."""
        return self.launch.world

    # -- rank 0's commands ------------------------------------------------------------------
    def send(self, command: Command, payload: bytes = b"") -> None:
        """Rank 0: tell every worker what to do next."""
        header = torch.tensor([int(command), len(payload)], dtype=torch.int64)
        self._guarded(lambda: self._broadcast(header, payload), _DOING[command])

    def receive(self) -> tuple[Command, bytes]:
        """A worker: wait for rank 0's next command."""
        header = torch.zeros(2, dtype=torch.int64)
        dist.broadcast(header, 0, group=self.control)
        blob = torch.zeros(int(header[1]), dtype=torch.uint8)
        if blob.numel():
            dist.broadcast(blob, 0, group=self.control)
        return Command(int(header[0])), blob.numpy().tobytes()

    def _broadcast(self, header: torch.Tensor, payload: bytes) -> None:
        dist.broadcast(header, 0, group=self.control)
        if payload:
            blob = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            dist.broadcast(blob, 0, group=self.control)

    def ready(self) -> None:
        """Every process has loaded its data (rank 0 waits here for its workers)."""
        self._guarded(lambda: dist.barrier(group=self.control), "waiting for the worker "
                      "processes to load their data")
        self.busy = False

    # -- collectives of a training call -------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum a tensor over every process, in place (the statistics group)."""
        dist.all_reduce(tensor, group=self.stats)

    def same_everywhere(self, digest: bytes) -> list[int]:
        """Ranks whose digest differs from rank 0's (empty: every process holds the same)."""
        mine = torch.frombuffer(bytearray(digest), dtype=torch.uint8)
        gathered = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(gathered, mine, group=self.control)
        return [r for r, other in enumerate(gathered) if not torch.equal(other, gathered[0])]

    # -- failures and the end -------------------------------------------------------------------
    def describe_failure(self, doing: str, exc: BaseException) -> str:
        """One line: what failed while doing what, how the spawned workers ended, what next."""
        self.broken = True
        ended = self._ended_workers(wait_s=2.0)
        who = ended or f"the group of {self.world} processes failed"
        return (f"{doing}: {who}; this silo stops ({gist(exc)}). Run the same command again to "
                "go on from the last round this silo finished")

    def _ended_workers(self, wait_s: float) -> str:
        """How the spawned workers that have exited ended, e.g. 'worker process rank 1 was
        killed by SIGKILL'."""
        deadline = time.monotonic() + wait_s
        while True:
            ended = [(rank, code) for rank, p in enumerate(self.workers, start=1)
                     if (code := p.poll()) is not None]
            if ended or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        return ", ".join(f"worker process rank {r} {ending(code)}" for r, code in ended)

    def _guarded(self, action: Callable[[], None], doing: str) -> None:
        if self.broken:
            raise RanksFailed(f"{doing}: this silo's group of processes has already failed")
        try:
            action()
        except RuntimeError as exc:          # torch.distributed errors are RuntimeErrors
            raise RanksFailed(self.describe_failure(doing, exc)) from None

    def close(self) -> None:
        """Rank 0: tell the workers to stop (if they can hear it), then end the group."""
        if self.rank == 0 and not self.busy and not self.broken:
            try:
                self.send(Command.STOP)
            except RanksFailed:
                pass                     # a worker already gone: nothing more to tell it
        interrupted = self.busy or self.broken
        if interrupted:
            # The workers may be inside a collective rank 0 will never join: end them.
            for worker in self.workers:
                if worker.poll() is None:
                    worker.terminate()
        _destroy()
        for worker in self.workers:
            try:
                worker.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()


def form_group(launch: Launch, device: torch.device,
               worker_command: Sequence[str] | None = None) -> RankGroup:
    """Join (or, rank 0 of `silo join --nproc`, start and join) this silo's processes.

    ``worker_command``: what rank 0 runs for each worker (its own command line); needed only
    when rank 0 starts them. RanksFailed if the group cannot be formed.
    """
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    workers: list[subprocess.Popen] = []
    try:
        if launch.torchrun:
            dist.init_process_group(backend, init_method="env://", rank=launch.rank,
                                    world_size=launch.world, timeout=timeout)
        elif launch.rank == 0:
            if worker_command is None:
                raise ValueError("rank 0 needs the workers' command line to start them")
            store = dist.TCPStore(LOOPBACK, 0, launch.world, is_master=True,
                                  timeout=timedelta(seconds=RENDEZVOUS_TIMEOUT_S),
                                  wait_for_workers=False)
            workers = _spawn(worker_command, launch.world, store.port)
            _wait_until_up(store, workers)
            dist.init_process_group(backend, store=store, rank=0, world_size=launch.world,
                                    timeout=timeout)
        else:
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                  launch.world, is_master=False,
                                  timeout=timedelta(seconds=RENDEZVOUS_TIMEOUT_S))
            store.set(_UP_KEY.format(rank=launch.rank), "1")
            dist.init_process_group(backend, store=store, rank=launch.rank,
                                    world_size=launch.world, timeout=timeout)
        control = dist.new_group(backend="gloo", timeout=timedelta(seconds=CONTROL_TIMEOUT_S))
        # Batch norm's reductions run inside the forward and backward passes; in a group of
        # their own they never interleave with DDP's gradient buckets.
        stats = dist.new_group(backend=backend, timeout=timeout)
    except BaseException as exc:       # Ctrl-C included: no worker outlives a failed start
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
        _destroy()
        if isinstance(exc, RanksFailed) or not isinstance(exc, (RuntimeError, KeyError,
                                                                ValueError)):
            raise
        raise RanksFailed(f"could not start training with {launch.world} processes: "
                          f"{gist(exc)}") from None
    return RankGroup(launch, device, control, stats, workers)


def _spawn(command: Sequence[str], world: int, port: int) -> list[subprocess.Popen]:
    """Start ranks 1..world-1 with the variables torchrun would set (own session: a Ctrl-C at
    the terminal reaches rank 0 alone, which then stops them)."""
    workers = []
    for rank in range(1, world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world),
               "LOCAL_RANK": str(rank), "MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port),
               SPAWNED_BY: str(os.getpid()), "TRELLIS_PROGRESS": "0"}
        workers.append(subprocess.Popen(list(command), env=env, stdin=subprocess.DEVNULL,
                                        start_new_session=True))
    return workers


def _wait_until_up(store: Any, workers: Sequence[subprocess.Popen]) -> None:
    """Wait for every spawned worker to reach the rendezvous; one that exits first fails it."""
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_S
    keys = [_UP_KEY.format(rank=rank) for rank in range(1, len(workers) + 1)]
    while not store.check(keys):
        for rank, worker in enumerate(workers, start=1):
            code = worker.poll()
            if code is not None:
                raise RanksFailed(f"worker process rank {rank} {ending(code)} before it "
                                  "joined")
        if time.monotonic() > deadline:
            raise RanksFailed(f"the worker processes did not start within "
                              f"{RENDEZVOUS_TIMEOUT_S:g} s")
        time.sleep(0.1)


def ending(code: int) -> str:
    """How a process ended, from its exit status ('was killed by SIGKILL', 'exited with ...')."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code} (its own lines above say why)"


def gist(exc: BaseException) -> str:
    """The first sentence of an error, without gloo's source location."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    first = re.sub(r"^\[[^\]]*\]\s*", "", text.splitlines()[0])
    return first.split(". ")[0].rstrip(".")


def _destroy() -> None:
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except RuntimeError:
            pass                       # a broken group: the process ends next anyway


def worker_command() -> list[str]:
    """The command line rank 0 runs for each worker: this very `silo` command."""
    return [sys.executable, "-m", "trellis.silo.cli", *sys.argv[1:]]
