"""A silo's random streams (silo/models/random_streams.py): inside ``drawing_from`` the dropout
masks come from the silo's generator on the tensor's device, never from torch's global ones.

Each test runs on the CPU and, where a CUDA GPU is present, on it (the same code: a CUDA draw
takes the silo's CUDA generator).
"""

from __future__ import annotations

import pytest
import torch

from trellis.silo.models.random_streams import RandomStreams, drawing_from, generator_for
from trellis.silo.models.shards import keep_mask

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: the silo's CUDA generator"))]
# keep_mask's three ways to draw: one bit, one byte, one uniform float per element.
RATES = [0.5, 0.25, 0.3]


def _masks(streams: RandomStreams, device: str, p: float, count: int = 3) -> list[torch.Tensor]:
    x = torch.ones(37, 19, device=device)
    with drawing_from(streams):
        return [keep_mask(x, p).cpu() for _ in range(count)]


def _global_states() -> list[torch.Tensor]:
    states = [torch.get_rng_state()]
    if torch.cuda.is_available():
        states += torch.cuda.get_rng_state_all()
    return states


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", RATES)
def test_masks_come_from_the_streams_and_leave_the_global_generators_alone(device: str,
                                                                           p: float) -> None:
    torch.manual_seed(1)
    first = _masks(RandomStreams(device, cpu_seed=5, device_seed=6), device, p)
    torch.manual_seed(2)
    before = _global_states()
    again = _masks(RandomStreams(device, cpu_seed=5, device_seed=6), device, p)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(before, _global_states(), strict=True))
    # Successive masks differ: the stream moves on.
    assert not torch.equal(first[0], first[1])


@pytest.mark.parametrize("device", DEVICES)
def test_different_seeds_draw_different_masks(device: str) -> None:
    one = _masks(RandomStreams(device, cpu_seed=5, device_seed=6), device, 0.5)
    other = _masks(RandomStreams(device, cpu_seed=7, device_seed=8), device, 0.5)
    assert not torch.equal(one[0], other[0])


@pytest.mark.parametrize("device", DEVICES)
def test_a_restored_state_redraws_the_same_masks(device: str) -> None:
    streams = RandomStreams(device, cpu_seed=5, device_seed=6)
    _masks(streams, device, 0.5)
    state = streams.state()
    assert all(t.device.type == "cpu" for t in state.values())     # a snapshot is CPU tensors
    first = _masks(streams, device, 0.5)
    streams.load_state(state)
    assert all(torch.equal(a, b) for a, b in zip(first, _masks(streams, device, 0.5),
                                                 strict=True))


@pytest.mark.parametrize("device", DEVICES)
def test_the_generator_is_the_one_on_the_tensors_device(device: str) -> None:
    streams = RandomStreams(device, cpu_seed=5, device_seed=6)
    with drawing_from(streams):
        assert generator_for(torch.device("cpu")) is streams.cpu_generator
        if device != "cpu":
            held = torch.ones(1, device=device).device
            assert generator_for(held) is streams.device_generator
    assert generator_for(torch.device("cpu")) is None       # outside: torch's default one


def test_a_draw_on_a_device_the_silo_does_not_hold_is_refused() -> None:
    # torch.device("cuda", 0) is only a name here: no GPU is touched.
    streams = RandomStreams("cpu", cpu_seed=5, device_seed=6)
    assert streams.device_generator is None
    with pytest.raises(ValueError, match=r"a random draw on cuda:0, but this silo's random "
                                         r"streams are on the CPU: the model and its batches "
                                         r"must be on the silo's device"):
        streams.on(torch.device("cuda", 0))


@pytest.mark.parametrize("device", DEVICES)
def test_a_state_from_another_kind_of_device_moves_only_the_cpu_stream(device: str) -> None:
    # A snapshot from a GPU silo resumed on a CPU one carries a device state nobody takes; one
    # from a CPU silo resumed on a GPU one carries none, and the device stream stays put.
    source = RandomStreams("cpu", cpu_seed=5, device_seed=6)
    state = source.state() | ({"device": torch.zeros(16, dtype=torch.uint8)}
                              if device == "cpu" else {})
    streams = RandomStreams(device, cpu_seed=7, device_seed=8)
    kept = None if streams.device_generator is None else streams.device_generator.get_state()
    streams.load_state(state)
    assert torch.equal(streams.cpu_generator.get_state(), source.cpu_generator.get_state())
    if streams.device_generator is not None:
        assert kept is not None and torch.equal(streams.device_generator.get_state(), kept)
