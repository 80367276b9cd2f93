"""An edge list with node and graph label files: TU's layout from plain files of any names.

- the edge list (the source): one edge per line, two node numbers separated by whitespace or a
  comma; blank lines and '#' comments are skipped. Nodes are numbered from 0 if any edge names
  node 0, else from 1 (TU's convention); every edge must join two nodes of the same graph.
- --graph-indicator: line i holds the graph of node i (graphs numbered from 0 if any line is 0,
  else from 1).
- --graph-labels: line k holds the integer label of graph k.
- --node-labels (optional): line i holds node i's integer label; they become one-hot columns over
  the smallest to the largest label, as PyG's TUDataset does. Without it every node has the
  constant feature 1.0.
Files whose lines stand for nodes or graphs cannot skip a line: a blank line there is an error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trellis.silo.data.graph_sources.graph_parts import both_directions, one_hot
from trellis.silo.data.graph_sources.tables import integer_label, read_number_table, read_text
from trellis.silo.data.prepared.model import (
    Featuriser,
    Preparation,
    PreparedGraph,
    Refusal,
    SourceOptions,
)
from trellis.silo.data.tu import DataFormatError

FEATURISER_VERSION = "1"


def read(source: Path, options: SourceOptions) -> Preparation:
    """The graphs of an edge list with its graph indicator, graph labels and node labels."""
    if options.graph_indicator is None or options.graph_labels is None:
        raise DataFormatError(f"{source.name}: an edge list needs --graph-indicator (the graph "
                              "of each node, one per line) and --graph-labels (one per graph)")
    graph_of, graph_base = _graph_indicator(options.graph_indicator)
    labels = _lines(options.graph_labels)
    if graph_of.max() - graph_base >= len(labels):
        at = int(np.argmax(graph_of))
        raise DataFormatError(f"{options.graph_indicator.name}: line {at + 1}: graph "
                              f"{graph_of[at]}, but {options.graph_labels.name} has "
                              f"{len(labels)} lines (graphs numbered from {graph_base})")
    graph_of = graph_of - graph_base
    edges = _edges(source, len(graph_of), graph_of)
    refused: list[Refusal] = []
    bad_graphs = np.zeros(len(labels), dtype=bool)
    for number, text in enumerate(labels, start=1):
        if integer_label(text) is None:
            refused.append(Refusal(options.graph_labels.name, str(number),
                                   f"graph label {text!r} is not an integer"))
            bad_graphs[number - 1] = True
    featuriser, x = _node_features(options.node_labels, graph_of, bad_graphs, refused)

    # Nodes and edges grouped by graph, each node numbered inside its graph.
    node_order = np.argsort(graph_of, kind="stable")
    node_counts = np.bincount(graph_of, minlength=len(labels))
    node_ptr = np.concatenate([[0], np.cumsum(node_counts)])
    local = np.empty(len(graph_of), dtype=np.int64)
    local[node_order] = np.arange(len(graph_of)) - node_ptr[graph_of[node_order]]
    edge_graph = graph_of[edges[0]]
    edge_order = np.argsort(edge_graph, kind="stable")
    edge_ptr = np.concatenate([[0], np.cumsum(np.bincount(edge_graph, minlength=len(labels)))])
    graphs: list[PreparedGraph] = []
    added = 0
    for graph, text in enumerate(labels):
        if bad_graphs[graph]:
            continue
        if node_counts[graph] == 0:
            refused.append(Refusal(options.graph_labels.name, str(graph + 1),
                                   f"graph {graph + graph_base} has no nodes in "
                                   f"{options.graph_indicator.name}"))
            continue
        nodes = node_order[node_ptr[graph]:node_ptr[graph + 1]]
        own = edges[:, edge_order[edge_ptr[graph]:edge_ptr[graph + 1]]]
        edge_index, _, more = both_directions(local[own], None, len(nodes))
        added += more
        label = integer_label(text)
        assert label is not None   # bad labels were refused above
        graphs.append(PreparedGraph(x=x[nodes], edge_index=edge_index, edge_attr=None,
                                    label=label, origin=f"{options.graph_labels.name}:{graph + 1}"))
    notes = [f"added the reverse of {added} one-direction edges"] if added else []
    if featuriser.settings["node_features"] == "constant":
        notes.append("no --node-labels: every node has the constant feature 1.0")
    sources = [source, options.graph_indicator, options.graph_labels]
    if options.node_labels is not None:
        sources.append(options.node_labels)
    return Preparation(graphs=graphs, refused=refused, featuriser=featuriser, sources=sources,
                       name=options.name or source.stem, notes=notes)


def _graph_indicator(path: Path) -> tuple[np.ndarray, int]:
    table, _ = read_number_table(path, np.int64)
    if table.shape[1] != 1:
        raise DataFormatError(f"{path.name}: line 1: {table.shape[1]} values; the graph "
                              "indicator holds one graph number per line (line i = node i)")
    graph_of = table[:, 0]
    if graph_of.min() < 0:
        raise DataFormatError(f"{path.name}: line {int(np.argmin(graph_of)) + 1}: a negative "
                              "graph number")
    return graph_of, 0 if (graph_of == 0).any() else 1


def _lines(path: Path) -> list[str]:
    lines = [line.strip() for line in read_text(path).rstrip().splitlines()]
    if not lines:
        raise DataFormatError(f"{path.name}: the file is empty")
    if "" in lines:
        raise DataFormatError(f"{path.name}: line {lines.index('') + 1}: empty line (line k "
                              "stands for item k: none may be skipped)")
    return lines


def _edges(path: Path, nodes: int, graph_of: np.ndarray) -> np.ndarray:
    """The edges as 0-based node indices [2, E], each checked to lie inside one graph."""
    if not read_text(path).strip():
        return np.zeros((2, 0), dtype=np.int64)
    table, lines = read_number_table(path, np.int64, comments=True, blank_lines=True)
    if table.shape[1] != 2:
        raise DataFormatError(f"{path.name}: line {lines[0]}: {table.shape[1]} values; an edge "
                              "is two node numbers")
    base = 0 if (table == 0).any() else 1
    edges = table.T - base
    outside = ((edges < 0) | (edges >= nodes)).any(axis=0)
    if outside.any():
        at = int(np.flatnonzero(outside)[0])
        raise DataFormatError(f"{path.name}: line {lines[at]}: node "
                              f"{int(table[at][(edges[:, at] < 0) | (edges[:, at] >= nodes)][0])}"
                              f", but the graph indicator lists {nodes} nodes (numbered from "
                              f"{base})")
    across = graph_of[edges[0]] != graph_of[edges[1]]
    if across.any():
        at = int(np.flatnonzero(across)[0])
        raise DataFormatError(f"{path.name}: line {lines[at]}: the edge {table[at][0]}-"
                              f"{table[at][1]} joins two graphs (nodes numbered from {base}: "
                              "is the numbering or the graph indicator wrong?)")
    return edges


def _node_features(path: Path | None, graph_of: np.ndarray, bad_graphs: np.ndarray,
                   refused: list[Refusal]) -> tuple[Featuriser, np.ndarray]:
    """The featuriser and every node's feature row; a bad node label refuses its graph."""
    if path is None:
        return (Featuriser("edgelist", FEATURISER_VERSION, {"node_features": "constant"}),
                np.ones((len(graph_of), 1), dtype=np.float32))
    lines = _lines(path)
    if len(lines) != len(graph_of):
        raise DataFormatError(f"{path.name}: {len(lines)} lines, but the graph indicator lists "
                              f"{len(graph_of)} nodes (one label per node)")
    values = np.zeros(len(lines), dtype=np.int64)
    good = np.ones(len(lines), dtype=bool)
    for number, text in enumerate(lines, start=1):
        value = integer_label(text)
        if value is None:
            good[number - 1] = False
            graph = int(graph_of[number - 1])
            if not bad_graphs[graph]:
                bad_graphs[graph] = True
                refused.append(Refusal(path.name, str(number), f"node label {text!r} is not "
                                       f"an integer (its graph, line {graph + 1} of the graph "
                                       "labels, is refused)"))
        else:
            values[number - 1] = value
    low = int(values[good].min()) if good.any() else 0
    width = int(values[good].max()) - low + 1 if good.any() else 1
    indices = np.where(good, values - low, 0)
    settings = {"node_features": "node-labels-one-hot", "label_low": low, "label_width": width}
    return Featuriser("edgelist", FEATURISER_VERSION, settings), one_hot(indices, width)
