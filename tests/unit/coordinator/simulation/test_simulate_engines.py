"""The simulation engines' settings and the Ray engine's machine host, without torch or Ray.

Flags are checked before anything heavy is loaded, each bad one named with its option; the
machine's host answers only the silo link's calls and sends refusals back as values.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from trellis.coordinator.cli.app import app
from trellis.coordinator.rounds.machine import Stage
from trellis.coordinator.simulation.machine import LINK_CALLS, MachineHost, Refused
from trellis.coordinator.simulation.options import (
    RayOptions,
    capacity_problem,
    check_engine,
    equal_gpu_share,
)
from trellis.protos.messages import Envelope, Phase
from trellis.protos.plan import parse_plan


def test_engine_names_fail_with_the_choices() -> None:
    assert check_engine("ray") == "ray"
    with pytest.raises(ValueError, match="unknown simulation engine 'spark': expected one of "
                                         "sequential, ray"):
        check_engine("spark")


@pytest.mark.parametrize("settings,message", [
    ({"cpus_per_silo": -1.0}, "--cpus-per-silo -1: must be above 0"),
    ({"cpus_per_silo": 0.0}, "--cpus-per-silo 0: must be above 0"),
    ({"cpus_per_silo": float("nan")}, "--cpus-per-silo nan: must be above 0"),
    ({"gpus_per_silo": -0.5}, "--gpus-per-silo -0.5: must be 0 or more"),
    ({"gpus_per_silo": 1.5}, "--gpus-per-silo 1.5: above 1 it must be a whole number"),
    ({"threads": 0}, "--threads 0: must be 1 or more"),
    ({"num_cpus": 0}, "--ray-cpus 0: must be 1 or more"),
    ({"num_cpus": 4, "address": "auto"}, "--ray-cpus sizes a local Ray"),
])
def test_bad_ray_settings_are_refused_naming_the_option(settings, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        RayOptions(**settings)
    assert message in str(refused.value)


def test_every_bad_setting_is_listed_at_once() -> None:
    with pytest.raises(ValueError) as refused:
        RayOptions(cpus_per_silo=-1, gpus_per_silo=-1)
    assert "--cpus-per-silo" in str(refused.value) and "--gpus-per-silo" in str(refused.value)


def test_threads_and_device_follow_the_silos_share() -> None:
    assert RayOptions().silo_threads == 1 and RayOptions().device == "cpu"
    assert RayOptions(cpus_per_silo=0.25).silo_threads == 1
    assert RayOptions(cpus_per_silo=2.5).silo_threads == 2
    assert RayOptions(cpus_per_silo=2, threads=1).silo_threads == 1
    assert RayOptions(gpus_per_silo=0.5).device == "cuda"
    assert RayOptions(gpus_per_silo=2).device == "cuda"
    assert RayOptions().local and not RayOptions(address="ray://head:10001").local


def test_the_ray_device_agrees_with_the_gpu_share() -> None:
    # auto follows the share; cuda without one takes an equal share (equal_gpu_share); cpu
    # refuses one (it would hold GPUs unused).
    assert RayOptions(requested_device="auto").device == "cpu"
    assert RayOptions(requested_device="auto", gpus_per_silo=0.5).device == "cuda"
    assert RayOptions(requested_device="cuda", gpus_per_silo=0.25).device == "cuda"
    assert RayOptions(requested_device="cuda").device == "cuda"
    assert RayOptions(requested_device="cpu").device == "cpu"
    for settings, message in (
            ({"requested_device": "cpu", "gpus_per_silo": 0.5},
             "--device cpu with --gpus-per-silo 0.5: the silos would hold GPUs they do not use"),
            ({"requested_device": "cuda:0", "gpus_per_silo": 1}, "give --device cuda with "
                                                                 "--gpus-per-silo"),
            ({"requested_device": "tpu"}, "--device 'tpu': expected auto, cpu, cuda or cuda:N")):
        with pytest.raises(ValueError) as refused:
            RayOptions(**settings)
        assert message in str(refused.value)


def test_silos_that_cannot_all_live_at_once_are_refused_with_a_share_that_fits() -> None:
    cluster = {"CPU": 2.0, "memory": 1e9}
    assert capacity_problem(cluster, 6, RayOptions(cpus_per_silo=0.33)) is None
    assert capacity_problem(cluster, 6, RayOptions(cpus_per_silo=1 / 3)) is None
    problem = capacity_problem(cluster, 6, RayOptions())
    assert problem == ("6 silos x 1 CPU need 6 CPUs but the Ray cluster has 2: let the silos "
                       "share with --cpus-per-silo 0.33, or give the local Ray more with "
                       "--ray-cpus")
    problem = capacity_problem(cluster, 4, RayOptions(cpus_per_silo=0.5, gpus_per_silo=0.5))
    assert problem is not None and problem.startswith("4 silos x 0.5 GPU need 2 GPUs but the "
                                                      "Ray cluster has 0: train on CPUs with "
                                                      "--gpus-per-silo 0")
    gpus = {"CPU": 64.0, "GPU": 1.0}
    assert capacity_problem(gpus, 4, RayOptions(gpus_per_silo=0.25)) is None
    assert "--gpus-per-silo 0.16" in str(capacity_problem(gpus, 6, RayOptions(gpus_per_silo=0.25,
                                                                              address="auto")))


# No GPU here: these check only what the actors would ask Ray for, from the resources a Ray
# cluster with GPUs reports (the CUDA run itself: tests/integration/test_ray_engine.py).
def test_on_cuda_each_silo_asks_for_an_equal_share_of_one_gpu_so_all_train_at_once() -> None:
    cuda = RayOptions(requested_device="cuda")
    assert cuda.device == "cuda"
    assert cuda.actor_resources(7, cluster_gpus=1.0) == {"num_cpus": 1.0, "num_gpus": 0.1428}
    assert cuda.actor_resources(4, cluster_gpus=1.0) == {"num_cpus": 1.0, "num_gpus": 0.25}
    assert cuda.actor_resources(1, cluster_gpus=1.0)["num_gpus"] == 1.0
    # Seven silos on two GPUs: four and three, a quarter each (a share never spans two GPUs).
    assert cuda.actor_resources(7, cluster_gpus=2.0)["num_gpus"] == 0.25
    # Shares add up to at most one GPU, in Ray's units of 1/10000.
    for silos in range(1, 40):
        share = equal_gpu_share(silos)
        assert 0 < share and round(share * 10_000) * silos <= 10_000
    # A share given by the operator wins; on CPUs no GPU is asked for.
    given = RayOptions(requested_device="cuda", gpus_per_silo=0.5)
    assert given.actor_resources(7, 1.0)["num_gpus"] == 0.5
    # auto follows the share: none given, none asked for.
    assert RayOptions(requested_device="auto").actor_resources(7, 1.0)["num_gpus"] == 0.0
    assert RayOptions().actor_resources(7, cluster_gpus=1.0) == {"num_cpus": 1.0, "num_gpus": 0.0}
    assert RayOptions(cpus_per_silo=2).actor_resources(3, 0.0) == {"num_cpus": 2, "num_gpus": 0.0}
    with pytest.raises(ValueError, match="0 silos: a simulation needs at least one"):
        equal_gpu_share(0)


def test_cuda_silos_fit_one_gpu_and_are_refused_with_the_way_out_where_there_is_none() -> None:
    cuda = RayOptions(requested_device="cuda", cpus_per_silo=2)
    assert capacity_problem({"CPU": 16.0, "GPU": 1.0}, 7, cuda) is None
    assert capacity_problem({"CPU": 16.0, "GPU": 1.0}, 7, RayOptions(gpus_per_silo=0.25,
                                                                     cpus_per_silo=2)) == (
        "7 silos x 0.25 GPU need 1.75 GPUs but the Ray cluster has 1: let the silos share with "
        "--gpus-per-silo 0.14")
    assert capacity_problem({"CPU": 16.0}, 7, cuda) == (
        "7 silos x 0.1428 GPU need 0.9996 GPUs but the Ray cluster has 0: train on CPUs with "
        "--device cpu")


@pytest.mark.parametrize("args,message", [
    (["--engine", "spark"], "unknown simulation engine 'spark': expected one of sequential, ray"),
    (["--engine", "ray", "--cpus-per-silo", "-1"], "--cpus-per-silo -1: must be above 0"),
    (["--engine", "ray", "--gpus-per-silo", "2.5"], "--gpus-per-silo 2.5: above 1 it must be a "
                                                  "whole number"),
    (["--cpus-per-silo", "0.5"], "--cpus-per-silo: for --engine ray only (this run's engine is "
                                 "sequential)"),
    (["--ray-address", "auto", "--ray-cpus", "2"], "--ray-address, --ray-cpus: for --engine ray "
                                                   "only"),
    (["--device", "gpu"], "--device 'gpu': expected auto, cpu, cuda or cuda:N"),
    (["--engine", "ray", "--device", "cpu", "--gpus-per-silo", "0.5"],
     "--device cpu with --gpus-per-silo 0.5: the silos would hold GPUs they do not use"),
    (["--engine", "ray", "--device", "cuda:1", "--gpus-per-silo", "1"],
     "--device cuda:1: with --engine ray each silo's actor trains on the GPU Ray gives it"),
])
def test_the_cli_refuses_bad_engine_flags_in_one_line_before_reading_the_plan(
        args: list[str], message: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["simulate", "--plan", str(tmp_path / "absent.toml"),
                                      *args])
    assert result.exit_code == 2, result.output
    assert f"error: {message}" in " ".join(result.output.split())
    assert "Traceback" not in result.output


def _plan() -> object:
    return parse_plan({"federation": {"id": "f", "algorithm": "fedavg", "rounds": 1,
                                      "silos": ["a", "b"]}}, base_dir=Path("."))


def test_the_machine_host_answers_only_the_link_calls_and_returns_refusals() -> None:
    host = MachineHost(_plan(), clock=lambda: 0.0)
    assert "fetch_state" in LINK_CALLS and "join" not in LINK_CALLS
    with pytest.raises(ValueError, match="'tick' is not a call of the silo's link"):
        host.call("a", "tick", 5.0)
    with pytest.raises(ValueError, match="'z' is not a silo of the plan"):
        host.call("z", "fetch_state", Envelope("f", 1, 0, Phase.FETCH_STATE))
    # Not joined yet: the machine refuses, and the refusal travels as a value.
    answer = host.call("a", "fetch_state", Envelope("f", 1, 0, Phase.FETCH_STATE))
    assert isinstance(answer, Refused) and "has not joined" in answer.reason


def test_the_machine_hosts_view_hands_each_event_over_once() -> None:
    host = MachineHost(_plan(), clock=lambda: 0.0)
    host.join("a", b"cert-a")
    first = host.view()
    assert [e.kind for e in first.events] == ["silo_joined"] and first.stage is Stage.WAITING
    assert first.due == {} and not first.finished
    assert host.view().events == []
    host.join("b", b"cert-b")               # all present: the first round opens
    view = host.view()
    assert view.stage in (Stage.ADVERTISE, Stage.SETUP_ADVERTISE)
    assert set(view.due) == set(view.waiting) == {"a", "b"}
    assert all(i.envelope.phase is Phase.ROUND_OPEN for i in view.due.values())
