"""Read a heterogeneous graph folder (`meta.json` + `arrays.npz`; docs/hetero-format.md).

The format is the one of the FedHGN benchmark graphs: typed nodes numbered per type, one
edge list per canonical edge type ``[source type, relation, destination type]``, labels on one
target node type with train/validation/test indices. Everything read here is schema: it stays
on the silo. Malformed folders raise `HeteroFormatError` naming the file and the field.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

META = "meta.json"
ARRAYS = "arrays.npz"


class HeteroFormatError(ValueError):
    """A heterogeneous graph folder cannot be read: missing, malformed or inconsistent."""


@dataclass(frozen=True)
class HeteroGraph:
    """One silo's typed graph: node counts per type, edges per canonical type, labels."""

    node_types: tuple[str, ...]
    num_nodes: dict[str, int]
    edge_types: tuple[tuple[str, str, str], ...]
    edges: dict[tuple[str, str, str], np.ndarray]     # (2, E) int64, per-type node ids
    target_type: str
    num_classes: int
    labels: np.ndarray                                  # per target node, -1 = unlabelled
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray

    @property
    def relations(self) -> tuple[str, ...]:
        """Distinct relation names, sorted (the model keys its parameters by these)."""
        return tuple(sorted({r for _, r, _ in self.edge_types}))

    @property
    def total_nodes(self) -> int:
        """Number of nodes of every type together."""
        return sum(self.num_nodes.values())


def load_hetero_folder(folder: Path) -> HeteroGraph:
    """Load and validate one heterogeneous graph folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise HeteroFormatError(f"{folder}: no such data folder")
    meta = _read_meta(folder / META)
    arrays = _read_arrays(folder / ARRAYS)
    where = str(folder / ARRAYS)
    node_types = tuple(_string_list(meta, "node_types", folder / META))
    if len(set(node_types)) != len(node_types):
        raise HeteroFormatError(f"{folder / META}: node_types lists a name twice")
    counts = _array(arrays, "num_nodes", where)
    if counts.shape != (len(node_types),) or np.any(counts < 0):
        raise HeteroFormatError(f"{where}: num_nodes must hold one non-negative count per node "
                                f"type ({len(node_types)}), got shape {counts.shape}")
    num_nodes = dict(zip(node_types, (int(c) for c in counts), strict=True))
    raw_types = meta.get("edge_types")
    if not isinstance(raw_types, list):
        raise HeteroFormatError(f"{folder / META}: edge_types must be a list of "
                                "[source type, relation, destination type]")
    edge_types: list[tuple[str, str, str]] = []
    edges: dict[tuple[str, str, str], np.ndarray] = {}
    for i, et in enumerate(raw_types):
        if (not isinstance(et, list) or len(et) != 3
                or not all(isinstance(x, str) and x for x in et)):
            raise HeteroFormatError(f"{folder / META}: edge_types[{i}] must be "
                                    f"[source type, relation, destination type], got {et!r}")
        src, rel, dst = et
        for end in (src, dst):
            if end not in num_nodes:
                raise HeteroFormatError(f"{folder / META}: edge_types[{i}] names node type "
                                        f"{end!r}, which is not in node_types")
        key = (src, rel, dst)
        if key in edges:
            raise HeteroFormatError(f"{folder / META}: edge type {list(key)} listed twice")
        index = _array(arrays, f"edge_index_{i}", where)
        if index.ndim != 2 or index.shape[0] != 2:
            raise HeteroFormatError(f"{where}: edge_index_{i} must have shape (2, E), got "
                                    f"{index.shape}")
        for row, end, side in ((0, src, "source"), (1, dst, "destination")):
            if index.shape[1] and (index[row].min() < 0 or index[row].max() >= num_nodes[end]):
                raise HeteroFormatError(
                    f"{where}: edge_index_{i} ({rel}) has a {side} id out of range "
                    f"[0, {num_nodes[end]}) for node type {end!r}")
        edge_types.append(key)
        edges[key] = index
    target = meta.get("target_node_type")
    if target not in num_nodes:
        raise HeteroFormatError(f"{folder / META}: target_node_type {target!r} is not one of "
                                f"the node types {list(node_types)}")
    num_classes = meta.get("num_classes")
    if not isinstance(num_classes, int) or num_classes < 2:
        raise HeteroFormatError(f"{folder / META}: num_classes must be an integer >= 2, got "
                                f"{num_classes!r}")
    n_target = num_nodes[str(target)]
    labels = _array(arrays, "y", where)
    if labels.shape != (n_target,):
        raise HeteroFormatError(f"{where}: y must hold one label per {target} node "
                                f"({n_target}), got shape {labels.shape}")
    if np.any((labels < -1) | (labels >= num_classes)):
        raise HeteroFormatError(f"{where}: y holds labels outside -1..{num_classes - 1}")
    splits = {}
    for name in ("train_idx", "val_idx", "test_idx"):
        idx = _array(arrays, name, where)
        if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= n_target)):
            raise HeteroFormatError(f"{where}: {name} must index {target} nodes in "
                                    f"[0, {n_target})")
        if np.any(labels[idx] < 0):
            raise HeteroFormatError(f"{where}: {name} includes unlabelled nodes (y = -1)")
        splits[name] = np.unique(idx)
    if splits["train_idx"].size == 0:
        raise HeteroFormatError(f"{where}: train_idx is empty: nothing to train on")
    overlap = (set(splits["train_idx"].tolist()) & set(splits["val_idx"].tolist())
               | set(splits["train_idx"].tolist()) & set(splits["test_idx"].tolist())
               | set(splits["val_idx"].tolist()) & set(splits["test_idx"].tolist()))
    if overlap:
        raise HeteroFormatError(f"{where}: train_idx, val_idx and test_idx overlap "
                                f"({len(overlap)} nodes)")
    return HeteroGraph(node_types, num_nodes, tuple(edge_types), edges, str(target),
                       num_classes, labels, splits["train_idx"], splits["val_idx"],
                       splits["test_idx"])


def is_hetero_folder(folder: Path) -> bool:
    """Whether a folder looks like a heterogeneous graph (has meta.json and arrays.npz)."""
    return (Path(folder) / META).is_file() and (Path(folder) / ARRAYS).is_file()


def save_hetero_folder(graph: HeteroGraph, folder: Path, extra_meta: dict[str, Any] | None = None
                       ) -> None:
    """Write a graph in the same format (used by the splitters)."""
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"node_types": list(graph.node_types),
            "edge_types": [list(et) for et in graph.edge_types],
            "target_node_type": graph.target_type, "num_classes": graph.num_classes,
            **(extra_meta or {})}
    (folder / META).write_text(json.dumps(meta, indent=1) + "\n")
    arrays: dict[str, Any] = {
        "num_nodes": np.array([graph.num_nodes[t] for t in graph.node_types], np.int64),
        "y": graph.labels.astype(np.int64), "train_idx": graph.train_idx.astype(np.int64),
        "val_idx": graph.val_idx.astype(np.int64), "test_idx": graph.test_idx.astype(np.int64)}
    for i, et in enumerate(graph.edge_types):
        arrays[f"edge_index_{i}"] = graph.edges[et].astype(np.int64)
    np.savez_compressed(folder / ARRAYS, **arrays)


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise HeteroFormatError(f"{path}: missing (a heterogeneous graph folder holds "
                                f"{META} and {ARRAYS})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeteroFormatError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise HeteroFormatError(f"{path}: must hold a JSON object")
    return meta


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {name: z[name] for name in z.files}
    except FileNotFoundError:
        raise HeteroFormatError(f"{path}: missing (a heterogeneous graph folder holds "
                                f"{META} and {ARRAYS})") from None
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise HeteroFormatError(f"{path}: not a readable .npz archive ({exc})") from None


def _array(arrays: dict[str, np.ndarray], name: str, where: str) -> np.ndarray:
    if name not in arrays:
        raise HeteroFormatError(f"{where}: array {name!r} is missing")
    value = arrays[name]
    if not np.issubdtype(value.dtype, np.integer):
        raise HeteroFormatError(f"{where}: array {name!r} must hold integers, got "
                                f"{value.dtype}")
    return value.astype(np.int64, copy=False)


def _string_list(meta: dict[str, Any], key: str, path: Path) -> list[str]:
    value = meta.get(key)
    if not isinstance(value, list) or not value or not all(
            isinstance(x, str) and x for x in value):
        raise HeteroFormatError(f"{path}: {key} must be a non-empty list of names")
    return value
