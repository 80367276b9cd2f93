"""Graphs packed once into flat tensors, so mini-batches are cut with a few tensor operations.

PyG's ``DataLoader`` collates every mini-batch graph by graph in Python; for the small molecules
of the TU sets that costs as much as the forward pass. ``PackedGraphs`` concatenates a split's
graphs once (node features, structure embeddings, per-graph edge lists with local node ids, and
the GCN normalisation of each graph) and ``select`` gathers any subset of graphs with index
arithmetic only. The structural GCN's normalisation depends on one graph alone, so it is
computed here once instead of in every forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.data import Data


@dataclass(frozen=True)
class GraphBatch:
    """A mini-batch as the models consume it."""

    x: Tensor                 # [N, n_feat]
    edge_index: Tensor        # [2, E] batch-wide node ids
    batch: Tensor             # [N] graph of each node (0..num_graphs-1)
    y: Tensor                 # [num_graphs]
    num_graphs: int
    stc_enc: Tensor | None    # [N, n_se] structure embeddings, if the algorithm uses them
    gcn_edge_index: Tensor | None   # [2, E + N] edges plus self loops, for the GCN channel
    gcn_weight: Tensor | None       # [E + N] symmetric GCN normalisation of those edges

    def to(self, device: torch.device) -> GraphBatch:
        """The same batch on another device."""
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)
        return GraphBatch(self.x.to(device), self.edge_index.to(device), self.batch.to(device),
                          self.y.to(device), self.num_graphs, move(self.stc_enc),
                          move(self.gcn_edge_index), move(self.gcn_weight))


class PackedGraphs:
    """A list of graphs stored as flat tensors with per-graph offsets."""

    def __init__(self, graphs: list[Data], *, structure: bool, gcn: bool) -> None:
        if not graphs:
            raise ValueError("cannot pack an empty list of graphs")
        nodes = torch.tensor([int(g.num_nodes) for g in graphs], dtype=torch.long)
        edges = torch.tensor([int(g.edge_index.size(1)) for g in graphs], dtype=torch.long)
        self.count = len(graphs)
        self.node_ptr = _ptr(nodes)
        self.edge_ptr = _ptr(edges)
        self.x = torch.cat([g.x for g in graphs]).float()
        self.y = torch.cat([g.y.view(-1)[:1] for g in graphs]).long()
        # Edge lists keep graph-local node ids; select() adds each graph's new offset.
        self.local_edges = torch.cat([g.edge_index for g in graphs], dim=1).long()
        self.stc_enc = torch.cat([g.stc_enc for g in graphs]).float() if structure else None
        self.gcn_ptr: Tensor | None = None
        self.gcn_local: Tensor | None = None
        self.gcn_norm: Tensor | None = None
        if gcn:
            self._pack_gcn(nodes, edges)

    def _pack_gcn(self, nodes: Tensor, edges: Tensor) -> None:
        """Per graph: its edges followed by one self loop per node, with D^-1/2 (A+I) D^-1/2."""
        graph_of_edge = torch.repeat_interleave(torch.arange(self.count), edges)
        src_global = self.local_edges[0] + self.node_ptr[graph_of_edge]
        dst_global = self.local_edges[1] + self.node_ptr[graph_of_edge]
        total_nodes = int(self.node_ptr[-1])
        # PyG's gcn_norm: in-degree (at the target) of A + I with unit weights.
        degree = torch.ones(total_nodes).index_add_(0, dst_global, torch.ones(dst_global.numel()))
        inv_sqrt = degree.pow(-0.5)
        graph_of_node = torch.repeat_interleave(torch.arange(self.count), nodes)
        node_local = torch.arange(total_nodes) - self.node_ptr[graph_of_node]
        # Order: all of graph 0's entries (edges, then loops), then graph 1's, ...
        entries = edges + nodes
        self.gcn_ptr = _ptr(entries)
        order_edges = self.gcn_ptr[graph_of_edge] + (torch.arange(int(edges.sum())) -
                                                      self.edge_ptr[graph_of_edge])
        order_loops = self.gcn_ptr[graph_of_node] + edges[graph_of_node] + node_local
        local = torch.empty(2, int(entries.sum()), dtype=torch.long)
        norm = torch.empty(int(entries.sum()))
        local[:, order_edges] = self.local_edges
        local[:, order_loops] = node_local.expand(2, -1)
        norm[order_edges] = inv_sqrt[src_global] * inv_sqrt[dst_global]
        norm[order_loops] = inv_sqrt * inv_sqrt
        self.gcn_local, self.gcn_norm = local, norm

    def all(self) -> GraphBatch:
        """Every graph, in order, as one batch."""
        return self.select(torch.arange(self.count))

    def select(self, graph_ids: Tensor) -> GraphBatch:
        """The given graphs (in the given order) as one batch."""
        ids = graph_ids.long()
        n_nodes = self.node_ptr[ids + 1] - self.node_ptr[ids]
        new_node_ptr = _ptr(n_nodes)
        node_idx = _gather_ranges(self.node_ptr[ids], n_nodes, new_node_ptr)
        edge_index = self._edges(ids, self.edge_ptr, self.local_edges, new_node_ptr)
        batch = torch.repeat_interleave(torch.arange(ids.numel()), n_nodes)
        stc = None if self.stc_enc is None else self.stc_enc[node_idx]
        gcn_edges = gcn_weight = None
        if self.gcn_ptr is not None and self.gcn_local is not None and self.gcn_norm is not None:
            counts = self.gcn_ptr[ids + 1] - self.gcn_ptr[ids]
            picked = _gather_ranges(self.gcn_ptr[ids], counts, _ptr(counts))
            gcn_edges = self.gcn_local[:, picked] + torch.repeat_interleave(new_node_ptr[:-1],
                                                                            counts)
            gcn_weight = self.gcn_norm[picked]
        return GraphBatch(self.x[node_idx], edge_index, batch, self.y[ids], int(ids.numel()),
                          stc, gcn_edges, gcn_weight)

    @staticmethod
    def _edges(ids: Tensor, ptr: Tensor, local: Tensor, new_node_ptr: Tensor) -> Tensor:
        counts = ptr[ids + 1] - ptr[ids]
        picked = _gather_ranges(ptr[ids], counts, _ptr(counts))
        return local[:, picked] + torch.repeat_interleave(new_node_ptr[:-1], counts)


def _ptr(counts: Tensor) -> Tensor:
    """Offsets [0, c0, c0+c1, ...]."""
    return torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(counts, 0)])


def _gather_ranges(starts: Tensor, counts: Tensor, new_ptr: Tensor) -> Tensor:
    """Concatenation of arange(start_i, start_i + count_i) for every i, without a Python loop."""
    total = int(new_ptr[-1])
    shift = torch.repeat_interleave(starts - new_ptr[:-1], counts)
    return torch.arange(total) + shift
