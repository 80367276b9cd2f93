"""Batches padded to static shapes (silo/models/static_batches.py): the padding reaches no real
value, forwards or backwards, and a bucket's buffers take any batch of the bucket in turn."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trellis.silo.data.graph import Graph
from trellis.silo.models.batching import PackedGraphs
from trellis.silo.models.graph_classifiers import GIN, DualChannelGIN, DualDenseGIN
from trellis.silo.models.padding_masks import PaddingMasks, padded_by
from trellis.silo.models.static_batches import StaticCut, bucket, cuts_statically, static_shape


def _graphs(count: int, seed: int) -> list[Graph]:
    """Undirected graphs of 1 to 9 nodes (some without edges), 4 features, 5 structure ones."""
    gen = torch.Generator().manual_seed(seed)
    graphs = []
    for _ in range(count):
        size = int(torch.randint(1, 10, (1,), generator=gen))
        edges = torch.randint(0, size, (2, 2 * size), generator=gen)
        edges = edges[:, edges[0] != edges[1]]
        edges = torch.unique(torch.cat([edges, edges.flip(0)], 1), dim=1)
        graphs.append(Graph(x=torch.randn(size, 4, generator=gen), edge_index=edges, num_nodes=size,
                            y=torch.tensor([size % 2]),
                            stc_enc=torch.randn(size, 5, generator=gen)))
    return graphs


def _model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "gin":
        return GIN(4, 2, hidden=8, dropout=0.0).train()
    if kind == "dense":
        return DualDenseGIN(4, 2, n_se=5, width=8, dropout=0.0).train()
    return DualChannelGIN(4, 2, n_se=5, hidden=8, dropout=0.0).train()


def _loss_and_grads(model: nn.Module, batch, weight=None) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    if weight is None:
        out = model(batch.x, batch.adjacency, batch.batch, batch.num_graphs, batch.stc_enc,
                    batch.gcn_adjacency)
        loss = nn.functional.nll_loss(out, batch.y)
    else:
        with padded_by(PaddingMasks.of(batch.batch, weight)):    # what graphed steps do
            out = model(batch.x, batch.adjacency, batch.batch, batch.num_graphs, batch.stc_enc,
                        batch.gcn_adjacency)
        loss = torch.dot(nn.functional.nll_loss(out, batch.y, reduction="none"), weight)
    loss.backward()
    return float(loss.detach()), [p.grad.clone() for p in model.parameters()]


def test_buckets_hold_their_count_with_at_most_an_eighth_of_padding() -> None:
    sizes = [bucket(n) for n in range(1, 5000)]
    assert all(size >= n for n, size in enumerate(sizes, start=1))
    assert sizes == sorted(sizes)
    assert all(size - n <= n / 4 for n, size in enumerate(sizes, start=1) if n >= 64)
    assert len(set(sizes[2000:4000])) <= 5          # few shapes between 2,000 and 4,000 nodes
    with pytest.raises(ValueError, match="at least one item"):
        bucket(0)


def _ids(graphs: list[int], slots: int, count: int) -> torch.Tensor:
    """A batch's id buffer: its graphs, then the empty id in every slot left."""
    return torch.tensor(graphs + [count] * (slots - len(graphs)))


@pytest.mark.parametrize("kind", ["gin", "dual", "dense"])
def test_a_padded_batch_has_the_loss_and_gradients_of_the_batch(kind: str) -> None:
    packed = PackedGraphs(_graphs(40, 1), structure=True, gcn=kind != "gin")
    model = _model(kind)
    # FedDense's batch norms: each padded batch must move the running statistics as the batch.
    padded_model = _model(kind)
    slots = 16
    # A full batch, a short one (the epoch's last) and one in another order.
    for graphs in (list(range(16)), [30, 3, 36, 8, 33, 31, 2], list(range(31, 15, -1))):
        ids = torch.tensor(graphs)
        batch = packed.select(ids)
        shape = static_shape(packed, ids, slots)
        padded, weight = StaticCut(packed, shape)(_ids(graphs, slots, packed.count))
        nodes = batch.x.size(0)
        assert shape.rows > nodes and padded.x.size(0) == shape.rows
        assert padded.num_graphs == slots and padded.edge_index.size(1) == shape.edges
        torch.testing.assert_close(padded.x[:nodes], batch.x)
        assert torch.equal(padded.batch[:nodes], batch.batch)
        assert bool((padded.batch[nodes:] == slots).all())
        assert torch.equal(padded.y[:len(graphs)], batch.y)
        expected = [1 / len(graphs)] * len(graphs) + [0.0] * (slots - len(graphs))
        assert weight.tolist() == pytest.approx(expected)
        loss, grads = _loss_and_grads(model, batch)
        padded_loss, padded_grads = _loss_and_grads(padded_model, padded, weight)
        assert padded_loss == pytest.approx(loss, rel=1e-5)
        for ours, reference in zip(padded_grads, grads, strict=True):
            torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-5)
        for ours, reference in zip(padded_model.buffers(), model.buffers(), strict=True):
            torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)


def test_the_cut_holds_the_batchs_edges_and_pads_with_weightless_ones() -> None:
    packed = PackedGraphs(_graphs(30, 4), structure=False, gcn=True)
    graphs = [5, 17, 2, 9]
    ids = torch.tensor(graphs)
    batch = packed.select(ids)
    shape = static_shape(packed, ids, 6)
    padded, _ = StaticCut(packed, shape)(_ids(graphs, 6, packed.count))
    nodes = batch.x.size(0)
    for ours, reference in ((padded.adjacency, batch.adjacency),
                            (padded.gcn_adjacency, batch.gcn_adjacency)):
        assert ours is not None and reference is not None
        assert ours.weighted == reference.weighted
        dense = ours.matrix.to_dense()
        expected = reference.matrix.to_dense()
        torch.testing.assert_close(dense[:nodes, :nodes], expected)
        assert not dense[nodes:].any() and not dense[:, nodes:].any()  # padding weighs zero
        assert torch.equal(dense, dense.T)


def test_static_shapes_refuse_what_they_cannot_hold() -> None:
    packed = PackedGraphs(_graphs(40, 2), structure=False, gcn=False)
    with pytest.raises(ValueError, match="does not fit 2 slots"):
        static_shape(packed, torch.arange(0, 30), 2)
    graphs = _graphs(6, 3)
    graphs[0] = Graph(x=torch.randn(3, 4), edge_index=torch.tensor([[0, 1], [1, 2]]),
                      num_nodes=3, y=torch.tensor([0]), stc_enc=torch.randn(3, 5))
    directed = PackedGraphs(graphs, structure=False, gcn=False)
    assert cuts_statically(packed) and not cuts_statically(directed)
    with pytest.raises(ValueError, match="directed edges are not cut"):
        StaticCut(directed, static_shape(directed, torch.arange(6), 6))
