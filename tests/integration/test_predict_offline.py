"""`silo predict` rebuilds a final model from its file alone: FedHGN on the silo's own graph,
and graph classification on a subset whose node labels span fewer values than training's."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.federation import make_hetero_workspace, write_hetero_plan
from trellis.protos.plan import load_plan
from trellis.silo.data.hetero import load_hetero_folder
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.data.tu import load_tu_folder
from trellis.silo.data.tu_split import write_tu_subsets
from trellis.silo.training.model_file import model_metadata, save_final_model
from trellis.silo.training.trainers import make_hetero_trainer


def test_a_fedhgn_final_model_predicts_its_own_nodes_as_its_trainer_does(tmp_path: Path
                                                                          ) -> None:
    ws = make_hetero_workspace(tmp_path)
    plan = load_plan(write_hetero_plan(ws, "hgn-predict", rounds=2)).public
    silo = ws.silos[1]
    trainer = make_hetero_trainer(load_hetero_folder(ws.data(silo)), plan, silo)
    for _ in range(3):
        trainer.train()
    acc, _, _ = trainer.evaluate("test")
    label = model_metadata(federation=plan.federation, run_id="r1", plan_json=plan.to_json(),
                           algorithm=plan.algorithm, round_no=2, silo=silo,
                           metrics={"test_acc": acc}, recipe=trainer.model_recipe())
    path, _ = save_final_model(tmp_path / "state", trainer.snapshot(), label)
    out = tmp_path / "nodes.csv"
    done = subprocess.run([sys.executable, "-m", "trellis.silo.cli", "predict", "--model",
                           str(path), "--data", str(ws.data(silo)), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(out.open()))
    graph = trainer.graph
    assert len(rows) == graph.num_nodes[graph.target_type]
    test = graph.test_idx
    predicted = np.array([int(rows[i]["predicted"]) for i in test])
    # The trainer's accuracy is a float32 mean: equal up to its rounding.
    assert float(np.mean(predicted == graph.labels[test])) == pytest.approx(acc, abs=1e-6)
    # Another silo's graph: other node types; refused in one line.
    done = subprocess.run([sys.executable, "-m", "trellis.silo.cli", "predict", "--model",
                           str(path), "--data", str(ws.data(ws.silos[0])), "--out",
                           str(tmp_path / "x.csv")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "predicts only for its own silo's graph" in done.stderr


def test_a_subset_is_encoded_as_the_training_data_was(tmp_path: Path) -> None:
    source = write_tu_folder(tmp_path / "data", "MOL", "molecules", 30, seed=3)
    full = load_tu_folder(source)
    assert full.encoding is not None and full.feature_kind == "node_labels"
    # The graph whose nodes carry the fewest distinct labels: alone, its one-hot is narrower.
    widths = [int(g.x.sum(0).gt(0).sum()) for g in full.graphs]
    one = int(np.argmin(widths))
    subset = write_tu_subsets(source, [np.array([one])], tmp_path / "one")[0]
    assert load_tu_folder(subset).num_features < full.num_features
    again = load_tu_folder(subset, encoding=full.encoding)
    assert again.num_features == full.num_features
    assert again.graphs[0].x.equal(full.graphs[one].x)
    assert int(again.graphs[0].y) == int(full.graphs[one].y)
