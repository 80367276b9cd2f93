"""A process's part of a global mini-batch (silo/models/shards.py): its rows are a contiguous run
of the one-process batch's rows, and its dropout masks are that batch's masks on those rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trellis.silo.data.datasets import load_graph_folder
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.models.batching import PackedGraphs
from trellis.silo.models.graph_classifiers import dropout, relu_dropout
from trellis.silo.models.shards import RowSpan, part_bounds, shard_batch


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("size", [0, 1, 2, 7, 16])
def test_parts_cover_the_batch_in_order_with_sizes_one_apart(size: int, world: int) -> None:
    bounds = [part_bounds(size, rank, world) for rank in range(world)]
    assert bounds[0][0] == 0 and bounds[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    sizes = [stop - start for start, stop in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_a_rank_outside_the_group_is_refused() -> None:
    with pytest.raises(ValueError, match="rank 2 is not one of 2 processes"):
        part_bounds(4, 2, 2)


@pytest.mark.parametrize("row_multiple", [1, 8])
def test_each_part_holds_a_contiguous_run_of_the_whole_batch_rows(row_multiple: int,
                                                                  tmp_path: Path) -> None:
    dataset = load_graph_folder(write_tu_folder(tmp_path, "MOL", "molecules", 12, seed=1))
    packed = PackedGraphs(dataset.graphs, structure=False, gcn=False)
    ids = torch.tensor([7, 2, 9, 0, 11, 4, 5])
    whole = packed.select(ids, row_multiple)
    for rank in range(3):
        local, shard = shard_batch(packed.node_ptr, ids, rank, 3, row_multiple)
        part = packed.select(local, row_multiple)
        nodes, graphs = shard.nodes, shard.graphs
        assert nodes.rows == whole.x.size(0) and graphs.rows == whole.num_graphs == 7
        assert torch.equal(part.x[:nodes.count], whole.x[nodes.start:nodes.start + nodes.count])
        assert torch.equal(part.y, whole.y[graphs.start:graphs.start + graphs.count])
        assert nodes.real == int(packed.node_ptr[ids + 1].sum() - packed.node_ptr[ids].sum())


@pytest.mark.parametrize("p", [0.5, 0.3])
def test_a_part_drops_what_the_whole_batch_drops_and_leaves_the_same_random_state(p: float
                                                                                  ) -> None:
    torch.manual_seed(3)
    whole = torch.randn(10, 4) + 5        # no zeros: a dropped entry is exactly 0
    torch.manual_seed(11)
    expected = dropout(whole, p, training=True)
    after = torch.get_rng_state()
    for start, count, padding in ((0, 4, 0), (4, 6, 2), (10, 0, 3)):
        torch.manual_seed(11)
        part = torch.cat([whole[start:start + count], torch.zeros(padding, 4)])
        got = dropout(part, p, training=True, rows=RowSpan(10, 10, start, count))
        assert torch.equal(got[:count], expected[start:start + count])
        assert torch.equal(torch.get_rng_state(), after)
        # The in-place ReLU and dropout of FedStar's layers draws and keeps alike.
        torch.manual_seed(11)
        fused = relu_dropout(part.clone(), p, training=True, rows=RowSpan(10, 10, start, count))
        assert torch.equal(fused[:count], expected[start:start + count])
        assert not fused[count:].any()
        assert torch.equal(torch.get_rng_state(), after)
