"""What the federation will see of a prepared folder, and what its algorithms cannot use.

`silo data inspect` prints this before a site joins: the graphs and classes, the split training
will use (the folder's own, or the stratified 80/10/10 of silo/data/split.py), the feature
widths, the graph sizes, the graphs that occur twice and the rows refused at preparation. A
problem (a class too small for the split, a single class) is listed with its counts.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trellis.silo.data.hetero import load_hetero_folder
from trellis.silo.data.prepared.arrays import SPLIT_PARTS
from trellis.silo.data.prepared.folder import read_manifest, read_prepared_arrays
from trellis.silo.data.split import DatasetTooSmall, Split, check_split, stratified_split

# How many groups of duplicates the report names (all are counted).
SHOWN_DUPLICATES = 5


@dataclass
class Inspection:
    """The report of one prepared folder (``problems`` empty when an algorithm can use it)."""

    folder: str
    name: str
    task: str
    graphs: int
    classes: dict[str, int]
    split: dict[str, int]
    split_kind: str
    node_features: int
    edge_features: int
    nodes: dict[str, float]
    edges: dict[str, float]
    featuriser: dict[str, Any]
    fingerprint: str
    duplicates: int = 0
    duplicate_groups: list[list[str]] = field(default_factory=list)
    conflicting_duplicates: int = 0
    refused: list[dict[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (`silo data inspect --json`)."""
        return asdict(self)


def inspect_prepared(folder: Path) -> Inspection:
    """Read and check a prepared folder and report what the federation will see of it."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest["task"] == "node":
        return _inspect_hetero(folder, manifest)
    manifest, arrays = read_prepared_arrays(folder)
    stats = manifest["stats"]
    report = Inspection(
        folder=str(folder), name=str(manifest.get("name", "")), task="graph",
        graphs=int(arrays["y"].size), classes=dict(manifest["counts"]["classes"]),
        split={}, split_kind="", node_features=int(stats["node_features"]),
        edge_features=int(stats["edge_features"]), nodes=dict(stats.get("nodes", {})),
        edges=dict(stats.get("edges", {})), featuriser=dict(manifest.get("featuriser", {})),
        fingerprint=str(manifest.get("fingerprint", "")),
        refused=list(manifest.get("refused", [])))
    _classes, labels = np.unique(arrays["y"], return_inverse=True)
    if manifest["split"] is not None:
        split = Split(*(arrays[f"split_{part}"] for part in SPLIT_PARTS))
        report.split_kind = f"the folder's own ({manifest['split'].get('kind', 'given')})"
    else:
        split = stratified_split(labels)
        report.split_kind = "stratified 80/10/10, as training makes it"
    report.split = {part: int(getattr(split, part).size) for part in SPLIT_PARTS}
    if len(report.classes) < 2:
        only = ", ".join(report.classes)
        report.problems.append(f"{folder}: every graph has the label {only}; a classifier "
                               "needs at least two classes")
    try:
        check_split(labels, split, str(folder))
    except DatasetTooSmall as exc:
        report.problems.append(str(exc))
    _find_duplicates(report, arrays)
    return report


def _find_duplicates(report: Inspection, arrays: dict[str, np.ndarray]) -> None:
    """Graphs with the same key (or, without keys, the same arrays) as an earlier graph."""
    identities = (arrays["key"].tolist() if "key" in arrays else _array_digests(arrays))
    origins = (arrays["origin"].tolist() if "origin" in arrays
               else [f"graph {g + 1}" for g in range(arrays["y"].size)])
    groups: dict[str, list[int]] = {}
    for g, identity in enumerate(identities):
        if identity:
            groups.setdefault(identity, []).append(g)
    repeated = [members for members in groups.values() if len(members) > 1]
    report.duplicates = sum(len(members) - 1 for members in repeated)
    report.duplicate_groups = [[origins[g] for g in members]
                               for members in repeated[:SHOWN_DUPLICATES]]
    y = arrays["y"]
    report.conflicting_duplicates = sum(1 for members in repeated
                                        if np.unique(y[members]).size > 1)


def _array_digests(arrays: dict[str, np.ndarray]) -> list[str]:
    """A digest of each graph's features and edges (node ids counted from the graph's first)."""
    x, edge_index, edge_attr = arrays["x"], arrays["edge_index"], arrays.get("edge_attr")
    node_ptr, edge_ptr = arrays["node_ptr"], arrays["edge_ptr"]
    digests = []
    for g in range(arrays["y"].size):
        n0, n1, e0, e1 = node_ptr[g], node_ptr[g + 1], edge_ptr[g], edge_ptr[g + 1]
        digest = hashlib.sha256(np.ascontiguousarray(x[n0:n1]).tobytes())
        digest.update(np.ascontiguousarray(edge_index[:, e0:e1] - n0).tobytes())
        if edge_attr is not None:
            digest.update(np.ascontiguousarray(edge_attr[e0:e1]).tobytes())
        digests.append(digest.hexdigest())
    return digests


def _inspect_hetero(folder: Path, manifest: dict[str, Any]) -> Inspection:
    """A heterogeneous graph (RDF): its target nodes' classes and its given split."""
    graph = load_hetero_folder(folder)
    stats = manifest.get("stats", {})
    labelled = graph.labels[graph.labels >= 0]
    classes, counts = np.unique(labelled, return_counts=True)
    report = Inspection(
        folder=str(folder), name=str(manifest.get("name", "")), task="node", graphs=1,
        classes={str(int(c)): int(n) for c, n in zip(classes, counts, strict=True)},
        split={"train": int(graph.train_idx.size), "val": int(graph.val_idx.size),
               "test": int(graph.test_idx.size)},
        split_kind=f"the folder's own ({graph.target_type} nodes)", node_features=0,
        edge_features=0, nodes=dict(stats.get("nodes", {})), edges=dict(stats.get("edges", {})),
        featuriser=dict(manifest.get("featuriser", {})),
        fingerprint=str(manifest.get("fingerprint", "")),
        refused=list(manifest.get("refused", [])))
    if classes.size < 2:
        report.problems.append(f"{folder}: the labelled {graph.target_type} nodes have "
                               f"{classes.size} class(es); a classifier needs at least two")
    for part, size in report.split.items():
        if size == 0:
            report.problems.append(f"{folder}: the {part} split is empty ({report.split})")
    return report
