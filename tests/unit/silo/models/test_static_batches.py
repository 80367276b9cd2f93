"""Batches padded to static shapes (silo/models/static_batches.py): the padding reaches no real
value, forwards or backwards, and a bucket's buffers take any batch of the bucket in turn."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trellis.silo.data.graph import Graph
from trellis.silo.models.batching import PackedGraphs
from trellis.silo.models.graph_classifiers import GIN, DualChannelGIN
from trellis.silo.models.static_batches import StaticBatch, bucket, is_static_batch, static_shape


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
    return DualChannelGIN(4, 2, n_se=5, hidden=8, dropout=0.0).train()


def _loss_and_grads(model: nn.Module, batch, weight=None) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(batch.x, batch.adjacency, batch.batch, batch.num_graphs, batch.stc_enc,
                batch.gcn_adjacency)
    if weight is None:
        loss = nn.functional.nll_loss(out, batch.y)
    else:
        loss = torch.dot(nn.functional.nll_loss(out, batch.y, reduction="none"), weight)
    loss.backward()
    return float(loss.detach()), [p.grad.clone() for p in model.parameters()]


def test_buckets_hold_their_count_with_at_most_an_eighth_of_padding() -> None:
    sizes = [bucket(n) for n in range(1, 5000)]
    assert all(size >= n for n, size in enumerate(sizes, start=1))
    assert sizes == sorted(sizes)
    assert all(size - n <= n / 8 for n, size in enumerate(sizes, start=1) if n >= 128)
    assert len(set(sizes[2000:4000])) <= 9          # few shapes between 2,000 and 4,000 nodes
    with pytest.raises(ValueError, match="at least one item"):
        bucket(0)


@pytest.mark.parametrize("kind", ["gin", "dual"])
def test_a_padded_batch_has_the_loss_and_gradients_of_the_batch(kind: str) -> None:
    packed = PackedGraphs(_graphs(40, 1), structure=True, gcn=kind == "dual")
    model = _model(kind)
    slots = 16
    full, short = torch.arange(0, 16), torch.arange(30, 37)      # a full and a short batch
    first = packed.select(full)
    buffers = StaticBatch(static_shape(first, slots), first)
    for ids in (full, short, torch.arange(16, 32)):
        batch = packed.select(ids)
        assert is_static_batch(batch)
        shape = static_shape(batch, slots)
        if shape != buffers.shape:
            buffers = StaticBatch(shape, batch)
        buffers.load(batch)
        assert buffers.batch.x.size(0) > batch.x.size(0) and buffers.batch.num_graphs == slots
        loss, grads = _loss_and_grads(model, batch)
        padded_loss, padded_grads = _loss_and_grads(model, buffers.batch, buffers.weight)
        assert padded_loss == pytest.approx(loss, rel=1e-5)
        for ours, reference in zip(padded_grads, grads, strict=True):
            torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)


def test_buffers_refuse_a_batch_of_another_bucket() -> None:
    packed = PackedGraphs(_graphs(40, 2), structure=False, gcn=False)
    big = packed.select(torch.arange(0, 30))
    buffers = StaticBatch(static_shape(big, 30), big)
    with pytest.raises(ValueError, match="loaded into the buffers of"):
        buffers.load(packed.select(torch.arange(0, 3)))
    with pytest.raises(ValueError, match="does not fit 2 slots"):
        static_shape(big, 2)


def test_directed_batches_are_not_padded() -> None:
    graphs = _graphs(6, 3)
    graphs[0] = Graph(x=torch.randn(3, 4), edge_index=torch.tensor([[0, 1], [1, 2]]), num_nodes=3,
                      y=torch.tensor([0]), stc_enc=torch.randn(3, 5))
    packed = PackedGraphs(graphs, structure=False, gcn=False)
    assert not is_static_batch(packed.select(torch.arange(6)))
