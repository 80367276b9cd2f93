"""The model averaged over the rounds ([training] average; silo/training/averaged_model.py): the
average moves by 1 - decay each round, a silo evaluates, reports and keeps it, its own model is
left as it was, and a snapshot carries it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from trellis.protos.plan import PublicPlan, parse_plan
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.data.tu import load_tu_folder
from trellis.silo.training.averaged_model import ModelAverage
from trellis.silo.training.trainer import LocalTrainer


def _values(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_average_moves_by_one_minus_decay_and_swaps_in_place() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    average = ModelAverage(model, 0.75)
    with average.swapped_in():                  # before any update: the model itself
        assert all(torch.equal(a, b) for a, b in zip(_values(model).values(),
                                                     model.state_dict().values(), strict=True))
    average.update()
    first = _values(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    average.update()
    now = _values(model)
    weight = model[0].weight
    pointer = weight.data_ptr()
    with average.swapped_in():
        for name, value in model.state_dict().items():
            if value.is_floating_point():
                assert torch.allclose(value, 0.75 * first[name] + 0.25 * now[name]), name
        assert weight.data_ptr() == pointer        # the same tensor, holding the average
    for name, value in model.state_dict().items():
        assert torch.equal(value, now[name]), name  # its own values back
    # The integer count of BatchNorm is not averaged; the state carries the floating entries.
    state = average.state()
    assert state is not None and "1.num_batches_tracked" not in state


def test_a_saved_average_comes_back_and_one_that_does_not_fit_is_refused() -> None:
    model = nn.Linear(3, 2)
    average = ModelAverage(model, 0.5)
    average.update()
    saved = average.state()
    with torch.no_grad():
        model.weight.mul_(3.0)
    other = ModelAverage(model, 0.5)
    other.load_state(saved)
    with other.swapped_in():
        assert saved is not None and torch.equal(model.weight, saved["weight"])
    with pytest.raises(ValueError, match="does not fit"):
        ModelAverage(nn.Linear(3, 5), 0.5).load_state(saved)
    for decay in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match=r"in \(0, 1\)"):
            ModelAverage(model, decay)


def _plan(average: float) -> PublicPlan:
    raw = {"federation": {"id": "f", "algorithm": "fedstar", "rounds": 3, "silos": ["a", "b"]},
           "model": {"hidden": 16, "layers": 2, "n_rw": 4, "n_dg": 4},
           "training": {"batch_size": 16, "average": average}}
    return parse_plan(raw, base_dir=Path(".")).public


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tu_folder(tmp_path_factory.mktemp("averaged"), "MOL", "molecules", 60, seed=5)


def test_a_silo_evaluates_reports_and_keeps_its_average(folder: Path) -> None:
    trainer = LocalTrainer(load_tu_folder(folder), _plan(0.6), "a")
    trainer.set_shared(trainer.get_shared())               # round 1's values: the average
    first = _values(trainer.model)
    trainer.train()
    trainer.set_shared(trainer.get_shared() + np.float32(0.05))
    now = _values(trainer.model)
    expected = {k: (0.6 * first[k] + 0.4 * v if v.is_floating_point() else v)
                for k, v in now.items()}
    figures = trainer.metrics(("val_acc", "val_loss", "test_acc"))
    losses, predictions = trainer.per_graph_losses("test"), trainer.predictions("test")
    assert all(torch.equal(v, now[k]) for k, v in trainer.model.state_dict().items())

    # The same figures from a trainer that holds the average by hand (and no average).
    by_hand = LocalTrainer(load_tu_folder(folder), _plan(0.0), "a")
    by_hand.model.load_state_dict(expected)
    assert by_hand.metrics(("val_acc", "val_loss", "test_acc")) == pytest.approx(figures)
    assert np.allclose(by_hand.per_graph_losses("test"), losses)
    assert np.array_equal(by_hand.predictions("test"), predictions)
    # The model itself reads otherwise: the average is what was evaluated.
    plain = LocalTrainer(load_tu_folder(folder), _plan(0.0), "a")
    plain.model.load_state_dict(now)
    assert not np.allclose(plain.per_graph_losses("test"), losses)

    # The final model holds the average; a snapshot carries it to a restored trainer.
    kept = trainer.final_snapshot()["model"]
    assert all(torch.allclose(kept[k].float(), expected[k].float()) for k in expected)
    snapshot = trainer.snapshot()
    assert all(torch.equal(snapshot["model"][k], now[k]) for k in now)
    again = LocalTrainer(load_tu_folder(folder), _plan(0.6), "a")
    again.restore(snapshot)
    assert again.metrics(("val_acc", "val_loss", "test_acc")) == pytest.approx(figures)


def test_the_plan_reads_the_average_and_names_a_bad_one() -> None:
    assert _plan(0.97).training.average == 0.97
    # Off, it is left out of the wire: plans without it keep their hashes.
    assert '"average"' not in _plan(0.0).to_json() and '"average"' in _plan(0.9).to_json()
    assert PublicPlan.from_json(_plan(0.9).to_json()).training.average == 0.9
    for bad in (1.0, -0.1, "high"):
        with pytest.raises(Exception, match="training.average"):
            _plan(bad)  # type: ignore[arg-type]
    with pytest.raises(Exception, match="training.average: fedhgn"):
        parse_plan({"federation": {"id": "f", "algorithm": "fedhgn", "rounds": 3,
                                   "silos": ["a", "b"]}, "training": {"average": 0.9}},
                   base_dir=Path("."))
