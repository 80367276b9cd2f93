"""Which tests share a pytest-xdist worker (tests/support/worker_groups.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests.support.worker_groups import worker_groups


def _test(nodeid: str, **fixtures: str) -> Any:
    """A stand-in for a collected test: its id and its fixtures' scopes."""
    defs = {name: [SimpleNamespace(scope=scope)] for name, scope in fixtures.items()}
    return SimpleNamespace(nodeid=nodeid, _fixtureinfo=SimpleNamespace(name2fixturedefs=defs))


def test_tests_joined_by_shared_module_fixtures_share_one_group() -> None:
    items = [
        _test("t/test_a.py::one", ws="module", run="module", tmp_path="function"),
        _test("t/test_a.py::two", run="module"),
        _test("t/test_a.py::three", ws="module", report="module"),
        _test("t/test_a.py::dropout", dropout_run="module"),
        _test("t/test_a.py::alone", tmp_path="function", workspace_factory="session"),
        _test("t/test_b.py::other", ws="module"),      # another module's ws: another fixture
    ]
    groups = worker_groups(items)
    assert groups == {"t/test_a.py::one": "t/test_a.py:report",
                      "t/test_a.py::two": "t/test_a.py:report",
                      "t/test_a.py::three": "t/test_a.py:report",
                      "t/test_a.py::dropout": "t/test_a.py:dropout_run",
                      "t/test_b.py::other": "t/test_b.py:ws"}
    # xdist reads a name after the last "]" of the id as the group: none may hold a bracket.
    assert not any("[" in g or "]" in g for g in groups.values())
