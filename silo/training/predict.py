"""Apply a silo's personalised final model to new graphs, without a coordinator or federation.

The final model file (silo/training/model_file.py) carries the public plan and the trainer's
recipe, so the model is rebuilt from the file alone: for graph classification, a TU folder is
encoded as the silo's training data was (same feature kind, one-hot slots and classes), or, for a
model trained on a prepared folder, a prepared folder of the same featuriser (name, version,
settings) is read, and every graph gets a predicted class and its class probabilities; for FedHGN,
a heterogeneous folder of the silo's own graph (same node types, node counts and relations: the
model learned one embedding per node) gets one row per target node. Files that are not final
models, older final models without a recipe, and folders that do not fit the model are refused
with one line (PredictError).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trellis.protos.algorithms import NODE_TASK, algorithm
from trellis.protos.files import write_atomic
from trellis.protos.plan import PublicPlan
from trellis.silo.data.hetero import HeteroFormatError, is_hetero_folder, load_hetero_folder
from trellis.silo.data.prepared.folder import is_prepared_folder, load_prepared
from trellis.silo.data.structure import add_structure_embeddings
from trellis.silo.data.tu import DataFormatError, FeatureEncoding, GraphDataset, load_tu_folder
from trellis.silo.models.batching import PackedGraphs
from trellis.silo.models.dense import ROWS, onednn_enabled
from trellis.silo.models.graph_classifiers import graph_model
from trellis.silo.models.hgn import BasisRGCN, build_operators
from trellis.silo.training.trainer import EVAL_NODES
from trellis.silo.training.trainers import hgn_config

PREPARED = "prepared"       # the encoding kind of a model trained on a prepared folder


class PredictError(ValueError):
    """The model file or the data cannot be used for prediction; the message says why."""


@dataclass(frozen=True)
class FinalModel:
    """A final model file read back: its label, plan, recipe and weights."""

    path: Path
    label: dict[str, Any]
    plan: PublicPlan
    recipe: dict[str, Any]
    weights: dict[str, torch.Tensor]


@dataclass(frozen=True)
class Predictions:
    """One row per graph (or target node): its id, true label, predicted class, probabilities."""

    ids: np.ndarray              # 1-based graph ids as in the TU files, or target node ids
    labels: list[int | None]     # the folder's label, in the model's class values (None: none)
    predicted: list[int]         # the predicted class value
    probabilities: np.ndarray    # [rows, classes]
    classes: tuple[int, ...]     # the class values, in probability column order
    id_column: str               # "graph" or "node"

    @property
    def accuracy(self) -> float | None:
        """Fraction of labelled rows predicted right (None when no row has a label)."""
        known = [(t, p) for t, p in zip(self.labels, self.predicted, strict=True)
                 if t is not None]
        return sum(t == p for t, p in known) / len(known) if known else None

    def csv_bytes(self) -> bytes:
        """The CSV `silo predict` writes: id, label, predicted, one probability per class."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([self.id_column, "label", "predicted",
                         *(f"prob_{c}" for c in self.classes)])
        for i, row_id in enumerate(self.ids.tolist()):
            label = self.labels[i]
            writer.writerow([row_id, "" if label is None else label, self.predicted[i],
                             *(f"{p:.6f}" for p in self.probabilities[i].tolist())])
        return out.getvalue().encode()


def read_final_model(path: Path) -> FinalModel:
    """Read a final model file and what rebuilds its model; PredictError if it cannot."""
    path = Path(path)
    if not path.is_file():
        raise PredictError(f"--model {path}: no such file")
    try:
        saved = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - torch.load raises many types for a foreign file
        raise PredictError(f"--model {path} is not a Trellis final model ({type(exc).__name__}"
                           "); pass the final_model.pt of a silo's --state-dir") from None
    label = saved.get("metadata") if isinstance(saved, dict) else None
    if not isinstance(label, dict) or not isinstance(saved.get("model"), dict):
        raise PredictError(f"--model {path} is not a Trellis final model (no labelled weights; "
                           "resume.pt is not one); pass the final_model.pt of a silo's "
                           "--state-dir")
    if "model" not in label or "plan" not in label:
        raise PredictError(f"--model {path} was saved by an older Trellis without what "
                           "rebuilds its model (feature encoding, classes, plan); it cannot be "
                           "used for prediction: run the federation again with this version")
    try:
        plan = PublicPlan.from_json(label["plan"])
    except Exception as exc:  # noqa: BLE001 - a damaged label: say so in one line
        raise PredictError(f"--model {path}: its plan cannot be read ({exc})") from None
    return FinalModel(path, label, plan, dict(label["model"]), saved["model"])


def predict_folder(model: FinalModel, folder: Path) -> Predictions:
    """Predict every graph (TU folder) or target node (heterogeneous folder) of `folder`."""
    node_task = algorithm(model.plan.algorithm).task == NODE_TASK
    if node_task != (model.recipe.get("task") == "node"):
        raise PredictError(f"--model {model.path}: its recipe does not match its algorithm")
    if node_task:
        return _predict_nodes(model, folder)
    return _predict_graphs(model, folder)


def write_predictions(predictions: Predictions, out: Path) -> None:
    """Write the predictions CSV whole or not at all."""
    blob = predictions.csv_bytes()
    write_atomic(out, lambda handle: handle.write(blob))


# -- graph classification ------------------------------------------------------------------
def _predict_graphs(model: FinalModel, folder: Path) -> Predictions:
    from trellis.silo.data.datasets import locate_tu_folder

    plan, recipe = model.plan, model.recipe
    encoding = FeatureEncoding.from_json(recipe["encoding"])
    if is_hetero_folder(Path(folder)) and not is_prepared_folder(Path(folder)):
        raise PredictError(f"--data {folder} is a heterogeneous graph folder; this "
                           f"{plan.algorithm} model classifies graphs of a TU folder")
    if encoding.kind == PREPARED or is_prepared_folder(Path(folder)):
        dataset, truth = _load_prepared_like(model, encoding, Path(folder))
    else:
        try:
            dataset = load_tu_folder(locate_tu_folder(Path(folder)), encoding=encoding)
        except DataFormatError as exc:
            if encoding.kind != "degree" and "is missing" in str(exc):
                raise PredictError(f"--data {folder}: the model was trained on {encoding.kind} "
                                   f"({encoding.width} features per node); this folder has no "
                                   f"{encoding.kind} file") from None
            raise PredictError(f"--data {folder}: {exc}") from None
        truth = [encoding.classes[int(g.y)] for g in dataset.graphs]
    spec = algorithm(plan.algorithm)
    if spec.uses_structure:
        add_structure_embeddings(dataset, n_rw=plan.model.n_rw, n_dg=plan.model.n_dg)
    registered = graph_model(spec.model)
    net = registered.build(int(recipe["num_features"]), int(recipe["num_classes"]), plan.model)
    _load_weights(net, model)
    packed = PackedGraphs(dataset.graphs, structure=spec.uses_structure,
                          gcn=registered.gcn_adjacency)
    # The rows padded as the trainer pads them on this CPU, so results match its evaluation.
    multiple = ROWS if onednn_enabled() and getattr(net, "accepts_padded_rows", False) else 1
    sizes = (packed.node_ptr[1:] - packed.node_ptr[:-1]).tolist()
    outputs, start, nodes = [], 0, 0
    with torch.no_grad():
        for i, size in enumerate([*sizes, None]):
            if size is None or (nodes and nodes + size > EVAL_NODES):
                batch = packed.select(torch.arange(start, i), multiple)
                outputs.append(net(batch.x, batch.adjacency, batch.batch, batch.num_graphs,
                                   batch.stc_enc, batch.gcn_adjacency))
                start, nodes = i, 0
            if size is not None:
                nodes += size
    probabilities = torch.cat(outputs).exp().numpy()
    classes = encoding.classes
    return Predictions(np.arange(1, len(dataset.graphs) + 1), list(truth),
                       [classes[i] for i in probabilities.argmax(axis=1).tolist()],
                       probabilities, classes, "graph")


def _load_prepared_like(model: FinalModel, encoding: FeatureEncoding, folder: Path
                        ) -> tuple[GraphDataset, list[int | None]]:
    """A prepared folder featurised as the model's training data was, and each graph's raw
    label where the model knows it (None otherwise)."""
    if encoding.kind != PREPARED:
        raise PredictError(f"--data {folder} is a prepared folder; this model was trained on a "
                           f"TU folder ({encoding.kind} features): pass a TU folder")
    if not is_prepared_folder(folder):
        raise PredictError(f"--data {folder} is not a prepared folder (no manifest.json); the "
                           f"model {model.path} was trained on one (featuriser "
                           f"{_featuriser_text(encoding.featuriser)}): prepare the graphs with "
                           "`silo data prepare` as its training data was")
    try:
        dataset = load_prepared(folder)
    except DataFormatError as exc:
        raise PredictError(f"--data {folder}: {exc}") from None
    assert dataset.encoding is not None        # load_prepared always records it
    ours = dataset.encoding.featuriser
    # A model saved before the featuriser was recorded: only the width can be checked.
    if encoding.featuriser and ours != encoding.featuriser:
        raise PredictError(f"--data {folder} was prepared with featuriser "
                           f"{_featuriser_text(ours)}, but the model was trained on featuriser "
                           f"{_featuriser_text(encoding.featuriser)}: prepare it again as the "
                           "model's training data was")
    if dataset.num_features != encoding.width:
        raise PredictError(f"--data {folder}: {dataset.num_features} features per node; the "
                           f"model was trained on {encoding.width}")
    known = set(encoding.classes)
    raw = [dataset.encoding.classes[int(g.y)] for g in dataset.graphs]
    return dataset, [label if label in known else None for label in raw]


def _featuriser_text(featuriser: str) -> str:
    """A featuriser's canonical JSON as one readable phrase: name version N {settings}."""
    if not featuriser:
        return "(not recorded)"
    document = json.loads(featuriser)
    settings = json.dumps(document.get("settings", {}), sort_keys=True)
    return f"{document.get('name')} version {document.get('version')} {settings}"


# -- FedHGN node classification ------------------------------------------------------------
def _predict_nodes(model: FinalModel, folder: Path) -> Predictions:
    plan, recipe = model.plan, model.recipe
    try:
        graph = load_hetero_folder(Path(folder))
    except HeteroFormatError as exc:
        raise PredictError(f"--data {folder}: {exc}") from None
    want = {t: int(n) for t, n in recipe["num_nodes"].items()}
    if tuple(graph.node_types) != tuple(recipe["node_types"]) or dict(graph.num_nodes) != want:
        raise PredictError(f"--data {folder}: its node types or counts differ from the graph "
                           "the model was trained on; a FedHGN model learned one embedding per "
                           "node and predicts only for its own silo's graph")
    unknown = sorted(set(graph.relations) - set(recipe["relations"]))
    if unknown or graph.target_type != recipe["target_type"]:
        raise PredictError(f"--data {folder}: {len(unknown)} relation(s) or the target type "
                           "differ from the graph the model was trained on")
    classes = tuple(range(int(recipe["num_classes"])))
    if graph.num_classes != len(classes):
        raise PredictError(f"--data {folder}: {graph.num_classes} classes; the model knows "
                           f"{len(classes)}")
    config = hgn_config(plan)
    net = BasisRGCN(graph.num_nodes, graph.node_types, len(recipe["relations"]), len(classes),
                    config.hidden, config.num_bases)
    _load_weights(net, model)
    ops = build_operators(graph, tuple(recipe["relations"]))
    net.eval()
    with torch.no_grad():
        probabilities = torch.softmax(net(ops), dim=1).numpy()
    labels: list[int | None] = [int(v) if v >= 0 else None for v in graph.labels.tolist()]
    return Predictions(np.arange(probabilities.shape[0]), labels,
                       probabilities.argmax(axis=1).tolist(), probabilities, classes, "node")


def _load_weights(net: torch.nn.Module, model: FinalModel) -> None:
    try:
        net.load_state_dict(model.weights)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise PredictError(f"--model {model.path}: its weights do not fit the model its "
                           f"recipe describes ({first})") from None
    net.eval()
