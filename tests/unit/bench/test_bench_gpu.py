"""bench/gpu.py's planning and record (`make bench-gpu`), without a GPU and without running it.

The parts themselves (child processes timing CHEM, federations, pytest) stand in here as plain
functions handed to ``run_all``; the budget's clock is a counter. What is checked: each phase
gets its share of what is left, a part that fails is recorded with its error and what it had
measured while the next still runs, the record is valid JSON after every part; every algorithm
of the table is in the sweep, plain and private, and every plan the sweep writes is one the
product accepts; a silo's device line is read as the check reads it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT
from tests.support.federation import make_hetero_workspace, make_workspace
from trellis.protos.algorithms import ALGORITHMS
from trellis.protos.plan import load_plan

sys.path.insert(0, str(ROOT / "bench"))

import gpu  # noqa: E402  (bench/ is not a package)
import gpu_chem  # noqa: E402
import gpu_sweep  # noqa: E402
import gpu_tests  # noqa: E402
from gpu_common import PartFailed  # noqa: E402


class Clock:
    """Seconds that pass only when a stand-in part says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_settings_are_tiny_when_quick_and_run_several_federations_on_many_cores() -> None:
    full = gpu.make_settings("cuda", quick=False, cpus=16)
    quick = gpu.make_settings("cpu", quick=True, cpus=2)
    assert full.budget_s == 330 and full.sweep_parallel == 4 and full.parts == gpu.PARTS
    assert quick.chem_rounds == quick.sweep_rounds == 1 and quick.sweep_parallel == 1
    assert quick.budget_s > full.budget_s            # CPUs are slow; still one bounded run
    with pytest.raises(ValueError, match="unknown parts warp: expected some of chem"):
        gpu.make_settings("cuda", False, 16, parts=("chem", "warp"))


def test_the_records_commit_can_be_named_from_where_the_call_is_made(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRELLIS_BENCH_COMMIT", "4164109")
    assert gpu._commit() == "4164109"
    monkeypatch.delenv("TRELLIS_BENCH_COMMIT")
    assert gpu._commit() != "4164109" and gpu._commit()       # git's HEAD here


def test_each_phase_gets_its_weight_of_what_is_left_and_the_timed_parts_run_alone() -> None:
    assert gpu.phases(gpu.PARTS) == [(("chem",), 0.36), (("graphs",), 0.17),
                                     (("many_silos",), 0.06), (("profile",), 0.10),
                                     (("sweep", "cuda_tests"), 0.31)]
    assert gpu.phases(("cuda_tests", "chem")) == [(("chem",), 0.36), (("cuda_tests",), 0.31)]
    assert gpu.phase_seconds(330, [0.36, 0.17, 0.06, 0.10, 0.31]) == pytest.approx(118.8)
    assert gpu.phase_seconds(100, [0.45]) == 100


def test_a_failing_part_is_recorded_with_its_error_and_the_next_still_runs(tmp_path) -> None:
    clock = Clock()
    given: dict[str, float] = {}

    def stand_in(name: str, settings: gpu.Settings, work: Path):
        if name == "cuda_tests":                # cannot even be set up
            raise ImportError("No module named 'gpu_tests'")

        def run(deadline):
            given[name] = deadline.left()
            clock.now += {"chem": 15.0, "many_silos": 100.0}.get(name, 1.0)
            if name == "many_silos":
                raise PartFailed("ray engine: exit 1: no GPU", {"runs": {"sequential": {}}})
            return {"table": {name: 1}}
        return run

    settings = gpu.make_settings("cuda", False, 16, budget_s=300,
                                 parts=("chem", "many_silos", "sweep", "cuda_tests"))
    record = gpu.Record(tmp_path / "gpu.json", {"device": {"name": "a GPU"}})
    gpu.run_all(settings, record, tmp_path, make_work=stand_in, clock=clock)
    parts = json.loads((tmp_path / "gpu.json").read_text())["parts"]
    assert list(parts) == ["chem", "many_silos", "sweep", "cuda_tests"]
    # chem's share: 0.36 of the weights of the chosen phases (0.36, 0.06, 0.31).
    assert parts["chem"] == {"status": "ok", "table": {"chem": 1},
                             "timeout_s": round(300 * 0.36 / 0.73, 1), "seconds": 15.0}
    # What chem left (285 s) is shared by the phases after it, by weight.
    assert given["many_silos"] == pytest.approx(285 * 0.06 / 0.37)
    assert parts["many_silos"]["status"] == "failed"
    assert parts["many_silos"]["error"] == "ray engine: exit 1: no GPU"
    assert parts["many_silos"]["runs"] == {"sequential": {}}
    assert given["sweep"] == pytest.approx(185)            # the last phase: all that is left
    assert parts["sweep"] == {"status": "ok", "table": {"sweep": 1}, "timeout_s": 185.0,
                              "seconds": 1.0}
    assert parts["cuda_tests"]["status"] == "failed"       # beside it, in the same phase
    assert parts["cuda_tests"]["error"] == "ImportError: No module named 'gpu_tests'"
    assert parts["cuda_tests"]["timeout_s"] == 185.0


def test_the_summary_names_the_device_each_figure_and_each_failure() -> None:
    doc = {"device": {"name": "NVIDIA H200", "torch": "2.13.0", "cuda": "12.8", "cpus": 16},
           "elapsed_s": 300.0, "settings": {"budget_s": 330},
           "parts": {"chem": {"status": "ok", "table": {"fedstar": {
               "device": {"s_per_round": 0.1234, "mean_test_acc": 0.7},
               "cpu_1_thread": {"error": "timed out"}}},
               "accuracy": {"rows": {"fedstar": {"test_acc": {"device": 0.7}}}}},
               "graphs": {"status": "ok", "summary": {"fedstar": {
                   "seeds": [1, 2, 3], "plain_s_per_round": 0.6, "graphs_s_per_round": 0.15,
                   "speedup": 4.0, "plain_test_acc": 0.71, "graphs_test_acc": 0.7}}},
               "profile": {"status": "ok", "plain": {
                   "mean_s": 0.723, "gpu_busy_s": 0.0569,
                   "runtime_calls": {"cudaLaunchKernel": 16227, "cuLaunchKernel": 1447,
                                     "cudaMemcpyAsync": 208}}},
               "sweep": {"status": "failed", "error": "1 of 17 runs failed: gcfl"}}}
    lines = gpu.summary(doc)
    assert ("  profile, plain: fedstar 0.723 s/round, GPU busy 0.0569 s, 17674 kernel launches "
            "a round" in lines)
    assert ("  fedstar    plain 0.600 s/round, graphs 0.150 (4.00x); test acc 0.710 / 0.700 "
            "over seeds [1, 2, 3]" in lines)
    assert lines[0].startswith("device: NVIDIA H200 (torch 2.13.0, CUDA 12.8, 16 cores)")
    assert any("fedstar" in line and "device 0.123" in line and "device 0.700" in line
               for line in lines)
    assert "sweep: failed -- 1 of 17 runs failed: gcfl" in lines


def test_the_accuracy_check_flags_a_row_whose_columns_disagree() -> None:
    table = {"fedstar": {"device": {"mean_test_acc": 0.70}, "cpu_1_thread": {
                 "mean_test_acc": 0.72}},
             "gcfl": {"device": {"mean_test_acc": 0.50}, "cpu_1_thread": {
                 "mean_test_acc": 0.70}},
             "feddense": {"device": {"error": "no CUDA"}, "cpu_1_thread": {
                 "mean_test_acc": 0.6}}}
    rows = gpu_chem.accuracy_check(table)["rows"]
    assert rows["fedstar"]["within_tolerance"] is True and rows["fedstar"]["spread"] == 0.02
    assert rows["gcfl"]["within_tolerance"] is False
    assert rows["feddense"]["within_tolerance"] is None      # one column: nothing to compare


def test_ray_gets_a_share_of_the_gpu_per_silo_and_the_sequential_engine_the_device() -> None:
    cuda = gpu_chem.engine_options("cuda", cpus=16)
    assert cuda["sequential"] == ["--device", "cuda"]
    assert cuda["ray"] == ["--engine", "ray", "--ray-cpus", "16", "--cpus-per-silo", "2.28",
                           "--gpus-per-silo", "0.1428"]
    cpu = gpu_chem.engine_options("cpu", cpus=2)
    assert cpu["sequential"] == [] and "--gpus-per-silo" not in cpu["ray"]     # cpu: default


def test_the_sweep_has_every_algorithm_plain_and_the_private_variants() -> None:
    runs = gpu_sweep.sweep_runs()
    assert [r.name for r in runs if not r.mechanism and not r.graphs] == list(ALGORITHMS)
    assert [r.name for r in runs if r.graphs] == ["feddense (TRELLIS_CUDA_GRAPHS=0)"]
    assert {r.name for r in runs if r.mechanism} == {
        "fedstar+ddg", "fedstar+local-gaussian", "feddense+ddg", "feddense+local-gaussian",
        "fedhgn+ddg (silo level)"}
    assert {r.algorithm for r in runs if r.simulated} == {
        a for a, row in ALGORITHMS.items() if row.simulation_only}
    assert len({r.slug for r in runs}) == len(runs)


def test_every_plan_of_the_sweep_is_accepted_as_the_product_reads_it(tmp_path) -> None:
    graphs = make_workspace(tmp_path / "graphs", graphs=12)
    hetero = make_hetero_workspace(tmp_path / "hetero")
    for run in gpu_sweep.sweep_runs():
        ws = hetero if run.hetero else graphs
        path = tmp_path / f"{run.slug}.toml"
        path.write_text(gpu_sweep.plan_text(run, ws, 2, 50123, tmp_path / run.slug))
        plan = load_plan(path)              # refuses, with the reason, a plan it cannot run
        assert plan.public.algorithm == run.algorithm and plan.public.rounds == 2
        assert list(plan.silos) == list(gpu_sweep.silos_of(run, ws))
        assert plan.public.privacy.mechanism == run.mechanism
        assert plan.public.privacy.unit == (run.unit or "record")


def test_a_silos_device_line_is_read_from_its_log() -> None:
    log = ("hospital-a 12:00:01 120 graphs from data/hospital-a (one-hot features, 2 classes) "
           "on cuda:0\nhospital-a 12:00:09 round 1 ...\n")
    assert gpu_sweep.devices_named(log) == ["cuda:0"]
    assert gpu_sweep.devices_named("30 graphs from d (2 classes) on cpu\n") == ["cpu"]
    log = ("a 12:00:01 training steps: CUDA graphs, one per batch shape where the model's ...\n"
           "a 12:00:02 training steps for feddense: plain steps (DualDenseGIN's masked ...)\n"
           "CUDA graphs given up, training on the plain path: RuntimeError: no\n"
           "CUDA graphs of evaluation given up, evaluating on the plain path: RuntimeError: x\n")
    assert gpu_sweep.step_paths_named(log) == [
        "training steps: CUDA graphs, one per batch shape where the model's ...",
        "training steps for feddense: plain steps (DualDenseGIN's masked ...)",
        "CUDA graphs given up, training on the plain path: RuntimeError: no",
        "CUDA graphs of evaluation given up, evaluating on the plain path: RuntimeError: x"]
    assert gpu_sweep.devices_named("heterogeneous graph from d: 90 nodes\n") == []


def test_the_cuda_tests_are_found_by_their_skip_and_read_from_pytests_report(tmp_path) -> None:
    files = [f.relative_to(ROOT).as_posix() for f in gpu_tests.cuda_test_files()]
    assert "tests/integration/test_nproc_option.py" in files
    report = tmp_path / "report.xml"
    report.write_text("""<testsuites><testsuite>
<testcase classname="tests.a" name="test_on_gpu"/>
<testcase classname="tests.a" name="test_fails"><failure message="device mismatch"/></testcase>
<testcase classname="tests.b" name="test_skips"><skipped message="needs a CUDA GPU: x"/>
</testcase></testsuite></testsuites>""")
    read = gpu_tests.read_junit(report)
    assert (read["passed"], read["failed"], read["errors"], read["skipped"]) == (1, 1, 0, 1)
    assert read["messages"] == {"tests.a::test_fails": "device mismatch",
                                "tests.b::test_skips": "needs a CUDA GPU: x"}


def test_tests_still_running_at_the_deadline_get_ctrl_c_then_are_killed() -> None:
    # A real process that would outlive the deadline (pytest, stopped so, still writes its
    # report); one that ignores Ctrl-C is killed after the grace.
    patient = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    code, stopped = gpu_tests._wait_or_interrupt(patient, limit=1.5, grace_s=1.0)
    assert stopped and code != 0
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                 "signal.signal(signal.SIGINT, signal.SIG_IGN); "
                                 "print(flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    assert stubborn.stdout is not None and stubborn.stdout.readline()   # its handler is set
    code, stopped = gpu_tests._wait_or_interrupt(stubborn, limit=1.5, grace_s=1.0)
    assert stopped and code == -9
    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    assert gpu_tests._wait_or_interrupt(quick, limit=60, grace_s=1.0) == (0, False)
