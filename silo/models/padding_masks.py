"""Which rows of a padded batch are real, for the layers whose statistics span rows: batch norm.

A batch padded to a static shape (silo/models/static_batches.py) carries padding node rows and,
at an epoch's end, padding graph slots. Most layers treat each row on its own, and padding rows
never reach a real one. Batch norm does not: its mean and variance are taken over every row of
the batch, so FedDense's batch norms (over node rows and over pooled graph rows) would count the
padding. Inside ``padded_by(masks)`` they take their statistics over the real rows alone
(``masked_batch_norm``), with every count on the device, so the step stays free of waits and of
sizes read by the host, as a recorded CUDA graph needs.

The masks are found through a context variable, as the silo's random streams are
(silo/models/random_streams.py), so the models keep their signatures.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F


@dataclass(frozen=True)
class PaddingMasks:
    """One padded batch's real rows: 1.0 real, 0.0 padding, as ``[rows, 1]`` columns."""

    nodes: Tensor
    graphs: Tensor

    @classmethod
    def of(cls, node_graph: Tensor, graph_weight: Tensor) -> PaddingMasks:
        """From a padded batch's graph of each node row (padding rows: one past the last slot)
        and its graph slots' loss weights (padding slots weigh zero)."""
        slots = graph_weight.numel()
        return cls((node_graph < slots).to(graph_weight.dtype).unsqueeze(1),
                   (graph_weight > 0).to(graph_weight.dtype).unsqueeze(1))


_ACTIVE: ContextVar[PaddingMasks | None] = ContextVar("trellis_padding_masks", default=None)


@contextmanager
def padded_by(masks: PaddingMasks) -> Iterator[PaddingMasks]:
    """Inside the block, the batch norms a model applies count only ``masks``' real rows."""
    token = _ACTIVE.set(masks)
    try:
        yield masks
    finally:
        _ACTIVE.reset(token)


def active_padding() -> PaddingMasks | None:
    """The masks of the padded batch being run, or None (an ordinary batch)."""
    return _ACTIVE.get()


def masked_batch_norm(norm: nn.BatchNorm1d, x: Tensor, mask: Tensor) -> Tensor:
    """``norm(x)`` in training with the statistics of the rows where ``mask`` is 1, the running
    statistics updated as torch updates them; where fewer than two rows are real (a lone graph
    at an epoch's end), the running statistics normalise instead and stay as they are, as
    silo/models/graph_classifiers.py ``_graph_norm`` does for a batch of one graph. Padding rows
    get values too, which no real row reads."""
    if not norm.training:
        return norm(x)
    count = mask.sum()
    enough = count >= 2
    mean = (x * mask).sum(0) / count.clamp(min=1)
    centred = x - mean
    var = (centred * centred * mask).sum(0) / count.clamp(min=1)
    batch_out = centred * torch.rsqrt(var + norm.eps)
    if norm.weight is not None:
        batch_out = batch_out * norm.weight
    if norm.bias is not None:
        batch_out = batch_out + norm.bias
    if norm.running_mean is None or norm.running_var is None:
        return batch_out
    # Copies: the update below changes the running statistics in place, which the backward
    # pass of this normalisation must not see.
    running_out = F.batch_norm(x, norm.running_mean.clone(), norm.running_var.clone(),
                               norm.weight, norm.bias, training=False, eps=norm.eps)
    _update_running(norm, mean.detach(), var.detach() * count / (count - 1).clamp(min=1),
                    enough)
    return torch.where(enough, batch_out, running_out)


def _update_running(norm: nn.BatchNorm1d, mean: Tensor, unbiased_var: Tensor, enough: Tensor
                    ) -> None:
    """torch's momentum update of the running statistics, taken only where ``enough``."""
    assert norm.running_mean is not None and norm.running_var is not None
    if norm.momentum is None:
        raise ValueError("masked batch norm keeps torch's momentum update only (momentum=None, "
                         "a cumulative average, would read a count from the device)")
    with torch.no_grad():
        factor = enough.to(mean.dtype) * norm.momentum
        norm.running_mean.mul_(1 - factor).add_(mean * factor)
        norm.running_var.mul_(1 - factor).add_(unbiased_var * factor)
        if norm.num_batches_tracked is not None:
            norm.num_batches_tracked.add_(enough.to(norm.num_batches_tracked.dtype))
