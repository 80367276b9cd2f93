"""``coordinator simulate``: the plan's algorithm on every silo's data, in one process or on Ray.

The simulation trains the silos' models, so torch (and Ray) are imported only inside the
command: the rest of the coordinator's command line runs without them.
"""

from __future__ import annotations

from pathlib import Path

import typer

from trellis.coordinator.cli.common import (
    EXIT_FAILED,
    fail,
    load_plan_or_exit,
    privacy_preamble,
)


def simulate(plan: Path = typer.Option(..., "--plan", help="plan.toml with a \\[simulation] "
                                                             "table: data = { silo = folder }"),
             out: Path = typer.Option(None, help="results file (default: state_dir/results-"
                                                 "simulation.json)"),
             threads: int = typer.Option(None, help="torch intra-op threads (with --engine "
                                                    "ray: in each silo's actor)"),
             quiet: bool = typer.Option(False, help="no progress lines"),
             device: str = typer.Option(None, help="where the silos train: cpu, cuda, cuda:N "
                                                   "or auto (a GPU if there is one); default "
                                                   "cpu; with --engine ray: cuda or auto with "
                                                   "--gpus-per-silo"),
             engine: str = typer.Option("sequential", help="sequential: every silo in this "
                                                           "process, in turn; ray: each silo a "
                                                           "Ray actor, in parallel (the ray "
                                                           "extra); same results"),
             ray_address: str = typer.Option(None, "--ray-address",
                                             help="ray engine: join this Ray cluster (auto, "
                                                  "host:port or ray://host:port) instead of "
                                                  "starting a local Ray for the run"),
             ray_cpus: int = typer.Option(None, "--ray-cpus",
                                          help="ray engine: CPUs of the local Ray (default: "
                                               "this machine's)"),
             cpus_per_silo: float = typer.Option(None, "--cpus-per-silo",
                                                 help="ray engine: CPUs each silo's actor "
                                                      "reserves for the run (default 1; 0.5: "
                                                      "two silos per CPU)"),
             gpus_per_silo: float = typer.Option(None, "--gpus-per-silo",
                                                 help="ray engine: GPUs each silo's actor "
                                                      "reserves, fractions allowed (default 0: "
                                                      "train on CPUs)")) -> None:
    """Run the plan's algorithm on each silo's data folder, in this process or on Ray (for
    research)."""
    from trellis.coordinator.simulation.options import RayOptions, check_engine
    from trellis.protos.devices import check_device_spec

    # Flags first, before the plan, torch or Ray are loaded: a typo fails at once.
    try:
        check_engine(engine)
        check_device_spec(device or "cpu")
    except ValueError as exc:
        fail(str(exc))
    ray_flags = {"--ray-address": ray_address, "--ray-cpus": ray_cpus,
                 "--cpus-per-silo": cpus_per_silo, "--gpus-per-silo": gpus_per_silo}
    given = [flag for flag, value in ray_flags.items() if value is not None]
    if engine != "ray" and given:
        fail(f"{', '.join(given)}: for --engine ray only (this run's engine is {engine})")
    options = None
    if engine == "ray":
        try:
            options = RayOptions(address=ray_address or "",
                                 cpus_per_silo=1.0 if cpus_per_silo is None else cpus_per_silo,
                                 gpus_per_silo=gpus_per_silo or 0.0, threads=threads,
                                 num_cpus=ray_cpus, requested_device=device or "auto")
        except ValueError as exc:
            fail(str(exc))
    loaded = load_plan_or_exit(plan)
    if loaded.silos_without_data:
        fail("simulation.data has no folder for: " + ", ".join(loaded.silos_without_data))
    from trellis.coordinator.state.results import accuracy_table
    from trellis.protos.files import write_json_atomic
    from trellis.protos.stop import describe, exit_code, stop_on_sigterm

    try:
        # The simulation trains every silo's model: it needs the silo's torch.
        from trellis.coordinator.simulation import sequential as simulation
    except ImportError as exc:
        fail(f"coordinator simulate trains the silos' models and needs torch ({exc}); install "
             "the silo extra: pip install 'trellis-fgl[silo]'")
    resolved = "cpu"
    if options is None:
        try:
            resolved = simulation.simulation_device(device or "cpu")
        except ValueError as exc:       # cuda on a machine without a GPU
            fail(str(exc))
    if options is not None:
        from trellis.coordinator.simulation import ray_engine

        try:
            ray_engine.import_ray()
        except ray_engine.RayMissing as exc:
            fail(str(exc))
    if not quiet:
        for line in privacy_preamble(loaded):
            typer.echo(line)
    stop_on_sigterm()      # a stop unwinds the run as Ctrl-C does (a local Ray is shut down)
    try:
        if options is not None:
            # Each silo's actor reads its own folder, where it runs.
            results = simulation.simulate(loaded, engine="ray", ray=options,
                                          progress=not quiet)
        else:
            if threads:
                simulation.set_threads(threads)
            datasets = simulation.load_simulation_data(loaded)
            results = simulation.run_simulation(loaded, datasets, progress=not quiet,
                                                device=resolved)
    except ValueError as exc:       # bad data folders, or silos that do not fit the Ray cluster
        fail(str(exc))
    except simulation.DeviceFailed as exc:    # a silo's step failed on its GPU
        fail(str(exc), EXIT_FAILED)
    except RuntimeError as exc:
        if options is None or not isinstance(exc, ray_engine.RayRunFailed):
            raise
        fail(str(exc), EXIT_FAILED)
    except KeyboardInterrupt as exc:
        typer.echo(f"simulation {describe(exc)}; no results written", err=True)
        raise typer.Exit(exit_code(exc)) from None
    target = out or loaded.server.state_dir / "results-simulation.json"
    write_json_atomic(target, results)
    typer.echo(accuracy_table(results))
    typer.echo(f"results: {target}")
    if results["status"] != "completed":
        fail(f"simulation {results['status']}: {results['failure']}", EXIT_FAILED)
