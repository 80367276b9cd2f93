"""The spelling of ``--device``, which ``silo join``, ``silo serve`` and ``coordinator simulate``
share: auto, cpu, cuda or cuda:N. Checked here without torch, so the coordinator's command line
refuses a typo before it loads torch; silo/training/devices.py resolves it to a torch device.
"""

from __future__ import annotations

import re

from trellis.protos.fields import shown

DEVICE_HELP = "auto | cpu | cuda | cuda:N"
_SPEC = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def check_device_spec(spec: str) -> str:
    """``spec`` if it is auto, cpu, cuda or cuda:N; else ValueError naming the choices."""
    if not isinstance(spec, str) or not _SPEC.fullmatch(spec):
        raise ValueError(f"--device {shown(spec)}: expected auto, cpu, cuda or cuda:N")
    return spec
