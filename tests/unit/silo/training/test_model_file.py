"""The silo's final model file: atomic, labelled, and never written over another run's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trellis.silo.training.model_file import (
    FINAL_MODEL,
    model_metadata,
    read_metadata,
    save_final_model,
)


def _label(run_id: str, round_no: int = 3) -> dict:
    return model_metadata(federation="fed", run_id=run_id, plan_json='{"a": 1}',
                          algorithm="fedstar", round_no=round_no, silo="hospital-a",
                          metrics={"test_acc": 0.75})


def _snapshot(value: float) -> dict:
    return {"model": {"w": torch.full((4,), value)}}


def test_the_label_is_read_back_without_the_weights_and_names_the_run(tmp_path: Path) -> None:
    path, moved = save_final_model(tmp_path, _snapshot(1.0), _label("run-1"))
    assert path == tmp_path / FINAL_MODEL and moved is None
    label = read_metadata(path)
    assert (label["federation"], label["run_id"], label["round"]) == ("fed", "run-1", 3)
    assert label["metrics"] == {"test_acc": 0.75} and label["algorithm"] == "fedstar"
    assert len(label["plan_sha256"]) == 64 and set(label["versions"]) == {
        "trellis", "torch", "python"}
    assert torch.equal(torch.load(path, weights_only=True)["model"]["w"], torch.ones(4))
    assert not list(tmp_path.glob(".final_model.pt.*"))     # no temporary file left


def test_the_same_run_replaces_its_model_and_another_run_is_kept_aside(tmp_path: Path) -> None:
    save_final_model(tmp_path, _snapshot(1.0), _label("run-1", 3))
    _, moved = save_final_model(tmp_path, _snapshot(2.0), _label("run-1", 4))
    assert moved is None and read_metadata(tmp_path / FINAL_MODEL)["round"] == 4
    _, moved = save_final_model(tmp_path, _snapshot(3.0), _label("run-2", 1))
    assert moved == tmp_path / "final_model-fed-run-1.pt"
    assert read_metadata(moved)["round"] == 4                 # the earlier run's model, intact
    assert read_metadata(tmp_path / FINAL_MODEL)["run_id"] == "run-2"


def test_a_file_without_a_label_is_named_as_such(tmp_path: Path) -> None:
    torch.save(_snapshot(1.0), tmp_path / FINAL_MODEL)
    with pytest.raises(ValueError, match="carries no model metadata"):
        read_metadata(tmp_path / FINAL_MODEL)
    _, moved = save_final_model(tmp_path, _snapshot(2.0), _label("run-9"))
    assert moved == tmp_path / "final_model-unknown-unlabelled.pt" and moved.exists()
