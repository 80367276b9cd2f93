"""Which tests must share a pytest-xdist worker: those that share a module-scoped fixture.

`make test` runs the suite on several workers with ``--dist loadgroup``, which sends the tests
of one ``xdist_group`` to one worker and spreads the others one by one. A module-scoped fixture
(a local Ray, two training processes, a finished federation) would otherwise be made again on
every worker that gets one of its tests: up to one copy per worker, each competing with the
others for the same cores. Tests of a module that share none (a module whose federation and
dropout runs are two fixtures, say) may still run on two workers at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest


def module_fixtures(item: pytest.Item) -> list[str]:
    """The module-scoped fixtures the test uses, directly or through other fixtures."""
    info = getattr(item, "_fixtureinfo", None)       # pytest's own record of them
    if info is None:
        return []
    return sorted(name for name, definitions in info.name2fixturedefs.items()
                  if any(d.scope == "module" for d in definitions))


def worker_groups(items: Sequence[pytest.Item]) -> dict[str, str]:
    """Test id -> group name, for each test that uses a module-scoped fixture: tests joined by
    any chain of fixtures shared two by two are in one group, named by its module and the first
    of its fixtures in alphabetical order (no brackets: xdist reads one as a parameter's end)."""
    parent: dict[tuple[str, str], tuple[str, str]] = {}

    def root(node: tuple[str, str]) -> tuple[str, str]:
        while parent[node] != node:
            node = parent[node]
        return node

    uses = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        nodes = [(module, name) for name in module_fixtures(item)]
        for node in nodes:
            parent.setdefault(node, node)
        for node in nodes[1:]:
            a, b = sorted((root(nodes[0]), root(node)))
            parent[b] = a
        if nodes:
            uses[item.nodeid] = nodes[0]
    return {nodeid: "{}:{}".format(*root(node)) for nodeid, node in uses.items()}
