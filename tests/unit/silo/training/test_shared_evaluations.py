"""A round's report evaluates each split once: inside `evaluations_shared()` the summed counts'
outputs are the figures' own (silo/training/shared_evaluations.py), equal to a fresh evaluation,
and a model that changes inside forgets them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from torch import nn

from tests.unit.silo.training.test_hgn_baselines import planted_graph
from trellis.protos.plan import PublicPlan, parse_plan
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.data.tu import load_tu_folder
from trellis.silo.training.hgn_trainer import HeteroTrainer, HGNConfig
from trellis.silo.training.trainer import LocalTrainer

FIGURES = ("val_acc", "val_loss", "test_acc", "test_loss")


def _plan() -> PublicPlan:
    raw = {"federation": {"id": "f", "algorithm": "fedstar", "rounds": 3, "silos": ["a", "b"]},
           "model": {"hidden": 16, "layers": 2, "n_rw": 4, "n_dg": 4},
           "training": {"batch_size": 16}}
    return parse_plan(raw, base_dir=Path(".")).public


def _counting(model: nn.Module) -> list[int]:
    """Count the model's forward passes (from now on)."""
    calls = [0]
    forward: Callable[..., object] = model.forward

    def counted(*args: object, **kwargs: object) -> object:
        calls[0] += 1
        return forward(*args, **kwargs)

    model.forward = counted  # type: ignore[method-assign]
    return calls


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tu_folder(tmp_path_factory.mktemp("shared-eval"), "MOL", "molecules", 60,
                           seed=5)


def _same_outputs(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> None:
    assert np.array_equal(a[0], b[0]) and a[1].dtype == b[1].dtype == np.float64
    assert np.array_equal(a[1], b[1])


def test_the_graph_trainers_counts_reuse_the_figures_evaluation(folder: Path) -> None:
    trainer = LocalTrainer(load_tu_folder(folder), _plan(), "a")
    trainer.train()
    fresh = {w: trainer.split_outputs(w) for w in ("val", "test")}
    alone = _counting(trainer.model)
    trainer.metrics(FIGURES)
    per_report = alone[0]                  # the figures' evaluation of both splits
    assert per_report > 0
    calls = _counting(trainer.model)
    with trainer.evaluations_shared():
        figures = trainer.metrics(FIGURES)
        shared = {w: trainer.split_outputs(w) for w in ("val", "test")}
    assert calls[0] == per_report          # the counts cost no second pass
    for which in ("val", "test"):
        _same_outputs(shared[which], fresh[which])
    assert figures == trainer.metrics(FIGURES)
    before = calls[0]
    trainer.split_outputs("val")           # outside the block: evaluated again
    assert calls[0] > before


def test_training_inside_the_block_forgets_what_was_kept(folder: Path) -> None:
    trainer = LocalTrainer(load_tu_folder(folder), _plan(), "a")
    with trainer.evaluations_shared():
        trainer.metrics(FIGURES)
        trainer.train()
        inside = trainer.split_outputs("val")
    _same_outputs(inside, trainer.split_outputs("val"))


def test_the_hetero_trainer_runs_its_whole_graph_once_per_report() -> None:
    trainer = HeteroTrainer(planted_graph(), HGNConfig(hidden=8, num_bases=4), 3, "f", "a",
                            num_classes=3)
    trainer.train()
    fresh = {w: trainer.split_outputs(w) for w in ("val", "test")}
    calls = _counting(trainer.model)
    with trainer.evaluations_shared():
        figures = trainer.metrics(FIGURES)
        shared = {w: trainer.split_outputs(w) for w in ("val", "test")}
    assert calls[0] == 1                   # was four: one per figure split, one per count split
    for which in ("val", "test"):
        _same_outputs(shared[which], fresh[which])
    assert figures == trainer.metrics(FIGURES)
    with trainer.evaluations_shared():
        trainer.metrics(FIGURES)
        trainer.train()                    # the model changes: the kept logits are forgotten
        _same_outputs(trainer.split_outputs("val"), _fresh_after(trainer))


def _fresh_after(trainer: HeteroTrainer) -> tuple[np.ndarray, np.ndarray]:
    """The validation outputs of the trainer's current model, outside any shared block."""
    memo = trainer._memo
    trainer._memo = None
    try:
        return trainer.split_outputs("val")
    finally:
        trainer._memo = memo
