"""bench/gpu.py's sweep: every algorithm, plain and private, as a real 3-silo federation on the
device, each checked to have completed and to have trained there.

A federation is `coordinator serve --plan` and three `silo join --device DEVICE` processes over
mTLS on loopback, with synthetic data and a throwaway CA (tests/support/federation.py, as the
end-to-end tests and bench/healthy_run.py do). It passes when every process exits 0, the
coordinator's results say completed, and every silo's log names the device it trained on (its
"... on cuda:0" line). The algorithms come from the algorithm table (protos/algorithms.py); those
that exist only in simulation (FedHGN's baselines, which see every silo's data) run under
`coordinator simulate --device DEVICE` instead, which must complete. Private variants: record-level
ddg and local-gaussian for FedStar and FedDense (FedDense with layer norm, as record-level DP
needs), silo-level ddg for FedHGN (without its envelopes' alignment term, as docs/privacy.md
says). Several runs go at once; each has its own ports and state folders.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_common import ROOT, Deadline, PartFailed, child_env, simulate_device, tail

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.federation import (  # noqa: E402
    FEDHGN_TABLE,
    Workspace,
    free_port,
    make_hetero_workspace,
    make_workspace,
    start_coordinator,
)
from trellis.protos.algorithms import ALGORITHMS, NODE_TASK  # noqa: E402

# mechanism, unit: the private variants of each algorithm that has any in the sweep.
PRIVATE: dict[str, tuple[tuple[str, str], ...]] = {
    "fedstar": (("ddg", "record"), ("local-gaussian", "record")),
    "feddense": (("ddg", "record"), ("local-gaussian", "record")),
    "fedhgn": (("ddg", "silo"),),
}
RECORD_LEVEL = """
[privacy]
mechanism = "{mechanism}"
noise_multiplier = 1.1
clip = 1.0
batch = 8
design_graphs = 20
"""
SILO_LEVEL = """
[privacy]
mechanism = "{mechanism}"
unit = "silo"
noise_multiplier = 0.5
clip = 1.0
"""
# The line `silo join` logs once its data is loaded: "... on cuda:0" (or "device cuda:0").
DEVICE_LINE = re.compile(r"\b(?:on|device:?) (cuda(?::\d+)?|cpu)\b")
# The lines that say how a silo takes its training steps.
STEP_LINE = re.compile(r"(training steps[^:]*: .*|CUDA graphs (?:of evaluation )?given up.*)$",
                       re.MULTILINE)


@dataclass(frozen=True)
class SweepRun:
    """One run of the sweep: an algorithm, plain or with one privacy mechanism."""

    algorithm: str
    mechanism: str = ""
    unit: str = ""
    graphs: str = ""          # TRELLIS_CUDA_GRAPHS for the silos ("": their default)

    @property
    def name(self) -> str:
        """How the record names it: fedstar, fedstar+ddg, fedhgn+ddg (silo level), feddense
        (TRELLIS_CUDA_GRAPHS=0)."""
        level = " (silo level)" if self.unit == "silo" else ""
        name = f"{self.algorithm}+{self.mechanism}{level}" if self.mechanism else self.algorithm
        return f"{name} (TRELLIS_CUDA_GRAPHS={self.graphs})" if self.graphs else name

    @property
    def slug(self) -> str:
        """A federation id and folder name: letters, digits and '-'."""
        graphs = f"graphs{self.graphs}" if self.graphs else ""
        text = "-".join(p for p in (self.algorithm, self.mechanism, self.unit, graphs) if p)
        return "gpu-" + text.replace("+", "plus")

    @property
    def hetero(self) -> bool:
        """Whether it trains on heterogeneous graphs (FedHGN and its baselines)."""
        return ALGORITHMS[self.algorithm].task == NODE_TASK

    @property
    def simulated(self) -> bool:
        """Whether it exists only in `coordinator simulate` (no real federation)."""
        return ALGORITHMS[self.algorithm].simulation_only


def sweep_runs() -> list[SweepRun]:
    """Every algorithm of the table on its default path (CUDA graphs on a GPU where the model
    allows), then each of its private variants; and FedDense on plain steps and evaluations
    (TRELLIS_CUDA_GRAPHS=0), the path every GPU silo had before the graphs."""
    return [run for name in ALGORITHMS
            for run in (SweepRun(name), *(SweepRun(name, m, u) for m, u in PRIVATE.get(name, ())))
            ] + [SweepRun("feddense", graphs="0")]


def silos_of(run: SweepRun, ws: Workspace) -> tuple[str, ...]:
    """The workspace's silos that take part (the first alone for a one-silo algorithm)."""
    return ws.silos[:1] if ALGORITHMS[run.algorithm].one_silo else ws.silos


def plan_text(run: SweepRun, ws: Workspace, rounds: int, port: int, state: Path) -> str:
    """The plan of one run over the workspace's silos."""
    silos = silos_of(run, ws)
    folder = (lambda s: ws.data(s)) if run.hetero else (
        lambda s: ws.data(s) / ws.domain(s).upper())
    data = ", ".join(f'"{s}" = "{folder(s)}"' for s in silos)
    extra = ""
    if run.hetero:
        extra = FEDHGN_TABLE.format(slots=8, patience=10)
        if run.mechanism:           # envelopes would reach every peer without noise
            extra = extra.replace("[fedhgn]\n", "[fedhgn]\nalign_weight = 0\n")
    if run.mechanism:
        level = SILO_LEVEL if run.unit == "silo" else RECORD_LEVEL
        extra += level.format(mechanism=run.mechanism)
        if run.algorithm == "feddense" and run.unit == "record":
            extra += '\n[model]\nnorm = "layer"\n'    # record-level DP refuses BatchNorm
    return f"""[federation]
id = "{run.slug}"
algorithm = "{run.algorithm}"
rounds = {rounds}
seed = 7
min_silos = {len(silos)}
silos = [{", ".join(f'"{s}"' for s in silos)}]

[server]
listen = "127.0.0.1:{port}"
ca_cert = "{ws.ca / 'ca.crt'}"
server_cert = "{ws.ca / 'server.crt'}"
server_key = "{ws.ca / 'server.key'}"
state_dir = "{state / 'coordinator'}"

[timeouts]
join_s = 120
round_s = 120
report_s = 30

[simulation]
data = {{ {data} }}
{extra}"""


def step_paths_named(log: str) -> list[str]:
    """The training-step paths a silo's log names ("training steps: ..." at its start, "training
    steps for <algorithm>: ..." once a GPU silo's model is built, "CUDA graphs given up ..."
    where a recording failed)."""
    return [m.group(1).strip() for m in STEP_LINE.finditer(log)]


def devices_named(log: str) -> list[str]:
    """The devices a silo's log says it trains on."""
    return DEVICE_LINE.findall(log)


def sweep(device: str, rounds: int, graphs: int, parallel: int, work: Path,
          deadline: Deadline) -> dict[str, Any]:
    """Every run of the sweep, ``parallel`` at a time; each one's outcome."""
    work = work.resolve()   # the federations' processes run in folders of their own
    graph_ws = make_workspace(work / "graphs", graphs=graphs)
    hetero_ws = make_hetero_workspace(work / "hetero")
    runs = sweep_runs()

    def one(run: SweepRun) -> dict[str, Any]:
        ws = hetero_ws if run.hetero else graph_ws
        began = time.monotonic()
        try:
            left = deadline.check(run.name)
            if run.simulated:
                outcome = _simulate(run, ws, device, rounds, work / run.slug, left)
            else:
                outcome = _federate(run, ws, device, rounds, work / run.slug, left)
        except PartFailed as exc:
            outcome = {"ok": False, "error": str(exc)}
        except Exception as exc:         # one run's surprise must not end the sweep
            outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return {"kind": "simulation" if run.simulated else "federation",
                "seconds": round(time.monotonic() - began, 1), **outcome}

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        outcomes = dict(zip([r.name for r in runs], pool.map(one, runs), strict=True))
    failed = [name for name, o in outcomes.items() if not o["ok"]]
    result = {"device": device, "rounds": rounds, "graphs_per_silo": graphs,
              "parallel": parallel, "runs": outcomes,
              "passed": len(runs) - len(failed), "failed": failed}
    if failed:
        raise PartFailed(f"{len(failed)} of {len(runs)} runs failed: {', '.join(failed)}",
                         result)
    return result


def _federate(run: SweepRun, ws: Workspace, device: str, rounds: int, folder: Path,
              limit: float) -> dict[str, Any]:
    """One real federation: coordinator and silo processes, waited for within ``limit``."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    plan = folder / "plan.toml"
    plan.write_text(plan_text(run, ws, rounds, port, folder))
    silos = silos_of(run, ws)
    coordinator = start_coordinator(plan, folder / "coordinator.log")
    processes = {"coordinator": coordinator}
    for silo in silos:
        args = [sys.executable, "-m", "trellis.silo.cli", "join", "--coordinator",
                f"127.0.0.1:{port}", "--data", str(ws.data(silo)), "--identity",
                str(ws.identity(silo)), "--state-dir", str(folder / silo), "--threads", "1",
                "--device", device, "--connect-timeout", "60"]
        extra = {"TRELLIS_CUDA_GRAPHS": run.graphs} if run.graphs else None
        processes[silo] = subprocess.Popen(args, stdout=open(folder / f"{silo}.log", "w"),
                                           stderr=subprocess.STDOUT, env=child_env(1, extra))
    codes = _wait(processes, limit)
    logs = {name: (folder / f"{name}.log").read_text(errors="replace") for name in processes}
    results_file = folder / "coordinator" / "results.json"
    status = (json.loads(results_file.read_text()).get("status", "unknown")
              if results_file.is_file() else "no results")
    named = {s: devices_named(logs[s]) for s in silos}
    on_device = all(named[s] and all(d.split(":")[0] == device for d in named[s])
                    for s in silos)
    outcome: dict[str, Any] = {
        "ok": status == "completed" and on_device and all(c == 0 for c in codes.values()),
        "status": status, "exit_codes": codes,
        "trained_on": {s: sorted(set(d)) for s, d in named.items()},
        "steps": {s: step_paths_named(logs[s]) for s in silos}}
    if not outcome["ok"]:
        outcome["error"] = _why(status, codes, named, device, logs)
    return outcome


def _simulate(run: SweepRun, ws: Workspace, device: str, rounds: int, folder: Path,
              limit: float) -> dict[str, Any]:
    """A simulation-only algorithm under `coordinator simulate --device`."""
    folder.mkdir(parents=True, exist_ok=True)
    plan = folder / "plan.toml"
    plan.write_text(plan_text(run, ws, rounds, free_port(), folder))
    out = folder / "results.json"
    args = [sys.executable, "-m", "trellis.coordinator.cli", "simulate", "--plan", str(plan),
            "--out", str(out), *simulate_device(device)]
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=limit,
                              env=child_env(1), cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {limit:.0f} s"}
    status = json.loads(out.read_text()).get("status") if out.is_file() else "no results"
    outcome: dict[str, Any] = {"ok": done.returncode == 0 and status == "completed",
                               "status": status, "exit_codes": {"simulate": done.returncode},
                               "device_named": sorted(set(devices_named(done.stdout)))}
    if not outcome["ok"]:
        outcome["error"] = f"exit {done.returncode}: {tail(done.stdout + done.stderr)}"
    return outcome


def _wait(processes: dict[str, subprocess.Popen[Any]], limit: float) -> dict[str, int | None]:
    """Every process's exit code; those still running after ``limit`` are killed (None)."""
    end = time.monotonic() + limit
    codes: dict[str, int | None] = {}
    for name, process in processes.items():
        try:
            codes[name] = process.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            codes[name] = None
    for process in processes.values():
        if process.poll() is None:
            process.kill()
            process.wait()
    return codes


def _why(status: str, codes: dict[str, int | None], named: dict[str, list[str]], device: str,
         logs: dict[str, str]) -> str:
    """One line on what went wrong, with the tail of the first log that says it."""
    bad = [n for n, c in codes.items() if c != 0]
    parts = [f"status {status}"]
    if bad:
        parts.append("exit codes " + ", ".join(
            f"{n} {'timed out' if codes[n] is None else codes[n]}" for n in bad))
    off = [s for s, d in named.items() if not d or any(x.split(":")[0] != device for x in d)]
    if off:
        parts.append("not on " + device + ": " + ", ".join(
            f"{s} ({', '.join(sorted(set(named[s]))) or 'no device line'})" for s in off))
    culprit = bad[0] if bad else (off[0] if off else "coordinator")
    return "; ".join(parts) + f"; {culprit}'s log: {tail(logs[culprit])}"
