"""Frozen parameter groups ([model] frozen): no step changes them, plain or private; they are
not sent; the optimiser, the accountant's dimension and the budget count only what trains."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from trellis.crypto.pki import Identity, throwaway_identities
from trellis.crypto.randomness import SeededRandomSource
from trellis.protos.plan import PublicPlan, parse_plan
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.data.tu import GraphDataset, load_tu_folder
from trellis.silo.federation.session import SiloSession
from trellis.silo.privacy.private_step import private_step
from trellis.silo.training.trainer import LocalTrainer
from trellis.silo.training.trainers import make_silo_trainer

SILOS = ["a", "b", "c"]
FROZEN = ["embedding_s", "pre", "readout"]       # one shared group, two local ones


def _plan(frozen: list[str], privacy: dict | None = None) -> PublicPlan:
    raw: dict = {"federation": {"id": "f", "algorithm": "fedstar", "rounds": 3, "silos": SILOS},
                 "model": {"frozen": frozen, "hidden": 16, "layers": 2, "n_rw": 4, "n_dg": 4},
                 "training": {"batch_size": 16}}
    if privacy is not None:
        raw["privacy"] = privacy
    return parse_plan(raw, base_dir=Path(".")).public


PRIVATE = {"mechanism": "ddg", "noise_multiplier": 1.0, "batch": 16, "design_graphs": 40,
           "clip": 1.0}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tu_folder(tmp_path_factory.mktemp("frozen"), "MOL", "molecules", 60, seed=3)


def _data(folder: Path) -> GraphDataset:
    return load_tu_folder(folder)


def _frozen_values(trainer: LocalTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()
            if n.split(".")[0] in FROZEN}


def _same(before: dict[str, torch.Tensor], trainer: LocalTrainer) -> bool:
    params = dict(trainer.model.named_parameters())
    return all(torch.equal(params[n], v) for n, v in before.items())


def test_a_plain_round_leaves_every_frozen_group_bit_for_bit(folder: Path) -> None:
    trainer = LocalTrainer(_data(folder), _plan(FROZEN), "a")
    before = _frozen_values(trainer)
    trained = {n: p.detach().clone() for n, p in trainer.model.named_parameters()
               if n not in before}
    trainer.train()
    assert _same(before, trainer)
    params = dict(trainer.model.named_parameters())
    assert any(not torch.equal(params[n], v) for n, v in trained.items())   # the rest trains
    assert all(not p.requires_grad for n, p in params.items() if n in before)
    # The optimiser holds only what trains: weight decay cannot reach a frozen group.
    held = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert held == {id(p) for n, p in params.items() if n not in before}


def test_the_same_plan_without_frozen_groups_changes_them(folder: Path) -> None:
    """The test above can fail: the groups it checks do move when nothing is frozen."""
    trainer = LocalTrainer(_data(folder), _plan([]), "a")
    before = _frozen_values(trainer)
    trainer.train()
    assert not _same(before, trainer)


def test_a_frozen_shared_group_is_not_in_the_shared_vector(folder: Path) -> None:
    frozen = LocalTrainer(_data(folder), _plan(FROZEN), "a")
    plain = LocalTrainer(_data(folder), _plan([]), "a")
    assert plain.layout.names[0].startswith("embedding_s.")
    assert not any(n.startswith("embedding_s.") for n in frozen.layout.names)
    assert frozen.layout.names == tuple(n for n in plain.layout.names
                                        if not n.startswith("embedding_s."))
    # Every silo freezes the plan's groups alike, so every silo's vector has this layout.
    other = LocalTrainer(_data(folder), _plan(FROZEN), "b")
    assert other.layout == frozen.layout


def test_a_private_round_and_its_aggregate_leave_every_frozen_group(folder: Path) -> None:
    plan = _plan(FROZEN, PRIVATE)
    trainer = LocalTrainer(_data(folder), plan, "a")
    before = _frozen_values(trainer)
    step = private_step(plan.privacy, threshold=2, dimension=trainer.trainable_values,
                        graphs=trainer.num_train)
    shared_sum = trainer.train_private(step, SeededRandomSource(b"frozen"))
    assert shared_sum.shape == (trainer.layout.length,)
    assert _same(before, trainer)
    # The coordinator's noisy aggregate moves the shared groups that train, never a frozen one.
    noise = np.random.default_rng(0).normal(size=trainer.layout.length).astype(np.float32)
    trainer.set_cluster_state(noise)
    assert _same(before, trainer)


def test_the_accountant_dimension_counts_only_trained_values(folder: Path,
                                                             tmp_path: Path) -> None:
    identity: Identity = throwaway_identities(["a"], tmp_path)["a"]
    data = _data(folder)
    sessions = {}
    for name, frozen in (("frozen", FROZEN), ("plain", [])):
        session = SiloSession(identity, lambda p: make_silo_trainer(_data(folder), p, "a"),
                              noise_source=SeededRandomSource(b"s"))
        session.accept_plan(_plan(frozen, PRIVATE).to_json())
        sessions[name] = session
    trainer = sessions["frozen"].trainer
    assert isinstance(trainer, LocalTrainer)
    frozen_values = sum(p.numel() for n, p in trainer.model.named_parameters()
                        if n.split(".")[0] in FROZEN)
    everything = sum(p.numel() for p in trainer.model.parameters())
    assert frozen_values > 0 and trainer.trainable_values == everything - frozen_values
    budget, plain_budget = sessions["frozen"].budget, sessions["plain"].budget
    assert budget is not None and plain_budget is not None
    assert budget.step.dimension == everything - frozen_values
    assert plain_budget.step.dimension == everything
    assert data.num_classes == 2


def test_silo_level_privacy_counts_only_the_shared_values_that_train(folder: Path,
                                                                     tmp_path: Path) -> None:
    identity: Identity = throwaway_identities(["a"], tmp_path)["a"]
    session = SiloSession(identity, lambda p: make_silo_trainer(_data(folder), p, "a"),
                          noise_source=SeededRandomSource(b"s"))
    session.accept_plan(_plan(FROZEN, {**PRIVATE, "unit": "silo"}).to_json())
    trainer = session.trainer
    assert isinstance(trainer, LocalTrainer) and session.budget is not None
    shared_trained = sum(p.numel() for n, p in trainer.model.named_parameters()
                         if n.startswith("graph_convs_s_gcn."))
    assert session.budget.step.dimension == trainer.layout.length == shared_trained
