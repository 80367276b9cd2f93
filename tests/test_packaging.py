"""Packaging guards: imports resolve to this repository; generated protobuf code is fresh."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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

    from protos import generate

    for name in generate.GENERATED:
        shutil.copy(ROOT / "protos" / name, tmp_path / name)
    assert generate.stale_files(tmp_path) == []
    with open(tmp_path / "federation_pb2.pyi", "a") as handle:
        handle.write("\n# edited by hand\n")
    assert generate.stale_files(tmp_path) == ["federation_pb2.pyi"]
