"""The model averaged over the rounds: what a silo evaluates, reports and keeps when its plan
names ``[training] average``.

An exponential average of every floating value of the model's state (parameters, and
normalisation statistics where the model has them), moved toward the model by ``1 - decay``
each time a round's shared values arrive. Under differential privacy the average is
post-processing of what the noise already protects (the released shared values and the silo's
own noised local steps), so evaluating or keeping it costs no epsilon; averaged iterates are
what published DP training evaluates (De et al. 2022).

For an evaluation the average is copied into the model's own tensors and copied back after:
the tensors stay the same objects, so a replayed CUDA graph of the evaluation reads the average
and a graphed training step the model's values.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


class ModelAverage:
    """An exponential average of ``model``'s floating state, ``decay`` per update."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"an average's decay is in (0, 1), got {decay}")
        self.model, self.decay = model, decay
        self._values: dict[str, torch.Tensor] | None = None

    def _floating(self) -> dict[str, torch.Tensor]:
        """The model's floating state entries (they share storage with its tensors)."""
        return {name: value for name, value in self.model.state_dict().items()
                if value.is_floating_point()}

    @torch.no_grad()
    def update(self) -> None:
        """Move the average toward the model's values now (the first update takes them)."""
        now = self._floating()
        if self._values is None:
            self._values = {name: value.detach().clone() for name, value in now.items()}
            return
        for name, average in self._values.items():
            average.lerp_(now[name], 1.0 - self.decay)

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Within the block the model holds the average (before any update: its own values)."""
        if self._values is None:
            yield
            return
        now = self._floating()
        with torch.no_grad():
            kept = {name: value.detach().clone() for name, value in now.items()}
            for name, value in now.items():
                value.copy_(self._values[name])
        try:
            yield
        finally:
            with torch.no_grad():
                for name, value in now.items():
                    value.copy_(kept[name])

    def state(self) -> dict[str, torch.Tensor] | None:
        """The average's values (None before the first update), for a snapshot."""
        if self._values is None:
            return None
        return {name: value.detach().clone() for name, value in self._values.items()}

    def load_state(self, values: dict[str, torch.Tensor] | None) -> None:
        """Take back values from `state()` (None: no update yet); refused if they do not fit."""
        if values is None:
            self._values = None
            return
        now = self._floating()
        if set(values) != set(now) or any(values[n].shape != now[n].shape for n in now):
            raise ValueError("the saved average does not fit this model")
        self._values = {name: values[name].detach().to(now[name].device, now[name].dtype).clone()
                        for name in now}
