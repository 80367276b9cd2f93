"""Cut one TU dataset into K silo datasets as GCFL's oneDS experiments did (docs/algorithms.md
§3.2).

The reference (`setupGC.py::_randChunk`, overlap off) gives silo i the contiguous block
``graphs[i*m:(i+1)*m]`` with ``m = min(50, N // K)`` in file order, then sends every remaining
graph to a silo drawn by NumPy's legacy generator seeded with 123, one ``randint`` per graph.
We draw from the same legacy stream, so the silos hold exactly the reference's graphs.

Each silo is written as a plain TU folder (``client-<i>/<DS>_*.txt``) holding only the files
the loader reads: A, graph_indicator, graph_labels and, where the source has them,
node_labels and node_attributes. Edge labels and attributes are not copied. For researchers
building benchmarks; the product's silos simply read their own folder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trellis.silo.data.tu import TuStructure, read_tu_node_table, read_tu_structure

# The reference's cap on the contiguous block each silo receives first.
BLOCK_CAP = 50
# Fewer graphs than this leave a silo without a usable 80/10/10 split.
MIN_GRAPHS_PER_SILO = 10


def reference_chunks(num_graphs: int, clients: int, seed: int = 123) -> list[np.ndarray]:
    """Sorted graph indices of each silo, as `_randChunk(graphs, K, overlap=False, seed)`."""
    if clients < 2:
        raise ValueError(f"clients must be at least 2; got {clients}")
    if num_graphs < clients * MIN_GRAPHS_PER_SILO:
        raise ValueError(f"{num_graphs} graphs cannot give {clients} silos at least "
                         f"{MIN_GRAPHS_PER_SILO} graphs each")
    block = min(BLOCK_CAP, num_graphs // clients)
    # The legacy RandomState's draws, one per remaining graph, are the reference's exactly
    # (it asks for them one at a time; the stream is the same).
    rng = np.random.RandomState(seed)
    rest = rng.randint(low=0, high=clients, size=num_graphs - clients * block)
    owner = np.concatenate([np.repeat(np.arange(clients), block), rest])
    return [np.flatnonzero(owner == i).astype(np.int64) for i in range(clients)]


def write_oneds_split(source: Path, clients: int, out: Path,
                      seed: int = 123) -> dict[Path, int]:
    """Cut the TU folder ``source`` into ``out/client-0..K-1``; returns each folder's graphs."""
    structure = read_tu_structure(source)
    parts = reference_chunks(structure.graph_labels.size, clients, seed)
    folders = write_tu_subsets(source, parts, out, structure)
    return {folder: part.size for folder, part in zip(folders, parts, strict=True)}


def write_tu_subsets(source: Path, parts: list[np.ndarray], out: Path,
                     structure: TuStructure | None = None) -> list[Path]:
    """Write each list of graph indices of the TU folder ``source`` as ``out/client-<i>``."""
    structure = structure or read_tu_structure(source)
    prefix, graph_labels = structure.prefix, structure.graph_labels
    graph_of_node, edges = structure.graph_of_node, structure.edges
    node_tables = {part: table for part in ("node_labels", "node_attributes")
                   if (table := read_tu_node_table(source, structure, part)) is not None}
    for i, graphs in enumerate(parts):
        if graphs.size == 0:
            raise ValueError(f"part {i} is empty")
        if graphs.min() < 0 or graphs.max() >= graph_labels.size:
            raise ValueError(f"part {i} names a graph outside 0..{graph_labels.size - 1}")
        if np.unique(graphs).size != graphs.size:
            raise ValueError(f"part {i} names a graph twice")

    folders = []
    for i, graphs in enumerate(map(np.sort, parts)):
        new_graph = np.full(graph_labels.size, -1, dtype=np.int64)
        new_graph[graphs] = np.arange(graphs.size)
        keep = new_graph[graph_of_node] >= 0
        new_node = np.cumsum(keep) - 1          # 0-based id among the kept nodes
        kept_edges = edges[keep[edges[:, 0]]]   # both ends lie in one graph (checked on read)
        folder = Path(out) / f"client-{i}"
        folder.mkdir(parents=True, exist_ok=False)
        _write(folder / f"{prefix}_A.txt", new_node[kept_edges] + 1, "%d")
        _write(folder / f"{prefix}_graph_indicator.txt",
               new_graph[graph_of_node[keep]][:, None] + 1, "%d")
        _write(folder / f"{prefix}_graph_labels.txt",
               graph_labels[graphs][:, None], "%d")
        for part, table in node_tables.items():
            _write(folder / f"{prefix}_{part}.txt", table[keep],
                   "%d" if table.dtype.kind == "i" else "%.17g")
        folders.append(folder)
    return folders


def _write(path: Path, table: np.ndarray, fmt: str) -> None:
    """One comma-separated line per row, as the TU files are written."""
    np.savetxt(path, table.reshape(table.shape[0], -1), fmt=fmt, delimiter=", ")
