"""The membership audit's AUC, and the per-graph losses it reads from a trainer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from trellis.protos.plan import parse_plan
from trellis.silo.data.datasets import load_graph_folder
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.privacy.membership_audit import loss_threshold_auc
from trellis.silo.training.trainer import LocalTrainer


def test_auc_is_half_for_one_distribution_and_one_when_separated() -> None:
    rng = np.random.default_rng(0)
    same = loss_threshold_auc(rng.exponential(size=4000), rng.exponential(size=4000))
    assert abs(same - 0.5) < 0.03
    assert loss_threshold_auc(np.array([0.1, 0.2]), np.array([0.3, 0.4])) == 1.0
    assert loss_threshold_auc(np.array([0.3, 0.4]), np.array([0.1, 0.2])) == 0.0
    assert loss_threshold_auc(np.array([0.2]), np.array([0.2])) == 0.5   # a tie counts half


def test_auc_refuses_empty_or_nan_losses() -> None:
    with pytest.raises(ValueError, match="both member and non-member"):
        loss_threshold_auc(np.array([]), np.array([1.0]))
    with pytest.raises(ValueError, match="finite"):
        loss_threshold_auc(np.array([np.nan]), np.array([1.0]))


def test_per_graph_losses_average_to_the_evaluated_loss(tmp_path: Path) -> None:
    folder = write_tu_folder(tmp_path, "SYN-molecules", "molecules", 60, seed=3)
    raw = {"federation": {"id": "audit", "algorithm": "fedstar", "rounds": 1,
                          "silos": ["a", "b"]}}
    trainer = LocalTrainer(load_graph_folder(folder), parse_plan(raw, base_dir=tmp_path).public,
                           "a")
    torch.manual_seed(0)
    trainer.train()
    for split in ("train", "test"):
        losses = trainer.per_graph_losses(split)
        _, mean_loss, count = trainer.evaluate(split)
        assert losses.shape == (count,) and (losses >= 0).all()
        assert losses.mean() == pytest.approx(mean_loss, rel=1e-5)
