"""The researchers' Python API: load a plan, simulate it, read the results (no CLI)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.federation import write_plan
from trellis.coordinator.simulation.sequential import load_simulation_data, simulate
from trellis.protos.plan import load_plan


@pytest.fixture(scope="module")
def plan_path(workspace_factory):
    ws = workspace_factory("api", graphs=40)
    return write_plan(ws, "api", algorithm="fedstar", rounds=2)


def test_simulate_a_plan_file_gives_the_cli_results(plan_path, tmp_path) -> None:
    results = simulate(plan_path, threads=1)
    assert results["status"] == "completed" and results["algorithm"] == "fedstar"
    assert results["personalised"] is True          # per-silo models (its algorithm row)
    assert [r["round"] for r in results["rounds"]] == [1, 2]
    assert set(results["final_metrics"]) == {"hospital-a", "pharma-b", "social-c"}
    out = tmp_path / "cli.json"
    done = subprocess.run([sys.executable, "-m", "trellis.coordinator.cli", "simulate", "--plan",
                           str(plan_path), "--out", str(out), "--quiet", "--threads", "1"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["final_metrics"] == results["final_metrics"]


def test_simulate_takes_a_loaded_plan_and_loaded_data(plan_path) -> None:
    plan = load_plan(plan_path)
    datasets = load_simulation_data(plan)
    first = simulate(plan, datasets)
    assert simulate(plan, load_simulation_data(plan))["final_metrics"] == first["final_metrics"]


def test_a_plan_without_simulation_data_is_refused_clearly(plan_path, tmp_path) -> None:
    text = plan_path.read_text().split("[simulation]")[0]
    bare = tmp_path / "bare.toml"
    bare.write_text(text)
    with pytest.raises(ValueError, match="simulation.data has no folder for: hospital-a"):
        simulate(bare)
