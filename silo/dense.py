"""Dense layers through oneDNN on the CPU: ``y = x W^T + b`` and both its gradients.

torch sends float32 CPU matrix products to MKL, which on AMD processors runs its AVX2 code
(about 90 GFLOP/s on one core of the machine these figures come from, an AVX-512 EPYC).
oneDNN, which torch also ships, reaches 220 GFLOP/s on the same products; the dense layers
are half of a FedStar round, so this is the largest single saving in local training.
``linear`` uses oneDNN's linear primitive (``torch.ops.mkldnn._linear_pointwise``, the op
torch's own compiler emits) forwards and for both gradients, and falls back to
``torch.nn.functional.linear`` wherever that primitive does not apply (GPU tensors, other
dtypes, a torch built without oneDNN, or ``TRELLIS_ONEDNN=0`` in the environment). Values
agree with torch's to float rounding; tests/test_dense.py compares them.

oneDNN compiles a kernel for every new matrix shape (about 0.9 ms, more than the product), and
every mini-batch has its own node count. So only the first ``ROWS * k`` rows go to oneDNN, a
handful of shapes that its cache keeps, and the remaining rows (fewer than ``ROWS``) to MKL.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor, nn


def _onednn_linear_op() -> object | None:
    """oneDNN's linear op if this torch has it and it computes a product correctly."""
    try:
        op = torch.ops.mkldnn._linear_pointwise
        if not torch.backends.mkldnn.is_available():
            return None
        x, w = torch.arange(6.0).view(2, 3), torch.ones(4, 3)
        if not torch.equal(op(x, w, None, "none", [], ""), x @ w.t()):
            return None
        return op
    except (AttributeError, RuntimeError):
        return None


# TRELLIS_ONEDNN=0 keeps torch's own products (for comparison, or should oneDNN misbehave).
_LINEAR = None if os.environ.get("TRELLIS_ONEDNN") == "0" else _onednn_linear_op()
ROWS = 256


def onednn_enabled() -> bool:
    """Whether dense layers on the CPU go through oneDNN in this process."""
    return _LINEAR is not None


def _product(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``x @ weight.T + bias``: whole blocks of ``ROWS`` rows by oneDNN, the rest by MKL."""
    main = x.size(0) - x.size(0) % ROWS
    if main == 0:
        return nn.functional.linear(x, weight, bias)
    head = _LINEAR(x[:main], weight, bias, "none", [], "")  # type: ignore[operator]
    if main == x.size(0):
        return head
    return torch.cat([head, nn.functional.linear(x[main:], weight, bias)])


def _weight_gradient(grad: Tensor, x: Tensor) -> Tensor:
    """``grad^T @ x``, summed over blocks of ``ROWS`` rows by oneDNN and the rest by MKL."""
    main = x.size(0) - x.size(0) % ROWS
    if main == 0:
        return grad.t() @ x
    total = _LINEAR(grad[:main].t(), x[:main].t(), None, "none", [], "")  # type: ignore[operator]
    if main == x.size(0):
        return total
    return total + grad[main:].t() @ x[main:]


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` for a 2-D ``x``, through oneDNN where it applies."""
    if (_LINEAR is None or x.device.type != "cpu" or x.dim() != 2
            or x.dtype != torch.float32 or weight.dtype != torch.float32):
        return nn.functional.linear(x, weight, bias)
    return _OneDnnLinear.apply(x, weight, bias)


class _OneDnnLinear(torch.autograd.Function):
    """Forward and both gradients as oneDNN products (the bias gradient is a column sum)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor,  # type: ignore[override]
                bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _product(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor  # type: ignore[override]
                 ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        need_x, need_w, need_b = ctx.needs_input_grad
        # grad @ W is a linear product with weight W^T.
        grad_x = _product(grad, weight.t().contiguous(), None) if need_x else None
        grad_w = _weight_gradient(grad, x) if need_w else None
        grad_b = grad.sum(0) if ctx.has_bias and need_b else None
        return grad_x, grad_w, grad_b


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, names and initialisation) computed by ``linear``."""

    def forward(self, x: Tensor) -> Tensor:
        """``x @ weight.T + bias``."""
        return linear(x, self.weight, self.bias)
