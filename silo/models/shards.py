"""One process's part of a global mini-batch (``silo join --nproc N``), and the two batch-wide
operations of the models that must still see the whole batch: dropout and batch norm.

Each global mini-batch of B graphs is cut into N contiguous runs of graphs whose sizes differ by
at most one. A process's node rows are then one contiguous run of the rows the one-process batch
would have had, and its graph rows one run of that batch's graphs (``RowSpan``). So:

- dropout draws the mask of the whole one-process batch (every process holds the same random
  streams: silo/models/random_streams.py) and keeps its own rows: the masks, and the random
  stream after them, are exactly those of one process;
- batch norm takes its mean and variance over every process's rows, and its backward the
  sums of every process's gradients, so its output and its gradient are those of the whole
  batch. torch's ``SyncBatchNorm`` does this on GPUs only (it refuses CPU tensors in torch
  2.13).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from trellis.silo.models.random_streams import generator_for


@dataclass(frozen=True)
class RowSpan:
    """Where one process's rows sit among the rows of the one-process batch."""

    rows: int      # rows of the one-process tensor (node rows: with its padding rows)
    real: int      # how many of them are real (not padding)
    start: int     # this process's first row
    count: int     # this process's real rows
    # The process group batch norm reduces over; None: torch.distributed's default group.
    group: Any = field(default=None, compare=False)


@dataclass(frozen=True)
class BatchShard:
    """One process's part of a global mini-batch: its node rows and its graph rows."""

    nodes: RowSpan
    graphs: RowSpan


def node_rows(shard: BatchShard | None) -> RowSpan | None:
    """The node rows of a shard (None: not sharded)."""
    return None if shard is None else shard.nodes


def graph_rows(shard: BatchShard | None) -> RowSpan | None:
    """The graph rows of a shard (None: not sharded)."""
    return None if shard is None else shard.graphs


def part_bounds(size: int, rank: int, world: int) -> tuple[int, int]:
    """[start, stop) of part ``rank`` of ``size`` items cut into ``world`` contiguous parts
    whose sizes differ by at most one (the first ``size % world`` parts are one longer)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not one of {world} processes")
    base, extra = divmod(size, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def shard_batch(node_ptr: Tensor, ids: Tensor, rank: int, world: int, row_multiple: int = 1,
                group: Any = None) -> tuple[Tensor, BatchShard]:
    """This process's graphs of the global mini-batch ``ids`` and where its rows sit.

    ``node_ptr`` is the packed split's node offsets (silo/models/batching.py); ``row_multiple`` the
    padding of the one-process batch, whose row count the dropout masks are drawn for.
    """
    start, stop = part_bounds(int(ids.numel()), rank, world)
    sizes = (node_ptr.index_select(0, ids + 1) - node_ptr.index_select(0, ids)).tolist()
    real = int(sum(sizes))
    before, own = int(sum(sizes[:start])), int(sum(sizes[start:stop]))
    padded = -(-real // row_multiple) * row_multiple
    nodes = RowSpan(padded, real, before, own, group)
    graphs = RowSpan(len(sizes), len(sizes), start, stop - start, group)
    return ids[start:stop], BatchShard(nodes, graphs)


def keep_mask(x: Tensor, p: float, rows: int | None = None) -> Tensor:
    """Dropout's keep mask (0 or 1, x's dtype) for x, or for ``rows`` rows of x's width.

    torch's uniform and bernoulli draw a full float per element. Where ``256 p`` is a whole
    number a byte of randomness decides an element (one random 64-bit integer: eight
    elements); at p = 0.5 (every published setting) a single bit does (one integer: 64
    elements), drawing an eighth of the random numbers. Other p use uniforms.

    The draws come from the silo's generator on x's device when its random streams are active
    (silo/models/random_streams.py), else from torch's default generator.
    """
    shape = x.shape if rows is None else (rows, *x.shape[1:])
    n = int(torch.Size(shape).numel())
    generator = generator_for(x.device)
    if p == 0.5:
        # Bit k of random byte j decides element k * bytes + j: every bit is its own fair coin.
        draws = _random_bytes((n + 7) // 8, x.device, generator)
        bits = torch.bitwise_and(draws, _bit_values(x.device)).view(-1)[:n].view(shape)
        return torch.ne(bits, 0, out=torch.empty(shape, dtype=x.dtype, device=x.device))
    threshold = p * 256
    if threshold.is_integer():
        return torch.ge(_random_bytes(n, x.device, generator).view(shape), int(threshold),
                        out=torch.empty(shape, dtype=x.dtype, device=x.device))
    return torch.rand(shape, dtype=x.dtype, device=x.device, generator=generator).ge_(p)


def _random_bytes(count: int, device: torch.device, generator: torch.Generator | None
                  ) -> Tensor:
    """``count`` uniformly random bytes (uint8), drawn as 64-bit integers from ``generator``
    (None: torch's default generator for the device)."""
    words = torch.empty((count + 7) // 8, dtype=torch.int64, device=device)
    # random_(lo, hi) over the whole int64 range: every byte is uniform on 0..255.
    return words.random_(-2 ** 63, 2 ** 63 - 1, generator=generator).view(torch.uint8)[:count]


@functools.cache
def _bit_values(device: torch.device) -> Tensor:
    """The eight one-bit byte values as a column, [8, 1] uint8, made once per device and on it
    (a copy from the host would make a GPU's queue wait at every mask). Read only."""
    shifts = torch.arange(8, dtype=torch.uint8, device=device)
    return torch.bitwise_left_shift(torch.ones_like(shifts), shifts).view(8, 1)


def own_rows(mask: Tensor, span: RowSpan, rows: int) -> Tensor:
    """This process's rows of a whole-batch mask, then ones for its own padding rows."""
    own = mask[span.start:span.start + span.count]
    if rows == span.count:
        return own
    return torch.cat([own, own.new_ones(rows - span.count, *mask.shape[1:])])


def batch_norm(norm: nn.BatchNorm1d, x: Tensor, rows: RowSpan | None) -> Tensor:
    """``norm(x)``; in a sharded training batch, with the statistics of every process's rows."""
    if rows is None or not norm.training:
        return norm(x)
    if x.size(0) != rows.count:
        raise ValueError("batch norm cannot take padding rows")
    if rows.real < 2:
        raise ValueError(f"Expected more than 1 value per channel when training, got input "
                         f"size {[rows.real, *x.shape[1:]]}")
    out, mean, var = _SyncBatchNorm.apply(x, norm.weight, norm.bias, rows.real, rows.group,
                                          norm.eps)
    if norm.track_running_stats and norm.running_mean is not None:
        _update_running(norm, mean, var * (rows.real / (rows.real - 1)))
    return out


class _SyncBatchNorm(torch.autograd.Function):
    """Batch norm over the rows of every process: forward and backward as torch's CPU kernel
    computes them (two passes, sums accumulated in float64), each sum all-reduced.

    Backward, with x^ the normalised rows, g their gradient and N the rows of all processes:
    dx = w / std (g - sum(g) / N - x^ sum(g x^) / N), the sums over every process's rows (one
    all-reduce); the weight's and bias's gradients are this process's sums, which DDP adds.
    Written out because autograd of the same formula sums thousands of rows in float32 (and
    builds a dozen small nodes): on NCI1 batches that moved gradients by 5e-4 of their largest
    entry and doubled FedDense's step time.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor | None,  # type: ignore[override]
                bias: Tensor | None, total: int, group: Any, eps: float
                ) -> tuple[Tensor, Tensor, Tensor]:
        summed = x.sum(0, dtype=torch.float64)
        dist.all_reduce(summed, group=group)
        mean = (summed / total).to(x.dtype)
        centred = x - mean
        squares = (centred * centred).sum(0, dtype=torch.float64)
        dist.all_reduce(squares, group=group)
        var = (squares / total).to(x.dtype)
        invstd = torch.rsqrt(squares / total + eps).to(x.dtype)
        normalised = centred * invstd
        out = normalised if weight is None else normalised * weight
        if bias is not None:
            out = out + bias
        ctx.save_for_backward(normalised, invstd if weight is None else invstd * weight)
        ctx.group, ctx.total = group, total
        ctx.mark_non_differentiable(mean, var)
        return out, mean, var

    @staticmethod
    def backward(ctx, grad: Tensor, *_: Tensor  # type: ignore[override]
                 ) -> tuple[Tensor, Tensor, Tensor, None, None, None]:
        normalised, scale = ctx.saved_tensors
        grad = grad.contiguous()
        width = normalised.size(1)
        sums = torch.cat([grad.sum(0, dtype=torch.float64),
                          (grad * normalised).sum(0, dtype=torch.float64)])
        grad_bias, grad_weight = sums[:width].to(grad.dtype), sums[width:].to(grad.dtype)
        dist.all_reduce(sums, group=ctx.group)
        means = (sums / ctx.total).to(grad.dtype)
        grad_x = (grad - means[:width] - normalised * means[width:]) * scale
        return grad_x, grad_weight, grad_bias, None, None, None


def _update_running(norm: nn.BatchNorm1d, mean: Tensor, unbiased_var: Tensor) -> None:
    """torch's running-statistics update of ``norm`` (momentum, or a cumulative average)."""
    assert norm.running_mean is not None and norm.running_var is not None
    with torch.no_grad():
        factor = 0.0
        if norm.num_batches_tracked is not None:
            norm.num_batches_tracked.add_(1)
            factor = (1.0 / float(norm.num_batches_tracked) if norm.momentum is None
                      else norm.momentum)
        elif norm.momentum is not None:
            factor = norm.momentum
        norm.running_mean.mul_(1 - factor).add_(mean, alpha=factor)
        norm.running_var.mul_(1 - factor).add_(unbiased_var, alpha=factor)
