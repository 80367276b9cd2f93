"""The arrays of graphs.npz: many graphs packed into flat arrays, and the checks on reading them.

Graph g's nodes are rows ``node_ptr[g]:node_ptr[g+1]`` of ``x`` and its edges columns
``edge_ptr[g]:edge_ptr[g+1]`` of ``edge_index``, whose node ids count across the whole file (as
in a PyG batch). A folder whose arrays do not fit each other or their manifest is refused in
one line naming the file, before training sees any of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from trellis.silo.data.prepared.model import PreparedGraph
from trellis.silo.data.tu import DataFormatError

SPLIT_PARTS = ("train", "val", "test")


def pack_graphs(graphs: Iterable[PreparedGraph]) -> dict[str, np.ndarray]:
    """The graphs.npz arrays of a list of graphs, each graph checked (DataFormatError naming its
    origin when its arrays are not what a source must return)."""
    xs: list[np.ndarray] = []
    edges: list[np.ndarray] = []
    attrs: list[np.ndarray | None] = []
    labels: list[int] = []
    origins: list[str] = []
    keys: list[str] = []
    width = edge_width = None
    offset = 0
    for graph in graphs:
        x, edge_index, edge_attr = _checked(graph, width, edge_width)
        width = x.shape[1]
        if edge_attr is not None:
            edge_width = edge_attr.shape[1]
        xs.append(x)
        edges.append(edge_index + offset)
        attrs.append(edge_attr)
        labels.append(int(graph.label))
        origins.append(graph.origin)
        keys.append(graph.key)
        offset += x.shape[0]
    arrays: dict[str, np.ndarray] = {
        "x": np.concatenate(xs) if xs else np.zeros((0, 0), np.float32),
        "edge_index": np.concatenate(edges, axis=1) if edges else np.zeros((2, 0), np.int64),
        "node_ptr": _pointers([x.shape[0] for x in xs]),
        "edge_ptr": _pointers([e.shape[1] for e in edges]),
        "y": np.asarray(labels, np.int64),
        "origin": np.asarray(origins, dtype=str)}
    if edge_width is not None:
        for i, (attr, edge_index) in enumerate(zip(attrs, edges, strict=True)):
            if attr is None:
                if edge_index.shape[1]:
                    raise DataFormatError(f"{origins[i]}: has edges without edge features, "
                                          f"while other graphs have {edge_width}")
                attrs[i] = np.zeros((0, edge_width), np.float32)
        arrays["edge_attr"] = np.concatenate([a for a in attrs if a is not None])
    if any(keys):
        arrays["key"] = np.asarray(keys, dtype=str)
    return arrays


def _checked(graph: PreparedGraph, width: int | None, edge_width: int | None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    where = graph.origin
    x = np.asarray(graph.x, np.float32)
    if x.ndim != 2 or x.shape[0] < 1:
        raise DataFormatError(f"{where}: node features must be [nodes >= 1, features], got "
                              f"shape {x.shape}")
    if width is not None and x.shape[1] != width:
        raise DataFormatError(f"{where}: {x.shape[1]} node features, while the graphs before "
                              f"have {width}")
    if not np.isfinite(x).all():
        raise DataFormatError(f"{where}: a node feature is NaN or infinite")
    edge_index = np.asarray(graph.edge_index)
    if edge_index.ndim != 2 or edge_index.shape[0] != 2 or (
            edge_index.size and edge_index.dtype.kind not in "iu"):
        raise DataFormatError(f"{where}: edge_index must be integers of shape [2, edges], got "
                              f"{edge_index.dtype} {edge_index.shape}")
    edge_index = edge_index.astype(np.int64)
    if edge_index.size and (edge_index.min() < 0 or edge_index.max() >= x.shape[0]):
        raise DataFormatError(f"{where}: an edge names a node outside 0..{x.shape[0] - 1}")
    edge_attr = None
    if graph.edge_attr is not None:
        edge_attr = np.asarray(graph.edge_attr, np.float32)
        if edge_attr.ndim != 2 or edge_attr.shape[0] != edge_index.shape[1]:
            raise DataFormatError(f"{where}: edge features must be [edges ({edge_index.shape[1]})"
                                  f", features], got shape {edge_attr.shape}")
        if edge_width is not None and edge_attr.shape[1] != edge_width:
            raise DataFormatError(f"{where}: {edge_attr.shape[1]} edge features, while the "
                                  f"graphs before have {edge_width}")
        if not np.isfinite(edge_attr).all():
            raise DataFormatError(f"{where}: an edge feature is NaN or infinite")
    return x, edge_index, edge_attr


def _pointers(sizes: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)


def check_graph_arrays(arrays: dict[str, np.ndarray], manifest: dict[str, Any], path: Path
                       ) -> None:
    """Refuse arrays that do not fit each other or the manifest (one line naming the file)."""
    counts, stats = _table(manifest, "counts", path), _table(manifest, "stats", path)
    for name, dtype, ndim in (("x", np.float32, 2), ("edge_index", np.int64, 2),
                              ("node_ptr", np.int64, 1), ("edge_ptr", np.int64, 1),
                              ("y", np.int64, 1)):
        _expect(arrays, name, dtype, ndim, path)
    x, edge_index, y = arrays["x"], arrays["edge_index"], arrays["y"]
    node_ptr, edge_ptr = arrays["node_ptr"], arrays["edge_ptr"]
    graphs = y.size
    if graphs != _number(counts, "graphs", path):
        raise DataFormatError(f"{path}: holds {graphs} graphs, but its manifest says "
                              f"{counts['graphs']}")
    if edge_index.shape[0] != 2:
        raise DataFormatError(f"{path}: edge_index must have shape [2, edges], got "
                              f"{edge_index.shape}")
    for name, ptr, total in (("node_ptr", node_ptr, x.shape[0]),
                             ("edge_ptr", edge_ptr, edge_index.shape[1])):
        if (ptr.size != graphs + 1 or ptr[0] != 0 or ptr[-1] != total
                or np.any(np.diff(ptr) < 0)):
            raise DataFormatError(f"{path}: {name} must rise from 0 to {total} in {graphs + 1} "
                                  "steps")
    if graphs and np.any(np.diff(node_ptr) < 1):
        raise DataFormatError(f"{path}: a graph has no nodes (node_ptr)")
    if x.shape[1] != _number(stats, "node_features", path):
        raise DataFormatError(f"{path}: x has {x.shape[1]} features per node, but its manifest "
                              f"says {stats['node_features']}")
    edge_features = _number(stats, "edge_features", path)
    if "edge_attr" in arrays:
        attr = _expect(arrays, "edge_attr", np.float32, 2, path)
        if attr.shape != (edge_index.shape[1], edge_features):
            raise DataFormatError(f"{path}: edge_attr has shape {attr.shape}, expected "
                                  f"({edge_index.shape[1]}, {edge_features})")
    elif edge_features:
        raise DataFormatError(f"{path}: edge_attr is missing; its manifest says "
                              f"{edge_features} features per edge")
    owner = np.repeat(np.arange(graphs), np.diff(edge_ptr))
    if edge_index.size and (np.any(edge_index < node_ptr[owner])
                            or np.any(edge_index >= node_ptr[owner + 1])):
        raise DataFormatError(f"{path}: an edge joins nodes outside its own graph")
    labels, per_label = np.unique(y, return_counts=True)
    stated = counts.get("classes")
    if stated != {str(int(c)): int(n) for c, n in zip(labels, per_label, strict=True)}:
        raise DataFormatError(f"{path}: the graphs' labels do not match the class counts of "
                              "its manifest")
    for name in ("origin", "key"):
        if name in arrays and (arrays[name].dtype.kind != "U" or arrays[name].shape != (graphs,)):
            raise DataFormatError(f"{path}: {name} must hold one string per graph")
    _check_split(arrays, manifest.get("split"), graphs, path)


def _check_split(arrays: dict[str, np.ndarray], split: Any, graphs: int, path: Path) -> None:
    present = [p for p in SPLIT_PARTS if f"split_{p}" in arrays]
    if split is None:
        if present:
            raise DataFormatError(f"{path}: holds split arrays, but its manifest has no split")
        return
    if not isinstance(split, dict):
        raise DataFormatError(f"{path.parent / 'manifest.json'}: split must be an object or null")
    seen: set[int] = set()
    for part in SPLIT_PARTS:
        index = _expect(arrays, f"split_{part}", np.int64, 1, path)
        if index.size != split.get(part):
            raise DataFormatError(f"{path}: split_{part} holds {index.size} graphs, but its "
                                  f"manifest says {split.get(part)}")
        if index.size and (index.min() < 0 or index.max() >= graphs):
            raise DataFormatError(f"{path}: split_{part} names a graph outside 0..{graphs - 1}")
        if np.unique(index).size != index.size or seen & set(index.tolist()):
            raise DataFormatError(f"{path}: split_{part} names a graph twice or shares one "
                                  "with another part")
        seen |= set(index.tolist())


def _expect(arrays: dict[str, np.ndarray], name: str, dtype: type, ndim: int, path: Path
            ) -> np.ndarray:
    array = arrays.get(name)
    if array is None:
        raise DataFormatError(f"{path}: the array {name} is missing")
    if array.dtype != dtype or array.ndim != ndim:
        raise DataFormatError(f"{path}: {name} must be {np.dtype(dtype).name} with {ndim} "
                              f"dimension(s), got {array.dtype} {array.shape}")
    return array


def _table(manifest: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    value = manifest.get(key)
    if not isinstance(value, dict):
        raise DataFormatError(f"{path.parent / 'manifest.json'}: {key} is missing")
    return value


def _number(table: dict[str, Any], key: str, path: Path) -> int:
    value = table.get(key)
    if not isinstance(value, int):
        raise DataFormatError(f"{path.parent / 'manifest.json'}: {key} must be a whole number, "
                              f"got {value!r}")
    return value
