"""Mini-batches padded to a few static shapes, in buffers that stay where they are.

A CUDA graph (silo/training/graphed_steps.py) replays the kernels it recorded on the tensors it
recorded them on: a captured training step can only be fed by copying each new batch into the
same buffers, of the same sizes. Every mini-batch has its own node and edge counts, so each is
padded up to a *bucket*: eight sizes per doubling (at most 12.5% padding), so a silo's batches of
similar size share a handful of shapes, and so of graphs.

How padding stays out of every real value (for models whose ``accepts_padded_rows`` says so):
- padding node rows belong to graph ``graphs``, one past the last graph slot; pooling leaves
  that slot out (silo/models/graph_classifiers.py ``sum_pool``);
- padding edges all run from and to the last row, which is always a padding row (a bucket holds
  at least one row more than the batch's nodes), with weight zero: no real node sends or
  receives through them, forwards or backwards, no padding row grows with their number, and
  the matrix stays symmetric, as ``Adjacency.from_symmetric_csr`` says it is;
- padding graph slots (the last batch of an epoch is short) hold no nodes; the loss weights them
  zero (``weight``): 1 / real graphs on every real graph, so the weighted sum is the batch's mean.
Rows and labels a batch does not overwrite keep an earlier batch's values: they are finite and
weighted zero (a row no real value depends on has a zero gradient), so they are never cleared.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from trellis.silo.models.batching import GraphBatch
from trellis.silo.models.propagation import Adjacency

# Bucket sizes per doubling: 2^3 = 8 keeps padding under 12.5% and a silo's shapes few.
STEP_SHIFT = 3
SMALLEST_STEP = 16


def bucket(count: int) -> int:
    """The smallest bucket size at least ``count``: a multiple of a step that doubles with every
    doubling of ``count`` (2^STEP_SHIFT sizes per doubling, steps of at least SMALLEST_STEP)."""
    if count <= 0:
        raise ValueError(f"a bucket holds at least one item, not {count}")
    step = max(SMALLEST_STEP, 1 << max(count.bit_length() - 1 - STEP_SHIFT, 0))
    return -(-count // step) * step


@dataclass(frozen=True)
class StaticShape:
    """The padded sizes of one bucket of batches."""

    graphs: int               # graph slots (the plan's batch size, or the split's graphs)
    rows: int                 # node rows, at least one of them padding
    edges: int                # entries of the adjacency
    gcn_edges: int            # entries of the GCN adjacency (0: the model takes none)


def is_static_batch(batch: GraphBatch) -> bool:
    """Whether a batch can be padded here: undirected edges (one CSR matrix is its own
    transpose) for each adjacency it carries."""
    adjacencies = [batch.adjacency] + ([] if batch.gcn_adjacency is None
                                       else [batch.gcn_adjacency])
    return all(a.transpose is a.matrix for a in adjacencies)


def static_shape(batch: GraphBatch, graphs: int) -> StaticShape:
    """The bucket of ``batch`` with ``graphs`` graph slots (read from sizes alone: no wait)."""
    if batch.num_graphs > graphs:
        raise ValueError(f"a batch of {batch.num_graphs} graphs does not fit {graphs} slots")
    gcn = batch.gcn_adjacency
    return StaticShape(graphs, bucket(batch.x.size(0) + 1), bucket(_entries(batch.adjacency)),
                       0 if gcn is None else bucket(_entries(gcn)))


def _entries(adjacency: Adjacency) -> int:
    return int(adjacency.matrix.col_indices().numel()) or 1


class StaticBatch:
    """One bucket's buffers, as a ``GraphBatch`` the model is run on, and the loss weights."""

    def __init__(self, shape: StaticShape, like: GraphBatch) -> None:
        self.shape = shape
        device, rows, graphs = like.x.device, shape.rows, shape.graphs
        self.x = like.x.new_zeros(rows, like.x.size(1))
        self.stc_enc = (None if like.stc_enc is None
                        else like.stc_enc.new_zeros(rows, like.stc_enc.size(1)))
        self.node_graph = like.batch.new_full((rows,), graphs)
        self.y = like.y.new_zeros(graphs)
        self.weight = torch.zeros(graphs, dtype=like.x.dtype, device=device)
        # Weights by the number of real graphs: the full batch and the epoch's last one.
        self._weights: dict[int, Tensor] = {}
        self.adjacency = _StaticAdjacency(like.adjacency, rows, shape.edges)
        self.gcn = (None if like.gcn_adjacency is None
                    else _StaticAdjacency(like.gcn_adjacency, rows, shape.gcn_edges))
        self.batch = GraphBatch(self.x, self.adjacency.adjacency, self.node_graph, self.y,
                                graphs, self.stc_enc,
                                None if self.gcn is None else self.gcn.adjacency)

    def load(self, batch: GraphBatch) -> None:
        """Copy ``batch`` (of this bucket, on the buffers' device) into the buffers."""
        if static_shape(batch, self.shape.graphs) != self.shape:
            raise ValueError(f"a batch of shape {static_shape(batch, self.shape.graphs)} "
                             f"loaded into the buffers of {self.shape}")
        nodes, graphs = batch.x.size(0), batch.num_graphs
        self.x[:nodes].copy_(batch.x)
        if self.stc_enc is not None:
            assert batch.stc_enc is not None
            self.stc_enc[:nodes].copy_(batch.stc_enc)
        self.node_graph[:nodes].copy_(batch.batch)
        self.node_graph[nodes:].fill_(self.shape.graphs)
        self.y[:graphs].copy_(batch.y)
        self.weight.copy_(self._weights_for(graphs))
        self.adjacency.load(batch.adjacency, nodes)
        if self.gcn is not None:
            assert batch.gcn_adjacency is not None
            self.gcn.load(batch.gcn_adjacency, nodes)

    def _weights_for(self, graphs: int) -> Tensor:
        weight = self._weights.get(graphs)
        if weight is None:
            weight = self._weights[graphs] = torch.zeros_like(self.weight)
            weight[:graphs] = 1.0 / graphs
        return weight


class _StaticAdjacency:
    """A symmetric CSR matrix of fixed rows and entries whose parts are overwritten in place."""

    def __init__(self, like: Adjacency, rows: int, entries: int) -> None:
        crow, col = like.matrix.crow_indices(), like.matrix.col_indices()
        self.weighted = like.weighted
        self.crow = crow.new_zeros(rows + 1)
        self.crow[rows] = entries                  # the last row holds the padding edges
        self.col = col.new_full((entries,), rows - 1)
        self.values = like.matrix.values().new_zeros(entries)
        self.adjacency = Adjacency.from_symmetric_csr(self.crow, self.col, self.values, rows)
        self.adjacency.weighted = like.weighted
        # The matrix may hold its own copies of the parts: write through its accessors.
        matrix = self.adjacency.matrix
        self._crow, self._col, self._values = (matrix.crow_indices(), matrix.col_indices(),
                                               matrix.values())
        self.rows = rows
        # Unweighted: the real edges' ones and the padding's zeros change only with the count.
        self._ones: int | None = None

    def load(self, adjacency: Adjacency, nodes: int) -> None:
        """Take ``adjacency``'s edges among the first ``nodes`` rows; pad the rest."""
        matrix = adjacency.matrix
        crow, col = matrix.crow_indices(), matrix.col_indices()
        entries = col.numel()
        self._crow[:nodes + 1].copy_(crow[:nodes + 1])
        # Rows past the batch's nodes hold no edge, but for the last (the padding edges).
        self._crow[nodes + 1:self.rows].copy_(crow[nodes:nodes + 1].expand(self.rows - nodes - 1))
        self._col[:entries].copy_(col)
        self._col[entries:].fill_(self.rows - 1)
        if self.weighted:
            self._values[:entries].copy_(matrix.values())
        elif self._ones != entries:
            self._values[:entries].fill_(1.0)
            self._ones = entries
        else:
            return
        self._values[entries:].zero_()
