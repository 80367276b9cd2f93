"""`coordinator simulate` with a public initial model ([simulation] init_model): every simulated
silo starts from the file the plan names, a frozen group keeps its values, and a file of
another hash fails the run in one line naming both."""

from __future__ import annotations

import pytest
import torch

from trellis.coordinator.simulation.sequential import run_simulation
from trellis.protos.plan import ModelConfig, PlanError, parse_plan
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.data.tu import load_tu_folder
from trellis.silo.models.graph_classifiers import graph_model
from trellis.silo.training.initial_model import write_initial_model
from trellis.silo.training.trainer import LocalTrainer

SILOS = ("a", "b")
MODEL = {"hidden": 16, "layers": 2, "n_rw": 4, "n_dg": 4}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("sim-init")
    folders = {s: write_tu_folder(root / s, "MOL", "molecules", 40, seed=i + 1)
               for i, s in enumerate(SILOS)}
    torch.manual_seed(5)
    model = graph_model("dual_channel_gin").build(3, 2, ModelConfig(**MODEL))
    shared = {n: p.detach().clone() for n, p in model.named_parameters()
              if n.split(".")[0] in ("embedding_s", "graph_convs_s_gcn")}
    digest = write_initial_model(root / "init.pt", shared, {"algorithm": "fedstar"})
    return {"root": root, "folders": folders, "digest": digest, "shared": shared}


def _plan(setup: dict, init_sha256: str, **simulation: object):
    return parse_plan({
        "federation": {"id": "sim", "algorithm": "fedstar", "rounds": 1, "silos": list(SILOS)},
        "model": {**MODEL, "init_sha256": init_sha256, "frozen": ["embedding_s"]},
        "simulation": {"data": {s: str(f) for s, f in setup["folders"].items()},
                       "init_model": "init.pt", **simulation}}, base_dir=setup["root"])


def test_every_simulated_silo_starts_from_the_file_and_keeps_the_frozen_group(setup) -> None:
    plan = _plan(setup, setup["digest"])
    assert plan.simulation_init == setup["root"] / "init.pt"
    seen = {}

    def inspect(machine, sessions) -> None:
        for name, session in sessions.items():
            assert isinstance(session.trainer, LocalTrainer)
            seen[name] = dict(session.trainer.model.named_parameters())

    datasets = {s: load_tu_folder(f) for s, f in setup["folders"].items()}
    run_simulation(plan, datasets, progress=False, inspect=inspect)
    assert set(seen) == set(SILOS)
    for params in seen.values():
        for name, value in setup["shared"].items():
            if name.startswith("embedding_s."):
                assert torch.equal(params[name], value), name


def test_a_file_of_another_hash_fails_the_run_naming_both(setup) -> None:
    other = "ab" * 32
    plan = _plan(setup, other)
    datasets = {s: load_tu_folder(f) for s, f in setup["folders"].items()}
    with pytest.raises(ValueError, match=f"silo a: the plan of federation sim starts from the "
                       f"initial model {other}.*this silo's file has {setup['digest']}"):
        run_simulation(plan, datasets, progress=False)


def test_an_init_model_without_init_sha256_is_refused_at_load(setup) -> None:
    with pytest.raises(PlanError, match=r"simulation\.init_model: the plan names no public"):
        _plan(setup, "")
