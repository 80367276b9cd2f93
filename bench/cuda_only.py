"""A pytest plugin (``-p cuda_only``, bench/ on the path): keep only the tests that need a GPU.

A test needs one when it is marked ``cuda`` (tests/support/cuda.py) or carries a ``skipif``
mark whose reason names CUDA, the project's convention (``pytest.mark.skipif(not
torch.cuda.is_available(), reason="needs a CUDA GPU: ...")``, on the test, its class or its
module); the rest are deselected. bench/gpu.py runs it.
"""

from __future__ import annotations

import pytest


def needs_cuda(item: pytest.Item) -> bool:
    """Whether the test is skipped where no CUDA device is present."""
    if item.get_closest_marker("cuda") is not None:
        return True
    return any("CUDA" in str(mark.kwargs.get("reason", ""))
               for mark in item.iter_markers("skipif"))


@pytest.hookimpl(tryfirst=True)         # before tests/conftest.py groups what is left
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect every test that does not need a GPU."""
    keep = [item for item in items if needs_cuda(item)]
    dropped = [item for item in items if not needs_cuda(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep
