"""Batch norm over a padded batch's real rows (silo/models/padding_masks.py): the output, the
gradients and the running statistics of torch's batch norm over those rows alone."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trellis.silo.models.padding_masks import (
    PaddingMasks,
    active_padding,
    masked_batch_norm,
    padded_by,
)


def _norms() -> tuple[nn.BatchNorm1d, nn.BatchNorm1d]:
    torch.manual_seed(0)
    ours = nn.BatchNorm1d(5)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ours.bias.uniform_(-0.5, 0.5)
        ours.running_mean.uniform_(-1, 1)
        ours.running_var.uniform_(0.5, 2)
    reference = nn.BatchNorm1d(5)
    reference.load_state_dict(ours.state_dict())
    return ours.train(), reference.train()


def test_the_real_rows_get_torchs_batch_norm_of_them_alone() -> None:
    ours, reference = _norms()
    x = torch.randn(9, 5) * 3 + 1
    real = 6                                          # three padding rows after them
    x[real:] = 1e3                                    # far off: counted, they would show
    mask = torch.zeros(9, 1)
    mask[:real] = 1
    ours_in, reference_in = x.clone().requires_grad_(), x[:real].clone().requires_grad_()
    out = masked_batch_norm(ours, ours_in, mask)
    expected = reference(reference_in)
    torch.testing.assert_close(out[:real], expected, rtol=1e-5, atol=1e-5)
    grad = torch.randn(real, 5)
    (out[:real] * grad).sum().backward()
    (expected * grad).sum().backward()
    assert ours_in.grad is not None and reference_in.grad is not None
    torch.testing.assert_close(ours_in.grad[:real], reference_in.grad, rtol=1e-4, atol=1e-5)
    assert not ours_in.grad[real:].any()              # padding rows reach no real value
    for name in ("weight", "bias"):
        torch.testing.assert_close(getattr(ours, name).grad, getattr(reference, name).grad,
                                   rtol=1e-4, atol=1e-5)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(ours, name), getattr(reference, name))


def test_a_lone_real_row_is_normalised_by_the_running_statistics() -> None:
    ours, _ = _norms()
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    x = torch.randn(4, 5)
    mask = torch.tensor([[1.0], [0.0], [0.0], [0.0]])
    out = masked_batch_norm(ours, x, mask)
    expected = nn.functional.batch_norm(x, before["running_mean"], before["running_var"],
                                        ours.weight, ours.bias, training=False, eps=ours.eps)
    torch.testing.assert_close(out[:1], expected[:1])
    for name, value in ours.state_dict().items():      # nothing learnt from one row
        assert torch.equal(value, before[name]), name


def test_the_masks_are_active_inside_their_block_only() -> None:
    masks = PaddingMasks.of(torch.tensor([0, 0, 1, 3, 3]), torch.tensor([0.5, 0.5, 0.0]))
    assert masks.nodes.view(-1).tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert masks.graphs.view(-1).tolist() == [1.0, 1.0, 0.0]
    assert active_padding() is None
    with padded_by(masks):
        assert active_padding() is masks
    assert active_padding() is None


def test_a_cumulative_average_is_refused() -> None:
    norm = nn.BatchNorm1d(3, momentum=None).train()
    with pytest.raises(ValueError, match="momentum update only"):
        masked_batch_norm(norm, torch.randn(4, 3), torch.ones(4, 1))
