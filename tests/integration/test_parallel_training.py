"""`silo join --nproc 2` trains the model one process would: two real processes over gloo on
loopback (tests/support/parallel_run.py, rank 0 starting rank 1 as `silo join` does) against a
LocalTrainer in this process, same data, seed and global batch. No GPU here: nccl is not run.

Tolerances. The two processes sum each gradient in another order than one process does (each
process sums over its part, DDP adds the parts), so values agree to float32 rounding, not bit
for bit. Observed: gradients within 2e-6 of the model's largest gradient entry, weights after
a round within 1e-6 relative (4e-5 absolute on batch norm's running variances, of size ~100),
losses within 1e-7. The assertions allow 1e-4 relative, 5e-5 absolute on weights (a twentieth
of the learning rate: a weight whose true gradient is zero, such as a bias before batch norm,
is moved by Adam on the rounding noise alone), and on gradients 1e-5 of the largest entry.
Across rounds, a ReLU whose input sits near zero can turn such rounding differences into
differences up to 1e-2 relative in a few tensors: one process does the same when its weights
are nudged by 1e-6 (docs/deploy.md). So the second round is checked by its loss, and by the
processes' own end-of-round check that they all hold the same model.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.parallel_run import one_process
from trellis.silo.data.synthetic import write_tu_folder

ALGORITHMS = ("fedstar", "feddense", "fedprox", "gcfl")
# 61 graphs: 48 for training. Batches of 47: one part of 24 and one of 23, then a batch of one
# graph, whose second part is empty (and which FedDense normalises with running statistics).
GRAPHS, BATCH, EPOCHS, ROUNDS = 61, 47, 2, 2


def _run(data: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Rank 0 of a two-process run (it starts rank 1), its output read from files: a pipe
    would also wait for rank 1, which has its own session, to close its copy."""
    logs = out.with_suffix(".stderr")
    with open(logs, "w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "tests.support.parallel_run",
                                    "--data", str(data), "--out", str(out), "--nproc", "2",
                                    *extra], stdout=subprocess.DEVNULL, stderr=stderr,
                                   text=True, cwd=Path(__file__).resolve().parents[2])
        try:
            # Below pytest-timeout's 300 s: a hang fails with what both ranks printed.
            code = process.wait(timeout=270)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            pytest.fail("the two-process run did not end within 270 s; what its ranks "
                        f"printed:\n{logs.read_text(errors='replace')[-4000:]}")
    return subprocess.CompletedProcess(process.args, code, "", logs.read_text(errors="replace"))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tu_folder(tmp_path_factory.mktemp("parallel"), "MOL", "molecules", GRAPHS,
                           seed=3)


@pytest.fixture(scope="module")
def two_processes(data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("parallel-run") / "results.pt"
    done = _run(data, out, "--algorithms", ",".join(ALGORITHMS), "--batch-size", str(BATCH),
                "--epochs", str(EPOCHS), "--rounds", str(ROUNDS), "--kill-worker-at-end")
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out, weights_only=True)


def _close(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(got[name].float(), value.float(), rtol=1e-4, atol=5e-5,
                                   msg=lambda m, name=name: f"{name}: {m}")


def _close_gradients(got: dict, expected: dict) -> None:
    """Each tensor within 1e-4 of its largest entry, plus 1e-5 of the model's largest: a
    gradient that is zero but for rounding (a bias before batch norm) is all noise."""
    assert got.keys() == expected.keys()
    top = max(float(g.abs().max()) for g in expected.values())
    for name, value in expected.items():
        allowed = 1e-4 * float(value.abs().max()) + 1e-5 * top
        assert float((got[name] - value).abs().max()) <= allowed, name


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_two_processes_train_the_model_of_one(algorithm: str, data: Path,
                                              two_processes: dict) -> None:
    expected = one_process(data, algorithm, BATCH, EPOCHS, ROUNDS)
    got = two_processes[algorithm]
    first, reference = got[0], expected[0]
    assert first["loss"] == pytest.approx(reference["loss"], rel=1e-5)
    # The last step's gradient (the batch of one graph): every parameter, both processes'
    # contributions summed as one process computes them.
    _close_gradients(first["grads"], reference["grads"])
    _close(first["model"], reference["model"])
    _close({"upload": first["upload"]}, {"upload": reference["upload"]})
    # Round 2 starts from a state loaded on rank 0 only: it reaches the worker, or the
    # processes would part (they check) and the loss would be another.
    second, reference = got[1], expected[1]
    assert second["loss"] == pytest.approx(reference["loss"], rel=1e-4)
    assert second["upload"].shape == reference["upload"].shape


def test_a_worker_that_dies_stops_rank_0_at_once_naming_it(two_processes: dict) -> None:
    """Rank 1 killed between rounds: rank 0's next round fails at once (gloo sees the closed
    connection), not at a collective's timeout, and says which process ended how."""
    after = two_processes["after_kill"]
    assert after["error"].startswith(
        "ParallelTrainingFailed: starting local training on the worker processes: worker "
        "process rank 1 was killed by SIGKILL; this silo stops ("), after["error"]
    assert after["error"].endswith("Run the same command again to go on from the last round "
                                   "this silo finished")
    assert after["seconds"] < 10, after
