"""Graphs packed once into flat tensors, so mini-batches are cut with a few tensor operations.

PyG's ``DataLoader`` collates every mini-batch graph by graph in Python; for the small molecules
of the TU sets that costs as much as the forward pass. ``PackedGraphs`` concatenates a split's
graphs once (node features, structure embeddings, per-graph edge lists with local node ids, and
the GCN normalisation of each graph) and ``select`` gathers any subset of graphs with index
arithmetic only. The structural GCN's normalisation depends on one graph alone, so it is
computed here once instead of in every forward pass.

Each graph's edges are stored sorted by target and, unless every graph is undirected (then the
transpose is the matrix itself), with the order that sorts them by source: a batch of whole
graphs placed one after another is then sorted too, so its sparse adjacency
(silo/models/propagation.py) is built by counting, never by sorting in the training loop; for
undirected graphs the row offsets are a running sum of the batch nodes' stored in-degrees,
and only the sources are gathered per edge. The store
keeps graph-local ids in 32 bits (a batch's CSR indices too, unless it has 2^31 rows or edges),
so a silo with tens of millions of edges keeps half the bytes per edge.

On a GPU a split is packed once and moved there whole (``PackedGraphs.to``): mini-batches are
gathered on the device by index, and never copied from the host per step. Every size a batch
needs before its tensors exist (its nodes, edges and rows) is read from the graph offsets kept
on the CPU beside the device copy, so cutting a batch never waits for the GPU.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from trellis.silo.data.graph import Graph
from trellis.silo.models.propagation import Adjacency, by_target, gcn_weights


@dataclass(frozen=True)
class GraphBatch:
    """A mini-batch as the models consume it."""

    x: Tensor                 # [N, n_feat]
    adjacency: Adjacency      # the graphs' edges, batch-wide node ids
    batch: Tensor             # [N] graph of each node (0..num_graphs-1)
    y: Tensor                 # [num_graphs]
    num_graphs: int
    stc_enc: Tensor | None    # [N, n_se] structure embeddings, if the algorithm uses them
    gcn_adjacency: Adjacency | None  # edges plus self loops, GCN-normalised, if needed

    @property
    def edge_index(self) -> Tensor:
        """The edges as a ``[2, E]`` list (sorted by target)."""
        return self.adjacency.edge_index

    def to(self, device: torch.device) -> GraphBatch:
        """The same batch on another device (its tensors themselves where they are there)."""
        return GraphBatch(self.x.to(device), self.adjacency.to(device), self.batch.to(device),
                          self.y.to(device), self.num_graphs,
                          None if self.stc_enc is None else self.stc_enc.to(device),
                          None if self.gcn_adjacency is None else self.gcn_adjacency.to(device))


class _PerGraphEdges:
    """Edge lists of many graphs, each sorted by (target, source), in graph-local node ids."""

    def __init__(self, local: Tensor, counts: Tensor, node_ptr: Tensor,
                 weight: Tensor | None = None, symmetric: bool | None = None) -> None:
        graph = torch.repeat_interleave(torch.arange(counts.numel()), counts)
        total = int(node_ptr[-1])
        self.ptr = _ptr(counts)
        # The edge offsets on the CPU, kept beside a device copy (``to``): a batch's edge count.
        self.host_ptr = self.ptr
        # Global ids keep every graph's edges together: its nodes form one contiguous range.
        offset = node_ptr.index_select(0, graph)
        order = by_target(local[0] + offset, local[1] + offset, total)
        # Graph-local ids and offsets fit 32 bits whenever one graph has fewer than 2^31 nodes
        # and edges: half the memory of the largest arrays a silo keeps (COLLAB: 25 M edges).
        narrow = _index_type(local, counts)
        self.local = local.index_select(1, order).to(narrow)
        self.weight = None if weight is None else weight.index_select(0, order)
        del order
        # Undirected graphs (the TU sets store each edge both ways): A^T is A, so neither the
        # store nor a batch keeps a by-source order, and a batch builds one sparse matrix per
        # adjacency instead of two. A caller that knows says so (``symmetric``), and nothing is
        # sorted again; None: checked here.
        self.transpose_local: Tensor | None = None
        # Symmetric edges only: each node's in-degree, from which a batch's CSR row offsets
        # come by one gather and one running sum (no per-edge target ids, no count).
        self.in_degree: Tensor | None = None
        if not symmetric:
            to_source = by_target(self.local[1] + offset, self.local[0] + offset, total)
            if symmetric is False or not _symmetric(self.local, self.weight, to_source):
                to_source -= self.ptr.index_select(0, graph)
                self.transpose_local = to_source.to(narrow)
                return
            del to_source
        self.in_degree = torch.bincount(self.local[1] + offset, minlength=total).to(narrow)

    @property
    def symmetric(self) -> bool:
        """Whether every edge u -> v also runs v -> u with the same weight (A^T is A)."""
        return self.in_degree is not None

    def to(self, device: torch.device) -> _PerGraphEdges:
        """The same edges on another device; the offsets stay on the CPU too (``host_ptr``)."""
        moved = copy.copy(self)
        for name in ("ptr", "local", "weight", "transpose_local", "in_degree"):
            value = getattr(self, name)
            setattr(moved, name, None if value is None else value.to(device, copy=True))
        return moved

    def select(self, ids: Tensor, new_node_ptr: Tensor, node_rows: Tensor,
               host_ids: Tensor | None = None, rows: int | None = None) -> Adjacency:
        """The adjacency of graphs ``ids`` placed at ``new_node_ptr`` (its last entry: the
        batch's ``rows``, padding included); ``node_rows``: the stored rows of its real nodes;
        ``host_ids``: ``ids`` on the CPU (both known to the caller, else read here)."""
        host_ids = ids.cpu() if host_ids is None else host_ids
        rows = int(new_node_ptr[-1]) if rows is None else rows
        # index_select, not t[idx]: several times faster for the gathers of every mini-batch.
        starts = self.ptr.index_select(0, ids)
        counts = self.ptr.index_select(0, ids + 1) - starts
        new_ptr = _ptr(counts)
        total = (int(new_ptr[-1]) if self.ptr is self.host_ptr
                 else _count(self.host_ptr, host_ids))
        picked = _gather_ranges(starts, counts, new_ptr, total)
        weight = None if self.weight is None else self.weight.index_select(0, picked)
        if self.in_degree is None:
            return self._select_directed(picked, counts, new_ptr, new_node_ptr, weight, total,
                                         rows)
        index = torch.int32 if max(rows, total) < 2 ** 31 else torch.long
        # Each edge's source: graph-local id plus its graph's first row in the batch.
        col = self.local[0].index_select(0, picked).to(index).add_(
            _per_item(new_node_ptr[:-1].to(index), counts, total))
        crow = torch.zeros(rows + 1, dtype=index, device=col.device)
        real = node_rows.numel()
        torch.cumsum(self.in_degree.index_select(0, node_rows), 0, dtype=index,
                     out=crow[1:real + 1])
        if rows > real:
            crow[real + 1:] = crow[real]                   # padding rows have no edges
        return Adjacency.from_symmetric_csr(crow, col, weight, rows)

    def _select_directed(self, picked: Tensor, counts: Tensor, new_ptr: Tensor,
                         new_node_ptr: Tensor, weight: Tensor | None, total: int,
                         rows: int) -> Adjacency:
        """``select`` for edges that are not symmetric: a CSR matrix and its transpose."""
        assert self.transpose_local is not None
        # int32 + int64 promotes to int64 in one pass.
        edges = self.local.index_select(1, picked) + _per_item(new_node_ptr[:-1], counts, total)
        # A graph's by-source order stays within the graph: shifted by its new edge offset,
        # it is the batch's by-source order.
        transpose = (self.transpose_local.index_select(0, picked)
                     + _per_item(new_ptr[:-1], counts, total))
        return Adjacency.from_sorted(edges[0], edges[1], rows, transpose, weight)


def _symmetric(local: Tensor, weight: Tensor | None, to_source: Tensor) -> bool:
    """Whether edges sorted by (target, source), taken in the by-(source, target) order
    ``to_source``, are the same edges reversed, weights included: every u -> v also v -> u.
    Row by row, so a directed set stops at the first."""
    pairs = [(local[0], local[1]), (local[1], local[0])]
    if weight is not None:
        pairs.append((weight, weight))
    return all(torch.equal(a.index_select(0, to_source), b) for a, b in pairs)


def _index_type(local: Tensor, counts: Tensor) -> torch.dtype:
    """int32 if every graph-local node id and edge position fits it, else int64."""
    largest = max(int(local.max()) if local.numel() else 0,
                  int(counts.max()) if counts.numel() else 0)
    return torch.int32 if largest < 2 ** 31 else torch.long


def _structure_embeddings(graphs: Sequence[Graph]) -> Tensor:
    """Every graph's structure embedding rows, one after another."""
    encodings = [g.stc_enc for g in graphs]
    missing = sum(e is None for e in encodings)
    if missing:
        raise ValueError(f"{missing} of {len(graphs)} graphs have no structure embeddings: "
                         "add them first (silo/data/structure.py add_structure_embeddings)")
    return torch.cat([e for e in encodings if e is not None]).float()


class PackedGraphs:
    """A list of graphs stored as flat tensors with per-graph offsets."""

    def __init__(self, graphs: Sequence[Graph], *, structure: bool, gcn: bool) -> None:
        if not graphs:
            raise ValueError("cannot pack an empty list of graphs")
        nodes = torch.tensor([int(g.num_nodes) for g in graphs], dtype=torch.long)
        edges = torch.tensor([int(g.edge_index.size(1)) for g in graphs], dtype=torch.long)
        self.count = len(graphs)
        self.node_ptr = _ptr(nodes)
        # The node offsets on the CPU, kept beside a device copy (``to``): a batch's node count.
        self.host_node_ptr = self.node_ptr
        self.x = torch.cat([g.x for g in graphs]).float()
        self.y = torch.cat([g.y.view(-1)[:1] for g in graphs]).long()
        local_edges = torch.cat([g.edge_index for g in graphs], dim=1).long()
        self.edges = _PerGraphEdges(local_edges, edges, self.node_ptr)
        self.stc_enc = _structure_embeddings(graphs) if structure else None
        self.gcn_edges = (_gcn_edges(local_edges, nodes, edges, self.node_ptr,
                                     self.edges.symmetric) if gcn else None)

    @property
    def device(self) -> torch.device:
        """Where the graphs' tensors are, and so every batch cut from them."""
        return self.x.device

    def to(self, device: torch.device | str) -> PackedGraphs:
        """The same graphs on another device (itself if they are there), the offsets kept on
        the CPU as well: batches are then cut there without waiting for it."""
        device = torch.device(device)
        if device.type == self.device.type and device.index in (None, self.device.index):
            return self
        return self._copy_to(device)

    def _copy_to(self, device: torch.device) -> PackedGraphs:
        """A copy on ``device`` that cuts its batches as a device copy does (wherever it is)."""
        moved = copy.copy(self)
        moved.x, moved.y = self.x.to(device, copy=True), self.y.to(device, copy=True)
        moved.node_ptr = self.node_ptr.to(device, copy=True)
        moved.stc_enc = None if self.stc_enc is None else self.stc_enc.to(device, copy=True)
        moved.edges = self.edges.to(device)
        moved.gcn_edges = None if self.gcn_edges is None else self.gcn_edges.to(device)
        return moved

    def all(self) -> GraphBatch:
        """Every graph, in order, as one batch."""
        return self.select(torch.arange(self.count))

    def select(self, graph_ids: Tensor, row_multiple: int = 1,
               device_ids: Tensor | None = None) -> GraphBatch:
        """The given graphs (in the given order) as one batch, on the graphs' device.

        ``graph_ids`` on the CPU: a batch's sizes are read from them and the CPU offsets, so
        that cutting it never waits for a GPU; ``device_ids``, the same ids already on the
        graphs' device, spares their copy there (one copy per epoch instead of one per batch).

        With ``row_multiple`` > 1 the node rows are padded with zero rows to a multiple of it.
        Padding nodes have no edges and belong to graph ``num_graphs``, one past the last, so
        they reach no real node and no pooled graph; the dense layers then see only a few
        distinct row counts (silo/models/dense.py compiles a kernel per count).
        """
        host_ids = graph_ids.long().cpu()
        resident = self.node_ptr is not self.host_node_ptr
        ids = host_ids
        if resident:
            ids = (device_ids.long() if device_ids is not None
                   else host_ids.to(self.device, non_blocking=True))
        starts = self.node_ptr.index_select(0, ids)
        n_nodes = self.node_ptr.index_select(0, ids + 1) - starts
        new_node_ptr = _ptr(n_nodes)
        total = _count(self.host_node_ptr, host_ids) if resident else int(new_node_ptr[-1])
        rows = -(-total // row_multiple) * row_multiple
        node_idx = _gather_ranges(starts, n_nodes, new_node_ptr, total)
        batch = _per_item(torch.arange(ids.numel(), device=ids.device), n_nodes, total)
        if rows > total:
            batch = torch.cat([batch, batch.new_full((rows - total,), ids.numel())])
        x = _padded_rows(self.x, node_idx, rows)
        stc = None if self.stc_enc is None else _padded_rows(self.stc_enc, node_idx, rows)
        # new_full, not torch.tensor([rows]): made on the device, no copy from the host.
        padded_ptr = torch.cat([new_node_ptr[:-1], new_node_ptr.new_full((1,), rows)])
        gcn = (None if self.gcn_edges is None
               else self.gcn_edges.select(ids, padded_ptr, node_idx, host_ids, rows))
        return GraphBatch(x, self.edges.select(ids, padded_ptr, node_idx, host_ids, rows), batch,
                          self.y.index_select(0, ids), int(ids.numel()), stc, gcn)


def _padded_rows(source: Tensor, rows_taken: Tensor, rows: int) -> Tensor:
    """``source[rows_taken]`` followed by zero rows up to ``rows`` rows, gathered in place."""
    if rows == rows_taken.numel():
        return source.index_select(0, rows_taken)
    out = source.new_zeros(rows, source.size(1))
    torch.index_select(source, 0, rows_taken, out=out[:rows_taken.numel()])
    return out


def _gcn_edges(local_edges: Tensor, nodes: Tensor, edges: Tensor, node_ptr: Tensor,
               symmetric: bool) -> _PerGraphEdges:
    """Per graph: its edges and one self loop per node, weighted D^-1/2 (A+I) D^-1/2
    (``symmetric``: the edges are, and so, loops and weights included, is the result)."""
    count = nodes.numel()
    total_nodes = int(node_ptr[-1])
    graph_of_edge = torch.repeat_interleave(torch.arange(count), edges)
    offset = node_ptr.index_select(0, graph_of_edge)
    edge_weight, loop_weight = gcn_weights(local_edges[0] + offset, local_edges[1] + offset,
                                           total_nodes)
    # Grouped by graph, each graph's edges before its loops: edge i of graph g moves to
    # i + node_ptr[g], the loop of node v of graph g to edge_ptr[g + 1] + v.
    edge_slot = torch.arange(local_edges.size(1)) + offset
    del offset, graph_of_edge
    graph_of_node = torch.repeat_interleave(torch.arange(count), nodes)
    loop_slot = torch.arange(total_nodes) + _ptr(edges)[1:].index_select(0, graph_of_node)
    node_local = torch.arange(total_nodes) - node_ptr.index_select(0, graph_of_node)
    del graph_of_node
    local = local_edges.new_empty(2, local_edges.size(1) + total_nodes)
    local[:, edge_slot] = local_edges
    local[:, loop_slot] = node_local
    norm = edge_weight.new_empty(local.size(1))
    norm[edge_slot] = edge_weight
    norm[loop_slot] = loop_weight
    return _PerGraphEdges(local, edges + nodes, node_ptr, norm, symmetric)


def _ptr(counts: Tensor) -> Tensor:
    """Offsets [0, c0, c0+c1, ...] (int64, on the counts' device)."""
    return torch.cat([counts.new_zeros(1, dtype=torch.long), torch.cumsum(counts, 0)])


def _count(ptr: Tensor, ids: Tensor) -> int:
    """How many items the groups ``ids`` hold together, by the CPU offsets ``ptr``."""
    return int((ptr.index_select(0, ids + 1) - ptr.index_select(0, ids)).sum())


def _per_item(values: Tensor, counts: Tensor, total: int) -> Tensor:
    """``values[i]`` repeated ``counts[i]`` times (``total`` = sum of counts, known already)."""
    return torch.repeat_interleave(values, counts, output_size=total)


def _gather_ranges(starts: Tensor, counts: Tensor, new_ptr: Tensor, total: int) -> Tensor:
    """Concatenation of arange(start_i, start_i + count_i) for every i, without a Python loop
    (``total`` = sum of counts, known already)."""
    return (torch.arange(total, device=starts.device)
            + _per_item(starts - new_ptr[:-1], counts, total))
