"""Where a silo trains: --device resolved or refused in one line, FedHGN's trainers placed on the
device they are given, and a device error inside a round turned into one line naming both.

The device errors here are torch's own, raised by tensors on the "meta" device (which every
build has) meeting tensors on the CPU: the same checks a tensor left on the CPU trips on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.federation import planted_hetero_graph
from trellis.protos.devices import check_device_spec
from trellis.silo.training.devices import (
    DeviceFailed,
    DeviceUnavailable,
    device_step,
    is_device_error,
    resolve_device,
    usable_device,
)
from trellis.silo.training.failures import FederationFailed
from trellis.silo.training.hgn_baselines import train_alone
from trellis.silo.training.hgn_trainer import HeteroTrainer, HGNConfig


def _graph():
    return planted_hetero_graph("item", (("shop", "sold_at", "sells"),), None, 30, seed=1)


@pytest.mark.parametrize("spec", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_the_device_spellings_every_command_takes(spec: str) -> None:
    assert check_device_spec(spec) == spec


@pytest.mark.parametrize("spec", ["gpu", "CUDA", "cuda:", "cuda:x", "mps", "", "cpu "])
def test_other_spellings_are_refused_naming_the_choices(spec: str) -> None:
    with pytest.raises(ValueError, match="expected auto, cpu, cuda or cuda:N") as refused:
        resolve_device(spec)
    assert str(refused.value).startswith(f"--device {spec!r}: ")


def test_cpu_and_auto_resolve_to_a_device_this_machine_has() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_a_gpu_this_machine_lacks_is_refused_in_one_line() -> None:
    # Without CUDA every GPU is missing; with it, the one past the last.
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    spec = f"cuda:{count}" if count else "cuda"
    with pytest.raises(DeviceUnavailable) as refused:
        resolve_device(spec)
    said = str(refused.value)
    assert said.startswith(f"--device {spec}: ") and "\n" not in said
    assert ("no CUDA device is available on this machine" in said if not count
            else f"this machine has {count} CUDA device(s)" in said)
    assert isinstance(refused.value, ValueError)      # bad input: the CLIs exit 2 on it


def test_a_trainer_refuses_a_gpu_this_machine_lacks() -> None:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(DeviceUnavailable, match="device cuda"):
        HeteroTrainer(_graph(), HGNConfig(hidden=8, num_bases=2), 1, "fed", "a", 3,
                      device=f"cuda:{count}")
    with pytest.raises(DeviceUnavailable):
        usable_device(torch.device("cuda", count))


@pytest.mark.parametrize("bases", [2, 0])       # FedHGN's basis model, the baselines' RGCN
def test_hetero_trainer_puts_model_and_data_on_its_device(bases: int) -> None:
    trainer = HeteroTrainer(_graph(), HGNConfig(hidden=8, num_bases=bases), 1, "fed", "a", 3,
                            device="cpu")
    assert trainer.device == torch.device("cpu")
    tensors = [*trainer.model.parameters(), trainer.labels, *trainer.index.values(),
               trainer.ops.layer1, trainer.ops.layer2, trainer.ops.target_nodes]
    assert {t.device.type for t in tensors} == {"cpu"}
    assert "train_loss" in trainer.train() and trainer.metrics(["val_acc"])


def test_baseline_trains_alone_on_the_device_it_is_given() -> None:
    result = train_alone(_graph(), HGNConfig(hidden=8), seed=1, name="a", max_epochs=5,
                         patience=5, device="cpu")
    assert result["epochs"] == 5
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(DeviceUnavailable):
        train_alone(_graph(), HGNConfig(hidden=8), seed=1, name="a", max_epochs=5,
                    device=f"cuda:{count}")


def _mismatch() -> RuntimeError:
    try:
        torch.zeros(3).index_add_(0, torch.tensor([0], device="meta"), torch.ones(1))
    except RuntimeError as exc:
        return exc
    raise AssertionError("torch accepted an index on another device")


def test_a_device_error_in_a_step_names_the_device_and_the_step() -> None:
    torch_error = _mismatch()
    assert is_device_error(torch_error)
    with pytest.raises(DeviceFailed) as failed:
        with device_step(torch.device("cuda", 0), "round 3 local training"):
            raise torch_error
    said = str(failed.value)
    assert said.startswith("round 3 local training failed on cuda:0: index_add(): self, index "
                           "and source expected to be in the same device")
    assert "\n" not in said and "--device cpu" in said
    assert failed.value.__cause__ is torch_error
    # It ends the silo's part as the federation's own failures do (silo join: one line, exit 1).
    assert isinstance(failed.value, FederationFailed)


def test_other_errors_pass_through_a_step_unchanged() -> None:
    bug = RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)")
    with pytest.raises(RuntimeError) as raised:
        with device_step("cpu", "round 1 local training"):
            raise bug
    assert raised.value is bug
    with pytest.raises(ValueError, match="a NaN"):
        with device_step("cpu", "round 1 local training"):
            raise ValueError("a NaN")


def test_a_trainer_with_a_layer_left_elsewhere_fails_with_a_device_error() -> None:
    """What happens on a GPU when one tensor stays on the CPU, here with meta for the GPU."""
    trainer = HeteroTrainer(_graph(), HGNConfig(hidden=8, num_bases=2), 1, "fed", "a", 3)
    trainer.model.decoder.to("meta")
    with pytest.raises(DeviceFailed, match=r"^round 1 local training failed on cpu: Tensor on "
                                           r"device meta is not on the expected device cpu!"):
        with device_step(trainer.device, "round 1 local training"):
            trainer.train()
