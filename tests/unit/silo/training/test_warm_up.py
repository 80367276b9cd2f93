"""A silo's warm-up loads, before it joins, what its first optimiser step would load later."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
from trellis.silo.training.warm_up import warm_up_optimisers
assert "torch._dynamo" not in sys.modules, "already loaded: the probe would prove nothing"
warm_up_optimisers()
assert "torch._dynamo" in sys.modules, "torch.optim no longer loads it: the warm-up can go"
"""


def test_the_warm_up_loads_what_torch_optim_loads_on_its_first_step() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
