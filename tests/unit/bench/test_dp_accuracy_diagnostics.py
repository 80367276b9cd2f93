"""bench/dp_accuracy.py's noise diagnostic (`--noise-scale`): it scales exactly the two noises it
names, only while a run lasts, and a run that uses it must carry a label. Its averaged
evaluation (`--eval-average`): a silo scores the rounds' average and keeps its own model.

The real `add_noise` and the real exact sampler run underneath; nothing is mocked.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from tests.paths import ROOT
from trellis.crypto.randomness import SeededRandomSource
from trellis.protos.plan import parse_plan
from trellis.silo.data.datasets import load_graph_folder
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.federation import session
from trellis.silo.training import trainer

sys.path.insert(0, str(ROOT / "bench"))

import dp_accuracy  # noqa: E402  (bench/ is not a package)

SIGMA = 1000.0
VALUES = 20_000


def _std(add: object) -> float:
    zeros = np.zeros(VALUES, dtype=np.int64)
    return float(np.std(add(zeros, SIGMA, SeededRandomSource(b"scale"))))  # type: ignore[operator]


def test_each_slice_gets_its_own_factor_and_both_come_back() -> None:
    plain_shared, plain_local = session.add_noise, trainer.add_noise
    with dp_accuracy.scaled_noise(0.0, 0.25):
        assert _std(session.add_noise) == 0.0                      # the shared slice: none
        assert abs(_std(trainer.add_noise) / (0.25 * SIGMA) - 1) < 0.03  # the local: a quarter
    assert session.add_noise is plain_shared and trainer.add_noise is plain_local
    assert abs(_std(trainer.add_noise) / SIGMA - 1) < 0.03


def test_the_functions_come_back_when_a_run_fails() -> None:
    plain = trainer.add_noise
    try:
        with dp_accuracy.scaled_noise(0.0, 0.0):
            raise RuntimeError("a run that failed")
    except RuntimeError:
        pass
    assert trainer.add_noise is plain


def test_a_scaled_run_without_a_label_is_refused() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "dp_accuracy.py"),
                          "--noise-scale", "0", "0", "--arms", "ddg"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "not private: label them with --recipe" in run.stderr


def _trainer(tmp_path: Path) -> trainer.LocalTrainer:
    folder = write_tu_folder(tmp_path, "SYN-molecules", "molecules", 40, seed=3)
    raw = {"federation": {"id": "averaged", "algorithm": "fedstar", "rounds": 2, "seed": 1,
                          "silos": ["a", "b"]},
           "training": {"batch_size": 8, "local_epochs": 1}}
    return trainer.LocalTrainer(load_graph_folder(folder), parse_plan(raw, base_dir=tmp_path)
                                .public, "a", "cpu")


def _values(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_an_averaged_evaluation_scores_the_rounds_average_and_leaves_the_model(
        tmp_path: Path) -> None:
    silo = _trainer(tmp_path)
    plain_set = trainer.LocalTrainer.set_shared
    plain_evaluate = trainer.LocalTrainer.evaluate_figures
    with dp_accuracy.averaged_evaluation(0.75):
        silo.set_shared(silo.get_shared())             # round 1's model: the average so far
        first = _values(silo.model)
        silo.train()
        silo.set_shared(silo.get_shared() + 0.05)      # round 2's model
        second = _values(silo.model)
        averaged = silo.evaluate_figures("test")
        losses = silo.per_graph_losses("test")
        after = _values(silo.model)
    assert trainer.LocalTrainer.set_shared is plain_set
    assert trainer.LocalTrainer.evaluate_figures is plain_evaluate
    assert all(torch.equal(after[n], second[n]) for n in second)      # the model as it was
    own = silo.evaluate_figures("test")
    with torch.no_grad():                      # the average by hand: 0.75 first, 0.25 second
        for name, param in silo.model.named_parameters():
            param.copy_(0.75 * first[name] + 0.25 * second[name])
    by_hand = silo.evaluate_figures("test")
    assert averaged["loss"] == by_hand["loss"] and averaged["acc"] == by_hand["acc"]
    assert np.array_equal(losses, silo.per_graph_losses("test"))
    assert own["loss"] != by_hand["loss"]              # not the model itself


def test_no_average_changes_nothing() -> None:
    plain = trainer.LocalTrainer.evaluate_figures
    with dp_accuracy.averaged_evaluation(0.0):
        assert trainer.LocalTrainer.evaluate_figures is plain
