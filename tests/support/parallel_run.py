"""Local training of one silo's trainer for a few rounds, in one process or with --nproc N real
processes (silo/training/parallel_trainer.py over gloo on loopback), for tests to compare.

Run as ``python -m tests.support.parallel_run --data FOLDER --out FILE --nproc N ...``: this
process is rank 0 and starts ranks 1..N-1 with this same command line, as ``silo join --nproc``
does. ``train_rounds`` is the one sequence of calls both ways run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trellis.protos.plan import AggregationConfig, ModelConfig, PublicPlan, TrainingConfig
from trellis.silo.data.datasets import load_graph_folder
from trellis.silo.training.trainer import LocalTrainer

SILO = "silo-a"


def plan_for(algorithm: str, batch_size: int, epochs: int) -> PublicPlan:
    """The public plan of these runs."""
    return PublicPlan("parallel", algorithm, 2, 7, ModelConfig(),
                      TrainingConfig(batch_size=batch_size, local_epochs=epochs),
                      AggregationConfig())


def train_rounds(trainer: LocalTrainer, rounds: int) -> list[dict[str, Any]]:
    """Train ``rounds`` local rounds; between them, load a new shared state as an aggregate
    would (half the current values). After each: the loss, what rank 0 would upload, the
    weights and buffers, and the gradient of the last step."""
    done = []
    for round_ in range(rounds):
        if round_:
            trainer.set_shared(trainer.get_shared() * np.float32(0.5))
        began = time.perf_counter()
        loss = trainer.train()["train_loss"]
        done.append({
            "loss": loss, "seconds": time.perf_counter() - began,
            "upload": torch.from_numpy(trainer.upload_vector().copy()),
            "model": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
            "grads": {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters()
                      if p.grad is not None}})
    return done


def one_process(data: Path, algorithm: str, batch_size: int, epochs: int, rounds: int,
                threads: int = 1) -> list[dict[str, Any]]:
    """The reference: a LocalTrainer in this process, one torch thread (as each rank has)."""
    held = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        trainer = LocalTrainer(load_graph_folder(data), plan_for(algorithm, batch_size, epochs),
                               SILO)
        return train_rounds(trainer, rounds)
    finally:
        torch.set_num_threads(held)


def main(argv: list[str]) -> None:
    """Rank 0 trains and writes the results; a worker serves rank 0 until it stops."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--nproc", type=int, required=True)
    parser.add_argument("--algorithms", default="fedstar")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kill-worker-at-end", action="store_true",
                        help="then kill rank 1 and train once more: what does rank 0 say?")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from trellis.silo.training.launch import launch_of
    from trellis.silo.training.parallel_trainer import ParallelTrainer, serve
    from trellis.silo.training.ranks import form_group

    launch = launch_of(args.nproc, os.environ)
    cpu = torch.device("cpu")
    if launch.rank > 0:
        group = form_group(launch, cpu)
        try:
            group.ready()
            serve(group, lambda: load_graph_folder(args.data), print)
        finally:
            group.close()
        return
    group = form_group(launch, cpu, [sys.executable, "-m", "tests.support.parallel_run", *argv])
    results: dict[str, Any] = {}
    try:
        group.ready()
        for algorithm in args.algorithms.split(","):
            plan = plan_for(algorithm, args.batch_size, args.epochs)
            trainer = ParallelTrainer.lead(group, load_graph_folder(args.data), plan, SILO, cpu)
            results[algorithm] = train_rounds(trainer, args.rounds)
        if args.kill_worker_at_end:
            group.workers[0].kill()
            group.workers[0].wait()
            began = time.monotonic()
            try:
                trainer.train()
            except Exception as exc:        # the test reads what rank 0 says
                results["after_kill"] = {"error": f"{type(exc).__name__}: {exc}",
                                         "seconds": time.monotonic() - began}
    finally:
        group.close()
    torch.save(results, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
