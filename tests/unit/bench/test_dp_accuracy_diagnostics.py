"""bench/dp_accuracy.py's noise diagnostic (`--noise-scale`): it scales exactly the two noises it
names, only while a run lasts, and a run that uses it must carry a label. Its averaged
evaluation (`--eval-average`): the plan's average over the rounds.

The real `add_noise` and the real exact sampler run underneath; nothing is mocked.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.paths import ROOT
from trellis.crypto.randomness import SeededRandomSource
from trellis.protos.plan import load_plan
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


def test_an_averaged_evaluation_is_the_plans_average(tmp_path: Path) -> None:
    """`--eval-average` names `[training] average` in every arm's plan (the product's average,
    tests/unit/silo/training/test_averaged_model.py); 0 names none."""
    folders = [write_tu_folder(tmp_path / f"s{i}", "SYN-molecules", "molecules", 20, seed=i)
               for i in range(2)]
    for decay in (0.95, 0.0):
        args = dp_accuracy.argument_parser().parse_args(
            ["--eval-average", str(decay), "--dropout", "0"])
        text = dp_accuracy.plan_text("ddg", 8.0, 1, 10, folders, tmp_path / "state", args)
        (tmp_path / "plan.toml").write_text(text)
        plan = load_plan(tmp_path / "plan.toml")
        assert plan.public.training.average == decay
        assert plan.public.model.dropout == 0.0
