"""FedHGN's trainer and its baselines draw no random number while they train (no dropout; the
initial weights come from a reseeded, forked CPU generator): torch's global generators neither
matter to their results nor are moved by them, so silos in one process stay independent."""

from __future__ import annotations

import torch

from tests.unit.silo.training.test_hgn_baselines import planted_graph
from trellis.silo.training.hgn_baselines import train_alone
from trellis.silo.training.hgn_trainer import HeteroTrainer, HGNConfig


def _states() -> list[torch.Tensor]:
    states = [torch.get_rng_state()]
    if torch.cuda.is_available():
        states += torch.cuda.get_rng_state_all()
    return states


def _reseed(seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    torch.rand(100)
    return _states()


def _same(one: list[torch.Tensor], other: list[torch.Tensor]) -> bool:
    return all(torch.equal(a, b) for a, b in zip(one, other, strict=True))


def test_hetero_training_ignores_and_keeps_the_global_generators() -> None:
    weights = []
    for seed in (1, 2):
        before = _reseed(seed)
        trainer = HeteroTrainer(planted_graph(), HGNConfig(hidden=8, num_bases=4), 3, "f", "a",
                                num_classes=3)
        for _ in range(2):
            trainer.train()
        assert _same(before, _states())
        weights.append([v.clone() for v in trainer.model.state_dict().values()])
    assert _same(weights[0], weights[1])


def test_the_baselines_ignore_and_keep_the_global_generators() -> None:
    results = []
    for seed in (1, 2):
        before = _reseed(seed)
        results.append(train_alone(planted_graph(), HGNConfig(hidden=8), seed=3, name="a",
                                   max_epochs=20))
        assert _same(before, _states())
    assert results[0] == results[1]
