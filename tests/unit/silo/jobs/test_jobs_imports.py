"""silo/jobs stays light: deciding and recording offers loads no torch, no gRPC and none of the
federation protocol, so `silo jobs` answers at once and the package can sit under the protocol."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "torch_geometric", "scipy", "grpc", "trellis.silo.federation",
         "trellis.silo.training", "trellis.silo.cli")


def test_the_jobs_package_imports_nothing_heavy() -> None:
    script = ("import sys\n"
              "import trellis.silo.jobs.approval, trellis.silo.jobs.store\n"
              f"heavy = {HEAVY!r}\n"
              "print(sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') "
              "for h in heavy)))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
