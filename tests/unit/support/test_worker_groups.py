"""Which tests share a pytest-xdist worker (tests/support/worker_groups.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support.worker_groups import worker_groups, write_groups


def _test(nodeid: str, group: str | None = None, **fixtures: str) -> Any:
    """A stand-in for a collected test: its id, its fixtures' scopes, its xdist_group mark."""
    defs = {name: [SimpleNamespace(scope=scope)] for name, scope in fixtures.items()}
    mark = None if group is None else pytest.mark.xdist_group(group).mark
    return SimpleNamespace(nodeid=nodeid, _fixtureinfo=SimpleNamespace(name2fixturedefs=defs),
                           get_closest_marker=lambda name: mark if name == "xdist_group" else None)


def test_tests_joined_by_shared_module_fixtures_share_one_group() -> None:
    items = [
        _test("t/test_a.py::one", ws="module", run="module", tmp_path="function"),
        _test("t/test_a.py::two", run="module"),
        _test("t/test_a.py::three", ws="module", report="module"),
        _test("t/test_a.py::dropout", dropout_run="module"),
        _test("t/test_a.py::alone", tmp_path="function", workspace_factory="session"),
        _test("t/test_b.py::other", ws="module"),      # another module's ws: another fixture
        _test("t/test_b.py::marked", group="by-hand", ws="module"),    # the mark decides
    ]
    groups = worker_groups(items)
    assert groups == {"t/test_a.py::one": "t/test_a.py:report",
                      "t/test_a.py::two": "t/test_a.py:report",
                      "t/test_a.py::three": "t/test_a.py:report",
                      "t/test_a.py::dropout": "t/test_a.py:dropout_run",
                      "t/test_b.py::other": "t/test_b.py:ws",
                      "t/test_b.py::marked": "by-hand"}


def test_the_groups_file_is_written_whole(tmp_path) -> None:
    path = tmp_path / "groups.json"
    write_groups(path, {"t/test_a.py::one": "t/test_a.py:run"})
    write_groups(path, {"t/test_a.py::one": "t/test_a.py:run"})     # a second worker's
    assert json.loads(path.read_text()) == {"t/test_a.py::one": "t/test_a.py:run"}
    assert [p.name for p in tmp_path.iterdir()] == ["groups.json"]
