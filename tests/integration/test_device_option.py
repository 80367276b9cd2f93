"""``--device`` as the operator meets it: the same choices for silo join, silo serve and
coordinator simulate, a GPU this machine lacks refused in one line (exit 2) before anything is
sent, a device error inside a round ending the silo in one line, and simulations on each device.

"A machine without a GPU" is made real on any machine: CUDA_VISIBLE_DEVICES="" hides every GPU
from torch. The cases that need a GPU carry the ``cuda`` mark (tests/support/cuda.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cuda import needs_cuda
from tests.support.federation import (
    HETERO_SILOS,
    Workspace,
    drive_machine_until,
    hetero_graphs,
    write_hetero_plan,
    write_plan,
)
from trellis.coordinator.rounds.machine import RoundMachine
from trellis.coordinator.rounds.strategies import make_strategy
from trellis.coordinator.simulation.sequential import run_simulation
from trellis.crypto.pki import throwaway_identities
from trellis.protos.plan import load_plan
from trellis.silo.data.hetero import save_hetero_folder
from trellis.silo.federation.session import SiloSession
from trellis.silo.training.devices import DeviceFailed
from trellis.silo.training.trainers import make_hetero_trainer

NO_GPU = "--device cuda: no CUDA device is available on this machine"


@pytest.fixture(scope="module")
def ws(workspace_factory) -> Workspace:
    return workspace_factory("device", graphs=20)


def _run(*args: str, hide_gpus: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRELLIS_PROGRESS": "0"}
    if hide_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_simulate_on_the_cpu_runs_its_rounds(ws: Workspace, tmp_path: Path) -> None:
    plan = write_plan(ws, "device-cpu", rounds=2)
    out = tmp_path / "results.json"
    done = _run("trellis.coordinator.cli", "simulate", "--plan", str(plan), "--device", "cpu",
                "--quiet", "--out", str(out))
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text())
    assert results["status"] == "completed" and len(results["rounds"]) == 2


def test_a_gpu_this_machine_lacks_is_refused_by_every_command(ws: Workspace) -> None:
    plan = write_plan(ws, "device-none", rounds=2)
    simulate = _run("trellis.coordinator.cli", "simulate", "--plan", str(plan), "--device",
                    "cuda", hide_gpus=True)
    join = _run("trellis.silo.cli", "join", "--coordinator", "127.0.0.1:1", "--data",
                str(ws.data("hospital-a")), "--identity", str(ws.identity("hospital-a")),
                "--device", "cuda", hide_gpus=True)
    serve = _run("trellis.silo.cli", "serve", "--coordinator", "127.0.0.1:1", "--data",
                 f"chem={ws.data('hospital-a')}", "--identity", str(ws.identity("hospital-a")),
                 "--device", "cuda", hide_gpus=True)
    for done in (simulate, join, serve):
        line = _one_error_line(done)
        assert line.startswith(f"error: {NO_GPU}") and "--device cpu" in line


def test_a_misspelt_device_is_refused_by_every_command(ws: Workspace) -> None:
    plan = write_plan(ws, "device-typo", rounds=2)
    for done in (_run("trellis.coordinator.cli", "simulate", "--plan", str(plan), "--device",
                      "gpu"),
                 _run("trellis.silo.cli", "serve", "--coordinator", "127.0.0.1:1", "--data",
                      f"chem={ws.data('hospital-a')}", "--device", "gpu")):
        assert _one_error_line(done) == ("error: --device 'gpu': expected auto, cpu, cuda or "
                                         "cuda:N")


def test_a_device_error_in_a_round_ends_the_silo_with_one_line(tmp_path: Path) -> None:
    """A layer left on another device (here "meta", standing for a GPU's counterpart) fails in
    round 1's training: the silo stops with DeviceFailed naming the step and the device, which
    silo join prints as one line (exit 1)."""
    ws = Workspace(tmp_path, HETERO_SILOS)
    graphs = hetero_graphs()
    for silo, graph in graphs.items():
        save_hetero_folder(graph, ws.data(silo))
    plan = load_plan(write_hetero_plan(ws, "device-fails", rounds=2, port=1))
    identities = throwaway_identities(list(plan.silos), tmp_path / "ids")
    broken = plan.silos[0]

    def trainer_of(name: str):
        def make(public):
            trainer = make_hetero_trainer(graphs[name], public, name)
            if name == broken:
                trainer.model.decoder.to("meta")
            return trainer
        return make

    machine = RoundMachine(plan, make_strategy("fedhgn", hetero=plan.public.hetero), 0.0)
    sessions = {}
    for name in plan.silos:
        sessions[name] = SiloSession(identities[name], trainer_of(name))
        sessions[name].accept_plan(plan.public.to_json())
        machine.join(name, identities[name].cert_pem, 0.0)
    with pytest.raises(DeviceFailed, match=r"^round 1 local training failed on cpu: Tensor on "
                                           r"device meta is not on the expected device cpu!"):
        drive_machine_until(machine, sessions, lambda: machine.finished)


@needs_cuda("coordinator simulate --device cuda trains every silo on the GPU")
def test_simulate_on_cuda_runs_its_rounds(ws: Workspace, tmp_path: Path) -> None:
    plan = write_plan(ws, "device-cuda", rounds=2)
    out = tmp_path / "results.json"
    done = _run("trellis.coordinator.cli", "simulate", "--plan", str(plan), "--device", "cuda",
                "--quiet", "--out", str(out))
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text())
    assert results["status"] == "completed" and len(results["rounds"]) == 2


@needs_cuda("a FedHGN simulation trains its silos on the GPU")
def test_fedhgn_simulation_on_cuda_runs_its_rounds(tmp_path: Path) -> None:
    ws = Workspace(tmp_path, HETERO_SILOS)
    for silo, graph in hetero_graphs().items():
        save_hetero_folder(graph, ws.data(silo))
    plan = load_plan(write_hetero_plan(ws, "device-hgn", rounds=2, port=1))
    seen: dict[str, set[str]] = {}

    def inspect(machine, sessions) -> None:
        seen["devices"] = {str(s.trainer.device.type) for s in sessions.values()}

    from trellis.coordinator.simulation.sequential import load_simulation_data

    results = run_simulation(plan, load_simulation_data(plan), progress=False, device="cuda",
                             inspect=inspect)
    assert results["status"] == "completed" and len(results["rounds"]) == 2
    assert seen["devices"] == {"cuda"}
