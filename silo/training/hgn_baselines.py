"""FedHGN's Central and Local baselines (docs/algorithms.md §5.6): one model on one graph, alone.

The recipe of the reference's `baselines/Central.py`: the RGCN without basis decomposition
(a full weight per relation), a fresh SGD optimiser, one full-batch step per epoch, the
validation accuracy after every epoch, early stopping with patience on it (an epoch improves
iff its accuracy is >= best + min_delta), and the test accuracy of the best epoch's model. A plan
whose `training.validation_metric` is balanced_acc or roc_auc stops and selects by that instead.
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
from trellis.silo.training.classification_metrics import split_figures
from trellis.silo.training.devices import usable_device
from trellis.silo.training.hgn_trainer import HGNConfig
from trellis.silo.training.trainer import derived_seed


def train_alone(graph: HeteroGraph, config: HGNConfig, *, seed: int, name: str,
                max_epochs: int = 6000, patience: int = 10, min_delta: float = 1e-5,
                metric: str = "acc", device: torch.device | str = "cpu") -> dict[str, Any]:
    """Train the full-weight RGCN on one graph with early stopping on the validation `metric`
    (acc, balanced_acc or roc_auc); JSON-ready results.

    The model is always the full-weight RGCN: `config.num_bases` is forced to 0 (the
    baselines are defined without bases). Of `config`, only `hidden` and `lr` are used:
    `local_epochs`, `align_weight` and `mu` are federated settings. A graph without test
    nodes reports a test accuracy of NaN with a count of 0. The model and the graph's operators
    are initialised on the CPU (the same numbers everywhere) and trained on ``device``.
    """
    if max_epochs < 1 or patience < 1:
        raise ValueError(f"max_epochs and patience must be >= 1, got {max_epochs}, {patience}")
    if graph.val_idx.size == 0:
        raise ValueError(f"{name}: no validation nodes to stop early on")
    if metric == "roc_auc" and (graph.num_classes != 2
                                or np.unique(graph.labels[graph.val_idx]).size != 2):
        raise ValueError(f"{name}: training.validation_metric roc_auc needs two classes among "
                         "the validation nodes; select by balanced_acc or acc")
    config = replace(config, num_bases=0)
    device = usable_device(device)
    ops = build_operators(graph).to(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derived_seed(seed, "hgn-alone", name))
        model = BasisRGCN(graph.num_nodes, graph.node_types, ops.num_relations,
                          graph.num_classes, config.hidden, config.num_bases).to(device)
    labels = torch.from_numpy(graph.labels).to(device)
    train = torch.from_numpy(graph.train_idx).to(device)
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
        value = _figures(model, ops, labels, graph.val_idx)[metric]
        curve.append(round(value, 4))
        if value >= best + min_delta:           # never for NaN (a diverged model's outputs)
            best, best_epoch, stale = value, epoch, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            stale += 1
            if stale >= patience:
                break
    if best_state:
        model.load_state_dict(best_state)
    val, test = (_figures(model, ops, labels, idx) for idx in (graph.val_idx, graph.test_idx))
    chosen = {} if metric == "acc" else {f"val_{metric}": val[metric],
                                         f"test_{metric}": test.get(metric, float("nan"))}
    return {"best_epoch": best_epoch, "epochs": epoch, "val_acc": val["acc"],
            "test_acc": test["acc"], **chosen,
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


def _figures(model: BasisRGCN, ops: HeteroOperators, labels: torch.Tensor,
             index: np.ndarray) -> dict[str, float]:
    """acc, balanced_acc and (two classes) roc_auc of the nodes `index` (NaN without any)."""
    if len(index) == 0:
        return {"acc": float("nan"), "balanced_acc": float("nan"), "roc_auc": float("nan")}
    idx = torch.as_tensor(index, device=labels.device)
    model.eval()
    with torch.no_grad():
        logits = model(ops)[idx]
    figures = split_figures(labels[idx].cpu().numpy(), logits.cpu().numpy())
    # Accuracy as the reference computes it (a float32 mean), so the numbers stay its own.
    return {**figures, "acc": float((logits.argmax(dim=1) == labels[idx]).float().mean())}
