"""Where the models report each use of a parameter, so that one batched pass gives per-graph
gradients (silo/privacy/per_graph_gradients.py).

A model's parameters enter its computation in two ways only: a dense product ``x W^T + b``
(silo/models/dense.py ``linear``) and a bias added after message passing or pooling (``add_bias``
below). Both report the use to the tap that is active in this context, if any; with none active
(ordinary training) they cost one context-variable read.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

from torch import Tensor


class ParameterTap(Protocol):
    """Receives every reported use of a parameter while it is active."""

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> None:
        """``out = x @ weight.T + bias`` was computed."""

    def bias(self, out: Tensor, bias: Tensor, scale: Tensor | None) -> None:
        """``out = h + scale * bias`` was computed (``scale``: one value per row, or none)."""


# A context variable, not a global: threads and tasks training side by side each see their own.
_ACTIVE: ContextVar[ParameterTap | None] = ContextVar("trellis_parameter_tap", default=None)


def active_tap() -> ParameterTap | None:
    """The tap receiving parameter uses in this context, if any."""
    return _ACTIVE.get()


@contextmanager
def tapping(tap: ParameterTap) -> Iterator[ParameterTap]:
    """Report every parameter use inside the block to ``tap``."""
    token = _ACTIVE.set(tap)
    try:
        yield tap
    finally:
        _ACTIVE.reset(token)


def add_bias(h: Tensor, bias: Tensor, scale: Tensor | None = None, *,
             in_place: bool = False) -> Tensor:
    """``h + scale * bias`` (``scale`` [rows, 1], e.g. node counts), reported to the active tap.

    ``in_place`` adds into ``h`` (only for a fresh tensor autograd does not keep).
    """
    term = bias if scale is None else scale * bias
    out = h.add_(term) if in_place else h + term
    tap = _ACTIVE.get()
    if tap is not None:
        tap.bias(out, bias, scale)
    return out
