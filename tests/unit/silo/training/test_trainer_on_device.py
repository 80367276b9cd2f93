"""A training step that never waits for the host: the splits stay on the trainer's device,
batches are gathered there, and the losses are read once when training ends
(silo/training/trainer.py, silo/models/batching.py)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from trellis.protos.plan import PublicPlan, parse_plan
from trellis.silo.data.datasets import load_graph_folder
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.training.trainer import LocalTrainer

CUDA = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="needs a CUDA GPU: host syncs and copies of a training epoch")
# 40 graphs, 4 per batch: about 8 steps an epoch, more than the syncs and copies allowed.
GRAPHS, BATCH = 40, 4


def _trainer(tmp_path: Path, algorithm: str, device: str) -> LocalTrainer:
    folder = write_tu_folder(tmp_path, "SYN-molecules", "molecules", GRAPHS, seed=3)
    raw = {"federation": {"id": "on-device", "algorithm": algorithm, "rounds": 1,
                          "silos": ["a", "b"]},
           "training": {"batch_size": BATCH, "local_epochs": 1}}
    plan: PublicPlan = parse_plan(raw, base_dir=tmp_path).public
    return LocalTrainer(load_graph_folder(folder), plan, "a", device)


def _recorded(trainer: LocalTrainer) -> int:
    """How many step graphs the trainer has recorded (0 on the plain path)."""
    return 0 if trainer._graphed is None else trainer._graphed.recorded


def _steps(trainer: LocalTrainer) -> int:
    return -(-trainer.num_train // BATCH)


def test_on_the_cpu_the_splits_are_not_copied(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, "fedstar", "cpu")
    assert all(trainer._resident[s] is trainer._packed[s] for s in ("train", "val", "test"))


@CUDA
@pytest.mark.parametrize("algorithm", ["fedstar", "feddense", "fedprox"])
def test_an_epoch_on_cuda_waits_for_the_gpu_a_bounded_number_of_times(
        tmp_path: Path, algorithm: str) -> None:
    trainer = _trainer(tmp_path, algorithm, "cuda")
    assert trainer._resident["train"].x.is_cuda
    trainer.train()                     # warms the allocators up
    trainer.metrics(("val_acc",))
    # Recording a batch shape's CUDA graph (silo/training/graphed_steps.py) waits once; the
    # epoch measured is one that records none (or takes plain steps).
    for _ in range(6):
        recorded = _recorded(trainer)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                loss = trainer.train()["train_loss"]
            finally:
                torch.cuda.set_sync_debug_mode("default")
        if _recorded(trainer) == recorded:
            break
    assert _recorded(trainer) == recorded, "every epoch recorded a new graph"
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
    # Reading the losses once at the end; a sync per step would be one per batch.
    assert _steps(trainer) >= 8 and len(syncs) <= 2, syncs
    assert torch.isfinite(torch.tensor(loss))


@CUDA
def test_batches_stay_on_the_gpu_with_no_copy_from_the_host_per_step(tmp_path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    trainer = _trainer(tmp_path, "fedstar", "cuda")
    trainer.train()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        trainer.train()
        torch.cuda.synchronize()
    copies = [e.name for e in prof.events() if "HtoD" in e.name]
    # The epoch's shuffled order, copied once (pinned); nothing per batch.
    assert _steps(trainer) >= 8 and len(copies) <= 2, copies


@CUDA
def test_evaluation_on_cuda_gives_the_figures_of_the_same_model_on_the_cpu(
        tmp_path: Path) -> None:
    on_gpu = _trainer(tmp_path / "gpu", "fedstar", "cuda")
    on_cpu = _trainer(tmp_path / "cpu", "fedstar", "cpu")
    on_cpu.model.load_state_dict({k: v.cpu() for k, v in on_gpu.model.state_dict().items()})
    gpu, cpu = on_gpu.evaluate_figures("test"), on_cpu.evaluate_figures("test")
    assert gpu["count"] == cpu["count"] and gpu["acc"] == pytest.approx(cpu["acc"])
    assert gpu["loss"] == pytest.approx(cpu["loss"], rel=1e-4)
