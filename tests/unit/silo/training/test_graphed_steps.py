"""Training steps replayed as CUDA graphs (silo/training/graphed_steps.py).

On the CPU: which path a trainer takes and why, and that the padded steps a graph records train
as the plain steps do (taken eagerly, ``capture=False``). On a CUDA GPU: the recorded steps take
exactly the padded eager steps, masks included; a step torch cannot record leaves the silo on
the plain path, trained, with the reason. (The random-stream tests,
test_trainer_random_streams.py, run FedStar on the GPU through the graphs too: a retried round
and interleaved silos.)
"""

from __future__ import annotations

import gc
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.support.cuda import needs_cuda, run_apart
from trellis.protos.plan import PublicPlan, parse_plan
from trellis.silo.data.datasets import load_graph_folder
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.models.graph_classifiers import DualChannelGIN, DualDenseGIN
from trellis.silo.training.graphed_steps import (
    GraphedSteps,
    graph_path,
    graphs_setting,
    no_collection,
)
from trellis.silo.training.trainer import LocalTrainer

GRAPHS, BATCH = 60, 8


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tu_folder(tmp_path_factory.mktemp("graphed"), "SYN-molecules", "molecules",
                           GRAPHS, seed=5)


def _trainer(folder: Path, device: str, algorithm: str = "fedstar", dropout: float = 0.5
             ) -> LocalTrainer:
    raw = {"federation": {"id": "graphed", "algorithm": algorithm, "rounds": 2, "seed": 3,
                          "silos": ["a", "b"]},
           "training": {"batch_size": BATCH, "local_epochs": 2},
           "model": {"dropout": dropout}}
    plan: PublicPlan = parse_plan(raw, base_dir=Path(".")).public
    return LocalTrainer(load_graph_folder(folder), plan, "a", device)


def _padded_eagerly(trainer: LocalTrainer) -> LocalTrainer:
    """The trainer's steps padded as a graph's are, taken without recording one."""
    train = trainer._resident["train"]
    assert train is not None
    trainer._graphed = GraphedSteps(trainer.model, trainer.optimizer, trainer._padded_loss,
                                    trainer._streams, train, BATCH, capture=False)
    return trainer


def _weights(trainer: LocalTrainer) -> list[torch.Tensor]:
    return [p.detach().cpu().clone() for p in trainer.model.parameters()]


def test_the_path_is_chosen_by_device_model_and_setting(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.delenv("TRELLIS_CUDA_GRAPHS", raising=False)
    cuda = torch.device("cuda")
    assert not graph_path("cpu").on and "need a GPU, not cpu" in graph_path("cpu").reason
    assert graph_path(cuda, DualChannelGIN(4, 2, n_se=5, hidden=8)).on
    assert graph_path(cuda, DualDenseGIN(4, 2, 5)).on       # its batch norms take masks
    monkeypatch.setenv("TRELLIS_CUDA_GRAPHS", "1")
    assert graph_path(cuda, DualDenseGIN(4, 2, 5)).on
    unpaddable = graph_path(cuda, nn.BatchNorm1d(4))        # normalises over every row
    assert not unpaddable.on and "sees every row" in unpaddable.reason
    monkeypatch.setenv("TRELLIS_CUDA_GRAPHS", "0")
    assert not graph_path(cuda).on and "TRELLIS_CUDA_GRAPHS=0" in graph_path(cuda).reason
    monkeypatch.setenv("TRELLIS_CUDA_GRAPHS", "yes")
    with pytest.raises(ValueError, match="TRELLIS_CUDA_GRAPHS='yes': expected 1 or auto"):
        graphs_setting()


def test_no_collection_runs_inside_a_recording_and_the_collector_comes_back_as_it_was(
        ) -> None:
    assert gc.isenabled()
    with no_collection():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="a failed recording"), no_collection():
        raise RuntimeError("a failed recording")
    assert gc.isenabled()
    gc.disable()                    # an operator's process that runs without the collector
    try:
        with no_collection():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_cpu_trainer_takes_plain_steps(folder: Path) -> None:
    trainer = _trainer(folder, "cpu")
    assert trainer._graphed is None and not trainer.graph_path.on


@pytest.mark.parametrize("algorithm", ["fedstar", "gcfl", "fedprox", "feddense"])
def test_padded_steps_train_as_the_plain_ones(folder: Path, algorithm: str) -> None:
    # Dropout off: the padded steps draw masks for their padding rows too, so with dropout the
    # two paths draw different (equally random) masks.
    plain = _trainer(folder, "cpu", algorithm, dropout=0.0)
    padded = _padded_eagerly(_trainer(folder, "cpu", algorithm, dropout=0.0))
    for _ in range(2):                                     # two rounds of two epochs
        plain_loss = plain.train()["train_loss"]
        padded_loss = padded.train()["train_loss"]
        assert padded_loss == pytest.approx(plain_loss, rel=1e-4)
    assert padded._graphed is not None and padded._graphed._recorded   # it took padded steps
    if algorithm == "feddense":
        _alike_after_rounding(padded, plain)
        return
    for ours, reference in zip(_weights(padded), _weights(plain), strict=True):
        torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-5)
    for ours, reference in zip(padded.model.buffers(), plain.model.buffers(), strict=True):
        torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-5)
    if algorithm == "gcfl":
        assert padded.update_statistics == pytest.approx(plain.update_statistics, rel=1e-3)


def _alike_after_rounding(padded: LocalTrainer, plain: LocalTrainer) -> None:
    """FedDense's weights and batch norms after padded and plain steps, as alike as rounding
    leaves them.

    Its masked batch norm sums in float32 where torch's CPU kernel sums in float64, and Adam's
    normalised steps carry such rounding on for weights whose gradient is near zero: after four
    epochs the largest difference was 2e-5 on one CPU and 1.1e-3 on an AMD EPYC (12 % of the
    weights beyond 1e-5, the batch norms' running statistics 0.5 % apart). The losses agree to
    1e-4 at every round; masking gone wrong would move them, and most weights, far more.
    """
    ours, reference = (torch.cat([w.reshape(-1) for w in _weights(t)]) for t in (padded, plain))
    assert float(torch.isclose(ours, reference, rtol=1e-4, atol=1e-4).double().mean()) >= 0.95
    torch.testing.assert_close(ours, reference, rtol=0.0, atol=5e-3)
    for mine, theirs in zip(padded.model.buffers(), plain.model.buffers(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=2e-2, atol=1e-4)


def _share_alike(one: list[torch.Tensor], other: list[torch.Tensor]) -> float:
    """The share of values within float tolerance of each other (rtol 1e-4, atol 1e-6)."""
    flat = [torch.cat([w.reshape(-1).double() for w in side]) for side in (one, other)]
    return float(torch.isclose(*flat, rtol=1e-4, atol=1e-6).double().mean())


@needs_cuda("recorded steps take the padded eager steps, dropout masks included")
@pytest.mark.parametrize("algorithm", ["fedstar", "gcfl", "fedprox", "feddense"])
def test_recorded_steps_take_the_padded_eager_steps_on_cuda(
        folder: Path, algorithm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRELLIS_CUDA_GRAPHS", "1")          # FedDense's graphs: asked for
    graphed = _trainer(folder, "cuda", algorithm)
    eager = _padded_eagerly(_trainer(folder, "cuda", algorithm))
    assert graphed.graph_path.on, graphed.graph_path.reason
    for _ in range(2):
        graphed_loss = graphed.train()["train_loss"]
        eager_loss = eager.train()["train_loss"]
        assert graphed_loss == pytest.approx(eager_loss, rel=1e-4)
    assert graphed._graphed is not None and graphed._graphed.recorded >= 1
    assert graphed.graph_path.on, graphed.graph_path.reason      # nothing was given up
    # Sum pooling's float atomics (index_add_) vary the last bits from run to run on a GPU;
    # other dropout masks would move 80 to 97 % of the weights beyond tolerance.
    assert _share_alike(_weights(graphed), _weights(eager)) >= 0.99
    assert graphed._streams.state()["device"].equal(eager._streams.state()["device"])
    if algorithm == "gcfl":
        assert graphed.update_statistics == pytest.approx(eager.update_statistics, rel=1e-3)


# In a process of its own: were the repair of the generators to fail, every later CUDA draw of
# the process would fail too, the other tests' included.
_UNRECORDABLE = """
import json, sys
from pathlib import Path
import torch
sys.path.insert(0, sys.argv[2])
from tests.unit.silo.training.test_graphed_steps import _trainer, _weights
trainer = _trainer(Path(sys.argv[1]), "cuda")
loss = trainer._padded_loss

def waits_for_the_host(batch, weight):          # a sync: what no graph may record
    value = loss(batch, weight)
    float(value.detach())
    return value

trainer._graphed._loss = waits_for_the_host
before = _weights(trainer)
first = trainer.train()["train_loss"]
second = trainer.train()["train_loss"]
changed = any(not torch.equal(a, b) for a, b in zip(before, _weights(trainer)))
torch.rand(3, device="cuda")                    # torch's own generator draws again
print(json.dumps({"on": trainer.graph_path.on, "reason": trainer.graph_path.reason,
                  "first": first, "second": second, "changed": changed}))
"""


@needs_cuda("a step torch cannot record leaves the silo on the plain path")
def test_a_step_that_cannot_be_recorded_is_taken_plainly_on_cuda(folder: Path) -> None:
    result, stderr = run_apart(_UNRECORDABLE, folder)
    assert not result["on"] and result["reason"].startswith("plain steps (")
    assert "CUDA graphs given up, training on the plain path" in stderr
    assert result["changed"] and math.isfinite(result["first"])
    assert math.isfinite(result["second"])
