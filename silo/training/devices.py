"""Where a silo trains: ``--device`` resolved to a torch device, and device failures as one line.

``silo join``, ``silo serve`` and ``coordinator simulate`` take the same ``--device`` (its
spelling: protos/devices.py). A device this machine cannot train on is refused before anything
is sent (``DeviceUnavailable``, a ValueError: bad input). A device error torch raises later,
inside a round (a tensor left on the wrong device, a GPU out of memory, a driver fault), ends
the silo's part with ``DeviceFailed``, which names the device and the step, instead of a raw
torch traceback.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from trellis.protos.devices import check_device_spec
from trellis.silo.training.failures import FederationFailed

# What torch's device errors say; other RuntimeErrors are bugs and keep their traceback.
_DEVICE_WORDS = re.compile(r"(?i)\b(cuda|cublas|cudnn|cusparse|cufft|nccl|device|devices)\b|"
                           r"out of memory|not compiled with cuda")
MAX_SHOWN = 300     # characters of torch's message repeated in ours


class DeviceUnavailable(ValueError):
    """The device asked for does not exist on this machine."""


class DeviceFailed(FederationFailed):
    """A round's step failed on the device: the silo stops (its message names both)."""


def resolve_device(spec: str) -> torch.device:
    """The device ``--device spec`` names (auto: the first GPU if there is one, else the CPU);
    DeviceUnavailable if this machine has no such device."""
    if check_device_spec(spec) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return usable_device(spec, f"--device {spec}")


def usable_device(device: torch.device | str, what: str = "") -> torch.device:
    """``device`` as a torch device, or DeviceUnavailable (naming ``what`` asked for it) if this
    machine cannot train on it."""
    device = torch.device(device)
    what = what or f"device {device}"
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        build = ("torch here is a CPU build" if torch.version.cuda is None
                 else f"torch {torch.__version__} sees no CUDA device or driver")
        raise DeviceUnavailable(f"{what}: no CUDA device is available on this machine ({build});"
                                " train with --device cpu or auto")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise DeviceUnavailable(f"{what}: this machine has {count} CUDA device(s), cuda:0 to "
                                f"cuda:{count - 1}")
    return device


def is_device_error(exc: BaseException) -> bool:
    """Whether torch raised ``exc`` because of the device (not a bug of the computation)."""
    if isinstance(exc, DeviceFailed):
        return False
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError | AssertionError) and bool(_DEVICE_WORDS.search(str(exc)))


@contextmanager
def device_step(device: object, step: str) -> Iterator[None]:
    """Run a step of a round; a device error inside it becomes DeviceFailed naming both."""
    try:
        yield
    except (RuntimeError, AssertionError) as exc:
        if not is_device_error(exc):
            raise
        said = " ".join(str(exc).split()) or type(exc).__name__
        if len(said) > MAX_SHOWN:
            said = said[:MAX_SHOWN - 1] + "…"
        raise DeviceFailed(f"{step} failed on {device}: {said} (this silo stops; rerun with "
                           "--device cpu to train on the CPU)") from exc
