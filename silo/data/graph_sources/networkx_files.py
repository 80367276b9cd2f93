"""Graphs in files NetworkX reads -- GraphML, GML, GEXF, node-link JSON -- one graph per file: a
file, or a folder of them (read in name order).

The graph's label is, with --labels, the row of that CSV whose id (its first column other than
--label-column, or --id-column) is the file's name or stem; otherwise (and for a file the CSV does
not list) the graph attribute --label-column (default "label"; GEXF has no graph attributes).
Node features, chosen once for the whole dataset: the node attribute "x" (a list of numbers, or
text such as "0.5 1 2" where the format cannot hold lists) when any node has one; else the
categorical node attribute "label", one-hot over the dataset's sorted values (which the
featuriser settings list); else the constant 1.0. An edge attribute "x" becomes edge features the
same way. Directed graphs get the reverse of every edge. GML and GEXF also use a node's label as
its display name: a GEXF label equal to the node's id counts as none.
"""

from __future__ import annotations

import csv
import json
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import numpy as np

from trellis.silo.data.graph_sources.graph_parts import both_directions, one_hot
from trellis.silo.data.graph_sources.tables import integer_label, read_text
from trellis.silo.data.prepared.model import (
    Featuriser,
    Preparation,
    PreparedGraph,
    Refusal,
    SourceOptions,
)
from trellis.silo.data.tu import DataFormatError

SUFFIXES = {".graphml": "GraphML", ".gml": "GML", ".gexf": "GEXF", ".json": "node-link JSON"}
FEATURISER_VERSION = "1"
# More distinct node labels than this across a dataset are names, not categories.
_MAX_CATEGORIES = 1000
_NUMBER_SPLIT = re.compile(r"[\s,;]+")


class _Refused(ValueError):
    """One file's graph cannot be used; the message says why."""


def read(source: Path, options: SourceOptions) -> Preparation:
    """The graphs of a NetworkX-readable file or folder of files, one graph per file."""
    import networkx as nx

    files = _files(source)
    labels = _label_table(options) if options.labels is not None else None
    loaded: list[tuple[Path, Any]] = []
    refused: list[Refusal] = []
    for path in files:
        try:
            loaded.append((path, _load(path, nx)))
        except _Refused as exc:
            if source.is_file():
                raise DataFormatError(f"{path.name}: {exc}") from None
            refused.append(Refusal(path.name, "1", str(exc)))
    node_mode = ("x" if _any_attribute(loaded, "x") else
                 "label" if _any_attribute(loaded, "label") else "constant")
    categories = _categories(loaded) if node_mode == "label" else []
    edge_x = any("x" in data for _, g in loaded for *_, data in g.edges(data=True))
    graphs: list[PreparedGraph] = []
    widths: tuple[int, int] | None = None
    added = 0
    for path, graph in loaded:
        try:
            label = _graph_label(path, graph, options.label_column, labels)
            prepared, more = _prepared(graph, node_mode, categories, edge_x, label, path.name)
            shape = (prepared.x.shape[1],
                     0 if prepared.edge_attr is None else prepared.edge_attr.shape[1])
            if widths is not None and shape != widths:
                raise _Refused(f"{shape[0]} node and {shape[1]} edge feature columns where the "
                               f"first graph has {widths[0]} and {widths[1]}")
        except _Refused as exc:
            refused.append(Refusal(path.name, "1", str(exc)))
            continue
        widths = shape
        added += more
        graphs.append(prepared)
    settings: dict[str, Any] = {"node_features": node_mode, "edge_features": edge_x}
    if node_mode == "label":
        settings["label_values"] = categories
    notes = [f"added the reverse of {added} edges of directed graphs"] if added else []
    sources = [*files, *([options.labels] if options.labels is not None else [])]
    return Preparation(graphs=graphs, refused=refused,
                       featuriser=Featuriser("networkx", FEATURISER_VERSION, settings),
                       sources=sources, name=options.name or source.stem, notes=notes)


def _files(source: Path) -> list[Path]:
    if source.is_file():
        if source.suffix.lower() not in SUFFIXES:
            raise DataFormatError(f"{source.name}: not a NetworkX file this source reads "
                                  f"({', '.join(SUFFIXES)})")
        return [source]
    if not source.is_dir():
        raise DataFormatError(f"{source}: no such file or folder")
    files = sorted(p for p in source.iterdir()
                   if p.is_file() and p.suffix.lower() in SUFFIXES)
    if not files:
        raise DataFormatError(f"{source}: no {', '.join(SUFFIXES)} files in the folder")
    return files


def _load(path: Path, nx: Any) -> Any:
    kind = SUFFIXES[path.suffix.lower()]
    try:
        if kind == "GraphML":
            return nx.read_graphml(path)
        if kind == "GML":
            return nx.read_gml(path, label=None)   # keep "label" as an attribute; ids are keys
        if kind == "GEXF":
            graph = nx.read_gexf(path)
            for node, data in graph.nodes(data=True):
                if str(data.get("label")) == str(node):
                    del data["label"]   # NetworkX's writer puts the id there when none is set
            return graph
        data = json.loads(read_text(path))
        if not isinstance(data, dict) or "nodes" not in data:
            raise _Refused("not node-link JSON: no \"nodes\" list")
        return nx.node_link_graph(data, edges="links" if "links" in data else "edges")
    except ElementTree.ParseError as exc:
        line, column = exc.position
        raise _Refused(f"line {line}: not well-formed {kind} (column {column})") from None
    except json.JSONDecodeError as exc:
        raise _Refused(f"line {exc.lineno}: not JSON: {exc.msg}") from None
    except DataFormatError as exc:
        raise _Refused(str(exc).removeprefix(f"{path.name}: ")) from None
    except (nx.NetworkXError, KeyError, TypeError, ValueError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _Refused(f"not a readable {kind} graph: {detail[:160]}") from None


def _any_attribute(loaded: list[tuple[Path, Any]], name: str) -> bool:
    return any(name in data for _, graph in loaded for _, data in graph.nodes(data=True))


def _categories(loaded: list[tuple[Path, Any]]) -> list[Any]:
    values = {data["label"] for _, graph in loaded for _, data in graph.nodes(data=True)
              if "label" in data and isinstance(data["label"], (str, int, float))}
    if len(values) > _MAX_CATEGORIES:
        raise DataFormatError(f"node attribute 'label' has {len(values)} distinct values across "
                              "the dataset: names, not categories; give numeric node features "
                              "as the node attribute 'x'")
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    return sorted(values) if numeric else sorted(values, key=str)


def _label_table(options: SourceOptions) -> dict[str, str]:
    assert options.labels is not None
    lines = read_text(options.labels).splitlines()
    reader = csv.DictReader(lines)
    columns = reader.fieldnames or []
    name = options.labels.name
    if options.label_column not in columns:
        raise DataFormatError(f"{name}: line 1: no column {options.label_column!r} "
                              f"(columns: {', '.join(columns)}); name it with --label-column")
    id_column = options.id_column or next((c for c in columns if c != options.label_column), "")
    if id_column not in columns:
        raise DataFormatError(f"{name}: line 1: no id column {id_column!r} (the file names "
                              "each label's graph file)")
    table: dict[str, str] = {}
    for number, row in enumerate(reader, start=2):
        key = (row.get(id_column) or "").strip()
        if key in table:
            raise DataFormatError(f"{name}: line {number}: {key!r} is listed twice")
        table[key] = (row.get(options.label_column) or "").strip()
    return table


def _graph_label(path: Path, graph: Any, column: str, labels: dict[str, str] | None) -> int:
    value: Any = None
    if labels is not None:
        value = labels.get(path.name, labels.get(path.stem))
    if value is None:
        value = graph.graph.get(column)
    if value is None:
        raise _Refused(f"no graph attribute {column!r} (the graph's label)" if labels is None
                       else f"no row in the labels file and no graph attribute {column!r}")
    label = int(value) if isinstance(value, bool) else integer_label(str(value).strip())
    if label is None:
        raise _Refused(f"the label {value!r} is not an integer class")
    return label


def _prepared(graph: Any, node_mode: str, categories: list[Any], edge_x: bool, label: int,
              origin: str) -> tuple[PreparedGraph, int]:
    nodes = list(graph.nodes(data=True))
    if not nodes:
        raise _Refused("the graph has no nodes")
    position = {node: index for index, (node, _) in enumerate(nodes)}
    if node_mode == "x":
        rows = [_numbers(data.get("x"), f"node {node!r}: x") for node, data in nodes]
        if len({len(row) for row in rows}) != 1:
            raise _Refused("nodes' x lists have different lengths")
        features = np.array(rows, dtype=np.float32)
    elif node_mode == "label":
        index = {value: i for i, value in enumerate(categories)}
        missing = [node for node, data in nodes if data.get("label") not in index]
        if missing:
            raise _Refused(f"node {missing[0]!r} has no categorical 'label'")
        features = one_hot(np.array([index[data["label"]] for _, data in nodes]),
                           len(categories))
    else:
        features = np.ones((len(nodes), 1), dtype=np.float32)
    edges = list(graph.edges(data=True))
    edge_index = np.array([[position[u] for u, _, _ in edges],
                           [position[v] for _, v, _ in edges]], dtype=np.int64).reshape(2, -1)
    attr = None
    if edge_x:
        edge_rows = [_numbers(data.get("x"), f"edge {u!r}-{v!r}: x") for u, v, data in edges]
        if len({len(row) for row in edge_rows}) > 1:
            raise _Refused("edges' x lists have different lengths")
        attr = np.array(edge_rows, dtype=np.float32).reshape(len(edges), -1)
    edge_index, attr, added = both_directions(edge_index, attr, len(nodes))
    return PreparedGraph(x=features, edge_index=edge_index, edge_attr=attr, label=label,
                         origin=origin), (added if graph.is_directed() else 0)


def _numbers(value: Any, what: str) -> list[float]:
    """A feature list from a list, a number, or text such as "[0.5, 1]" or "0.5 1"."""
    if value is None:
        raise _Refused(f"{what} is missing")
    items = value if isinstance(value, (list, tuple)) else (
        [part for part in _NUMBER_SPLIT.split(value.strip().strip("[]()")) if part]
        if isinstance(value, str) else [value])
    try:
        numbers = [float(item) for item in items]
    except (TypeError, ValueError):
        raise _Refused(f"{what} {value!r} is not a list of numbers") from None
    if not numbers or not np.isfinite(numbers).all():
        raise _Refused(f"{what} {value!r} is empty or not finite")
    return numbers
