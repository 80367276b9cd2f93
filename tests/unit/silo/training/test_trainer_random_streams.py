"""Each silo's trainer draws its dropout masks from its own random streams (CPU and device): a
retried or a resumed round redraws exactly the same masks, silos interleaved in one process train
as each alone, different silos draw different masks, and torch's global generators do not matter.

Every test runs on the CPU and, where a CUDA GPU is present, on it: the same code, the silo's
CUDA generator drawing the masks there. The same masks show twice: the streams end a round in
exactly the same state, and the trained weights agree (with dropout 0.5 on every layer, other
masks move 80 to 97 % of them beyond float tolerance: measured on the CPU, fedstar, feddense and
fedavg).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from trellis.protos.plan import PublicPlan, parse_plan
from trellis.silo.data.datasets import load_graph_folder
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.data.tu import GraphDataset
from trellis.silo.models.shards import keep_mask
from trellis.silo.training.trainer import LocalTrainer, snapshot_from_bytes, snapshot_to_bytes

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: the silo's CUDA generator"))]
SILOS = ["a", "b"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tu_folder(tmp_path_factory.mktemp("streams"), "SYN-molecules", "molecules", 48,
                           seed=3)


def _plan(algorithm: str = "fedstar") -> PublicPlan:
    raw = {"federation": {"id": "streams", "algorithm": algorithm, "rounds": 3, "seed": 11,
                          "silos": SILOS},
           "training": {"batch_size": 8, "local_epochs": 2}}
    return parse_plan(raw, base_dir=Path(".")).public


def _trainer(folder: Path, device: str, silo: str = "a", algorithm: str = "fedstar"
             ) -> LocalTrainer:
    dataset: GraphDataset = load_graph_folder(folder)
    return LocalTrainer(dataset, _plan(algorithm), silo, device)


@dataclass(frozen=True)
class RoundEnd:
    """Where a trainer ended a round: its streams' states and its weights (CPU copies)."""

    streams: dict[str, torch.Tensor]
    weights: list[torch.Tensor]
    device: str


def _end(trainer: LocalTrainer) -> RoundEnd:
    return RoundEnd(trainer._streams.state(),
                    [v.detach().cpu().clone() for v in trainer.model.state_dict().values()],
                    trainer.device.type)


def _equal(one: list[torch.Tensor], other: list[torch.Tensor]) -> bool:
    return len(one) == len(other) and all(torch.equal(a, b)
                                          for a, b in zip(one, other, strict=True))


def _alike(one: RoundEnd, other: RoundEnd) -> bool:
    """The same stream states, exactly, and the same weights: exactly on the CPU; on a GPU to
    float tolerance in all but 1 % of them, as sum pooling's float atomics there (index_add_)
    vary the last bits from run to run."""
    if one.streams.keys() != other.streams.keys() or not _equal(
            [one.streams[k] for k in one.streams], [other.streams[k] for k in one.streams]):
        return False
    if one.device == "cpu":
        return _equal(one.weights, other.weights)
    flat = [torch.cat([w.reshape(-1).double() for w in end.weights]) for end in (one, other)]
    return float(torch.isclose(*flat, rtol=1e-4, atol=1e-6).double().mean()) >= 0.99


def _global_states() -> list[torch.Tensor]:
    states = [torch.get_rng_state()]
    if torch.cuda.is_available():
        states += torch.cuda.get_rng_state_all()
    return states


def _reseed(seed: int) -> None:
    """Move torch's global generators (CPU and every GPU), as other code in the process may."""
    torch.manual_seed(seed)
    torch.rand(1000)
    if torch.cuda.is_available():
        torch.rand(1000, device="cuda")


@pytest.mark.parametrize("algorithm", ["fedstar", "feddense", "fedavg"])
@pytest.mark.parametrize("device", DEVICES)
def test_a_retried_round_redraws_the_same_masks(folder: Path, device: str,
                                                algorithm: str) -> None:
    trainer = _trainer(folder, device, algorithm=algorithm)
    trainer.train()
    snapshot = trainer.snapshot()          # what the session keeps before a round's attempt
    trainer.train()
    first = _end(trainer)
    _reseed(5)
    trainer.restore(snapshot)
    trainer.train()
    assert _alike(first, _end(trainer))


@pytest.mark.parametrize("device", DEVICES)
def test_a_resumed_round_redraws_the_same_masks(folder: Path, device: str) -> None:
    trainer = _trainer(folder, device)
    trainer.train()
    saved = snapshot_to_bytes(trainer.snapshot())      # as resume.pt holds it
    trainer.train()
    expected = _end(trainer)
    # A restarted process: a new trainer, its global generators wherever they happen to be.
    _reseed(6)
    restarted = _trainer(folder, device)
    restarted.restore(snapshot_from_bytes(saved))
    restarted.train()
    assert _alike(expected, _end(restarted))


@pytest.mark.parametrize("device", DEVICES)
def test_two_silos_interleaved_train_as_each_alone(folder: Path, device: str) -> None:
    alone = {}
    for silo in SILOS:
        trainer = _trainer(folder, device, silo)
        for _ in range(2):
            trainer.train()
        alone[silo] = _end(trainer)
    together = {silo: _trainer(folder, device, silo) for silo in SILOS}
    for _ in range(2):
        for trainer in together.values():
            trainer.train()
    for silo in SILOS:
        assert _alike(alone[silo], _end(together[silo]))


@pytest.mark.parametrize("device", DEVICES)
def test_different_silos_draw_different_masks(folder: Path, device: str) -> None:
    x = torch.ones(64, 32, device=device)
    masks = []
    for silo in SILOS:
        trainer = _trainer(folder, device, silo)
        with trainer._own_rng():
            masks.append(keep_mask(x, 0.5))
    assert not torch.equal(masks[0], masks[1])
    # The same silo built again draws the same: the stream is the silo's, not the process's.
    again = _trainer(folder, device, "a")
    with again._own_rng():
        assert torch.equal(keep_mask(x, 0.5), masks[0])


@pytest.mark.parametrize("device", DEVICES)
def test_torch_global_generators_do_not_matter(folder: Path, device: str) -> None:
    results = []
    for seed in (1, 2):
        _reseed(seed)
        trainer = _trainer(folder, device)
        for round_ in range(2):
            _reseed(seed * 10 + round_)
            before = _global_states()
            trainer.train()
            assert _equal(before, _global_states())      # nor are they moved
        results.append(_end(trainer))
    assert _alike(results[0], results[1])


def test_a_snapshot_from_before_the_streams_restores_its_cpu_stream(folder: Path) -> None:
    # Until the streams, the snapshot's "rng" was the CPU generator's state, a bare tensor.
    trainer = _trainer(folder, "cpu")
    snapshot = trainer.snapshot()
    old = snapshot | {"rng": snapshot["rng"]["cpu"]}
    trainer.train()
    expected = _end(trainer)
    trainer.restore(old)
    trainer.train()
    assert _alike(expected, _end(trainer))
