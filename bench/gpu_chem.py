"""bench/gpu.py's timed parts: the CHEM table and many silos on one GPU.

The CHEM table: seconds per round of local training on the 7 CHEM silos in one process
(bench/speed_chem.py's ``measure``, in a fresh child per figure), for FedStar, FedDense and
GCFL (and the authors' FedStar, bench/fedstar_authors.py, when a checkout is given) on the
device, on the CPU at one torch thread and on the CPU at every core's thread; with each figure,
the silos' mean test accuracy after the last round, which the device must not change. The
device column and the all-threads column run one child at a time; the one-thread children run
together (one core each), which saves their minutes and leaves the other cores idle.

Many silos on one GPU: the 7-silo CHEM FedStar plan under `coordinator simulate`, the
sequential engine (every silo in turn, on the device) against the Ray engine with each silo's
actor holding a share of the GPU (options.equal_gpu_share), seconds per round.
"""

from __future__ import annotations

import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpu_common import (
    BENCH,
    CHEM,
    TU,
    Deadline,
    PartFailed,
    child_env,
    last_json,
    python,
    run_child,
    simulate_device,
)

ALGORITHMS = ("fedstar", "feddense", "gcfl")
AUTHORS_ROW = "authors' fedstar"
# Timed rounds of a GPU figure: a round there takes a tenth of a second, and the CUDA graphs
# recorded in its first rounds (steps by batch shape, evaluations at their second pass) would
# weigh on a mean of three; the median is recorded too.
GPU_ROUNDS = 10
# Test accuracies of one row may differ by this much between columns before the record flags
# it: the device's floats round differently and its dropout masks come from its own generator.
ACCURACY_TOLERANCE = 0.05


def columns(device: str, cpus: int) -> dict[str, tuple[str, int]]:
    """The table's columns: name -> (device, torch threads)."""
    return {"device": (device, cpus), "cpu_1_thread": ("cpu", 1),
            "cpu_all_threads": ("cpu", cpus)}


def chem_table(device: str, cpus: int, rounds: int, deadline: Deadline,
               authors: Path | None = None, datasets: tuple[str, ...] = CHEM) -> dict[str, Any]:
    """Every figure of the table (ours over ``datasets``; the authors' code always over CHEM);
    a figure that fails is recorded with its error."""
    if not TU.is_dir():
        raise PartFailed(f"needs the shared datasets at {TU}")
    rows = list(ALGORITHMS)
    table: dict[str, dict[str, Any]] = {row: {} for row in rows}
    if authors is not None:
        table[AUTHORS_ROW] = {}
        try:
            _prepare_authors(authors)
            rows.append(AUTHORS_ROW)
        except Exception as exc:       # their code's set-up: recorded, ours still runs
            table[AUTHORS_ROW]["error"] = f"{type(exc).__name__}: {exc}"
    spec = columns(device, cpus)
    # Alone, one after another: the device column, then every core's threads (on a CPU run the
    # same figure, measured once).
    for column in ("device", "cpu_all_threads"):
        for row in rows:
            if row == AUTHORS_ROW and column == "cpu_all_threads":
                continue
            same = column != "device" and spec[column] == spec["device"]
            timed = (max(rounds, GPU_ROUNDS) if column == "device" and spec[column][0] == "cuda"
                     else rounds)
            table[row][column] = (table[row]["device"] if same else
                                  _figure(row, *spec[column], timed, deadline, authors,
                                          datasets))
    # One thread each, together.
    with ThreadPoolExecutor(max_workers=len(rows)) as pool:
        ones = {row: pool.submit(_figure, row, *spec["cpu_1_thread"], rounds, deadline,
                                 authors, datasets) for row in rows}
    for row, future in ones.items():
        table[row]["cpu_1_thread"] = future.result()
    result = {"rounds": rounds, "datasets": list(datasets),
              "columns": {c: {"device": d, "threads": t} for c, (d, t) in spec.items()},
              "table": table, "accuracy": accuracy_check(table)}
    errors = [f"{row}, {column}: {f['error']}" for row, figures in table.items()
              for column, f in figures.items() if isinstance(f, dict) and "error" in f]
    errors += [f"{row}: {figures['error']}" for row, figures in table.items()
               if isinstance(figures.get("error"), str)]
    if errors:
        raise PartFailed(f"{len(errors)} figure(s) failed; first: {errors[0]}", result)
    return result


def _figure(row: str, device: str, threads: int, rounds: int, deadline: Deadline,
            authors: Path | None, datasets: tuple[str, ...]) -> dict[str, Any]:
    """One child's figure, or its error."""
    what = f"{row} on {device} with {threads} thread{'s' * (threads != 1)}"
    args = ([python(), str(BENCH / "speed_chem.py"), "--authors-child", str(authors)]
            if row == AUTHORS_ROW and authors is not None
            else [python(), str(BENCH / "speed_chem.py"), "--child", row, "--datasets",
                  *datasets])
    args += ["--rounds", str(rounds), "--device", device, "--threads", str(threads)]
    try:
        done = run_child(args, deadline, what, env=child_env(threads))
        figure = last_json(done.stdout, what)
    except PartFailed as exc:
        return {"error": str(exc)}
    keep = ("s_per_round", "min_s", "median_s", "setup_s", "peak_rss_mb", "mean_test_acc",
            "mean_val_acc", "device", "threads", "path")
    return {k: round(v, 4) if isinstance(v, float) else v
            for k, v in figure.items() if k in keep}


def _prepare_authors(authors: Path) -> None:
    """Their data folder and their dependencies (bench/fedstar_authors.py)."""
    if not (authors / "lib" / "setupGC.py").is_file():
        raise PartFailed(f"{authors} is not a checkout of yuetan031/FedStar "
                         "(no lib/setupGC.py)")
    from fedstar_authors import ensure_dependencies, prepare_data

    prepare_data(authors, TU)
    ensure_dependencies(authors, python())


def accuracy_check(table: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per row: each column's mean test accuracy, their spread, whether it is within
    ACCURACY_TOLERANCE (None where fewer than two columns have one)."""
    checks: dict[str, Any] = {}
    for row, figures in table.items():
        accs = {c: f["mean_test_acc"] for c, f in figures.items()
                if isinstance(f, dict) and "mean_test_acc" in f}
        spread = max(accs.values()) - min(accs.values()) if len(accs) > 1 else None
        checks[row] = {"test_acc": accs,
                       "spread": None if spread is None else round(spread, 4),
                       "within_tolerance": None if spread is None
                       else spread <= ACCURACY_TOLERANCE}
    return {"tolerance": ACCURACY_TOLERANCE, "rows": checks}


# -- many silos on one GPU ---------------------------------------------------------------------
def silo_name(dataset: str) -> str:
    """A CHEM dataset's silo name."""
    return dataset.lower().replace("_", "-")


def write_chem_plan(work: Path, rounds: int, datasets: tuple[str, ...] = CHEM) -> Path:
    """The CHEM FedStar plan (a silo per dataset) for `coordinator simulate`."""
    work.mkdir(parents=True, exist_ok=True)
    silos = ", ".join(f'"{silo_name(d)}"' for d in datasets)
    data = ", ".join(f'"{silo_name(d)}" = "{TU / d}"' for d in datasets)
    plan = work / "chem.toml"
    plan.write_text(f"""[federation]
id = "bench-gpu-chem"
algorithm = "fedstar"
rounds = {rounds}
seed = 1
silos = [{silos}]

[server]
state_dir = "state"

[timeouts]
join_s = 300

[simulation]
data = {{ {data} }}
""")
    return plan


def engine_options(device: str, cpus: int, silos: int = len(CHEM)) -> dict[str, list[str]]:
    """`coordinator simulate` options of each engine: the sequential engine on the device; Ray
    with every core, each silo's actor an equal share of them and, on cuda, of one GPU."""
    from trellis.coordinator.simulation.options import equal_gpu_share

    share = max(0.01, math.floor(cpus / silos * 100) / 100)
    ray = ["--engine", "ray", "--ray-cpus", str(cpus), "--cpus-per-silo", f"{share:g}"]
    if device == "cuda":
        ray += ["--gpus-per-silo", f"{equal_gpu_share(silos):g}"]
    return {"sequential": simulate_device(device), "ray": ray}


def many_silos(device: str, cpus: int, rounds: int, work: Path, deadline: Deadline,
               datasets: tuple[str, ...] = CHEM) -> dict[str, Any]:
    """Both engines on the CHEM plan: wall and per-round seconds, test accuracy, speed-up."""
    if not TU.is_dir():
        raise PartFailed(f"needs the shared datasets at {TU}")
    from ray_engine import per_round, without_timings

    plan = write_chem_plan(work, rounds, datasets)
    runs: dict[str, dict[str, Any]] = {}
    docs = {}
    for engine, options in engine_options(device, cpus, len(datasets)).items():
        out = work / f"{engine}.json"
        args = [python(), "-m", "trellis.coordinator.cli", "simulate", "--plan", str(plan),
                "--quiet", "--out", str(out), *options]
        began = deadline.clock()
        try:
            run_child(args, deadline, f"{engine} engine", env=child_env())
            docs[engine] = doc = json.loads(out.read_text())
        except (PartFailed, OSError, json.JSONDecodeError) as exc:
            runs[engine] = {"options": " ".join(options), "error": str(exc)}
            continue
        runs[engine] = {"options": " ".join(options),
                        "wall_s": round(deadline.clock() - began, 2),
                        "s_per_round": round(per_round(doc), 4), "status": doc["status"],
                        "mean_test_acc": round(doc["final_mean"].get("test_acc", math.nan), 4)}
    result: dict[str, Any] = {"silos": len(datasets), "rounds": rounds, "algorithm": "fedstar",
                              "cpus": cpus, "runs": runs}
    if len(docs) == 2:
        result["ray_speedup"] = round(runs["sequential"]["s_per_round"]
                                      / runs["ray"]["s_per_round"], 3)
        # Equal on CPUs; on a GPU the two engines' floats may round differently.
        result["results_equal"] = (without_timings(docs["sequential"])
                                   == without_timings(docs["ray"]))
    errors = [f"{e}: {r['error']}" for e, r in runs.items() if "error" in r]
    if errors:
        raise PartFailed("; ".join(errors), result)
    return result


def cpu_count() -> int:
    """The cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
