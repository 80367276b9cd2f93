"""FedStar structure embeddings: random-walk return probabilities (RWSE) and degree one-hot (DSE).

Follows ``yuetan031/FedStar:lib/utils.py::init_structure_encoding`` with ``type_init='rw_dg'``
(docs/algorithms.md §2.1): ``stc_enc = [RWSE(n_rw) || DSE(n_dg)]``. The reference computes each
graph with float32 scipy sparse powers; we compute all graphs of a dataset at once in float64
and return float32. One deliberate difference: a node with out-degree 0 contributes 0 instead
of the reference's ``1/0`` (which only matters for directed inputs; on symmetric graphs an
isolated node's column is empty and its row is all zeros in both).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from trellis.silo.data.tu import GraphDataset
from trellis.silo.progress_bar import track

# A size bucket holds consecutive graphs (sorted by size) padded to the largest one; it is
# closed when a graph is this much larger than the bucket's first graph or the padded
# matrices would exceed the element budget (one graph alone may exceed it).
_BUCKET_GROWTH = 1.25
_BUCKET_ELEMENTS = 1 << 22
# Dense batched matmul (BLAS) beats a scipy sparse-times-dense product unless the padded
# blocks are much larger than the number of stored entries; measured on 2 CPU cores.
_DENSE_PER_ENTRY = 24


def degree_onehot(edge_index: Tensor, num_nodes: int, k: int = 16) -> Tensor:
    """Return DSE [n, k]: one-hot of the source degree clamped to [1, k], slot ``clamp(d) - 1``."""
    _check_k(k)
    src, _ = _edge_arrays(edge_index, num_nodes)
    return torch.from_numpy(_degree_onehot(src, num_nodes, k)).float()


def random_walk_return_probs(edge_index: Tensor, num_nodes: int, k: int = 16) -> Tensor:
    """Return RWSE [n, k]: column j is ``diag(T^(j+1))`` with ``T = A D^-1``."""
    _check_k(k)
    src, dst = _edge_arrays(edge_index, num_nodes)
    probs = _return_probs(src, dst, np.array([num_nodes], dtype=np.int64), k)
    return torch.from_numpy(probs).float()


def structure_embedding(
    edge_index: Tensor, num_nodes: int, n_rw: int = 16, n_dg: int = 16
) -> Tensor:
    """Return float32 [n, n_rw + n_dg] = [RWSE || DSE] for one graph."""
    _check_widths(n_rw, n_dg)
    src, dst = _edge_arrays(edge_index, num_nodes)
    return torch.from_numpy(_embedding(src, dst, np.array([num_nodes], dtype=np.int64), n_rw, n_dg))


def add_structure_embeddings(dataset: GraphDataset, n_rw: int = 16, n_dg: int = 16) -> None:
    """Set ``data.stc_enc`` (float32 [n, n_rw + n_dg]) on every graph, computed in one pass."""
    _check_widths(n_rw, n_dg)
    if not dataset.graphs:
        return
    sizes = np.array([int(g.num_nodes) for g in dataset.graphs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    sources, targets = [], []
    for g, data in enumerate(dataset.graphs):
        src, dst = _edge_arrays(data.edge_index, int(sizes[g]))
        sources.append(src + offsets[g])
        targets.append(dst + offsets[g])
    emb = _embedding(np.concatenate(sources), np.concatenate(targets), sizes, n_rw, n_dg)
    for g, data in enumerate(dataset.graphs):
        data.stc_enc = torch.from_numpy(emb[offsets[g] : offsets[g + 1]].copy())


def _check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be >= 1; got {k}")


def _edge_arrays(edge_index: Tensor, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Validate one graph's edge_index and return its (source, target) int64 arrays."""
    if num_nodes < 0:
        raise ValueError(f"num_nodes must be >= 0; got {num_nodes}")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, E]; got {tuple(edge_index.shape)}")
    if edge_index.dtype.is_floating_point or edge_index.dtype == torch.bool:
        raise ValueError(f"edge_index must hold integers; got {edge_index.dtype}")
    ei = edge_index.detach().cpu().numpy().astype(np.int64, copy=False)
    if ei.size and (ei.min() < 0 or ei.max() >= num_nodes):
        raise ValueError(f"edge_index has node ids outside 0..{num_nodes - 1}")
    return ei[0], ei[1]


def _check_widths(n_rw: int, n_dg: int) -> None:
    if n_rw < 0 or n_dg < 0 or n_rw + n_dg == 0:
        raise ValueError(f"need n_rw >= 0, n_dg >= 0 and n_rw + n_dg >= 1; got {n_rw}, {n_dg}")


def _embedding(
    src: np.ndarray, dst: np.ndarray, sizes: np.ndarray, n_rw: int, n_dg: int
) -> np.ndarray:
    num_nodes = int(sizes.sum())
    parts = []
    if n_rw:
        parts.append(_return_probs(src, dst, sizes, n_rw))
    if n_dg:
        parts.append(_degree_onehot(src, num_nodes, n_dg))
    return np.concatenate(parts, axis=1).astype(np.float32)


def _degree_onehot(src: np.ndarray, num_nodes: int, k: int) -> np.ndarray:
    slot = np.clip(np.bincount(src, minlength=num_nodes), 1, k) - 1
    out = np.zeros((num_nodes, k), dtype=np.float32)
    out[np.arange(num_nodes), slot] = 1.0
    return out


def _return_probs(src: np.ndarray, dst: np.ndarray, sizes: np.ndarray, k: int) -> np.ndarray:
    """Return float64 [N, k] with ``diag(T^j)``, j = 1..k, for graphs laid out back to back.

    ``sizes`` are the graphs' node counts; nodes of graph g are the next ``sizes[g]`` ids and
    no edge joins two graphs, so every power of the global T stays block-diagonal.
    """
    num_nodes = int(sizes.sum())
    out = np.zeros((num_nodes, k))
    if src.size == 0:
        return out
    degree = np.bincount(src, minlength=num_nodes).astype(np.float64)
    inv_degree = np.divide(1.0, degree, out=np.zeros_like(degree), where=degree > 0)
    weight = inv_degree[dst]  # T[i, j] = A[i, j] / d_j

    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    graph_of_node = np.repeat(np.arange(sizes.size), sizes)
    local = np.arange(num_nodes) - starts[graph_of_node]
    edge_order = np.argsort(graph_of_node[src], kind="stable")
    edge_ptr = np.searchsorted(graph_of_node[src][edge_order], np.arange(sizes.size + 1))

    buckets = _buckets(sizes)
    for members in track(buckets, "structure encoding", total=len(buckets)):
        edges = np.concatenate([edge_order[edge_ptr[g] : edge_ptr[g + 1]] for g in members])
        if edges.size == 0:
            continue  # graphs without edges: all return probabilities are zero
        m = int(sizes[members[-1]])
        nodes = np.concatenate([np.arange(starts[g], starts[g] + sizes[g]) for g in members])
        if members.size * m * m <= _DENSE_PER_ENTRY * edges.size:
            slot_of_graph = np.zeros(sizes.size, dtype=np.int64)
            slot_of_graph[members] = np.arange(members.size)
            slot = slot_of_graph[graph_of_node[src[edges]]]
            out[nodes] = _dense_powers(
                slot, local[src[edges]], local[dst[edges]], weight[edges], sizes[members], k
            )
        else:
            out[nodes] = _sparse_powers(nodes, local, src[edges], dst[edges], weight[edges], k)
    return out


def _buckets(sizes: np.ndarray) -> list[np.ndarray]:
    """Group graph ids by similar size; each group is sorted by increasing size."""
    order = np.argsort(sizes, kind="stable")
    groups: list[np.ndarray] = []
    begin = 0
    for i in range(1, order.size + 1):
        if i < order.size:
            first, size = sizes[order[begin]], sizes[order[i]]
            fits = (i + 1 - begin) * size * size <= _BUCKET_ELEMENTS
            if size <= max(first * _BUCKET_GROWTH, first + 2) and fits:
                continue
        groups.append(order[begin:i])
        begin = i
    return groups


def _dense_powers(
    slot: np.ndarray,
    row: np.ndarray,
    col: np.ndarray,
    weight: np.ndarray,
    member_sizes: np.ndarray,
    k: int,
) -> np.ndarray:
    """Powers of each graph's T as a zero-padded [B, m, m] batch; return the real diagonals."""
    batch, m = member_sizes.size, int(member_sizes.max())
    flat = (slot * m + row) * m + col
    matrix = np.bincount(flat, weights=weight, minlength=batch * m * m)
    step = torch.from_numpy(matrix.reshape(batch, m, m))
    power = step
    diagonals = np.empty((batch, m, k))
    for j in range(k):
        if j:
            power = torch.bmm(power, step)
        diagonals[:, :, j] = power.diagonal(dim1=1, dim2=2).numpy()
    real = np.arange(m)[None, :] < member_sizes[:, None]
    return diagonals[real]


def _sparse_powers(
    nodes: np.ndarray,
    local: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    weight: np.ndarray,
    k: int,
) -> np.ndarray:
    """Powers via the block-diagonal sparse T times a stacked dense [nodes, m] block of T^j."""
    row_of_node = np.zeros(local.size, dtype=np.int64)
    row_of_node[nodes] = np.arange(nodes.size)
    rows, cols = row_of_node[src], row_of_node[dst]
    step = sp.csr_matrix((weight, (rows, cols)), shape=(nodes.size, nodes.size))
    # Row r of `power` is row r of its own graph's T^j, indexed by the local column id, so
    # the block structure needs no padding rows: the width is the bucket's largest graph.
    diag_cols = local[nodes]
    power = np.zeros((nodes.size, int(diag_cols.max()) + 1))
    np.add.at(power, (rows, local[dst]), weight)
    diagonals = np.empty((nodes.size, k))
    every = np.arange(nodes.size)
    for j in range(k):
        if j:
            power = step @ power
        diagonals[:, j] = power[every, diag_cols]
    return diagonals
