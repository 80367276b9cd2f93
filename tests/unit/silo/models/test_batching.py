"""Packed graphs kept on a device: batches cut there equal those cut on the CPU, and cutting
them never waits for the device (silo/models/batching.py)."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from trellis.silo.models.batching import GraphBatch, PackedGraphs

CUDA = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="needs a CUDA GPU: packed graphs resident on the device")


def _graphs(directed: bool) -> list[Data]:
    """Small graphs of varied sizes, one of them without edges."""
    gen = torch.Generator().manual_seed(11)
    graphs = []
    for size in (3, 1, 6, 4, 2, 5, 7):
        edges = torch.randint(0, size, (2, 2 * size), generator=gen)
        edges = edges[:, edges[0] != edges[1]]
        if not directed:
            edges = torch.unique(torch.cat([edges, edges.flip(0)], 1), dim=1)
        graphs.append(Data(x=torch.randn(size, 4, generator=gen), edge_index=edges,
                           y=torch.tensor([size % 3]),
                           stc_enc=torch.randn(size, 5, generator=gen)))
    return graphs


def _dense(adjacency) -> torch.Tensor:
    n = adjacency.num_nodes
    weight = adjacency.weight
    values = torch.ones(adjacency.src.numel()) if weight is None else weight.cpu()
    return torch.zeros(n, n).index_put_((adjacency.dst.cpu(), adjacency.src.cpu()), values,
                                        accumulate=True)


def _assert_same(ours: GraphBatch, reference: GraphBatch) -> None:
    assert ours.num_graphs == reference.num_graphs
    for name in ("x", "batch", "y", "stc_enc"):
        assert torch.equal(getattr(ours, name).cpu(), getattr(reference, name)), name
    assert torch.equal(_dense(ours.adjacency), _dense(reference.adjacency))
    assert torch.allclose(_dense(ours.gcn_adjacency), _dense(reference.gcn_adjacency))
    y = torch.randn(reference.x.size(0), 3)
    assert torch.allclose(ours.adjacency(y.to(ours.x.device)).cpu(), reference.adjacency(y),
                          atol=1e-6)


@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("row_multiple", [1, 8])
def test_a_copy_cut_by_its_host_offsets_gives_the_batches_of_the_original(
        directed: bool, row_multiple: int) -> None:
    """The device path (sizes from the CPU offsets, ids given on the device) run on the CPU."""
    packed = PackedGraphs(_graphs(directed), structure=True, gcn=True)
    copy = packed._copy_to(torch.device("cpu"))
    assert copy.node_ptr is not copy.host_node_ptr        # the device path, not the CPU one
    ids = torch.tensor([5, 0, 2, 1, 6])
    reference = packed.select(ids, row_multiple)
    _assert_same(copy.select(ids, row_multiple, device_ids=ids.clone()), reference)
    _assert_same(copy.select(ids, row_multiple), reference)


def test_packed_graphs_on_their_own_device_are_themselves() -> None:
    packed = PackedGraphs(_graphs(False), structure=False, gcn=False)
    assert packed.to("cpu") is packed and packed.device == torch.device("cpu")


@CUDA
@pytest.mark.parametrize("directed", [False, True])
def test_batches_cut_on_the_gpu_equal_those_cut_on_the_cpu_without_a_sync(
        directed: bool) -> None:
    packed = PackedGraphs(_graphs(directed), structure=True, gcn=True)
    resident = packed.to("cuda")
    assert resident.x.is_cuda and not resident.host_node_ptr.is_cuda
    ids = torch.tensor([5, 0, 2, 1, 6])
    on_device = ids.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        batch = resident.select(ids, device_ids=on_device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert batch.x.is_cuda and batch.adjacency.matrix.is_cuda
    _assert_same(batch, packed.select(ids))
