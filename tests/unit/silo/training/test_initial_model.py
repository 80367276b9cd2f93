"""A public initial model ([model] init_sha256): its file, its check against the plan, and a
trainer that starts from exactly its values."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from trellis.protos.plan import PublicPlan, parse_plan
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.data.tu import load_tu_folder
from trellis.silo.training.initial_model import (
    InitialModelMismatch,
    model_parameters,
    read_initial_model,
    write_initial_model,
)
from trellis.silo.training.trainer import LocalTrainer
from trellis.silo.training.trainers import make_trainer

MODEL = {"hidden": 16, "layers": 2, "n_rw": 4, "n_dg": 4}


def _plan(init: str = "", seed: int = 1, **model: object) -> PublicPlan:
    table = {**MODEL, **model, **({"init_sha256": init} if init else {})}
    return parse_plan({"federation": {"id": "f", "algorithm": "fedstar", "rounds": 2,
                                      "seed": seed, "silos": ["a", "b"]},
                       "model": table}, base_dir=Path(".")).public


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("initial")
    return {"mol": write_tu_folder(root, "MOL", "molecules", 50, seed=1),
            "bio": write_tu_folder(root, "BIO", "bio", 50, seed=2)}


@pytest.fixture(scope="module")
def pretrained(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
               ) -> tuple[Path, str, dict[str, torch.Tensor]]:
    """A model of another seed, written as an initial model: every value differs from the
    plan's own start."""
    source = LocalTrainer(load_tu_folder(folders["mol"]), _plan(seed=99), "elsewhere")
    source.train()
    params = {n: t.clone() for n, t in model_parameters(source.model).items()}
    path = tmp_path_factory.mktemp("init") / "init.pt"
    digest = write_initial_model(path, params, {"algorithm": "fedstar", "model": MODEL,
                                                "pretrained_on": ["MOL"]})
    return path, digest, params


def test_the_written_file_reads_back_with_its_hash_and_header(pretrained) -> None:
    path, digest, params = pretrained
    initial = read_initial_model(path)
    assert initial.sha256 == digest and len(digest) == 64
    assert initial.header["pretrained_on"] == ["MOL"]
    assert set(initial.parameters) == set(params)
    assert all(torch.equal(initial.parameters[n], t) for n, t in params.items())


def test_a_silo_starting_from_it_has_exactly_its_values_before_round_1(folders,
                                                                       pretrained) -> None:
    path, digest, params = pretrained
    data = load_tu_folder(folders["mol"])
    trainer = make_trainer(data, _plan(digest), "a", initial=read_initial_model(path))
    assert isinstance(trainer, LocalTrainer)
    model = dict(trainer.model.named_parameters())
    assert all(torch.equal(model[n], params[n]) for n in params)
    assert set(trainer.started_from) == {n.split(".")[0] for n in params}
    shared = np.concatenate([params[n].reshape(-1).numpy() for n in trainer.layout.names])
    assert np.array_equal(trainer.get_shared(), shared)
    # ... and not the start it would have had: the test would fail without the file.
    seeded = LocalTrainer(load_tu_folder(folders["mol"]), _plan(), "a")
    assert not np.array_equal(seeded.get_shared(), shared)


def test_local_groups_of_other_shapes_keep_the_seeded_start(folders, pretrained) -> None:
    """Another dataset's feature width: `pre` cannot come from the file; the shared groups do."""
    path, digest, params = pretrained
    data = load_tu_folder(folders["bio"])
    assert data.num_features != load_tu_folder(folders["mol"]).num_features
    trainer = LocalTrainer(data, _plan(digest), "a", initial=read_initial_model(path))
    assert "pre" not in trainer.started_from
    assert {"embedding_s", "graph_convs_s_gcn"} <= set(trainer.started_from)
    model = dict(trainer.model.named_parameters())
    assert torch.equal(model["embedding_s.weight"], params["embedding_s.weight"])


def test_a_shared_group_of_other_shapes_is_refused_naming_it(folders, pretrained) -> None:
    path, digest, _ = pretrained
    with pytest.raises(InitialModelMismatch, match=r"cannot start the shared group "
                       r"'embedding_s': embedding_s\.weight has shape \(16, 8\) in the file "
                       r"and \(32, 8\) in the plan's model"):
        LocalTrainer(load_tu_folder(folders["mol"]), _plan(digest, hidden=32), "a",
                     initial=read_initial_model(path))


def test_a_plan_naming_another_hash_is_refused_with_both_hashes(folders, pretrained) -> None:
    path, digest, _ = pretrained
    other = "ab" * 32
    with pytest.raises(InitialModelMismatch) as caught:
        make_trainer(load_tu_folder(folders["mol"]), _plan(other), "a",
                     initial=read_initial_model(path))
    assert other in str(caught.value) and digest in str(caught.value)
    assert "nothing was sent" in str(caught.value)


def test_a_plan_naming_a_model_the_silo_was_not_given_is_refused(folders, pretrained) -> None:
    _, digest, _ = pretrained
    with pytest.raises(InitialModelMismatch, match=f"starts from the public initial model "
                       f"{digest}.*this silo was given none: pass the file with --init-model"):
        make_trainer(load_tu_folder(folders["mol"]), _plan(digest), "a")


def test_a_silo_given_a_model_the_plan_does_not_name_refuses(folders, pretrained) -> None:
    path, digest, _ = pretrained
    with pytest.raises(InitialModelMismatch, match=f"given an initial model \\(sha256 {digest}"
                       r"\) but the plan of federation f names none"):
        make_trainer(load_tu_folder(folders["mol"]), _plan(), "a",
                     initial=read_initial_model(path))


class _Code:
    """A pickled object: what weights_only refuses to unpickle."""


@pytest.mark.parametrize("content", [b"not a model at all", pickle.dumps(_Code()),
                                     b"PK\x03\x04 a broken zip"],
                         ids=["text", "pickled-object", "broken-zip"])
def test_a_file_that_is_not_an_initial_model_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "init.pt"
    path.write_bytes(content)
    with pytest.raises(InitialModelMismatch, match=r"is not an initial model file"):
        read_initial_model(path)


def test_a_torch_file_of_other_content_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    torch.save({"weight": torch.zeros(2)}, path)
    with pytest.raises(InitialModelMismatch, match=r"no 'trellis-initial-model' format mark"):
        read_initial_model(path)
    torch.save({"format": "trellis-initial-model", "version": 1, "header": "{}",
                "parameters": {"w": torch.tensor([float("nan")])}}, path)
    with pytest.raises(InitialModelMismatch, match=r"NaN or infinite values in w"):
        read_initial_model(path)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InitialModelMismatch, match=r"cannot read the initial model .*absent"):
        read_initial_model(tmp_path / "absent.pt")
