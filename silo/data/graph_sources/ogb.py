"""An OGB graph-property-prediction folder (ogbg-molhiv, ogbg-ppa, ...) as OGB ships it, read with
numpy alone (no ``ogb`` package): ``raw/`` holds the graphs, ``split/<name>/`` OGB's split.

The layout (OGB's ``read_csv_graph_raw``): ``raw/num-node-list.csv.gz`` and
``raw/num-edge-list.csv.gz`` give each graph's node and edge count; ``raw/edge.csv.gz`` holds
every graph's edges one after the other, as node indices local to their graph, one direction per
undirected edge; ``raw/node-feat.csv.gz`` and ``raw/edge-feat.csv.gz`` (optional) one row per
node and edge; ``raw/graph-label.csv.gz`` one row per graph, one column per task (empty = NaN);
``split/<name>/{train,valid,test}.csv.gz`` graph indices; ``mapping/mol.csv.gz``'s header names
the molecule datasets' tasks. Molecule datasets (``ogbg-mol*``) carry OGB's categorical atom and
bond features, which become one-hot columns over OGB's vocabularies (``ogb/utils/features.py``:
the widths below, 174 atom and 13 bond columns); other datasets keep their features as floats.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import numpy as np

from trellis.silo.data.graph_sources.graph_parts import both_directions, one_hot_columns
from trellis.silo.data.graph_sources.tables import integer_label, read_number_table, read_text
from trellis.silo.data.prepared.model import (
    Featuriser,
    Preparation,
    PreparedGraph,
    Refusal,
    SourceOptions,
)
from trellis.silo.data.tu import DataFormatError

# OGB's allowable atom features: atomic number (1-118 + misc), chirality, degree, formal charge,
# number of hydrogens, radical electrons, hybridisation, aromatic, in ring.
OGB_ATOM_FEATURE_DIMS = (119, 5, 12, 12, 10, 6, 6, 2, 2)
# OGB's allowable bond features: bond type, stereo, conjugated.
OGB_BOND_FEATURE_DIMS = (5, 6, 2)
FEATURISER_VERSION = "1"
_LABEL_FILE = "graph-label.csv.gz"
# The feature rows [start, stop) of the whole folder's nodes or edges.
_Rows = Callable[[int, int], np.ndarray]
_SPLIT_PARTS = {"train": "train", "val": "valid", "test": "test"}


def is_ogb_folder(path: Path) -> bool:
    """Whether ``path`` looks like an OGB graph-property folder (raw/num-node-list.csv.gz)."""
    return (path / "raw" / "num-node-list.csv.gz").is_file()


def read(source: Path, options: SourceOptions) -> Preparation:
    """The graphs of an OGB graph-property folder, with OGB's split and the chosen task's label."""
    if not source.is_dir():
        raise DataFormatError(f"{source}: not a folder (an OGB dataset is a folder holding "
                              "raw/ and split/, e.g. dataset/ogbg_molhiv)")
    if not is_ogb_folder(source):
        raise DataFormatError(f"{source}: not an OGB graph-property folder: "
                              "raw/num-node-list.csv.gz is missing (point at the dataset folder "
                              "that holds raw/ and split/, e.g. dataset/ogbg_molhiv)")
    name = options.name or _ogb_name(source)
    raw = source / "raw"
    sources: list[Path] = []

    def table(file: str, dtype: type, width: int | None = None) -> np.ndarray | None:
        path = raw / file
        if not path.is_file():
            return None
        sources.append(path)
        values, _ = read_number_table(path, dtype)
        if width is not None and values.shape[1] != width:
            raise DataFormatError(f"{file}: line 1: {values.shape[1]} columns, expected {width}")
        return values

    nodes_table = table("num-node-list.csv.gz", np.int64, 1)
    edges_table = table("num-edge-list.csv.gz", np.int64, 1)
    if edges_table is None:
        raise DataFormatError(f"{raw / 'num-edge-list.csv.gz'}: no such file")
    assert nodes_table is not None   # is_ogb_folder checked it
    num_nodes, num_edges = nodes_table[:, 0], edges_table[:, 0]
    if len(num_nodes) != len(num_edges):
        raise DataFormatError(f"num-edge-list.csv.gz: {len(num_edges)} graphs, but "
                              f"num-node-list.csv.gz has {len(num_nodes)}")
    for file, counts in (("num-node-list.csv.gz", num_nodes), ("num-edge-list.csv.gz", num_edges)):
        if (counts < 0).any():
            line = int(np.flatnonzero(counts < 0)[0]) + 1
            raise DataFormatError(f"{file}: line {line}: a negative count")
    if not (raw / "edge.csv.gz").is_file():
        raise DataFormatError(f"{raw / 'edge.csv.gz'}: no such file")
    edges = _edges(raw / "edge.csv.gz", int(num_edges.sum()))
    sources.append(raw / "edge.csv.gz")
    node_feat = table("node-feat.csv.gz", np.float64)
    edge_feat = table("edge-feat.csv.gz", np.float64)
    _check_rows("node-feat.csv.gz", node_feat, int(num_nodes.sum()), "nodes",
                "num-node-list.csv.gz")
    _check_rows("edge-feat.csv.gz", edge_feat, len(edges), "edges", "edge.csv.gz")
    labels, task, label_sources = _task_labels(source, options.label_column, len(num_nodes))
    sources += label_sources

    featuriser, node_rows, edge_rows, notes = _featurise(name, node_feat, edge_feat,
                                                         int(num_nodes.sum()))
    graphs: list[PreparedGraph] = []
    refused: list[Refusal] = []
    kept = np.full(len(num_nodes), -1, dtype=np.int64)
    node_ptr = np.concatenate([[0], np.cumsum(num_nodes)])
    edge_ptr = np.concatenate([[0], np.cumsum(num_edges)])
    added = 0
    for graph, text in enumerate(labels):
        row = str(graph + 1)
        label = integer_label(text) if text.strip().lower() not in ("", "nan") else None
        n = int(num_nodes[graph])
        local = edges[edge_ptr[graph]:edge_ptr[graph + 1]].T
        if label is None:
            reason = (f"task {task} has no label for this graph (empty/NaN)"
                      if text.strip().lower() in ("", "nan")
                      else f"task {task}'s label {text.strip()!r} is not an integer class")
            refused.append(Refusal(_LABEL_FILE, row, reason))
            continue
        if n < 1:
            refused.append(Refusal(_LABEL_FILE, row, "the graph has no nodes"))
            continue
        if local.size and (local.min() < 0 or local.max() >= n):
            bad = int(np.flatnonzero((local < 0).any(axis=0) | (local >= n).any(axis=0))[0])
            refused.append(Refusal("edge.csv.gz", str(int(edge_ptr[graph]) + bad + 1),
                                   f"an edge of graph {graph} names a node outside its {n} nodes"))
            continue
        attr = None if edge_rows is None else edge_rows(edge_ptr[graph], edge_ptr[graph + 1])
        edge_index, attr, more = both_directions(local, attr, n)
        added += more
        kept[graph] = len(graphs)
        graphs.append(PreparedGraph(x=node_rows(node_ptr[graph], node_ptr[graph + 1]),
                                    edge_index=edge_index, edge_attr=attr, label=label,
                                    origin=f"{_LABEL_FILE}:{row}"))
    if added:
        notes.append(f"added the reverse of {added} edges (OGB stores one direction)")
    split, split_kind, split_sources = _split(source, kept)
    sources += split_sources
    return Preparation(graphs=graphs, refused=refused, featuriser=featuriser, sources=sources,
                       name=name, split=split, split_kind=split_kind, notes=notes)


def _ogb_name(source: Path) -> str:
    # OGB names the folder of "ogbg-molhiv" "ogbg_molhiv".
    folder = source.resolve().name
    return folder.replace("_", "-", 1) if folder.startswith("ogbg_") else folder


def _edges(path: Path, expected: int) -> np.ndarray:
    if expected == 0 and not read_text(path).strip():
        return np.zeros((0, 2), dtype=np.int64)
    edges, _ = read_number_table(path, np.int64)
    if edges.shape[1] != 2:
        raise DataFormatError(f"{path.name}: line 1: {edges.shape[1]} columns, expected 2 "
                              "(source node, target node)")
    if len(edges) != expected:
        raise DataFormatError(f"{path.name}: {len(edges)} edges, but num-edge-list.csv.gz "
                              f"counts {expected}")
    return edges


def _check_rows(file: str, table: np.ndarray | None, expected: int, what: str, counted_by: str
                ) -> None:
    if table is not None and len(table) != expected:
        raise DataFormatError(f"{file}: {len(table)} rows, but {counted_by} counts "
                              f"{expected} {what}")


def _task_labels(source: Path, label_column: str, graphs: int
                 ) -> tuple[list[str], str, list[Path]]:
    """Each graph's label text in the chosen task column, the task's name, the files read."""
    path = source / "raw" / _LABEL_FILE
    if not path.is_file():
        raise DataFormatError(f"{path}: no such file (an OGB graph-property folder has one label "
                              "row per graph)")
    lines = read_text(path).rstrip().splitlines()
    if len(lines) != graphs:
        raise DataFormatError(f"{_LABEL_FILE}: {len(lines)} rows, but num-node-list.csv.gz "
                              f"counts {graphs} graphs")
    rows = [line.split(",") for line in lines]
    width = len(rows[0]) if rows else 1
    for number, row in enumerate(rows, start=1):
        if len(row) != width:
            raise DataFormatError(f"{_LABEL_FILE}: line {number}: {len(row)} columns where the "
                                  f"first line has {width}")
    names, name_sources = _task_names(source, width)
    column = _task_column(label_column, names, width)
    labels = [row[column] for row in rows]
    first = next((text for text in labels if text.strip().lower() not in ("", "nan")), None)
    if first is not None and integer_label(first) is None:
        line = labels.index(first) + 1
        raise DataFormatError(f"{_LABEL_FILE}: line {line}: label {first.strip()!r} is not an "
                              "integer class: a regression task (only graph classification "
                              "is prepared)")
    return labels, names[column], [path, *name_sources]


def _task_names(source: Path, width: int) -> tuple[list[str], list[Path]]:
    mapping = source / "mapping" / "mol.csv.gz"
    if mapping.is_file():
        try:
            with gzip.open(mapping, "rt", encoding="utf-8") as handle:
                header = handle.readline().strip().split(",")
        except (OSError, EOFError, UnicodeDecodeError):
            header = []
        names = [column for column in header if column not in ("smiles", "mol_id")]
        if len(names) == width:
            return names, [mapping]
    return [str(column) for column in range(width)], []


def _task_column(label_column: str, names: list[str], width: int) -> int:
    if label_column.isdigit():
        if int(label_column) >= width:
            raise DataFormatError(f"{_LABEL_FILE}: --label-column {label_column}, but the "
                                  f"folder has {width} task column(s) (0-{width - 1})")
        return int(label_column)
    if label_column in names:
        return names.index(label_column)
    if width == 1 and label_column == "label":
        return 0
    shown = ", ".join(names[:8]) + (f", ... ({width} in all)" if width > 8 else "")
    what = (f"--label-column {label_column!r} is not one of its tasks"
            if label_column != "label" else
            f"{width} task columns; choose one with --label-column (an index or a name)")
    raise DataFormatError(f"{_LABEL_FILE}: {what}: {shown}")


def _featurise(name: str, node_feat: np.ndarray | None, edge_feat: np.ndarray | None,
               total_nodes: int) -> tuple[Featuriser, _Rows, _Rows | None, list[str]]:
    """The featuriser and how to make the feature rows of one graph (one graph at a time:
    ogbg-molpcba's 11 million atoms one-hot at once would take 8 GB)."""
    molecules = (name.startswith("ogbg-mol") and node_feat is not None
                 and node_feat.shape[1] == len(OGB_ATOM_FEATURE_DIMS)
                 and (edge_feat is None or edge_feat.shape[1] == len(OGB_BOND_FEATURE_DIMS)))
    if molecules:
        assert node_feat is not None
        atoms = _categories("node-feat.csv.gz", node_feat, OGB_ATOM_FEATURE_DIMS)
        bonds = None if edge_feat is None else _categories(
            "edge-feat.csv.gz", edge_feat, OGB_BOND_FEATURE_DIMS)
        featuriser = Featuriser("ogb-mol-one-hot", FEATURISER_VERSION,
                                {"atom_dims": list(OGB_ATOM_FEATURE_DIMS),
                                 "bond_dims": list(OGB_BOND_FEATURE_DIMS)})
        return (featuriser, _one_hot_rows(atoms, OGB_ATOM_FEATURE_DIMS),
                None if bonds is None else _one_hot_rows(bonds, OGB_BOND_FEATURE_DIMS), [])
    notes = []
    if node_feat is None:
        x = np.ones((total_nodes, 1), dtype=np.float32)
        notes.append("no raw/node-feat.csv.gz: every node has the constant feature 1.0")
    else:
        x = node_feat.astype(np.float32)
    settings = {"node_features": "constant" if node_feat is None else "node-feat.csv.gz"}
    return (Featuriser("ogb-as-given", FEATURISER_VERSION, settings), _float_rows(x),
            None if edge_feat is None else _float_rows(edge_feat.astype(np.float32)), notes)


def _one_hot_rows(table: np.ndarray, dims: tuple[int, ...]) -> _Rows:
    return lambda start, stop: one_hot_columns(table[start:stop], dims)


def _float_rows(table: np.ndarray) -> _Rows:
    return lambda start, stop: table[start:stop].copy()


def _categories(file: str, table: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
    """The table as integer category indices, each inside its OGB vocabulary."""
    bad = (table != np.round(table)) | (table < 0) | (table >= np.array(dims))
    if bad.any():
        row, column = (int(i) for i in np.argwhere(bad)[0])
        raise DataFormatError(f"{file}: line {row + 1}: column {column + 1} is "
                              f"{table[row, column]:g}, outside OGB's vocabulary "
                              f"(0-{dims[column] - 1}); not an OGB molecule dataset?")
    return table.astype(np.int64)


def _split(source: Path, kept: np.ndarray
           ) -> tuple[dict[str, np.ndarray] | None, str, list[Path]]:
    """OGB's split as indices into the kept graphs, its kind, and the files read."""
    root = source / "split"
    kinds = sorted(p for p in root.iterdir() if (p / "train.csv.gz").is_file()) \
        if root.is_dir() else []
    if not kinds:
        return None, "", []
    folder = kinds[0]
    split: dict[str, np.ndarray] = {}
    files = []
    for part, file_stem in _SPLIT_PARTS.items():
        path = folder / f"{file_stem}.csv.gz"
        if not path.is_file():
            raise DataFormatError(f"{path}: no such file (OGB's split has train, valid and "
                                  "test)")
        files.append(path)
        if not read_text(path).strip():
            split[part] = np.zeros(0, dtype=np.int64)
            continue
        table, lines = read_number_table(path, np.int64)
        indices = table[:, 0]
        outside = (indices < 0) | (indices >= len(kept))
        if outside.any():
            at = int(np.flatnonzero(outside)[0])
            raise DataFormatError(f"{path.relative_to(source)}: line {lines[at]}: graph "
                                  f"{indices[at]}, but the folder has {len(kept)} graphs")
        mapped = kept[indices]
        split[part] = mapped[mapped >= 0]   # refused graphs leave the split
    return split, f"ogb-{folder.name}", files
