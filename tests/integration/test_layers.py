"""The layer rule of DESIGN.md §3 is enforced by import-linter contracts (pyproject.toml).

`make lint` runs them on the real tree; these tests show that each one catches a violation: a copy
of the packages with one import added (a silo module importing the coordinator, the coordinator
importing torch, a silo layer importing one above it, round logic importing gRPC, two modules
importing each other...) breaks the contract named. docs/architecture.md lists the contracts.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grimp
import pytest

from tests.paths import ROOT

PACKAGES = ("silo", "coordinator", "crypto", "protos")
CONTRACTS = 8      # in pyproject.toml's [tool.importlinter]


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
    return subprocess.run([str(lint), str(tmp_path / "pyproject.toml")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})


def _broken_section(done: subprocess.CompletedProcess[str]) -> str:
    """What lint-imports says about the broken contracts, after its summary."""
    assert done.returncode == 1, done.stdout[-2000:]
    assert "BROKEN" in done.stdout, done.stdout[-2000:]
    return done.stdout.split("Broken contracts")[-1]


def test_the_contracts_hold_on_this_tree(tmp_path: Path) -> None:
    done = _lint_copy(tmp_path, "silo.cli.app", "")
    assert done.returncode == 0, done.stdout[-2000:]
    assert f"{CONTRACTS} kept, 0 broken" in done.stdout


@pytest.mark.parametrize("module,line,broken", [
    # Between the packages.
    ("silo.training.trainer", "import trellis.coordinator.rounds.machine  # noqa",
     "Layers: crypto"),
    ("coordinator.rounds.strategies", "import trellis.silo.models.graph_classifiers  # noqa",
     "Layers: crypto"),
    ("coordinator.serving.core", "import torch  # noqa", "needs no torch"),
    ("silo.models.batching", "import torch_geometric.data  # noqa", "needs no torch_geometric"),
    ("crypto.shamir", "import trellis.protos.plan  # noqa", "Layers: crypto"),
    ("coordinator.operations.status", "import trellis.protos.federation_pb2  # noqa",
     "Only the codec"),
    # Inside the silo: training never reaches the federation protocol (the import that
    # silo/training/failures.py replaced), data and models never reach what sits above them.
    ("silo.training.parallel_trainer", "import trellis.silo.federation.driver  # noqa",
     "Silo layers"),
    ("silo.data.tu", "import trellis.silo.operations.status  # noqa", "Silo layers"),
    ("silo.models.dense", "import trellis.silo.privacy.budget  # noqa", "Silo layers"),
    # Inside the coordinator: state under everything that reads it, serving and the simulation
    # apart, operations and onboarding apart.
    ("coordinator.state.checkpoint", "import trellis.coordinator.serving.health  # noqa",
     "Coordinator layers"),
    ("coordinator.serving.core", "import trellis.coordinator.simulation.options  # noqa",
     "Coordinator layers"),
    ("coordinator.operations.report", "import trellis.coordinator.pki.onboarding  # noqa",
     "Coordinator layers"),
    # Round logic: no gRPC, even where no layer is crossed.
    ("coordinator.rounds.strategies", "import grpc  # noqa", "Round logic is pure"),
])
def test_a_forbidden_import_breaks_a_contract(tmp_path: Path, module: str, line: str,
                                              broken: str) -> None:
    done = _lint_copy(tmp_path, module, line)
    assert broken in _broken_section(done), done.stdout[-2000:]
    assert f"trellis.{module}" in done.stdout


@pytest.mark.parametrize("module,line,package,edge", [
    # The circle silo/privacy/violations.py undid: the [privacy] table's checks importing the
    # policy that reads the table.
    ("silo.privacy.dp_policy", "import trellis.silo.privacy.policy  # noqa",
     "trellis.silo.privacy", {".policy", ".dp_policy"}),
    # The circle coordinator/simulation/silos.py undid: the Ray engine's actors importing the
    # sequential engine, which hands a run to the Ray engine.
    ("coordinator.simulation.ray_actors",
     "import trellis.coordinator.simulation.sequential  # noqa", "trellis.coordinator.simulation",
     {".sequential", ".ray_engine", ".ray_actors"}),
])
def test_a_new_import_circle_breaks_the_acyclic_contract(tmp_path: Path, module: str, line: str,
                                                         package: str, edge: set[str]) -> None:
    done = _lint_copy(tmp_path, module, line)
    said = _broken_section(done)
    assert "No import cycles" in said and f"No cycles are allowed in {package}." in said, said
    # It names an import that, removed, would break the circle: one between two of its modules.
    breakers = [ln.split()[1:4] for ln in said.splitlines() if ln.startswith("- .")]
    assert any(b[0] in edge and b[2] in edge for b in breakers), said


def _import_circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The graph's strongly connected components of more than one module: each a set of modules
    that import one another round a circle (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        work.append((module, iter(sorted(graph.find_modules_directly_imported_by(module)))))

    for root in sorted(graph.modules):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = []
        visit(root)
        while work:
            module, imported = work[-1]
            for other in imported:
                if other not in index:
                    visit(other)
                    break
                if other in on_stack:
                    low[module] = min(low[module], index[other])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    members: list[str] = []
                    while not members or members[-1] != module:
                        members.append(stack.pop())
                        on_stack.discard(members[-1])
                    if len(members) > 1:
                        circles.append(sorted(members))
    return circles


def test_no_module_is_part_of_an_import_circle() -> None:
    """Every circle among modules, including one through a package's own __init__ (which the
    acyclic contract, comparing a package's children, does not see), named by its modules."""
    graph = grimp.build_graph(*(f"trellis.{p}" for p in PACKAGES))
    circles = _import_circles(graph)
    assert not circles, "modules that import each other: " + "; ".join(
        " <-> ".join(c) for c in circles)


def test_a_circle_through_a_package_init_is_found() -> None:
    """The case the acyclic contract misses: a package's __init__ re-exports a child module that
    imports the package back."""
    graph = grimp.ImportGraph()
    for module in ("p", "p.cli", "p.cli.app", "p.data", "p.data.tu"):
        graph.add_module(module)
    graph.add_import(importer="p.cli", imported="p.cli.app")
    graph.add_import(importer="p.cli.app", imported="p.data.tu")
    assert _import_circles(graph) == []
    graph.add_import(importer="p.cli.app", imported="p.cli")
    assert _import_circles(graph) == [["p.cli", "p.cli.app"]]
