"""A dataset that carries its own split (a prepared scaffold split) is trained on exactly that
split: the trainer packs those graphs, weighs the silo by them and evaluates on the others."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from trellis.protos.plan import PublicPlan, parse_plan
from trellis.silo.data.datasets import load_graph_folder
from trellis.silo.data.split import DatasetTooSmall, stratified_split
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.data.tu import GraphDataset
from trellis.silo.training.trainer import LocalTrainer


def _dataset(tmp_path: Path) -> GraphDataset:
    return load_graph_folder(write_tu_folder(tmp_path, "SYN-molecules", "molecules", 40, seed=3))


def _plan(tmp_path: Path, algorithm: str) -> PublicPlan:
    raw = {"federation": {"id": "prepared-split", "algorithm": algorithm, "rounds": 1,
                          "silos": ["a", "b"]}}
    return parse_plan(raw, base_dir=tmp_path).public


def _labels(dataset: GraphDataset) -> np.ndarray:
    return np.array([int(g.y.view(-1)[0]) for g in dataset.graphs])


def _given(dataset: GraphDataset) -> dict[str, np.ndarray]:
    """Not what the stratified split would draw: the first 30 graphs train, then 4 and 6."""
    assert set(_labels(dataset)[:30].tolist()) == set(_labels(dataset).tolist())
    return {"train": np.arange(30, dtype=np.int64), "val": np.arange(30, 34, dtype=np.int64),
            "test": np.arange(34, 40, dtype=np.int64)}


@pytest.mark.parametrize("algorithm", ["fedavg", "fedstar"])
def test_the_trainer_trains_on_exactly_the_given_split(tmp_path: Path, algorithm: str) -> None:
    dataset = _dataset(tmp_path)
    dataset.split = _given(dataset)
    nodes = [int(g.num_nodes) for g in dataset.graphs]
    trainer = LocalTrainer(dataset, _plan(tmp_path, algorithm), "a")
    assert not np.array_equal(trainer.split.train, stratified_split(_labels(dataset)).train)
    for part, given in dataset.split.items():
        assert np.array_equal(getattr(trainer.split, part), given)
        assert trainer.evaluate(part)[2] == given.size
        # The packed graphs are those graphs, in that order (their node counts show it).
        packed_nodes = np.diff(trainer._packed[part].node_ptr.numpy())
        assert packed_nodes.tolist() == [nodes[i] for i in given.tolist()]
    assert trainer.num_train == 30
    torch.manual_seed(0)
    assert np.isfinite(trainer.train()["train_loss"])


def test_without_a_split_the_trainer_draws_the_stratified_split(tmp_path: Path) -> None:
    dataset = _dataset(tmp_path)
    plan = _plan(tmp_path, "fedavg")
    trainer = LocalTrainer(dataset, plan, "a")
    expected = stratified_split(_labels(dataset), seed=plan.training.split_seed)
    assert np.array_equal(trainer.split.train, expected.train)
    assert np.array_equal(trainer.split.test, expected.test)


def test_a_given_split_without_a_class_in_training_is_refused(tmp_path: Path) -> None:
    dataset = _dataset(tmp_path)
    labels = _labels(dataset)
    first, others = np.flatnonzero(labels == labels[0]), np.flatnonzero(labels != labels[0])
    dataset.split = {"train": others[:-2], "val": others[-2:], "test": first}
    with pytest.raises(DatasetTooSmall, match=f"classes \\[{labels[0]}\\] would have no "
                                              "training graph"):
        LocalTrainer(dataset, _plan(tmp_path, "fedavg"), "a")
