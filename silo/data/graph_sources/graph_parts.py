"""Small pieces every graph source shares: both directions of every edge, one-hot columns."""

from __future__ import annotations

import numpy as np


def both_directions(edge_index: np.ndarray, edge_attr: np.ndarray | None, num_nodes: int
                    ) -> tuple[np.ndarray, np.ndarray | None, int]:
    """The edges with every missing reverse added (attributes copied), and how many were added.

    An edge list that already holds both directions comes back unchanged; self-loops are their
    own reverse.
    """
    edge_index = np.asarray(edge_index, dtype=np.int64).reshape(2, -1)
    if edge_index.shape[1] == 0:
        return edge_index, edge_attr, 0
    codes = edge_index[0] * num_nodes + edge_index[1]
    reverse = edge_index[1] * num_nodes + edge_index[0]
    missing = ~np.isin(reverse, codes)
    added = int(missing.sum())
    if not added:
        return edge_index, edge_attr, 0
    # Each added reverse follows its edge, as OGB and PyG's to_undirected lay them out.
    order = np.argsort(np.concatenate([np.arange(edge_index.shape[1]),
                                       np.flatnonzero(missing)]), kind="stable")
    full = np.concatenate([edge_index, edge_index[::-1, missing]], axis=1)[:, order]
    attr = None
    if edge_attr is not None:
        attr = np.concatenate([edge_attr, edge_attr[missing]], axis=0)[order]
    return np.ascontiguousarray(full), attr, added


def one_hot(indices: np.ndarray, width: int) -> np.ndarray:
    """float32 [n, width] with a 1 in each row's column ``indices[row]``."""
    out = np.zeros((len(indices), width), dtype=np.float32)
    out[np.arange(len(indices)), indices] = 1.0
    return out


def one_hot_columns(table: np.ndarray, widths: tuple[int, ...]) -> np.ndarray:
    """Each integer column one-hot over its width, side by side: float32 [n, sum(widths)]."""
    out = np.zeros((len(table), sum(widths)), dtype=np.float32)
    offset = 0
    rows = np.arange(len(table))
    for column, width in enumerate(widths):
        out[rows, offset + table[:, column]] = 1.0
        offset += width
    return out
