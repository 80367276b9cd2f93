"""A split's evaluation replayed as one CUDA graph (silo/training/graphed_evaluations.py).

On the CPU: when evaluation is recorded, and that the pass a graph records gives each graph's
own figures (every graph scored alone, summed on the host). On a CUDA GPU: the replayed pass
gives the plain pass's figures after training, ``set_shared`` and a restore, each split recorded
once; a pass torch cannot record leaves the silo evaluating plainly, with the reason.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.support.cuda import needs_cuda, run_apart
from trellis.protos.plan import PublicPlan, parse_plan
from trellis.silo.data.datasets import load_graph_folder
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.training.graphed_evaluations import (
    GraphedEvaluations,
    evaluation_graphs_on,
    score_split,
)
from trellis.silo.training.trainer import LocalTrainer

GRAPHS = 60


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tu_folder(tmp_path_factory.mktemp("graphed-eval"), "SYN-molecules",
                           "molecules", GRAPHS, seed=7)


def _trainer(folder: Path, device: str, algorithm: str = "fedstar") -> LocalTrainer:
    raw = {"federation": {"id": "graphed-eval", "algorithm": algorithm, "rounds": 2, "seed": 4,
                          "silos": ["a", "b"]},
           "training": {"batch_size": 8, "local_epochs": 1},
           "model": {"dropout": 0.5}}
    plan: PublicPlan = parse_plan(raw, base_dir=Path(".")).public
    return LocalTrainer(load_graph_folder(folder), plan, "a", device)


def test_evaluation_is_recorded_on_cuda_unless_switched_off_or_compiled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.delenv("TRELLIS_CUDA_GRAPHS", raising=False)
    assert evaluation_graphs_on(cuda) and not evaluation_graphs_on(cpu)
    assert not evaluation_graphs_on(cuda, compiled=True)
    monkeypatch.setenv("TRELLIS_CUDA_GRAPHS", "1")
    assert evaluation_graphs_on(cuda)
    monkeypatch.setenv("TRELLIS_CUDA_GRAPHS", "0")
    assert not evaluation_graphs_on(cuda)
    monkeypatch.setenv("TRELLIS_CUDA_GRAPHS", "yes")
    with pytest.raises(ValueError, match="TRELLIS_CUDA_GRAPHS"):
        evaluation_graphs_on(cuda)


def test_a_cpu_trainer_evaluates_plainly(folder: Path) -> None:
    trainer = _trainer(folder, "cpu")
    assert trainer._graphed_evaluations is None
    assert trainer.evaluation_path == "plain passes"


@pytest.mark.parametrize("algorithm", ["fedstar", "feddense"])
def test_the_recorded_pass_gives_each_graphs_own_figures(folder: Path, algorithm: str) -> None:
    trainer = _trainer(folder, "cpu", algorithm)
    trainer.train()
    trainer.model.eval()
    packed = trainer._resident["test"]
    assert packed is not None and packed.count > 1
    # The pass a graph records, taken eagerly over two batches of the split.
    half = packed.count // 2
    batches = [packed.select(torch.arange(0, half)), packed.select(torch.arange(half,
                                                                                 packed.count))]
    unrecorded = GraphedEvaluations(trainer._summed_score, trainer._streams, trainer.device,
                                    capture=False)
    with torch.no_grad():
        scores = unrecorded("test", batches)
        alone = [trainer.model(b.x, b.adjacency, b.batch, 1, b.stc_enc, b.gcn_adjacency)
                 for b in (packed.select(torch.tensor([i])) for i in range(packed.count))]
    labels = torch.cat([packed.select(torch.tensor([i])).y for i in range(packed.count)])
    outputs = torch.cat(alone)
    assert torch.equal(scores.labels, labels)
    torch.testing.assert_close(scores.outputs, outputs, rtol=1e-5, atol=1e-5)
    assert int(scores.correct) == int((outputs.argmax(dim=1) == labels).sum())
    expected_loss = sum(float(nn.functional.nll_loss(o, y.view(1), reduction="sum"))
                        for o, y in zip(alone, labels, strict=True))
    assert float(scores.loss_sum) == pytest.approx(expected_loss, rel=1e-5)
    assert scores.loss_sum.dtype == torch.float64 and unrecorded.recorded == 0
    # The trainer's figures are that pass's, over its own batches.
    figures = trainer.evaluate_figures("test")
    assert figures["acc"] == int(scores.correct) / packed.count
    assert figures["loss"] == pytest.approx(expected_loss / packed.count, rel=1e-5)


def _plain(trainer: LocalTrainer, which: str) -> tuple[int, float, torch.Tensor]:
    """The split's plain pass on the trainer's model as it is now: correct, loss, outputs."""
    packed = trainer._resident[which]
    assert packed is not None
    trainer.model.eval()
    with torch.no_grad():
        scores = score_split(trainer._summed_score, trainer._evaluation_batches(which, packed))
    return int(scores.correct), float(scores.loss_sum) / packed.count, scores.outputs.cpu()


def _recorded(trainer: LocalTrainer, which: str) -> tuple[int, float, torch.Tensor]:
    """What the trainer's own evaluation gives now (replayed where recorded)."""
    figures = trainer.evaluate_figures(which)
    packed = trainer._resident[which]
    assert packed is not None
    with trainer.evaluations_shared():
        trainer.evaluate_figures(which)
        _, outputs = trainer.split_outputs(which)
    return round(figures["acc"] * packed.count), figures["loss"], torch.from_numpy(outputs)


@needs_cuda("a split's evaluation replayed as a CUDA graph gives the plain pass's figures")
@pytest.mark.parametrize("algorithm", ["fedstar", "gcfl", "feddense"])
def test_a_replayed_evaluation_gives_the_plain_figures_on_cuda(
        folder: Path, algorithm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRELLIS_CUDA_GRAPHS", raising=False)
    trainer = _trainer(folder, "cuda", algorithm)
    graphed = trainer._graphed_evaluations
    assert graphed is not None, trainer.evaluation_path
    snapshot = trainer.snapshot()
    changes = [trainer.train, trainer.train,
               lambda: trainer.set_shared(trainer.get_shared() * 0.5 + 0.01),
               lambda: trainer.restore(snapshot), trainer.train]
    for change in changes:                  # the first evaluations warm up and record
        change()
        for which in ("val", "test"):
            correct, loss, outputs = _recorded(trainer, which)
            plain_correct, plain_loss, plain_outputs = _plain(trainer, which)
            assert correct == plain_correct
            assert loss == pytest.approx(plain_loss, rel=1e-5)
            torch.testing.assert_close(outputs.float(), plain_outputs, rtol=1e-5, atol=1e-5)
    assert graphed.failure is None and graphed.recorded == 2       # each split once
    assert trainer.evaluation_path.startswith("one CUDA graph per split")


# In a process of its own: were the repair of the generators to fail, every later CUDA draw of
# the process would fail too, the other tests' included.
_UNRECORDABLE = """
import json, sys
from pathlib import Path
import torch
sys.path.insert(0, sys.argv[2])
from tests.unit.silo.training.test_graphed_evaluations import _trainer, _plain
trainer = _trainer(Path(sys.argv[1]), "cuda")
graphed = trainer._graphed_evaluations
scored = graphed._scored

def waits_for_the_host(batch):                  # a sync: what no graph may record
    out, summed = scored(batch)
    float(summed)
    return out, summed

graphed._scored = waits_for_the_host
figures = []
for _ in range(3):
    trainer.train()
    acc = trainer.evaluate_figures("val")["acc"]
    figures.append([acc, _plain(trainer, "val")[0] / trainer._resident["val"].count])
torch.rand(3, device="cuda")                    # torch's own generator draws again
print(json.dumps({"figures": figures, "path": trainer.evaluation_path,
                  "failure": graphed.failure}))
"""


@needs_cuda("an evaluation torch cannot record leaves the silo on the plain path")
def test_an_evaluation_that_cannot_be_recorded_is_taken_plainly_on_cuda(folder: Path) -> None:
    result, stderr = run_apart(_UNRECORDABLE, folder)
    assert result["failure"] and result["path"].startswith("plain passes (")
    assert "CUDA graphs of evaluation given up, evaluating on the plain path" in stderr
    for acc, plain in result["figures"]:
        assert math.isfinite(acc) and acc == plain
