"""The one-process simulation runs every algorithm through the same round machine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support.federation import SILOS, write_plan
from trellis.coordinator.simulation.sequential import run_simulation
from trellis.protos.plan import load_plan
from trellis.silo.data.datasets import load_graph_folder
from trellis.silo.training.trainer import LocalTrainer


@pytest.fixture(scope="module")
def ws(workspace_factory):
    return workspace_factory("sim", graphs=60)


@pytest.mark.parametrize("algorithm", ["local", "fedavg", "fedprox", "fedstar", "feddense"])
def test_every_algorithm_completes(ws, algorithm: str) -> None:
    plan = load_plan(write_plan(ws, f"sim-{algorithm}", algorithm=algorithm, rounds=2))
    datasets = {s: load_graph_folder(plan.simulation_data[s]) for s in SILOS}
    results = run_simulation(plan, datasets, progress=False)
    assert results["status"] == "completed" and results["rounds_completed"] == 2
    for silo in SILOS:
        assert 0.0 <= results["final_metrics"][silo]["test_acc"] <= 1.0


def test_shared_groups_start_identical_and_local_groups_differ(ws) -> None:
    plan = load_plan(write_plan(ws, "init", rounds=1))
    trainers = [LocalTrainer(load_graph_folder(plan.simulation_data[s]), plan.public, s)
                for s in SILOS]
    shared = [t.get_shared() for t in trainers]
    assert all(np.array_equal(shared[0], s) for s in shared[1:])
    pre = [dict(t.model.named_parameters())["post.0.weight"] for t in trainers]
    assert not torch.equal(pre[0], pre[1])


def test_retry_restores_the_pre_round_state_exactly(ws) -> None:
    plan = load_plan(write_plan(ws, "retry", rounds=1))
    trainer = LocalTrainer(load_graph_folder(plan.simulation_data["hospital-a"]), plan.public,
                           "hospital-a")
    snap = trainer.snapshot()
    trainer.train()
    first = trainer.get_shared()
    trainer.restore(snap)
    trainer.train()
    assert np.array_equal(first, trainer.get_shared())   # same data order, same dropout
    with pytest.raises(ValueError, match="NaN"):
        trainer.set_shared(np.full(trainer.layout.length, np.nan, np.float32))
    with pytest.raises(ValueError, match="shape"):
        trainer.set_shared(np.zeros(3, np.float32))
