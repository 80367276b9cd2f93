"""`coordinator simulate --engine ray` on a real local Ray of 2 CPUs: six silos as actors give the
sequential engine's results seed for seed, and no Ray process outlives the run.

One Ray serves the module (started and stopped by the engine's own runtime, as a local run does);
the runs find it already connected and leave it up.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from tests.support.federation import write_plan
from tests.support.processes import ray_processes, raylets
from trellis.coordinator.cli.app import app
from trellis.coordinator.simulation.options import RayOptions, equal_gpu_share
from trellis.coordinator.simulation.sequential import load_simulation_data, simulate
from trellis.protos.plan import load_plan

ray = pytest.importorskip("ray", reason="needs the ray extra: pip install -e '.[ray]'")

from trellis.coordinator.simulation import ray_engine  # noqa: E402 (after the skip)
from trellis.coordinator.simulation.ray_engine import (  # noqa: E402 (after the skip)
    RayMissing,
    check_address,
    import_ray,
    ray_runtime,
    run_ray_simulation,
)

SHARE = 0.33          # six silos' actors on two CPUs


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A local Ray of 2 CPUs, started and stopped by the engine's ray_runtime."""
    # A short folder: Ray's socket paths under it must fit in 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="trellis-rt-", dir="/tmp"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tempfile, "tempdir", str(root))      # where the runtime puts its folder
        runtime = ray_runtime(RayOptions(num_cpus=2))
        runtime.__enter__()
    try:
        raylet_ids = raylets(str(root))
        assert raylet_ids and ray.cluster_resources()["CPU"] == 2
        yield
    finally:
        runtime.__exit__(None, None, None)
    deadline = time.monotonic() + 20
    while (left := ray_processes(str(root), raylet_ids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [f"{p.pid} {p.command}" for p in left] == [], "Ray processes outlived the run"
    assert list(root.iterdir()) == [], "the runtime left its Ray folder behind"
    root.rmdir()


@pytest.fixture(scope="module")
def six_silos(workspace_factory) -> Path:
    ws = workspace_factory("ray-engine", graphs=30, extra=3)
    assert len(ws.silos) == 6
    plan = write_plan(ws, "ray-engine", algorithm="fedstar", rounds=2, min_silos=6)
    # Six actors and the machine's each import torch before they load their data, on 2 cores
    # shared with other tests (make test runs several pytest workers): a margin over
    # write_plan's 120 s, as the test is about results, not start-up time.
    plan.write_text(plan.read_text().replace("join_s = 120", "join_s = 240"))
    return plan


def _without_timings(results: dict[str, Any]) -> dict[str, Any]:
    doc = {k: v for k, v in results.items() if k not in ("elapsed_s", "engine")}
    doc["rounds"] = [{k: v for k, v in r.items() if k != "seconds"} for r in results["rounds"]]
    return doc


@pytest.mark.timeout(600)       # a slow start may take the plan's whole join_s (above)
def test_six_silo_actors_on_two_cpus_give_the_sequential_results(local_ray, six_silos) -> None:
    plan = load_plan(six_silos)
    loaded = load_simulation_data(plan)
    sequential = simulate(plan, loaded, threads=1)
    # Both ways of giving data in one run: a folder (read by the silo's actor, where it runs)
    # for every other silo, graphs loaded here (through Ray's object store) for the rest.
    data = {s: (plan.simulation_data[s] if i % 2 else loaded[s])
            for i, s in enumerate(plan.silos)}
    on_ray = run_ray_simulation(plan, data, RayOptions(cpus_per_silo=SHARE), progress=True)
    assert sequential["engine"] == "sequential" and on_ray["engine"] == "ray"
    assert on_ray["status"] == "completed" and len(on_ray["final_metrics"]) == 6
    # Every round's reported metrics and every final figure, exactly (floats compared as equal).
    assert _without_timings(on_ray) == _without_timings(sequential)


def test_a_local_rays_workers_run_at_the_runs_own_priority(local_ray) -> None:
    # Ray's own niceness of 15 left the silo actors a few percent of a core beside other busy
    # processes: the six-silo test above took its whole join_s in CI (bench/ray_niceness.py).
    def niceness() -> int:
        return os.nice(0)

    assert ray.get(ray.remote(num_cpus=0)(niceness).remote()) == os.nice(0)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU: six silo actors train on one GPU at once")
@pytest.mark.timeout(600)
def test_six_silo_actors_on_cuda_share_the_gpu_and_complete(local_ray, six_silos) -> None:
    plan = load_plan(six_silos)
    options = RayOptions(cpus_per_silo=SHARE, requested_device="cuda")
    gpus = ray.cluster_resources().get("GPU", 0.0)
    assert gpus >= 1, "Ray found no GPU on a machine where torch sees one"
    # Every actor holds its share for the whole run: all six live on the GPU(s) at once.
    assert options.actor_resources(6, gpus)["num_gpus"] == equal_gpu_share(6, gpus) <= 1 / 6
    # Each actor refuses to start where its torch sees no CUDA device (ray_actors.SiloHost).
    on_ray = run_ray_simulation(plan, plan.simulation_data, options, progress=False)
    assert on_ray["status"] == "completed" and len(on_ray["final_metrics"]) == 6
    assert all(0.0 <= m["test_acc"] <= 1.0 for m in on_ray["final_metrics"].values())


def test_the_cli_refuses_silos_that_do_not_fit_the_cluster_before_any_actor_starts(
        local_ray, six_silos, monkeypatch) -> None:
    # The command turns SIGTERM into an interrupt; this process keeps its own handling.
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    result = CliRunner().invoke(app, ["simulate", "--plan", str(six_silos), "--engine", "ray",
                                      "--quiet"])
    assert result.exit_code == 2, result.output
    assert ("error: 6 silos x 1 CPU need 6 CPUs but the Ray cluster has 2: let the silos share "
            "with --cpus-per-silo 0.33") in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_a_bad_data_folder_read_by_an_actor_is_reported_with_its_silo(local_ray,
                                                                       workspace_factory,
                                                                       tmp_path: Path) -> None:
    ws = workspace_factory("ray-engine-bad", graphs=20)
    path = write_plan(ws, "ray-engine-bad", algorithm="fedstar", rounds=1)
    # The actors' start on a loaded machine, as for six_silos above: the test is about the error.
    path.write_text(path.read_text().replace("join_s = 120", "join_s = 240"))
    plan = load_plan(path)
    bad = tmp_path / "graphs"
    bad.mkdir()
    (bad / "BAD_graph_indicator.txt").write_text("1\n1\n")
    (bad / "BAD_graph_labels.txt").write_text("1\n")
    (bad / "BAD_A.txt").write_text("1, 2\n2, x\n")
    data = {**plan.simulation_data, "pharma-b": bad}
    with pytest.raises(ValueError, match="silo pharma-b: BAD_A.txt line 2"):
        run_ray_simulation(plan, data, RayOptions(cpus_per_silo=SHARE), progress=False)


def test_a_missing_ray_names_the_extra_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)      # as if Ray were not installed
    with pytest.raises(RayMissing, match=r"pip install 'trellis-fgl\[ray\]'"):
        import_ray()


def test_a_cluster_address_where_nothing_answers_fails_at_once() -> None:
    # ray.init itself would retry it for many minutes.
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"cannot join the Ray cluster at --ray-address "
                                         r"ray://127\.0\.0\.1:1: nothing answers there"):
        check_address("ray://127.0.0.1:1")
    assert time.monotonic() - started < 5
    check_address("auto")          # Ray's to find


_SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)"]


def _until_started(process: subprocess.Popen[bytes], mark: str, timeout_s: float = 30.0) -> None:
    """Wait until ``process`` runs its own command line (naming ``mark``), as a real Ray
    process does by the time ray.init gives up: before its exec it still shows this test's
    command line, which the engine rightly does not take for Ray's (seen on a loaded machine)."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if any(mark in arg for arg in psutil.Process(process.pid).cmdline()):
                return
        except psutil.Error:
            return
        time.sleep(0.01)


class _SlowThenReadyRay:
    """Stands in for Ray's module where a real one cannot be made slow on demand: its first
    ``failures`` local starts leave a real process behind (as a GCS or raylet started inside a
    failed ray.init is: its command line names the run's Ray folder) and fail as Ray's do when
    the GCS or raylet misses its wait, or raise ``error`` instead; the next succeeds. Each start
    also starts a process of somebody else's (no Ray folder), which must be left alone."""

    def __init__(self, failures: int, message: str,
                 error: type[BaseException] = Exception) -> None:
        self.failures, self.message, self.error = failures, message, error
        self.inits, self.shutdowns = 0, 0
        self.left: list[subprocess.Popen[bytes]] = []
        self.others: list[subprocess.Popen[bytes]] = []
        self.gcs_waits: list[str | None] = []
        self.nicenesses: list[str | None] = []

    def is_initialized(self) -> bool:
        return False

    def init(self, **options: object) -> None:
        self.inits += 1
        self.gcs_waits.append(os.environ.get("RAY_gcs_server_port_wait_time_s"))
        self.nicenesses.append(os.environ.get("RAY_worker_niceness"))
        self.others.append(subprocess.Popen(_SLEEPER))
        if self.inits <= self.failures:
            left = subprocess.Popen([*_SLEEPER, str(options["_temp_dir"])])
            self.left.append(left)
            _until_started(left, str(options["_temp_dir"]))
            raise self.error(self.message)

    def shutdown(self, **_: object) -> None:
        self.shutdowns += 1

    def check_and_clean(self) -> None:
        """Every failed start's process is gone and nobody else's was touched; then none is
        left running whatever the test found."""
        try:
            assert all(process.poll() is not None for process in self.left)
            assert all(process.poll() is None for process in self.others)
        finally:
            for process in self.left + self.others:
                process.kill()
                process.wait()


_SLOW_GCS = "Timed out waiting for file /tmp/x/session_1/gcs_server_port_4d1d"
_SLOW_RAYLET = "The current node timed out during startup. This could happen ..."


@pytest.mark.parametrize("message", [_SLOW_GCS, _SLOW_RAYLET])
@pytest.mark.parametrize(("failures", "started"), [(1, True), (2, False)])
def test_a_local_ray_slow_to_start_is_tried_once_more(monkeypatch, failures: int, started: bool,
                                                      message: str) -> None:
    monkeypatch.delenv("RAY_gcs_server_port_wait_time_s", raising=False)
    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    fake = _SlowThenReadyRay(failures, message)
    monkeypatch.setattr(ray_engine, "import_ray", lambda: fake)
    runtime = ray_engine.ray_runtime(RayOptions(num_cpus=1))
    if started:
        with runtime:
            pass
        assert fake.inits == 2 and fake.shutdowns == 2      # the failed node, then the run's
    else:
        with pytest.raises(Exception, match=re.escape(message[:20])), runtime:
            pass
        assert fake.inits == 2
    # Every failed start's process was stopped, not left to outlive the run.
    assert len(fake.left) == failures
    fake.check_and_clean()
    # The GCS had 120 s to publish its port, the workers the run's niceness, at each start;
    # and the variables are gone again.
    assert fake.gcs_waits == ["120", "120"] and fake.nicenesses == ["0", "0"]
    assert "RAY_gcs_server_port_wait_time_s" not in os.environ
    assert "RAY_worker_niceness" not in os.environ


def test_an_operators_ray_settings_are_kept_and_other_errors_are_not_retried(monkeypatch
                                                                              ) -> None:
    monkeypatch.setenv("RAY_gcs_server_port_wait_time_s", "300")
    monkeypatch.setenv("RAY_worker_niceness", "10")
    fake = _SlowThenReadyRay(1, "object_store_memory is too large")
    monkeypatch.setattr(ray_engine, "import_ray", lambda: fake)
    with pytest.raises(Exception, match="too large"), ray_engine.ray_runtime(
            RayOptions(num_cpus=1)):
        pass
    assert fake.inits == 1 and fake.gcs_waits == ["300"] and fake.nicenesses == ["10"]
    fake.check_and_clean()
    assert os.environ["RAY_gcs_server_port_wait_time_s"] == "300"
    assert os.environ["RAY_worker_niceness"] == "10"


def test_a_start_interrupted_by_ctrl_c_leaves_nothing_and_is_not_retried(monkeypatch) -> None:
    monkeypatch.delenv("RAY_gcs_server_port_wait_time_s", raising=False)
    fake = _SlowThenReadyRay(1, _SLOW_GCS, error=KeyboardInterrupt)
    monkeypatch.setattr(ray_engine, "import_ray", lambda: fake)
    with pytest.raises(KeyboardInterrupt), ray_engine.ray_runtime(RayOptions(num_cpus=1)):
        pass
    assert fake.inits == 1
    fake.check_and_clean()
    assert "RAY_gcs_server_port_wait_time_s" not in os.environ
