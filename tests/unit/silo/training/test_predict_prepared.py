"""`silo predict` on a model trained from a prepared folder: it reads a prepared folder of the
same featuriser, refuses one of another featuriser naming both, and a TU folder in one line."""

from __future__ import annotations

import csv
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from trellis.protos.plan import PublicPlan, parse_plan
from trellis.silo.data.prepared import tu_source
from trellis.silo.data.prepared.folder import load_prepared, write_prepared
from trellis.silo.data.prepared.model import Featuriser, SourceOptions
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.training.model_file import model_metadata, save_final_model
from trellis.silo.training.predict import PredictError, predict_folder, read_final_model
from trellis.silo.training.trainer import LocalTrainer


def _plan(tmp_path: Path) -> PublicPlan:
    raw = {"federation": {"id": "predict-prepared", "algorithm": "fedavg", "rounds": 1,
                          "silos": ["a", "b"]}}
    return parse_plan(raw, base_dir=tmp_path).public


def _final_model(tmp_path: Path, prepared: Path) -> Path:
    """A LocalTrainer trained two steps on `prepared`, saved as `silo join` saves it."""
    plan = _plan(tmp_path)
    torch.manual_seed(0)
    trainer = LocalTrainer(load_prepared(prepared), plan, "a")
    for _ in range(2):
        trainer.train()
    label = model_metadata(federation=plan.federation, run_id="r1", plan_json=plan.to_json(),
                           algorithm=plan.algorithm, round_no=1, silo="a", metrics={},
                           recipe=trainer.model_recipe())
    path, _ = save_final_model(tmp_path / "state", trainer.snapshot(), label)
    return path


@pytest.fixture
def tu(tmp_path: Path) -> Path:
    return write_tu_folder(tmp_path / "tu", "MOL", "molecules", 30, seed=3)


def test_a_prepared_model_predicts_a_prepared_folder(tmp_path: Path, tu: Path) -> None:
    prepared = write_prepared(tu_source.read(tu, SourceOptions()), tmp_path / "prepared",
                              strict=False)
    model = _final_model(tmp_path, prepared)
    recipe = read_final_model(model).recipe
    # The featuriser the model was trained with is in its label.
    assert recipe["encoding"]["kind"] == "prepared"
    assert recipe["encoding"]["featuriser"] == json.loads(
        (prepared / "manifest.json").read_text())["featuriser"]
    out = tmp_path / "predicted.csv"
    done = subprocess.run([sys.executable, "-m", "trellis.silo.cli", "predict", "--model",
                           str(model), "--data", str(prepared), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "predicted 30 graphs" in done.stdout
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 30
    raw = np.load(prepared / "graphs.npz")["y"]
    assert [int(r["label"]) for r in rows] == raw.tolist()
    classes = sorted(set(raw.tolist()))
    assert list(rows[0]) == ["graph", "label", "predicted", *(f"prob_{c}" for c in classes)]
    assert {int(r["predicted"]) for r in rows} <= set(classes)


def test_a_prepared_folder_of_another_featuriser_is_refused_naming_both(tmp_path: Path,
                                                                         tu: Path) -> None:
    prep = tu_source.read(tu, SourceOptions())
    model = read_final_model(_final_model(tmp_path, write_prepared(prep, tmp_path / "p1",
                                                                   strict=False)))
    other = dataclasses.replace(prep, featuriser=Featuriser("tu-one-hot", "2",
                                                            prep.featuriser.settings))
    folder = write_prepared(other, tmp_path / "p2", strict=False)
    with pytest.raises(PredictError) as refused:
        predict_folder(model, folder)
    message = str(refused.value)
    assert "\n" not in message
    assert 'featuriser tu-one-hot version 2 {"features": "node_labels"}' in message
    assert 'trained on featuriser tu-one-hot version 1 {"features": "node_labels"}' in message
    # The TU folder itself is not what the model reads: refused in one line, too.
    with pytest.raises(PredictError, match="is not a prepared folder .*`silo data prepare`"):
        predict_folder(model, tu)
