"""The mark of every test that needs a CUDA GPU.

``needs_cuda(what)`` marks a test ``cuda`` and skips it, saying what it checks, where torch sees
no CUDA device; on a GPU machine it runs unchanged. ``cuda_marks(what)`` are the same marks for
one case of a parametrised test (``pytest.param("cuda", marks=cuda_marks(...))``). ``pytest -m
cuda`` selects every such test (``make bench-gpu`` runs them); ``-m "not cuda"`` leaves them out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest
import torch

Test = TypeVar("Test", bound=Callable[..., object])


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
