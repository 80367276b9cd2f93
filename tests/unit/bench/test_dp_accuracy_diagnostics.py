"""bench/dp_accuracy.py's noise diagnostic (`--noise-scale`): it scales exactly the two noises it
names, only while a run lasts, and a run that uses it must carry a label.

The real `add_noise` and the real exact sampler run underneath; nothing is mocked.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from tests.paths import ROOT
from trellis.crypto.randomness import SeededRandomSource
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
