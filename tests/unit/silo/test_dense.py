"""Dense layers through oneDNN (silo/dense.py) against torch's own linear, values and gradients."""

from __future__ import annotations

import pytest
import torch

from trellis.silo import dense
from trellis.silo.dense import Linear, linear


@pytest.mark.parametrize("rows", [5, dense.ROWS, 3 * dense.ROWS + 17])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_equals_torch_in_value_and_all_gradients(rows: int, with_bias: bool) -> None:
    """Fewer rows than a block, whole blocks, and blocks plus a remainder."""
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 48, generator=gen, requires_grad=True)
    weight = torch.randn(20, 48, generator=gen, requires_grad=True)
    bias = torch.randn(20, generator=gen, requires_grad=True) if with_bias else None
    upstream = torch.randn(rows, 20, generator=gen)
    inputs = [x, weight] + ([bias] if bias is not None else [])

    ours = linear(x, weight, bias)
    reference = torch.nn.functional.linear(x, weight, bias)
    assert torch.allclose(ours, reference, atol=1e-4)
    for got, want in zip(torch.autograd.grad(ours, inputs, upstream),
                         torch.autograd.grad(reference, inputs, upstream), strict=True):
        assert torch.allclose(got, want, atol=1e-3, rtol=1e-5)


def test_onednn_is_used_on_this_cpu_and_skipped_where_it_does_not_apply() -> None:
    """The fast path must be live here (else the speed figures would not be what they say)."""
    assert dense.onednn_enabled(), "this torch has no usable oneDNN linear op"
    x = torch.randn(300, 8, requires_grad=True)
    weight = torch.randn(4, 8, requires_grad=True)
    assert type(linear(x, weight).grad_fn).__name__ == "_OneDnnLinearBackward"
    wide = linear(x.double(), weight.double())          # float64: torch's own path
    assert wide.dtype == torch.float64 and type(wide.grad_fn).__name__ != "_OneDnnLinearBackward"
    batched = linear(torch.randn(2, 300, 8), weight)    # 3-D input: torch's own path
    assert batched.shape == (2, 300, 4)


def test_non_contiguous_input_and_frozen_input() -> None:
    gen = torch.Generator().manual_seed(2)
    base = torch.randn(40, 2 * dense.ROWS + 3, generator=gen)
    x = base.t()                                           # a transposed view
    weight = torch.randn(6, 40, generator=gen, requires_grad=True)
    out = linear(x, weight)
    assert torch.allclose(out, x @ weight.t(), atol=1e-4)
    (grad_w,) = torch.autograd.grad(out.sum(), [weight])
    assert torch.allclose(grad_w, torch.ones(x.size(0), 6).t() @ x, atol=1e-3)


def test_linear_module_keeps_nn_linear_parameters_and_initialisation() -> None:
    torch.manual_seed(4)
    ours = Linear(7, 3)
    torch.manual_seed(4)
    theirs = torch.nn.Linear(7, 3)
    assert isinstance(ours, torch.nn.Linear)
    assert [n for n, _ in ours.named_parameters()] == ["weight", "bias"]
    assert torch.equal(ours.weight, theirs.weight) and torch.equal(ours.bias, theirs.bias)
    x = torch.randn(dense.ROWS + 1, 7)
    assert torch.allclose(ours(x), theirs(x), atol=1e-5)
