"""Which tests must share a pytest-xdist worker, and the scheduler that keeps them together.

`make test` runs the suite on several workers with ``--dist loadgroup``. A module-scoped
fixture (a local Ray, two training processes, a finished federation) would be made again on
every worker that gets one of its tests: up to one copy per worker, each competing with the
others for the same cores. So the tests that share one (directly, or through a chain of tests
sharing one two by two) form a group, sent whole to one worker; the other tests are spread one
by one, and two groups of one module (its federation and its dropout run, say) may run at once.
An ``xdist_group`` mark on a test names its group outright.

pytest-xdist 3.8 passes groups to its scheduler by appending ``@group`` to each test id, which
pytest 9.2 ignores (pytest-dev/pytest-xdist#1386): groups are then silently spread. So the
workers write the groups to a file the controller names (``workerinput``), and the scheduler
of ``--dist loadgroup`` is replaced by one that reads them there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

# The key of the groups file's path in each worker's workerinput.
GROUPS_FILE = "trellis_worker_groups"


def module_fixtures(item: pytest.Item) -> list[str]:
    """The module-scoped fixtures the test uses, directly or through other fixtures."""
    info = getattr(item, "_fixtureinfo", None)       # pytest's own record of them
    if info is None:
        return []
    return sorted(name for name, definitions in info.name2fixturedefs.items()
                  if any(d.scope == "module" for d in definitions))


def worker_groups(items: Sequence[pytest.Item]) -> dict[str, str]:
    """Test id -> group name, for each test that is marked ``xdist_group`` or uses a
    module-scoped fixture: tests joined by any chain of fixtures shared two by two are in one
    group, named by its module and the first of its fixtures in alphabetical order."""
    parent: dict[tuple[str, str], tuple[str, str]] = {}

    def root(node: tuple[str, str]) -> tuple[str, str]:
        while parent[node] != node:
            node = parent[node]
        return node

    marked, uses = {}, {}
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            marked[item.nodeid] = str(mark.args[0] if mark.args else
                                      mark.kwargs.get("name", "default"))
            continue
        module = item.nodeid.split("::")[0]
        nodes = [(module, name) for name in module_fixtures(item)]
        for node in nodes:
            parent.setdefault(node, node)
        for node in nodes[1:]:
            a, b = sorted((root(nodes[0]), root(node)))
            parent[b] = a
        if nodes:
            uses[item.nodeid] = nodes[0]
    return {**{nodeid: "{}:{}".format(*root(node)) for nodeid, node in uses.items()}, **marked}


def write_groups(path: Path, groups: dict[str, str]) -> None:
    """Write the groups whole or not at all (every worker writes the same ones)."""
    part = path.with_name(f"{path.name}.{os.getpid()}")
    part.write_text(json.dumps(groups))
    os.replace(part, path)


def group_scheduler(config: pytest.Config, log: Any, path: Path) -> Any:
    """xdist's loadgroup scheduler, with the groups read from ``path`` (written by the workers
    before they report their collection, so before any test is scheduled)."""
    from xdist.scheduler import LoadGroupScheduling

    class FileGroupScheduling(LoadGroupScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = json.loads(path.read_text()) if path.exists() else {}
            # A test id never holds a group's name: the names cannot clash with ungrouped ids.
            return self.groups.get(nodeid) or super()._split_scope(nodeid)

    return FileGroupScheduling(config, log)
