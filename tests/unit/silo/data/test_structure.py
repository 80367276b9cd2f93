"""Tests for the FedStar structure embeddings (RWSE || DSE) on hand-computed graphs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.data import Data

import trellis.silo.data.structure as structure
from trellis.silo.data.structure import (
    add_structure_embeddings,
    degree_onehot,
    random_walk_return_probs,
    structure_embedding,
)
from trellis.silo.data.tu import GraphDataset


def _undirected(pairs: list[tuple[int, int]]) -> torch.Tensor:
    both = pairs + [(b, a) for a, b in pairs]
    return torch.tensor(both, dtype=torch.long).reshape(-1, 2).t()


PATH3 = _undirected([(0, 1), (1, 2)])
TRIANGLE = _undirected([(0, 1), (1, 2), (0, 2)])
STAR20 = _undirected([(0, leaf) for leaf in range(1, 21)])


def test_path_of_three_nodes() -> None:
    rw = random_walk_return_probs(PATH3, 3, k=4)
    # Step 1: no self loops, so 0 everywhere. The path is bipartite: odd steps are 0.
    # Step 2 from an end: go to the middle (prob 1), back to this end (prob 1/2) -> 0.5.
    # Step 2 from the middle: go to either end (1/2 each), which must come back -> 1.0.
    # Step 4 from an end: end->mid (1), mid->either end (1/2+1/2), end->mid (1),
    #   mid->this end (1/2) -> 0.5; from the middle every 2-step round trip returns -> 1.0.
    expected = [[0, 0.5, 0, 0.5], [0, 1.0, 0, 1.0], [0, 0.5, 0, 0.5]]
    assert torch.allclose(rw, torch.tensor(expected))
    assert rw.dtype == torch.float32


def test_triangle() -> None:
    rw = random_walk_return_probs(TRIANGLE, 3, k=16)
    # Step 2: any neighbour (prob 1), then back (1/2) -> 1/2. Step 3: two directed
    # 3-cycles, each 1/2 * 1/2 * 1/2 -> 1/4. In general, on K3: (1 + 2 (-1/2)^k) / 3.
    assert torch.allclose(rw[:, 1], torch.full((3,), 0.5))
    assert torch.allclose(rw[:, 2], torch.full((3,), 0.25))
    k = torch.arange(1, 17, dtype=torch.float64)
    formula = ((1 + 2 * (-0.5) ** k) / 3).float()
    assert torch.allclose(rw, formula.expand(3, 16), atol=1e-7)


def test_isolated_node_and_one_edge() -> None:
    edge_index = _undirected([(1, 2)])
    rw = random_walk_return_probs(edge_index, 3, k=6)
    assert torch.equal(rw[0], torch.zeros(6))  # isolated: no walk at all
    assert torch.equal(rw[1], torch.tensor([0.0, 1, 0, 1, 0, 1]))
    dse = degree_onehot(edge_index, 3, k=16)
    # Degree 0 and degree 1 share slot 0 (clamp to [1, k], then minus 1).
    assert torch.equal(dse[:, 0], torch.ones(3)) and dse.sum() == 3


def test_star_with_twenty_leaves() -> None:
    dse = degree_onehot(STAR20, 21)
    assert dse[0].argmax() == 15 and dse[0].sum() == 1  # degree 20 >= 16 -> last slot
    assert torch.all(dse[1:, 0] == 1)
    rw = random_walk_return_probs(STAR20, 21, k=4)
    # Hub: every 2-step walk returns. Leaf: leaf -> hub -> this leaf with prob 1/20.
    assert torch.allclose(rw[0], torch.tensor([0.0, 1, 0, 1]))
    assert torch.allclose(rw[1:], torch.tensor([0.0, 0.05, 0, 0.05]).expand(20, 4))


def test_embedding_is_rwse_then_dse() -> None:
    emb = structure_embedding(STAR20, 21)
    assert emb.shape == (21, 32) and emb.dtype == torch.float32
    assert torch.equal(emb[:, :16], random_walk_return_probs(STAR20, 21, 16))
    assert torch.equal(emb[:, 16:], degree_onehot(STAR20, 21, 16))
    assert structure_embedding(STAR20, 21, n_rw=3, n_dg=5).shape == (21, 8)
    assert torch.equal(
        structure_embedding(STAR20, 21, n_rw=0, n_dg=4), degree_onehot(STAR20, 21, 4)
    )


def test_empty_and_edgeless_graphs() -> None:
    empty = torch.zeros((2, 0), dtype=torch.long)
    assert structure_embedding(empty, 0).shape == (0, 32)
    emb = structure_embedding(empty, 2)
    assert torch.equal(emb[:, :16], torch.zeros(2, 16)) and torch.equal(emb[:, 16], torch.ones(2))


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="outside"):
        structure_embedding(PATH3, 2)
    with pytest.raises(ValueError, match="shape"):
        structure_embedding(PATH3.t(), 3)
    with pytest.raises(ValueError, match="integers"):
        structure_embedding(PATH3.float(), 3)
    with pytest.raises(ValueError, match="k must be"):
        random_walk_return_probs(PATH3, 3, k=0)
    with pytest.raises(ValueError, match="n_rw"):
        structure_embedding(PATH3, 3, n_rw=0, n_dg=0)


# --- property tests against a naive per-graph computation ----------------------------------


def _naive_rwse(edge_index: np.ndarray, n: int, k: int) -> np.ndarray:
    """diag((A D^-1)^j), j = 1..k, with A counting repeated entries and 1/0 taken as 0."""
    a = np.zeros((n, n))
    np.add.at(a, (edge_index[0], edge_index[1]), 1.0)
    degree = np.bincount(edge_index[0], minlength=n).astype(float)
    inv = np.divide(1.0, degree, out=np.zeros(n), where=degree > 0)
    t = a * inv[None, :]
    return np.stack([np.diag(np.linalg.matrix_power(t, j)) for j in range(1, k + 1)], axis=1)


@st.composite
def graphs(draw: st.DrawFn, max_nodes: int = 9, symmetric: bool = True) -> tuple[torch.Tensor, int]:
    """A random graph: symmetric without self loops, or any directed multigraph."""
    n = draw(st.integers(min_value=1, max_value=max_nodes))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    if symmetric:
        return _undirected([(a, b) for a, b in pairs if a != b]), n
    return torch.tensor(pairs, dtype=torch.long).reshape(-1, 2).t(), n


@settings(max_examples=60, deadline=None)
@given(graph=graphs(), k=st.integers(min_value=1, max_value=16))
def test_rwse_matches_naive(graph: tuple[torch.Tensor, int], k: int) -> None:
    edge_index, n = graph
    expected = _naive_rwse(edge_index.numpy(), n, k)
    assert np.allclose(random_walk_return_probs(edge_index, n, k).numpy(), expected, atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(graph=graphs(symmetric=False))
def test_rwse_matches_naive_on_directed_multigraphs(graph: tuple[torch.Tensor, int]) -> None:
    edge_index, n = graph
    expected = _naive_rwse(edge_index.numpy(), n, 16)
    assert np.allclose(random_walk_return_probs(edge_index, n).numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("dense_per_entry", [0.0, 24.0, 1e9], ids=["sparse", "auto", "dense"])
@settings(max_examples=15, deadline=None)
@given(batch=st.lists(graphs(max_nodes=14), min_size=1, max_size=12))
def test_batched_equals_per_graph(
    batch: list[tuple[torch.Tensor, int]], dense_per_entry: float
) -> None:
    dataset = GraphDataset(
        name="toy",
        graphs=[Data(edge_index=e, num_nodes=n) for e, n in batch],
        num_classes=1,
        num_features=0,
        feature_kind="degree",
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(structure, "_DENSE_PER_ENTRY", dense_per_entry)
        add_structure_embeddings(dataset)
    for data, (edge_index, n) in zip(dataset.graphs, batch, strict=True):
        single = structure_embedding(edge_index, n)
        assert data.stc_enc.shape == (n, 32) and data.stc_enc.dtype == torch.float32
        assert torch.allclose(data.stc_enc, single, atol=1e-6)
        naive = _naive_rwse(edge_index.numpy(), n, 16)
        assert np.allclose(data.stc_enc[:, :16].numpy(), naive, atol=1e-6)


def test_add_structure_embeddings_buckets_mixed_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Small budgets force many buckets, including one graph above the element budget.
    monkeypatch.setattr(structure, "_BUCKET_ELEMENTS", 64)
    rng = np.random.default_rng(0)
    graphs_ = []
    for n in [1, 2, 3, 5, 8, 13, 21, 3, 5, 40]:
        pairs = [(int(a), int(b)) for a, b in rng.integers(0, n, size=(2 * n, 2)) if a != b]
        graphs_.append(Data(edge_index=_undirected(pairs), num_nodes=n))
    dataset = GraphDataset("mixed", graphs_, 1, 0, "degree")
    add_structure_embeddings(dataset)
    for data in dataset.graphs:
        assert torch.allclose(data.stc_enc, structure_embedding(data.edge_index, data.num_nodes))
