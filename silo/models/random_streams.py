"""One silo's random streams, and the context in which the models draw from them.

A silo owns explicit generators: one on the CPU and one on its training device when that is not
the CPU. Inside ``drawing_from(streams)`` every random number a model draws (the dropout masks of
silo/models/shards.py) comes from the generator of ``streams`` on the tensor's device, never from
torch's global generators: so a retried or resumed round redraws exactly the same masks once the
streams' state is restored, silos interleaved in one process do not share a stream, and nothing
else in the process (another silo, a library, a test reseeding torch) moves a silo's stream.

The streams are found through a context variable, as parameter taps are
(silo/models/parameter_taps.py), rather than passed through every forward: the models, DDP's
forward and the per-graph-gradient hooks keep their signatures, and the draws still name their
generator explicitly. Outside any such block (a model called directly, in tests) a draw uses
torch's default generator, as torch's own dropout does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor


class RandomStreams:
    """One silo's generators: one on the CPU, one on ``device`` when that is not the CPU."""

    def __init__(self, device: torch.device | str, *, cpu_seed: int, device_seed: int) -> None:
        device = torch.device(device)
        self.cpu_generator = torch.Generator().manual_seed(cpu_seed)
        # A generator on the device itself: a CUDA draw takes a CUDA generator.
        self.device_generator: torch.Generator | None = (
            None if device.type == "cpu"
            else torch.Generator(device=device).manual_seed(device_seed))
        # Each device's generator, found once: a mask is drawn at every dropout of every step.
        self._by_device: dict[torch.device, torch.Generator] = {}

    def on(self, device: torch.device) -> torch.Generator:
        """The generator that draws for tensors on ``device``."""
        generator = self._by_device.get(device)
        if generator is None:
            generator = self._by_device[device] = self._find(device)
        return generator

    def _find(self, device: torch.device) -> torch.Generator:
        if device.type == "cpu":
            return self.cpu_generator
        if self.device_generator is not None and _holds(self.device_generator.device, device):
            return self.device_generator
        held = ("the CPU" if self.device_generator is None
                else f"the CPU and {self.device_generator.device}")
        raise ValueError(f"a random draw on {device}, but this silo's random streams are on "
                         f"{held}: the model and its batches must be on the silo's device")

    def state(self) -> dict[str, Tensor]:
        """The generators' states (CPU tensors), for a snapshot."""
        state = {"cpu": self.cpu_generator.get_state()}
        if self.device_generator is not None:
            state["device"] = self.device_generator.get_state()
        return state

    def load_state(self, state: dict[str, Tensor]) -> None:
        """Return to a `state()`. A device state is taken only by streams with a device
        generator (a snapshot from a CPU-only silo leaves the device stream where it is)."""
        self.cpu_generator.set_state(state["cpu"])
        if self.device_generator is not None and "device" in state:
            self.device_generator.set_state(state["device"])


def _holds(held: torch.device, device: torch.device) -> bool:
    """Whether a generator made for ``held`` draws for ``device`` (a generator made for
    ``cuda`` without an index serves the current CUDA device, as the tensors moved there)."""
    return held.type == device.type and (held.index is None or device.index is None
                                         or held.index == device.index)


# A context variable, not a global: threads and tasks training side by side each see their own.
_ACTIVE: ContextVar[RandomStreams | None] = ContextVar("trellis_random_streams", default=None)


@contextmanager
def drawing_from(streams: RandomStreams) -> Iterator[RandomStreams]:
    """Draw every model random number inside the block from ``streams``."""
    token = _ACTIVE.set(streams)
    try:
        yield streams
    finally:
        _ACTIVE.reset(token)


def generator_for(device: torch.device) -> torch.Generator | None:
    """The active streams' generator on ``device``; None (torch's default generator for the
    device) outside any `drawing_from` block."""
    streams = _ACTIVE.get()
    return None if streams is None else streams.on(device)
