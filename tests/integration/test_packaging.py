"""Packaging guards: imports resolve to this repository; generated protobuf code is fresh."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT


@pytest.mark.parametrize("package", ["silo", "coordinator", "crypto", "protos"])
def test_packages_resolve_to_this_repository(package: str) -> None:
    # PyPI has unrelated packages called `crypto` and `coordinator`.
    module = importlib.import_module(package)
    assert Path(module.__file__).resolve().parent == ROOT / package


def test_generated_protobuf_code_is_not_stale() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "protos" / "generate.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_stale_check_detects_an_edit(tmp_path: Path) -> None:
    import shutil

    from trellis.protos import generate

    for name in generate.GENERATED:
        shutil.copy(ROOT / "protos" / name, tmp_path / name)
    assert generate.stale_files(tmp_path) == []
    with open(tmp_path / "federation_pb2.pyi", "a") as handle:
        handle.write("\n# edited by hand\n")
    assert generate.stale_files(tmp_path) == ["federation_pb2.pyi"]


def _recipe(target: str, *assignments: str) -> str:
    """The commands `make` would run for `target`, variables expanded (nothing is run)."""
    done = subprocess.run(["make", "-C", str(ROOT), "-n", "-B", *assignments, target],
                          capture_output=True, text=True, check=True)
    return done.stdout


def test_the_accountant_is_the_privacy_extra_not_a_core_dependency() -> None:
    # dp-accounting brings scipy (~143 MB): the coordinator image carries no ML stack, so only
    # the installs that account a private plan's epsilon get it (docs/architecture.md).
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]

    def names(requirements: list[str]) -> set[str]:
        return {r.split(">")[0].split("=")[0].split("[")[0].strip() for r in requirements}

    assert "dp-accounting" not in names(project["dependencies"])
    assert "dp-accounting" in names(extras["privacy"])
    assert "dp-accounting" in names(extras["silo"])      # every silo accounts its own epsilon
    # The coordinator's torch-free test environment serves private plans too.
    assert "privacy" in _recipe(".venv-coordinator/.trellis-installed")


def test_the_makefile_installs_torch_from_pytorchs_cpu_index() -> None:
    # PyPI's Linux torch is the CUDA build (several GB of nvidia-* packages): `make demo` and
    # `make test` name PyTorch's CPU index, and TORCH_INDEX_URL picks another (a CUDA build).
    recipe = _recipe(".venv/.trellis-installed")
    assert "pip install -q --index-url https://download.pytorch.org/whl/cpu torch==2.13.0" in recipe
    # Only where that index does not answer within 10 s (this machine, CI: PyPI only) does
    # torch come from elsewhere, and a warning says so.
    probe, fallback = recipe.split("else", 1)
    assert "'https://download.pytorch.org/whl/cpu'" in probe and "timeout=10" in probe
    assert "warning: https://download.pytorch.org/whl/cpu does not answer" in fallback
    cuda = _recipe(".venv/.trellis-installed",
                   "TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128")
    assert "--index-url https://download.pytorch.org/whl/cu128 torch==2.13.0" in cuda
    assert "whl/cpu" not in cuda
