"""Every kind of training on the device it is given, against the same training on the CPU.

Each case runs once on the CPU (where it checks the comparison itself: CPU against CPU is exact)
and once on CUDA (marked ``cuda``, skipped without a GPU: tests/support/cuda.py). On a GPU the
numbers differ from the CPU's by float rounding and summation order only: models are initialised
on the CPU, dropout is off, and the private steps draw their samples and noise from the same
seeded source, so the results must agree within a tolerance far below one graph's influence.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.cuda import cuda_marks
from tests.support.federation import planted_hetero_graph
from trellis.crypto.randomness import SeededRandomSource
from trellis.protos.plan import PublicPlan, parse_plan
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.data.tu import load_tu_folder
from trellis.silo.privacy.private_step import PrivateStep, private_step
from trellis.silo.training.hgn_baselines import train_alone
from trellis.silo.training.hgn_trainer import HeteroTrainer, HGNConfig
from trellis.silo.training.trainer import LocalTrainer

DEVICES = ["cpu", pytest.param("cuda", marks=cuda_marks("training on cuda agrees with the CPU"))]
# Float32 sums in another order: relative differences of about 1e-6 of a sum's scale.
RTOL = 1e-4


@pytest.fixture(scope="module")
def molecules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tu_folder(tmp_path_factory.mktemp("tu"), "SYN", "molecules", 48, seed=3)


def _private_plan(algorithm: str, mechanism: str) -> PublicPlan:
    return parse_plan({
        "federation": {"id": "f", "algorithm": algorithm, "rounds": 2,
                       "silos": ["a", "b", "c"]},
        "model": {"dropout": 0.0, "norm": "layer", "hidden": 16, "width": 16},
        "privacy": {"mechanism": mechanism, "noise_multiplier": 1.0, "clip": 1.0, "batch": 12,
                    "design_graphs": 40},
    }, base_dir=Path(".")).public


def _private_round(folder: Path, plan: PublicPlan, device: str
                   ) -> tuple[PrivateStep, np.ndarray, dict[str, torch.Tensor], LocalTrainer]:
    trainer = LocalTrainer(load_tu_folder(folder), plan, "a", device)
    step = private_step(plan.privacy, threshold=2, dimension=trainer.trainable_values,
                        graphs=trainer.num_train)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        shared = trainer.train_private(step, SeededRandomSource(b"issue 37"))
    fallbacks = [str(w.message) for w in seen if "per-graph gradients unavailable" in
                 str(w.message)]
    assert not fallbacks, fallbacks           # the fast method ran, on this device
    local = {n: p.grad.detach().cpu() for n, p in trainer.model.named_parameters()
             if p.grad is not None}
    return step, shared, local, trainer


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mechanism", ["ddg", "local-gaussian"])
@pytest.mark.parametrize("algorithm", ["fedstar", "feddense"])
def test_a_private_step_on_the_device_equals_the_cpus(molecules: Path, algorithm: str,
                                                      mechanism: str, device: str) -> None:
    plan = _private_plan(algorithm, mechanism)
    step, cpu_shared, cpu_local, _ = _private_round(molecules, plan, "cpu")
    _, shared, local, trainer = _private_round(molecules, plan, device)
    assert {p.device.type for p in trainer.model.parameters()} == {device}
    assert shared.dtype == np.int64 and shared.shape == cpu_shared.shape
    assert np.abs(cpu_shared).max() > 0 and cpu_local.keys() == local.keys() and local
    # Integer units: a sum of at most `batch`-ish clipped gradients, times the scale.
    atol = RTOL * step.scale * step.clip * plan.privacy.batch + 1
    assert np.abs(shared - cpu_shared).max() <= atol
    # The local slice's noised gradient: the same noise, divided by scale * batch.
    for name, grad in local.items():
        torch.testing.assert_close(grad, cpu_local[name], rtol=0,
                                   atol=atol / (step.scale * plan.privacy.batch),
                                   msg=lambda m, n=name: f"{n}: {m}")


def _hetero():
    return planted_hetero_graph("item", (("shop", "sold_at", "sells"),), None, 60, seed=4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bases", [3, 0])      # FedHGN, and the FedAvg/FedProx baselines' RGCN
def test_a_fedhgn_round_on_the_device_equals_the_cpus(device: str, bases: int) -> None:
    config = HGNConfig(hidden=16, num_bases=bases, lr=0.5, local_epochs=3)
    graph = _hetero()
    trainers = {d: HeteroTrainer(graph, config, 1, "fed", "a", graph.num_classes, device=d)
                for d in ("cpu", device)}
    pool = np.full((2, bases), 0.1, np.float32) if bases else None
    losses = {}
    for d, trainer in trainers.items():
        trainer.set_pool(pool)
        losses[d] = trainer.train()["train_loss"]
    trained = trainers[device]
    assert {p.device.type for p in trained.model.parameters()} == {device}
    assert losses[device] == pytest.approx(losses["cpu"], rel=RTOL)
    np.testing.assert_allclose(trained.get_shared(), trainers["cpu"].get_shared(), rtol=RTOL,
                               atol=RTOL)
    np.testing.assert_allclose(trained.coefficient_rows(), trainers["cpu"].coefficient_rows(),
                               rtol=RTOL, atol=RTOL)
    figures = trained.metrics(["val_acc", "val_loss"])
    assert figures["val_loss"] == pytest.approx(trainers["cpu"].metrics(["val_loss"])["val_loss"],
                                                rel=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_a_baseline_trained_alone_on_the_device_equals_the_cpus(device: str) -> None:
    graph = _hetero()
    runs = {d: train_alone(graph, HGNConfig(hidden=16, lr=0.5), seed=1, name="a", max_epochs=8,
                           patience=50, device=d) for d in ("cpu", device)}
    assert runs[device]["epochs"] == runs["cpu"]["epochs"] == 8
    # Accuracies count nodes: one node whose two best logits tie to float rounding may flip.
    one_node = 1.0 / runs["cpu"]["val_count"]
    np.testing.assert_allclose(runs[device]["curve"], runs["cpu"]["curve"], atol=one_node + 1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_a_snapshot_written_on_the_device_resumes_on_the_cpu(molecules: Path, device: str
                                                             ) -> None:
    """A silo restarted with another --device goes on from its resume file."""
    plan = _private_plan("fedstar", "ddg")
    written = LocalTrainer(load_tu_folder(molecules), plan, "a", device)
    written.train()
    resumed = LocalTrainer(load_tu_folder(molecules), plan, "a", "cpu")
    resumed.from_bytes(written.to_bytes())
    np.testing.assert_array_equal(resumed.get_shared(), written.get_shared())
    assert {p.device.type for p in resumed.model.parameters()} == {"cpu"}
    resumed.train()                         # the optimiser's state moved along
    hetero = HeteroTrainer(_hetero(), HGNConfig(hidden=8, num_bases=2), 1, "fed", "a", 3,
                           device=device)
    hetero.train()
    back = HeteroTrainer(_hetero(), HGNConfig(hidden=8, num_bases=2, mu=0.1), 1, "fed", "a", 3)
    back.from_bytes(hetero.to_bytes())
    np.testing.assert_array_equal(back.get_shared(), hetero.get_shared())
    back.train()                            # FedProx's anchors are on the CPU too
