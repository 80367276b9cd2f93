"""The mark of every test that needs a CUDA GPU.

``needs_cuda(what)`` marks a test ``cuda`` and skips it, saying what it checks, where torch sees
no CUDA device; on a GPU machine it runs unchanged. ``cuda_marks(what)`` are the same marks for
one case of a parametrised test (``pytest.param("cuda", marks=cuda_marks(...))``). ``pytest -m
cuda`` selects every such test (``make bench-gpu`` runs them); ``-m "not cuda"`` leaves them out.
``run_apart(script, folder)`` runs a test's script in a Python process of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch

Test = TypeVar("Test", bound=Callable[..., object])
ROOT = Path(__file__).resolve().parents[2]


def cuda_marks(what: str) -> list[pytest.MarkDecorator]:
    """``cuda``, and a skip with the reason ``needs a CUDA GPU: <what>`` where there is none."""
    return [pytest.mark.cuda,
            pytest.mark.skipif(not torch.cuda.is_available(), reason=f"needs a CUDA GPU: {what}")]


def needs_cuda(what: str) -> Callable[[Test], Test]:
    """Mark a test ``cuda``; skip it with the reason ``needs a CUDA GPU: <what>`` without one."""

    def mark(test: Test) -> Test:
        for each in cuda_marks(what):
            test = each(test)
        return test

    return mark


def run_apart(script: str, folder: Path) -> tuple[dict[str, Any], str]:
    """Run ``script`` as ``python -c script folder root`` from the checkout's root; its exit
    status must be 0. Returns the JSON of its last line of output, and what it wrote to stderr.

    For what could spoil the process for the tests after it (a CUDA generator left broken).
    """
    done = subprocess.run([sys.executable, "-c", script, str(folder), str(ROOT)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr
