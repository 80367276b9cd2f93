"""FedHGN's trainers and the validation metric: the figures they report per split, and
hgn-local's early stop on the plan's metric."""

from __future__ import annotations

import json
import math

import pytest

from tests.unit.silo.data.test_hetero import small_graph
from tests.unit.silo.training.test_hgn_baselines import planted_graph
from trellis.silo.data.hetero import HeteroGraph
from trellis.silo.training.hgn_baselines import train_alone
from trellis.silo.training.hgn_trainer import HeteroTrainer, HGNConfig

CONFIG = HGNConfig(hidden=16, num_bases=0, lr=0.5)


def _binary(graph: HeteroGraph) -> HeteroGraph:
    """The same graph with its items labelled by parity (two classes)."""
    return HeteroGraph(graph.node_types, graph.num_nodes, graph.edge_types, graph.edges,
                       graph.target_type, 2, graph.labels % 2, graph.train_idx, graph.val_idx,
                       graph.test_idx)


def test_hetero_trainer_reports_balanced_accuracy_and_roc_auc_per_split() -> None:
    trainer = HeteroTrainer(small_graph(), HGNConfig(hidden=8, num_bases=0), 1, "fed", "a", 2)
    assert trainer.num_classes == 2
    values = trainer.metrics(["val_balanced_acc", "test_roc_auc", "val_count"])
    assert set(values) == {"val_balanced_acc", "test_roc_auc", "val_count"}
    assert values["val_balanced_acc"] in (0.0, 1.0)       # one validation node
    assert math.isnan(values["test_roc_auc"])             # one test node: one class
    three = HeteroTrainer(planted_graph(), HGNConfig(hidden=8, num_bases=0), 1, "fed", "a", 3)
    assert "val_roc_auc" not in three.metrics(["val_roc_auc", "val_balanced_acc"])


def test_hgn_local_stops_early_on_balanced_accuracy() -> None:
    graph = planted_graph()
    result = train_alone(graph, CONFIG, seed=1, name="a", max_epochs=300, patience=5,
                         metric="balanced_acc")
    json.dumps(result)
    curve, best = result["curve"], result["best_epoch"]
    # The curve is now balanced accuracy; the best epoch is its first maximum.
    assert best == curve.index(max(curve)) + 1 and result["epochs"] == best + 5
    assert round(result["val_balanced_acc"], 4) == max(curve)
    assert 0.0 <= result["test_balanced_acc"] <= 1.0 and 0.0 <= result["test_acc"] <= 1.0
    plain = train_alone(graph, CONFIG, seed=1, name="a", max_epochs=300, patience=5)
    assert "val_balanced_acc" not in plain


def test_hgn_local_on_roc_auc_needs_two_classes_among_its_validation_nodes() -> None:
    with pytest.raises(ValueError, match="a: training.validation_metric roc_auc needs two "
                                         "classes among the validation nodes"):
        train_alone(planted_graph(), CONFIG, seed=1, name="a", metric="roc_auc")
    result = train_alone(_binary(planted_graph()), CONFIG, seed=1, name="a", max_epochs=300,
                         patience=5, metric="roc_auc")
    assert round(result["val_roc_auc"], 4) == max(result["curve"])
    assert 0.0 <= result["test_roc_auc"] <= 1.0
