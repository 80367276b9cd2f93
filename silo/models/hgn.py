"""FedHGN's heterogeneous GNN (docs/algorithms.md §5.2): a two-layer RGCN with basis decomposition.

Node embeddings, the relation list and each relation's basis coefficients are bound to the
silo's schema and never leave it; the bases, the biases and the decoder are schema-free and
are the only shared tensors. Parameter names carry no type or relation name.

With `num_bases <= 0` the same class builds the baselines' RGCN (§5.6): one full weight per
relation slot instead of bases and coefficients. Its layer-2 weights are bound to a relation
order, so they are shareable only when every silo builds over the same (union) relation list.

Computation is full-batch and exact. Per canonical edge type c the message is the mean over
in-neighbours (right normalisation, degree clamped to 1); relation names tie parameters
across canonical types. Layer 1 has no weights, so all its relations fold into one sparse
matrix; layer 2 is needed only at target-type nodes, where each relation's aggregate is
mixed through the shared bases.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn

from trellis.protos.algorithms import HGN_SCHEMA_FREE, in_groups
from trellis.silo.data.hetero import HeteroGraph


@dataclass(frozen=True)
class HeteroOperators:
    """The graph as sparse operators, built once per graph."""

    num_nodes: int
    offsets: dict[str, int]           # first global id of each node type
    layer1: torch.Tensor              # (N, N) sparse COO: sum over canonical types of D^-1 A
    layer2: torch.Tensor              # (R * T, N) sparse COO: per relation, target-node rows
    num_relations: int
    target_nodes: torch.Tensor        # (T,) global ids of the target-type nodes

    def to(self, device: torch.device | str) -> HeteroOperators:
        """The same operators on another device."""
        return replace(self, layer1=self.layer1.to(device), layer2=self.layer2.to(device),
                       target_nodes=self.target_nodes.to(device))


def build_operators(graph: HeteroGraph, relations: Sequence[str] | None = None
                    ) -> HeteroOperators:
    """Normalised adjacency operators, one relation slot per name of `relations` (default:
    `graph.relations`); slots of relations the graph lacks hold no edges."""
    order = tuple(graph.relations if relations is None else relations)
    if len(set(order)) != len(order):
        raise ValueError("the relation list names a relation twice")
    relation_index = {r: i for i, r in enumerate(order)}
    foreign = [r for r in graph.relations if r not in relation_index]
    if foreign:
        shown = ", ".join(repr(r) for r in foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise ValueError(f"the graph has {len(foreign)} relation(s) that are not in the given "
                         f"relation list: {shown}")
    offsets: dict[str, int] = {}
    total = 0
    for t in graph.node_types:
        offsets[t] = total
        total += graph.num_nodes[t]
    target_offset = offsets[graph.target_type]
    n_target = graph.num_nodes[graph.target_type]
    rows1, cols1, vals1 = [], [], []
    rows2, cols2, vals2 = [], [], []
    for (src, rel, dst), index in graph.edges.items():
        if index.shape[1] == 0:
            continue
        u = index[0] + offsets[src]
        v = index[1] + offsets[dst]
        degree = np.bincount(index[1], minlength=graph.num_nodes[dst]).astype(np.float64)
        weight = 1.0 / np.maximum(degree[index[1]], 1.0)
        rows1.append(v)
        cols1.append(u)
        vals1.append(weight)
        if dst == graph.target_type:
            rows2.append(relation_index[rel] * n_target + (v - target_offset))
            cols2.append(u)
            vals2.append(weight)
    layer1 = _sparse(rows1, cols1, vals1, (total, total))
    layer2 = _sparse(rows2, cols2, vals2, (len(relation_index) * n_target, total))
    target = torch.arange(target_offset, target_offset + n_target)
    return HeteroOperators(total, offsets, layer1, layer2, len(relation_index), target)


def _sparse(rows: list[np.ndarray], cols: list[np.ndarray], vals: list[np.ndarray],
            shape: tuple[int, int]) -> torch.Tensor:
    if rows:
        index = torch.from_numpy(np.stack([np.concatenate(rows), np.concatenate(cols)]))
        values = torch.from_numpy(np.concatenate(vals).astype(np.float32))
    else:
        index, values = torch.zeros(2, 0, dtype=torch.long), torch.zeros(0)
    # Duplicate (row, col) pairs (parallel edges, or canonical types sharing a name) add up.
    return torch.sparse_coo_tensor(index, values, shape, check_invariants=True).coalesce()


class BasisRGCN(nn.Module):
    """Embeddings -> mean aggregation (+bias, ReLU) -> per-relation layer 2 -> decoder.

    Layer 2 mixes `num_bases` shared bases [B, d, d] through private coefficients [R, B]
    (FedHGN); with `num_bases <= 0` it holds a full weight per relation, `layer2.weights`
    [R, d, d], and there are no coefficients (the baselines' RGCN, §5.6).
    """

    coefficients: nn.Parameter | None

    def __init__(self, num_nodes: dict[str, int], node_types: tuple[str, ...],
                 num_relations: int, num_classes: int, hidden: int = 64,
                 num_bases: int = 20) -> None:
        super().__init__()
        self.num_relations = num_relations
        self.hidden = hidden
        self.num_bases = num_bases
        # Indexed by position in the silo's own node-type list: no names in parameter names.
        self.embeddings = nn.ParameterList(
            nn.Parameter(torch.randn(num_nodes[t], hidden)) for t in node_types)
        # The creation order below fixes which random numbers each tensor draws: keep it.
        self.coefficients = (nn.Parameter(torch.empty(num_relations, num_bases))
                             if num_bases > 0 else None)
        self.layer1 = _Bias(hidden)
        self.layer2: _BasisLayer | _RelationLayer = (
            _BasisLayer(hidden, num_bases) if num_bases > 0
            else _RelationLayer(hidden, num_relations))
        self.decoder = nn.Linear(hidden, num_classes)
        if self.coefficients is not None:
            gain = nn.init.calculate_gain("relu")
            # Xavier-uniform on a 1 x B view per relation, as the reference's ParameterDict.
            bound = gain * math.sqrt(6.0 / (1 + num_bases))
            nn.init.uniform_(self.coefficients, -bound, bound)

    def forward(self, ops: HeteroOperators) -> torch.Tensor:
        """Logits of every target-type node."""
        if ops.num_relations != self.num_relations:
            raise ValueError(f"the operators have {ops.num_relations} relation slots; the "
                             f"model has {self.num_relations}")
        h0 = torch.cat(list(self.embeddings), dim=0)
        h1 = torch.relu(torch.sparse.mm(ops.layer1, h0) + self.layer1.bias)
        per_relation = torch.sparse.mm(ops.layer2, h1).view(ops.num_relations, -1, h1.shape[1])
        if self.coefficients is not None:
            h2 = self.layer2(per_relation, self.coefficients)
        else:
            h2 = self.layer2(per_relation)
        return self.decoder(torch.relu(h2))

    def shared_names(self, groups: Sequence[str] = HGN_SCHEMA_FREE) -> list[str]:
        """Names of the tensors of the shared groups (the algorithm row's `shares`), in
        parameter order: never the embeddings or the coefficients."""
        return [n for n, _ in self.named_parameters() if in_groups(n, groups)]


class _Bias(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(hidden))


class _BasisLayer(nn.Module):
    def __init__(self, hidden: int, num_bases: int) -> None:
        super().__init__()
        self.bases = nn.Parameter(torch.empty(num_bases, hidden, hidden))
        nn.init.xavier_uniform_(self.bases, gain=nn.init.calculate_gain("relu"))
        self.bias = nn.Parameter(torch.zeros(hidden))

    def forward(self, per_relation: torch.Tensor, coefficients: torch.Tensor) -> torch.Tensor:
        # sum_r M_r (sum_b beta_rb V_b) = sum_b (sum_r beta_rb M_r) V_b: B products, not R.
        mixed = torch.einsum("rb,rtd->btd", coefficients, per_relation)
        return torch.einsum("btd,bde->te", mixed, self.bases) + self.bias


class _RelationLayer(nn.Module):
    def __init__(self, hidden: int, num_relations: int) -> None:
        super().__init__()
        self.weights = nn.Parameter(torch.empty(num_relations, hidden, hidden))
        # Xavier-uniform over the whole [R, d, d] tensor (fan_in d*d, fan_out R*d), as the
        # reference's `RGCNLayer.weight` (baselines/RGCN.py) and as our bases.
        nn.init.xavier_uniform_(self.weights, gain=nn.init.calculate_gain("relu"))
        self.bias = nn.Parameter(torch.zeros(hidden))

    def forward(self, per_relation: torch.Tensor) -> torch.Tensor:
        return torch.einsum("rtd,rde->te", per_relation, self.weights) + self.bias


def alignment_loss(coefficients: torch.Tensor, pool: torch.Tensor | None) -> torch.Tensor:
    """FedHGN's alignment (§5.4): each relation's squared distance to its nearest pooled vector."""
    if pool is None or pool.numel() == 0:
        return coefficients.new_zeros(())
    distances = (coefficients[:, None, :] - pool.detach()[None, :, :]).pow(2).sum(dim=2)
    return distances.min(dim=1).values.sum()
