"""Where a FedStar round's time goes on a GPU: the 7 CHEM silos in one process on the device.

Builds the CHEM trainers once per path asked for: plain steps (TRELLIS_CUDA_GRAPHS=0), steps
replayed as CUDA graphs (the default on a GPU, silo/training/graphed_steps.py) or the compiled
forward pass (TRELLIS_COMPILE=1, silo/models/compiled.py); warms each up, times their rounds in
alternation, then profiles one round of each: kernel launches, copies and synchronisations
counted by torch.profiler, the GPU's busy time (the sum of its kernels' and copies' times),
and the Python functions that take the most host time (cProfile). The round is that of
bench/speed_chem.py: one local epoch per silo, then its validation and test figures.

    python bench/gpu_profile.py [--algorithm fedstar] [--rounds 3] [--paths plain graphs]
                                [--out FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

from gpu_common import BENCH, CHEM, ROOT, TU, Deadline, PartFailed, python, run_child

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The runtime calls whose counts say what waits for whom.
RUNTIME_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx",
                 "cudaMemcpyAsync", "cudaMemsetAsync", "cudaStreamSynchronize",
                 "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaHostAlloc")


# Each path's settings: (TRELLIS_COMPILE, TRELLIS_CUDA_GRAPHS).
PATHS = {"plain": ("0", "0"), "graphs": ("0", "auto"), "compiled": ("1", "0")}


def build(algorithm: str, device: str, path: str, datasets: tuple[str, ...] = CHEM
          ) -> list[Any]:
    """The CHEM trainers on ``device``, on ``path`` (one of PATHS)."""
    from one_thread import one_thread_public_plan

    from trellis.silo.data.datasets import load_graph_folder
    from trellis.silo.training.trainer import LocalTrainer

    os.environ["TRELLIS_COMPILE"], os.environ["TRELLIS_CUDA_GRAPHS"] = PATHS[path]
    public = one_thread_public_plan(algorithm)
    return [LocalTrainer(load_graph_folder(TU / d), public, d, device) for d in datasets]


def one_round(trainers: list[Any]) -> float:
    """One round of every silo; its seconds, ended when the device's work has."""
    began = time.perf_counter()
    for trainer in trainers:
        trainer.train()
        trainer.metrics(("val_acc", "val_loss", "test_acc", "test_loss"))
    return time.perf_counter() - began


def device_profile(trainers: list[Any]) -> dict[str, Any]:
    """One round under torch.profiler: runtime calls counted, the GPU's busy seconds, the top
    kernels by GPU time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        seconds = one_round(trainers)
        torch.cuda.synchronize()
    averages = prof.key_averages()
    calls = {e.key: e.count for e in averages if e.key in RUNTIME_CALLS}
    busy_us = 0.0
    kernels = []
    for event in prof.events():
        if str(getattr(event, "device_type", "")).endswith("CUDA"):
            busy_us += event.time_range.elapsed_us()
    for e in averages:
        own = getattr(e, "self_device_time_total", None)
        if own is None:
            own = getattr(e, "self_cuda_time_total", 0.0)
        if own:
            kernels.append((own, e.count, e.key))
    kernels.sort(reverse=True)
    return {"s_per_round_profiled": round(seconds, 3), "gpu_busy_s": round(busy_us / 1e6, 4),
            "runtime_calls": calls,
            "top_device_ops": [{"us": round(us, 1), "count": n, "name": name[:120]}
                               for us, n, name in kernels[:15]]}


def host_profile(trainers: list[Any]) -> str:
    """One round under cProfile: the 25 functions with the most own host time."""
    profiler = cProfile.Profile()
    profiler.enable()
    one_round(trainers)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


def profile_part(device: str, work: Path, deadline: Deadline, datasets: tuple[str, ...] = CHEM
                 ) -> dict[str, Any]:
    """bench/gpu.py's ``profile`` part: this script on the plain and graphed paths in a child
    process, their figures without the host profiles' text (kept in the part's own file)."""
    if not TU.is_dir():
        raise PartFailed(f"needs the shared datasets at {TU}")
    out = work / "gpu_profile.json"
    run_child([python(), str(BENCH / "gpu_profile.py"), "--device", device, "--rounds", "2",
               "--paths", "plain", "graphs", "--datasets", *datasets, "--out", str(out)],
              deadline, f"the profile on {device}")
    doc = json.loads(out.read_text())
    return {"algorithm": "fedstar", "file": str(out),
            **{path: {k: v for k, v in doc[path].items() if k != "host_profile"}
               for path in ("plain", "graphs")}}


def main() -> None:
    """Build, warm up, time in alternation, profile; print and write the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", default="fedstar")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--paths", nargs="+", choices=tuple(PATHS),
                        default=["plain", "graphs"], help="the step paths to time")
    parser.add_argument("--datasets", nargs="+", default=list(CHEM))
    parser.add_argument("--out", type=Path, default=ROOT / "bench-run" / "gpu_profile.json")
    args = parser.parse_args()
    import torch

    paths = {}
    for path in args.paths:
        began = time.perf_counter()
        trainers = build(args.algorithm, args.device, path, tuple(args.datasets))
        warm = [one_round(trainers) for _ in range(2)]
        paths[path] = {
            "trainers": trainers, "graph_path": trainers[0].graph_path.reason,
            "setup_and_warm_s": round(time.perf_counter() - began, 1),
            "warm_rounds_s": [round(w, 3) for w in warm], "rounds_s": []}
    for _ in range(args.rounds):                 # alternate: the machine's drift hits both
        for figures in paths.values():
            figures["rounds_s"].append(round(one_round(figures["trainers"]), 3))
    doc: dict[str, Any] = {"algorithm": args.algorithm, "device": args.device,
                           "name": torch.cuda.get_device_name(0)
                           if torch.cuda.is_available() else "cpu"}
    for name, figures in paths.items():
        trainers = figures.pop("trainers")
        figures["mean_s"] = round(sum(figures["rounds_s"]) / len(figures["rounds_s"]), 3)
        if args.device == "cuda":
            try:
                figures |= device_profile(trainers)
            except Exception as exc:             # the host profile still runs
                figures["device_profile_error"] = f"{type(exc).__name__}: {exc}"
        figures["host_profile"] = host_profile(trainers)
        doc[name] = figures
        print(f"{name}: {figures['mean_s']} s/round {figures['rounds_s']}; busy "
              f"{figures.get('gpu_busy_s')} s; calls {figures.get('runtime_calls')}")
        print(figures["host_profile"][:6000])
        for op in figures.get("top_device_ops", []):
            print(f"  {op['us']:>10} us {op['count']:>6}x {op['name']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
