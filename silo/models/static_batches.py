"""Mini-batches of static shapes, cut on the device from a packed split by graph ids alone.

A CUDA graph (silo/training/graphed_steps.py) replays the kernels it recorded, on tensors of the
sizes it recorded: nothing in a recorded step may depend on a size the host reads. So every
mini-batch is padded up to a *bucket* (four sizes per doubling: at most a quarter of padding),
its node rows and its edges each, and ``StaticCut`` cuts it from the split kept on the device
(silo/models/batching.py ``PackedGraphs``) with device operations of the bucket's sizes only:
given the ids of its graphs in a buffer, every row finds its graph by a search over the batch's
node offsets, every edge likewise, and gathers what it holds. The cut is part of the recorded
step, so a step is one copy of its ids and one replay, whatever the batch.

How padding stays out of every real value (for models whose ``accepts_padded_rows`` says so):
- padding node rows belong to graph ``graphs``, one past the last slot; pooling leaves that slot
  out (silo/models/graph_classifiers.py ``sum_pool``); they read node 0's features (finite:
  their gradient is zero, and a row no real value depends on adds nothing to a weight's);
- padding edges all sit in the last row, always a padding row (a bucket holds at least one row
  more than the batch's nodes), from that row to itself, with weight zero: no real node sends or
  receives through them, forwards or backwards, and the matrix stays symmetric, as
  ``Adjacency.from_symmetric_csr`` says it is;
- padding graph slots (the epoch's last batch is short) hold the id one past the split's last
  graph, which has no nodes; the loss weights them zero: each real graph 1 / real graphs, so the
  weighted sum is the batch's mean loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from trellis.silo.models.batching import GraphBatch, PackedGraphs, _count, _PerGraphEdges, _ptr
from trellis.silo.models.propagation import Adjacency

# Bucket sizes per doubling: 2^2 = 4 keeps padding under a quarter and a silo's shapes few (a
# recorded graph costs about 20 ms once; an H200 measured 61 graphs for 7 CHEM silos at 8).
STEP_SHIFT = 2
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
    edges: int                # entries of the adjacency (the GCN one has ``edges + rows``)


def cuts_statically(packed: PackedGraphs) -> bool:
    """Whether ``packed``'s batches can be cut here: undirected edges (one CSR matrix is its own
    transpose) in the adjacency and, if the model takes one, the GCN adjacency."""
    return packed.edges.symmetric and (packed.gcn_edges is None or packed.gcn_edges.symmetric)


def static_shape(packed: PackedGraphs, ids: Tensor, graphs: int) -> StaticShape:
    """The bucket of the batch of graphs ``ids`` (on the CPU) with ``graphs`` slots, from the
    offsets kept on the CPU: no wait for the device."""
    if ids.numel() > graphs:
        raise ValueError(f"a batch of {ids.numel()} graphs does not fit {graphs} slots")
    nodes = _count(packed.host_node_ptr, ids)
    edges = _count(packed.edges.host_ptr, ids)
    return StaticShape(graphs, bucket(nodes + 1), bucket(max(edges, 1)))


class StaticCut:
    """Cuts padded batches of one bucket from ``packed`` (on its device) by graph ids.

    ``ids`` (int64, ``shape.graphs`` long, on the device) names the batch's graphs in order;
    slots past the batch's last graph hold ``packed.count`` (no graph: no nodes, no edges).
    """

    def __init__(self, packed: PackedGraphs, shape: StaticShape) -> None:
        if not cuts_statically(packed):
            raise ValueError("batches with directed edges are not cut to static shapes")
        self.packed, self.shape = packed, shape
        device = packed.device
        # Per graph, plus a last entry for the empty id ``count``: its nodes, and its label 0.
        self._nodes = _with_empty(packed.node_ptr[1:] - packed.node_ptr[:-1])
        self._y = _with_empty(packed.y)
        self._rows = torch.arange(shape.rows, device=device)
        self._edges = _EdgeCut(packed.edges, shape.edges, device)
        self._gcn = (None if packed.gcn_edges is None
                     else _EdgeCut(packed.gcn_edges, shape.edges + shape.rows, device))

    def __call__(self, ids: Tensor) -> tuple[GraphBatch, Tensor]:
        """The padded batch of graphs ``ids``, and each graph slot's loss weight."""
        packed, graphs, rows = self.packed, self.shape.graphs, self.shape.rows
        real = ids < packed.count
        first = packed.node_ptr.index_select(0, ids.clamp(max=packed.count - 1))
        sizes = self._nodes.index_select(0, ids)
        offsets = _ptr(sizes)
        # Each row's graph slot (graphs: padding) and its node of the split (node 0: padding).
        slot = torch.searchsorted(offsets[1:], self._rows, right=True)
        within = slot.clamp(max=graphs - 1)
        node = first.index_select(0, within) + self._rows - offsets.index_select(0, within)
        node = torch.where(slot < graphs, node, 0)
        x = packed.x.index_select(0, node)
        stc = None if packed.stc_enc is None else packed.stc_enc.index_select(0, node)
        padding = slot >= graphs
        adjacency = self._edges(ids, offsets, node, padding, rows)
        gcn = None if self._gcn is None else self._gcn(ids, offsets, node, padding, rows)
        counted = real.to(x.dtype)
        weight = counted / counted.sum()
        return (GraphBatch(x, adjacency, slot, self._y.index_select(0, ids), graphs, stc, gcn),
                weight)


class _EdgeCut:
    """One adjacency's part of a cut: its entries gathered by the same search, padded."""

    def __init__(self, edges: _PerGraphEdges, entries: int, device: torch.device) -> None:
        assert edges.in_degree is not None           # symmetric: ``cuts_statically``
        self.edges, self.entries = edges, entries
        self._counts = _with_empty(edges.ptr[1:] - edges.ptr[:-1])
        self._index = torch.arange(entries, device=device)
        self._index_type = (torch.int32 if max(entries, int(edges.host_ptr[-1])) < 2 ** 31
                            else torch.long)

    def __call__(self, ids: Tensor, node_offsets: Tensor, node: Tensor, padding: Tensor,
                 rows: int) -> Adjacency:
        edges, graphs = self.edges, ids.numel()
        assert edges.in_degree is not None
        count = edges.ptr.numel() - 1
        first = edges.ptr.index_select(0, ids.clamp(max=count - 1))
        offsets = _ptr(self._counts.index_select(0, ids))
        slot = torch.searchsorted(offsets[1:], self._index, right=True)
        within = slot.clamp(max=graphs - 1)
        entry = first.index_select(0, within) + self._index - offsets.index_select(0, within)
        real = slot < graphs
        entry = torch.where(real, entry, 0)
        # A real entry's source: its graph-local id plus its graph's first row in the batch.
        col = edges.local[0].index_select(0, entry).long() + node_offsets.index_select(0, within)
        col = torch.where(real, col, rows - 1).to(self._index_type)
        weight = (real.float() if edges.weight is None
                  else torch.where(real, edges.weight.index_select(0, entry), 0.0))
        degree = torch.where(padding, 0, edges.in_degree.index_select(0, node).long())
        # The last row, padding, holds the padding entries: its offset ends at ``entries``.
        crow = torch.cat([degree.new_zeros(1), torch.cumsum(degree[:-1], 0),
                          degree.new_full((1,), self.entries)]).to(self._index_type)
        adjacency = Adjacency.from_symmetric_csr(crow, col, weight, rows)
        adjacency.weighted = edges.weight is not None
        return adjacency


def _with_empty(values: Tensor) -> Tensor:
    """``values`` and a zero after them: what the empty id (one past the last graph) reads."""
    return torch.cat([values, values.new_zeros(1)])
