"""The GIN and GCN layers' parameters, as PyG's ``GINConv`` and ``GCNConv`` hold them.

The models (silo/models/graph_classifiers.py) do their message passing themselves, as one sparse
product per layer; PyG's modules only held the parameters. These two hold the same ones, under
the same names (``nn.*`` and the ``eps`` buffer; ``lin.weight`` and ``bias``), initialised by
the same draws in the same order, so a seed gives the weights PyG's gave and a model saved with
PyG's modules loads here (tests/unit/silo/models/test_convolutions.py compares both).

Why not PyG's own: importing ``torch_geometric`` imports its whole package, ``torch._dynamo`` and
sympy among it, about 1.5 s of CPU in every silo process that never uses any of it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _reset(module: nn.Module) -> None:
    """PyG's ``reset``: a module's own ``reset_parameters``, else its children's, depth first."""
    reset_parameters = getattr(module, "reset_parameters", None)
    if callable(reset_parameters):
        reset_parameters()
        return
    for child in module.children():
        _reset(child)


class GINConv(nn.Module):
    """GIN's layer parameters: the MLP ``nn`` and a fixed ``eps`` buffer (PyG's, not trained)."""

    eps: Tensor

    def __init__(self, mlp: nn.Sequential, eps: float = 0.0) -> None:
        super().__init__()
        self.nn: nn.Sequential = mlp
        self.initial_eps = eps
        self.register_buffer("eps", torch.empty(1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw the MLP's parameters again (as PyG does on construction); eps to its value."""
        _reset(self.nn)
        self.eps.fill_(self.initial_eps)


class _GlorotLinear(nn.Linear):
    """A bias-free product weight ``[out, in]``, Glorot-initialised (PyG's ``Linear``)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(in_channels, out_channels, bias=False)   # draws once, as PyG's does

    def reset_parameters(self) -> None:
        """A new Glorot draw (PyG's ``glorot`` is torch's Xavier-uniform, gain 1)."""
        nn.init.xavier_uniform_(self.weight)


class GCNConv(nn.Module):
    """GCN's layer parameters: the product ``lin`` and the ``bias`` added after the sum."""

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True) -> None:
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.lin = _GlorotLinear(in_channels, out_channels)
        self.bias: nn.Parameter | None
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """A new draw of ``lin`` (PyG draws it twice on construction: once here), bias zero."""
        self.lin.reset_parameters()
        if self.bias is not None:
            with torch.no_grad():
                self.bias.zero_()
