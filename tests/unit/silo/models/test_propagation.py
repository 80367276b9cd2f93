"""Sparse message passing (silo/models/propagation.py) against the gather/scatter it replaces."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch_geometric.data import Batch, Data

from trellis.silo.models.batching import PackedGraphs
from trellis.silo.models.propagation import Adjacency


def _scatter(y: torch.Tensor, edge_index: torch.Tensor, weight: torch.Tensor | None
             ) -> torch.Tensor:
    messages = y.index_select(0, edge_index[0])
    if weight is not None:
        messages = messages * weight.unsqueeze(1)
    return torch.zeros_like(y).index_add_(0, edge_index[1], messages)


@pytest.mark.parametrize("weighted", [False, True])
def test_product_and_gradient_equal_the_scatter(weighted: bool) -> None:
    gen = torch.Generator().manual_seed(5)
    n = 40
    edge_index = torch.randint(0, n, (2, 150), generator=gen)
    edge_index = torch.cat([edge_index, edge_index[:, :10]], dim=1)   # repeated edges count twice
    weight = torch.rand(edge_index.size(1), generator=gen) if weighted else None
    y = torch.randn(n, 8, generator=gen, requires_grad=True)
    upstream = torch.randn(n, 8, generator=gen)

    ours = Adjacency.from_edges(edge_index, n, weight)(y)
    (grad_ours,) = torch.autograd.grad(ours, y, upstream)
    reference = _scatter(y, edge_index, weight)
    (grad_ref,) = torch.autograd.grad(reference, y, upstream)
    assert torch.allclose(ours, reference, atol=1e-5)
    assert torch.allclose(grad_ours, grad_ref, atol=1e-5)


@pytest.mark.parametrize("kind", ["directed", "undirected", "one directed edge"])
def test_packed_batch_adjacency_needs_no_sort_and_equals_the_scatter(kind: str) -> None:
    """Batches cut in any graph order carry a valid CSR and transpose; for undirected graphs
    (every edge both ways, as the TU sets store them) the transpose is the matrix itself."""
    gen = torch.Generator().manual_seed(8)
    graphs = []
    for size in (4, 1, 6, 3, 5):
        edges = torch.randint(0, size, (2, 3 * size), generator=gen)   # repeats kept
        if kind != "directed":
            edges = torch.cat([edges, edges.flip(0)], dim=1)
        if kind == "one directed edge" and size == 6:
            edges = torch.cat([edges, torch.tensor([[0], [5]])], dim=1)
        graphs.append(Data(x=torch.randn(size, 3, generator=gen), edge_index=edges,
                           y=torch.tensor([0])))
    packed = PackedGraphs(graphs, structure=False, gcn=True)
    assert packed.gcn_edges is not None
    assert packed.edges.symmetric == packed.gcn_edges.symmetric == (kind == "undirected")
    assert (packed.edges.transpose_local is None) == (kind == "undirected")
    for ids in (torch.tensor([3, 0, 4]), torch.tensor([2, 1, 0, 4, 3]), torch.tensor([1])):
        batch = packed.select(ids)
        for adjacency in (batch.adjacency, batch.gcn_adjacency):
            assert adjacency is not None
            assert (adjacency.transpose is adjacency.matrix) == (kind == "undirected")
        reference = Batch.from_data_list([graphs[i] for i in ids])
        y = torch.randn(reference.num_nodes, 5, generator=gen, requires_grad=True)
        upstream = torch.randn(reference.num_nodes, 5, generator=gen)
        ours = batch.adjacency(y)
        expected = _scatter(y, reference.edge_index, None)
        assert torch.allclose(ours, expected, atol=1e-5)
        grads = [torch.autograd.grad(out, y, upstream)[0] for out in (ours, expected)]
        assert torch.allclose(grads[0], grads[1], atol=1e-5)
        gcn = batch.gcn_adjacency
        assert gcn is not None
        (grad_gcn,) = torch.autograd.grad(gcn(y), y, upstream)
        by_scatter = _scatter(y, torch.stack([gcn.src, gcn.dst]), gcn.weight)
        (grad_scatter,) = torch.autograd.grad(by_scatter, y, upstream)
        assert torch.allclose(grad_gcn, grad_scatter, atol=1e-5)
        # Padding rows (row_multiple) have no edges: real rows unchanged, padding rows zero.
        padded = packed.select(ids, row_multiple=8)
        rows = padded.x.size(0)
        assert rows % 8 == 0 and rows > reference.num_nodes
        y_padded = torch.cat([y.detach(), torch.randn(rows - y.size(0), 5, generator=gen)])
        for small, big in ((batch.adjacency, padded.adjacency),
                           (batch.gcn_adjacency, padded.gcn_adjacency)):
            assert big is not None and big.num_nodes == rows
            out = big(y_padded)
            assert torch.allclose(out[:y.size(0)], small(y.detach()), atol=1e-6)
            assert not out[y.size(0):].any()


def test_edges_both_ways_with_unequal_weights_keep_their_transpose() -> None:
    """The symmetry check covers the weights: u -> v and v -> u weighted differently is no
    symmetric matrix, and its gradient needs the real transpose."""
    from trellis.silo.models.batching import _PerGraphEdges

    local = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    counts, node_ptr = torch.tensor([4]), torch.tensor([0, 3])
    assert _PerGraphEdges(local, counts, node_ptr, torch.ones(4)).symmetric
    uneven = _PerGraphEdges(local, counts, node_ptr, torch.tensor([1.0, 2.0, 1.0, 1.0]))
    assert not uneven.symmetric and uneven.transpose_local is not None
    adjacency = uneven.select(torch.tensor([0]), node_ptr, torch.arange(3))
    y = torch.randn(3, 2, requires_grad=True)
    upstream = torch.randn(3, 2)
    (grad,) = torch.autograd.grad(adjacency(y), y, upstream)
    dense = torch.zeros(3, 3).index_put_((adjacency.dst, adjacency.src), adjacency.weight,
                                         accumulate=True)
    assert torch.allclose(grad, dense.T @ upstream, atol=1e-6)


def test_packed_edges_keep_32_bit_local_ids_and_batches_get_64_bit_ones() -> None:
    """The packed store halves its largest arrays; ids too large for int32 keep int64."""
    from trellis.silo.models.batching import _index_type

    graphs = [Data(x=torch.ones(3, 1), edge_index=torch.tensor([[0, 1, 2], [1, 2, 0]]),
                   y=torch.tensor([0])) for _ in range(2)]
    packed = PackedGraphs(graphs, structure=False, gcn=True)
    assert packed.edges.local.dtype == torch.int32
    assert packed.edges.transpose_local is not None          # a directed cycle
    assert packed.edges.transpose_local.dtype == torch.int32
    assert packed.gcn_edges is not None and packed.gcn_edges.local.dtype == torch.int32
    batch = packed.select(torch.tensor([1, 0]))
    assert batch.edge_index.dtype == torch.long
    assert batch.edge_index.tolist() == [[2, 0, 1, 5, 3, 4], [0, 1, 2, 3, 4, 5]]
    local = torch.tensor([[0], [1]])
    assert _index_type(local, torch.tensor([2 ** 31 - 1])) == torch.int32
    assert _index_type(local, torch.tensor([2 ** 31])) == torch.long
    assert _index_type(torch.tensor([[2 ** 31], [0]]), torch.tensor([1])) == torch.long


def test_bad_edges_and_features_are_refused() -> None:
    with pytest.raises(ValueError, match=r"shape \[2, E\]"):
        Adjacency.from_edges(torch.zeros(3, 4, dtype=torch.long), 5)
    with pytest.raises(ValueError, match="names node 7; the graph has 5 nodes"):
        Adjacency.from_edges(torch.tensor([[0, 7], [1, 2]]), 5)
    with pytest.raises(ValueError, match="weight has shape"):
        Adjacency.from_edges(torch.tensor([[0, 1], [1, 2]]), 5, torch.ones(3))
    adjacency = Adjacency.from_edges(torch.tensor([[0, 1], [1, 2]]), 5)
    with pytest.raises(ValueError, match="features have 4 rows; the graph has 5 nodes"):
        adjacency(torch.zeros(4, 2))


def test_isolated_nodes_and_empty_graphs_give_zeros() -> None:
    adjacency = Adjacency.from_edges(torch.zeros(2, 0, dtype=torch.long), 3)
    y = torch.ones(3, 2, requires_grad=True)
    out = adjacency(y)
    assert torch.equal(out, torch.zeros(3, 2))
    out.sum().backward()
    assert y.grad is not None and torch.equal(y.grad, torch.zeros(3, 2))


def test_rows_without_edges_are_zero_even_over_reused_memory() -> None:
    """The product writes into uninitialised memory (beta = 0): empty rows must still be 0."""
    for _ in range(3):
        poison = torch.full((500, 16), float("nan"))
        del poison
        adjacency = Adjacency.from_edges(torch.tensor([[1, 2], [0, 0]]), 500)
        out = adjacency(torch.ones(500, 16))
        assert torch.equal(out[0], torch.full((16,), 2.0))
        assert torch.equal(out[1:], torch.zeros(499, 16))


@pytest.mark.parametrize("index", [torch.int32, torch.int64])
def test_symmetric_csr_parts_of_either_index_type(index: torch.dtype) -> None:
    """A batch's CSR from its parts, 32-bit indices (every batch here) or 64-bit (a batch of
    2^31 rows or edges): the same product, gradient and derived edge list."""
    crow = torch.tensor([0, 1, 3, 4, 4], dtype=index)          # node 3: no edges
    col = torch.tensor([1, 0, 2, 1], dtype=index)              # 0-1 and 1-2, both ways
    weight = torch.tensor([0.5, 0.5, 2.0, 2.0])
    adjacency = Adjacency.from_symmetric_csr(crow, col, weight, 4)
    assert adjacency.transpose is adjacency.matrix
    dense = torch.zeros(4, 4)
    dense[[0, 1, 1, 2], [1, 0, 2, 1]] = weight
    y = torch.randn(4, 3, requires_grad=True)
    upstream = torch.randn(4, 3)
    (grad,) = torch.autograd.grad(adjacency(y), y, upstream)
    assert torch.allclose(adjacency(y), dense @ y, atol=1e-6)
    assert torch.allclose(grad, dense.T @ upstream, atol=1e-6)
    assert adjacency.edge_index.tolist() == [[1, 0, 2, 1], [0, 1, 1, 2]]
    assert adjacency.weight is not None and torch.equal(adjacency.weight, weight)
    assert Adjacency.from_symmetric_csr(crow, col, None, 4).weight is None


# Run in a fresh process: torch warns once per process, so no earlier test may have used it up.
_AFTER_A_BATCH = """
import warnings, torch
from trellis.silo.models.propagation import Adjacency
Adjacency.from_edges(torch.tensor([[0, 1, 1], [1, 0, 2]]), 3)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.ones(1), (2, 2))
print(repr([str(w.message) for w in seen]))
"""


def test_once_a_batch_is_built_torch_never_says_sparse_checks_are_implicitly_off() -> None:
    """torch >= 2.11 prints "Sparse invariant checks are implicitly disabled" once per process
    while the process-wide setting is unset (2.11 even where we pass check_invariants=False).
    Our constructions set it explicitly, to what it was: after the first batch no sparse tensor
    of the process, ours or another library's, makes torch say it."""
    done = subprocess.run([sys.executable, "-c", _AFTER_A_BATCH], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "invariant" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert done.stdout.strip() == "[]"


def test_a_process_that_turned_sparse_checks_on_keeps_them_on() -> None:
    before = torch.sparse.check_sparse_tensor_invariants.is_enabled()
    torch.sparse.check_sparse_tensor_invariants.enable()
    try:
        Adjacency.from_edges(torch.tensor([[0, 1], [1, 0]]), 2).to(torch.device("cpu"))
        assert torch.sparse.check_sparse_tensor_invariants.is_enabled()
    finally:
        if not before:
            torch.sparse.check_sparse_tensor_invariants.disable()
