"""The layer rule of DESIGN.md §3 is enforced by import-linter contracts (pyproject.toml).

`make lint` runs them on the real tree; these tests show that they catch a violation: a copy
of the packages where a silo module imports the coordinator (or the reverse, or the coordinator
imports torch) breaks the contracts.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

PACKAGES = ("silo", "coordinator", "crypto", "protos")


def _lint_copy(tmp_path: Path, module: str, line: str) -> subprocess.CompletedProcess[str]:
    """Copy the packages under tmp/trellis/, append an import to one module, run lint-imports."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / "trellis" / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "trellis" / (module.replace(".", "/") + ".py")
    target.write_text(target.read_text() + f"\n{line}\n")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    lint = Path(sys.executable).with_name("lint-imports")
    # The copy comes first on the path, so `trellis.*` resolves to it, not to the checkout.
    return subprocess.run([str(lint), "--config", str(tmp_path / "pyproject.toml")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})


def test_the_contracts_hold_on_this_tree(tmp_path: Path) -> None:
    done = _lint_copy(tmp_path, "silo.cli", "")
    assert done.returncode == 0, done.stdout[-2000:]
    assert "3 kept, 0 broken" in done.stdout


@pytest.mark.parametrize("module,line,broken", [
    ("silo.trainer", "import trellis.coordinator.rounds.machine  # noqa", "Layers"),
    ("coordinator.strategies", "import trellis.silo.models.graph_classifiers  # noqa", "Layers"),
    ("coordinator.service", "import torch  # noqa", "needs no torch"),
    ("crypto.shamir", "import trellis.protos.plan  # noqa", "Layers"),
])
def test_a_forbidden_import_breaks_a_contract(tmp_path: Path, module: str, line: str,
                                              broken: str) -> None:
    done = _lint_copy(tmp_path, module, line)
    assert done.returncode == 1, done.stdout[-2000:]
    assert "BROKEN" in done.stdout and broken in done.stdout.split("Broken contracts")[-1]
    assert f"trellis.{module}" in done.stdout
