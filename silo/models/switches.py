"""The environment switches that choose a training path: "1", "0" or "auto".

TRELLIS_ONEDNN (silo/models/dense.py), TRELLIS_COMPILE (silo/models/compiled.py) and
TRELLIS_CUDA_GRAPHS (silo/training/graphed_steps.py) are read alike: unset or empty is "auto",
case and surrounding spaces do not matter, and anything else is refused with what each value
means, so a typo fails before a round instead of silently choosing a path.
"""

from __future__ import annotations

import os


def three_way(variable: str, meanings: str) -> str:
    """``variable``'s value: "1", "0" or "auto" (unset); ValueError naming ``meanings`` (what
    each value chooses) for anything else."""
    setting = os.environ.get(variable, "auto").strip().lower() or "auto"
    if setting not in ("0", "1", "auto"):
        raise ValueError(f"{variable}={setting!r}: expected {meanings}")
    return setting
