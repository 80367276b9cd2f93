"""The coordinator installs and runs without torch (`pip install trellis-fgl`, no extras).

`make test-coordinator` runs the coordinator's slice of the suite in an environment made that way;
these tests check that it really lacks torch and that every coordinator module still imports.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import subprocess
import sys

import pytest

import trellis.coordinator as coordinator_package

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is not None,
    reason="needs the torch-free environment of `make test-coordinator`")

# The simulation modules that train silos' models (DESIGN §3): the simulated silos both engines
# share, the sequential engine, and the Ray engine's silo actors and loop. Its machine side
# (simulation.machine) and the engines' settings (simulation.options) need no torch, like the rest
# of the coordinator.
SIMULATION = {"trellis.coordinator.simulation.silos",
              "trellis.coordinator.simulation.sequential",
              "trellis.coordinator.simulation.ray_actors",
              "trellis.coordinator.simulation.ray_engine"}


def test_this_environment_has_neither_torch_nor_torch_geometric() -> None:
    assert importlib.util.find_spec("torch") is None
    assert importlib.util.find_spec("torch_geometric") is None


def test_every_coordinator_module_but_the_simulation_imports_without_torch() -> None:
    # Every module of every sub-package (walk_packages imports the packages to look inside),
    # except the entry points: importing `cli.__main__` runs the command line.
    names = [m.name for m in pkgutil.walk_packages(coordinator_package.__path__,
                                                   "trellis.coordinator.")
             if not m.name.endswith(".__main__")]
    assert "trellis.coordinator.serving.service" in names and SIMULATION <= set(names)
    assert "trellis.coordinator.simulation.machine" in names
    for name in names:
        if name not in SIMULATION:
            importlib.import_module(name)


def test_coordinator_simulate_says_it_needs_the_silo_extra(tmp_path) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text('[federation]\nid = "f"\nalgorithm = "fedavg"\nrounds = 1\n'
                    'silos = ["a", "b"]\n[simulation.data]\na = "a"\nb = "b"\n')
    done = subprocess.run([sys.executable, "-m", "trellis.coordinator.cli", "simulate",
                           "--plan", str(plan)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "pip install 'trellis-fgl[silo]'" in done.stderr
    assert "Traceback" not in done.stderr
