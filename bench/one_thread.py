"""Set-up shared by the one-thread local-training benchmarks (speed_chem.py, silo_memory.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trellis.protos.plan import PublicPlan

ROOT = Path(__file__).resolve().parents[1]
# The benchmarks run as scripts: the project's packages are importable once this is imported.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def one_thread_public_plan(algorithm: str) -> PublicPlan:
    """The default plan of ``algorithm``, with torch held to one thread in this process."""
    import torch

    from trellis.protos.plan import parse_plan

    torch.set_num_threads(1)
    raw = {"federation": {"id": "bench", "algorithm": algorithm, "rounds": 1,
                          "silos": ["a", "b"]}}
    return parse_plan(raw, base_dir=ROOT).public
