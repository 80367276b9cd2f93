"""FedHGN's Central and Local baselines (docs/algorithms.md §5.6): one model on one graph, alone.

The recipe of the reference's `baselines/Central.py`: the RGCN without basis decomposition
(a full weight per relation), a fresh SGD optimiser, one full-batch step per epoch, the
validation accuracy after every epoch, early stopping with patience on it (an epoch improves
iff its accuracy is >= best + min_delta), and the test accuracy of the best epoch's model.
Central runs it on the whole graph; Local runs it on each silo's graph and reports the
accuracy weighted by the number of test nodes (`weighted_accuracy`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from trellis.protos.metrics import weighted_accuracy as reported_weighted_accuracy
from trellis.silo.data.hetero import HeteroGraph
from trellis.silo.models.hgn import BasisRGCN, HeteroOperators, build_operators
from trellis.silo.training.hgn_trainer import HGNConfig
from trellis.silo.training.trainer import derived_seed


def train_alone(graph: HeteroGraph, config: HGNConfig, *, seed: int, name: str,
                max_epochs: int = 6000, patience: int = 10, min_delta: float = 1e-5
                ) -> dict[str, Any]:
    """Train the full-weight RGCN on one graph with early stopping; JSON-ready results.

    The model is always the full-weight RGCN: `config.num_bases` is forced to 0 (the
    baselines are defined without bases). Of `config`, only `hidden` and `lr` are used:
    `local_epochs`, `align_weight` and `mu` are federated settings. A graph without test
    nodes reports a test accuracy of NaN with a count of 0.
    """
    if max_epochs < 1 or patience < 1:
        raise ValueError(f"max_epochs and patience must be >= 1, got {max_epochs}, {patience}")
    if graph.val_idx.size == 0:
        raise ValueError(f"{name}: no validation nodes to stop early on")
    config = replace(config, num_bases=0)
    ops = build_operators(graph)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derived_seed(seed, "hgn-alone", name))
        model = BasisRGCN(graph.num_nodes, graph.node_types, ops.num_relations,
                          graph.num_classes, config.hidden, config.num_bases)
    labels = torch.from_numpy(graph.labels)
    train = torch.from_numpy(graph.train_idx)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    best, best_epoch, stale = -math.inf, 0, 0
    best_state: dict[str, torch.Tensor] = {}
    curve: list[float] = []
    epoch = 0
    for epoch in range(1, max_epochs + 1):
        model.train()
        optimizer.zero_grad()
        F.cross_entropy(model(ops)[train], labels[train]).backward()
        optimizer.step()
        val_acc = _accuracy(model, ops, labels, graph.val_idx)
        curve.append(round(val_acc, 4))
        if val_acc >= best + min_delta:
            best, best_epoch, stale = val_acc, epoch, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            stale += 1
            if stale >= patience:
                break
    model.load_state_dict(best_state)
    return {"best_epoch": best_epoch, "epochs": epoch,
            "val_acc": _accuracy(model, ops, labels, graph.val_idx),
            "test_acc": _accuracy(model, ops, labels, graph.test_idx),
            "val_count": int(graph.val_idx.size), "test_count": int(graph.test_idx.size),
            "curve": curve}


def weighted_accuracy(per_silo: Mapping[str, Mapping[str, float]], which: str) -> float:
    """Sum of acc * count over sum of count for `which` in ("val", "test"); count-0 silos
    are ignored."""
    if which not in ("val", "test"):
        raise ValueError(f"which must be 'val' or 'test', got {which!r}")
    value = reported_weighted_accuracy(per_silo, which)
    if value is None:
        raise ValueError(f"no silo has {which} nodes: the weighted accuracy is undefined")
    return value


def _accuracy(model: BasisRGCN, ops: HeteroOperators, labels: torch.Tensor,
              index: np.ndarray) -> float:
    if len(index) == 0:
        return float("nan")
    idx = torch.as_tensor(index)
    model.eval()
    with torch.no_grad():
        predicted = model(ops)[idx].argmax(dim=1)
    return float((predicted == labels[idx]).float().mean())
