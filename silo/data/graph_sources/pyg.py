"""A list of PyTorch Geometric ``Data`` (or of plain dicts of tensors) saved with ``torch.save``.

The file is loaded with ``torch.load(weights_only=True)``: its pickle may rebuild tensors, plain
containers and the handful of PyG classes a ``Data`` is made of, nothing else -- a file from
elsewhere never runs code here, and one that would is refused whole. Each graph needs
``edge_index`` [2, e] and ``y`` (one integer; for a multi-task ``y`` name the task's index with
--label-column); ``x`` [n, F] and ``edge_attr`` [e, B] are used as given. A file whose graphs
have no ``x`` at all gets the constant node feature 1.0 (``num_nodes`` or the largest node in
``edge_index`` gives the node count), and says so in a note.
"""

from __future__ import annotations

import pickle
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trellis.silo.data.graph_sources.graph_parts import both_directions
from trellis.silo.data.prepared.model import (
    Featuriser,
    Preparation,
    PreparedGraph,
    Refusal,
    SourceOptions,
)
from trellis.silo.data.tu import DataFormatError

FEATURISER_VERSION = "1"
_GLOBAL_NAME = re.compile(r"GLOBAL ([\w.]+)")


class _Refused(ValueError):
    """One graph of the list cannot be used; the message says why."""


def read(source: Path, options: SourceOptions) -> Preparation:
    """The graphs of a torch-saved list of PyG ``Data``, features as given."""
    items = load_graph_list(source)
    task = int(options.label_column) if options.label_column.isdigit() else None
    with_x = any(_field(item, "x") is not None for item in items)
    graphs: list[PreparedGraph] = []
    refused: list[Refusal] = []
    widths: tuple[int, int] | None = None
    added = 0
    for index, item in enumerate(items):
        row = f"[{index}]"
        try:
            graph, more = _graph(item, task, with_x, f"{source.name}:{row}")
            shape = (graph.x.shape[1], -1 if graph.edge_attr is None else graph.edge_attr.shape[1])
            if widths is not None and shape != widths:
                raise _Refused(_width_reason(shape, widths))
        except _Refused as exc:
            refused.append(Refusal(source.name, row, str(exc)))
            continue
        widths = shape
        added += more
        graphs.append(graph)
    notes = []
    if not with_x:
        notes.append(f"{source.name} has no x: every node has the constant feature 1.0")
    if added:
        notes.append(f"added the reverse of {added} one-direction edges")
    featuriser = Featuriser("pyg-as-given", FEATURISER_VERSION,
                            {"node_features": "x" if with_x else "constant"})
    return Preparation(graphs=graphs, refused=refused, featuriser=featuriser, sources=[source],
                       name=options.name or source.stem, notes=notes)


def load_graph_list(path: Path) -> list[Any]:
    """The list in a torch-saved file, loaded without running any code the file names."""
    from torch_geometric.data import Data
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import GlobalStorage

    if not path.is_file():
        raise DataFormatError(f"{path}: no such file")
    # What a pickled Data names besides tensors (PyG 2.8 on torch 2.13): the class, its
    # attribute-key classes and its storage. weights_only=True stays: never load with False.
    pyg_classes = [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage]
    try:
        with torch.serialization.safe_globals(pyg_classes), warnings.catch_warnings():
            warnings.simplefilter("ignore")   # torch's notes on pickle protocols: not for sites
            loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        named = _GLOBAL_NAME.search(str(exc))
        what = (f"it names {named.group(1)}" if named else
                "it holds pickle operations that torch.load(weights_only=True) refuses")
        raise DataFormatError(f"{path.name}: refused: the file would run code when loaded "
                              f"({what}); save plain tensors/Data only") from None
    except Exception as exc:   # torch raises many kinds for a file it did not write
        # Only torch's own messages say something a site can use (a KeyError's is a number).
        said = str(exc).splitlines()[0] if isinstance(exc, RuntimeError) and str(exc) else ""
        detail = f" ({said[:120]})" if said else ""
        raise DataFormatError(f"{path.name}: not a file torch.save wrote{detail}") from None
    if isinstance(loaded, tuple) and len(loaded) >= 2 and isinstance(loaded[0], dict):
        raise DataFormatError(f"{path.name}: looks like a PyG dataset's collated processed file; "
                              "save the graphs as a list instead: torch.save(list(dataset), "
                              "PATH)")
    if not isinstance(loaded, (list, tuple)):
        raise DataFormatError(f"{path.name}: holds a {type(loaded).__name__}, not a list of "
                              "graphs; save one: torch.save([data1, data2, ...], PATH)")
    if not loaded:
        raise DataFormatError(f"{path.name}: the list of graphs is empty")
    return list(loaded)


def _field(item: Any, name: str) -> Any:
    if isinstance(item, dict):
        return item.get(name)
    return getattr(item, name, None) if _is_data(item) else None


def _is_data(item: Any) -> bool:
    from torch_geometric.data import Data

    return isinstance(item, Data)


def _graph(item: Any, task: int | None, with_x: bool, origin: str) -> tuple[PreparedGraph, int]:
    if not (_is_data(item) or isinstance(item, dict)):
        raise _Refused(f"a {type(item).__name__}, not a Data or a dict of tensors")
    edge_index = _array(_field(item, "edge_index"), "edge_index")
    if edge_index is None:
        raise _Refused("no edge_index")
    if edge_index.ndim != 2 or edge_index.shape[0] != 2 or edge_index.dtype.kind not in "iu":
        raise _Refused(f"edge_index is {edge_index.dtype} {list(edge_index.shape)}; expected "
                       "integers [2, num_edges]")
    x = _array(_field(item, "x"), "x")
    if x is None:
        if with_x:
            raise _Refused("no x, where other graphs of the file have one")
        x = np.ones((_node_count(item, edge_index), 1), dtype=np.float32)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or x.shape[0] < 1:
        raise _Refused(f"x is {list(x.shape)}; expected [num_nodes >= 1, num_features]")
    x = x.astype(np.float32)
    if not np.isfinite(x).all():
        raise _Refused("x holds NaN or infinite values")
    n = x.shape[0]
    if edge_index.size and (edge_index.min() < 0 or edge_index.max() >= n):
        raise _Refused(f"edge_index names node {int(edge_index.max())} but the graph has {n} "
                       "nodes")
    edge_attr = _array(_field(item, "edge_attr"), "edge_attr")
    if edge_attr is not None:
        edge_attr = (edge_attr[:, None] if edge_attr.ndim == 1 else edge_attr).astype(np.float32)
        if edge_attr.ndim != 2 or edge_attr.shape[0] != edge_index.shape[1]:
            raise _Refused(f"edge_attr is {list(edge_attr.shape)} for {edge_index.shape[1]} "
                           "edges")
    label = _label(_array(_field(item, "y"), "y"), task)
    edges, attr, added = both_directions(edge_index.astype(np.int64), edge_attr, n)
    return PreparedGraph(x=x, edge_index=edges, edge_attr=attr, label=label,
                         origin=origin), added


def _array(value: Any, name: str) -> np.ndarray | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if value.is_sparse or value.layout != torch.strided:
            raise _Refused(f"{name} is a sparse tensor; save it dense")
        return value.detach().cpu().numpy()
    if isinstance(value, (int, float, bool)):
        return np.asarray(value)
    raise _Refused(f"{name} is a {type(value).__name__}, not a tensor")


def _node_count(item: Any, edge_index: np.ndarray) -> int:
    count = item.get("num_nodes") if isinstance(item, dict) else item._store.get("num_nodes")
    if count is None:
        count = int(edge_index.max()) + 1 if edge_index.size else 0
    count = int(count)
    if count < 1:
        raise _Refused("no nodes (no x, no num_nodes, no edges)")
    return count


def _label(y: np.ndarray | None, task: int | None) -> int:
    if y is None:
        raise _Refused("no y (the graph's label)")
    values = y.reshape(-1)
    if values.size != 1:
        if task is None:
            raise _Refused(f"y has {values.size} values; a multi-task y needs the task's index "
                           "as --label-column")
        if task >= values.size:
            raise _Refused(f"y has {values.size} values; --label-column {task} is past them")
        values = values[task:task + 1]
    value = float(values[0])
    if not np.isfinite(value) or not value.is_integer():
        raise _Refused(f"y is {value:g}, not an integer class")
    return int(value)


def _width_reason(shape: tuple[int, int], first: tuple[int, int]) -> str:
    if shape[0] != first[0]:
        return f"x has {shape[0]} columns where the first graph's has {first[0]}"
    if -1 in (shape[1], first[1]):
        return ("edge_attr present where the first graph has none" if first[1] == -1 else
                "no edge_attr where the first graph has one")
    return f"edge_attr has {shape[1]} columns where the first graph's has {first[1]}"
