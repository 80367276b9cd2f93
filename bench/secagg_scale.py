"""Benchmark: one secure-aggregation round of N real silos against a real coordinator.

Real identities and transport: a throwaway CA signs one certificate per silo; the coordinator is
`coordinator serve`, its own process; the silos are protocol-only (bench/protocol_silos.py: the
`silo join` agent with a synthetic vector of length d instead of a model), a few dozen per
process, each with its own mTLS channel. 10 % of the silos leave after sending their key shares
(the dropout the protocol must survive). Per run it reports: the time of each secure-aggregation
stage (from the coordinator's audit log), the coordinator's peak resident memory (VmHWM) and CPU
seconds, the bytes each silo sent and received (from the silos' audit logs), and whether the
coordinator's new global state is exactly the fixed-point mean of the surviving silos' vectors.
Writes bench/results/secagg_scale.json (or --out).

    python bench/secagg_scale.py [--silos 50 100 200] [--length 100000 1000000] \
        [--protocols secagg+ bonawitz] [--per-process 40]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.process_sampler import ProcessSampler  # noqa: E402
from bench.protocol_silos import synthetic_vector, synthetic_weight  # noqa: E402
from trellis.crypto.audit_crosscheck import read_records  # noqa: E402
from trellis.crypto.fixedpoint import FixedPointSpec  # noqa: E402
from trellis.crypto.pki import init_ca, request_identity, sign_request  # noqa: E402
from trellis.protos.plan import load_plan  # noqa: E402

SECURE_STAGES = ("advertise", "share", "collect", "consistency", "unmask")


@dataclass(frozen=True)
class Case:
    """One measured round: silos, vector length, protocol."""

    silos: int
    length: int
    protocol: str          # "secagg+" (about 2 log2 N neighbours) or "bonawitz" (all pairs)

    @property
    def neighbours(self) -> int:
        """k for SecAgg+ (even, below N), 0 for the full graph."""
        if self.protocol == "bonawitz":
            return 0
        k = 2 * math.ceil(math.log2(self.silos))
        return min(k, self.silos - 1 - (self.silos - 1) % 2)

    @property
    def name(self) -> str:
        """A folder- and federation-id-safe label."""
        return f"{self.protocol.replace('+', 'plus')}-n{self.silos}-d{self.length}"


def silo_names(n: int) -> list[str]:
    """silo-000, silo-001, ..."""
    return [f"silo-{i:03d}" for i in range(n)]


def dropping(names: list[str], fraction: float) -> list[str]:
    """Every k-th silo, for the asked fraction (at least one when the fraction is above 0)."""
    if fraction <= 0:
        return []
    count = max(1, round(len(names) * fraction))
    step = len(names) / count
    return [names[int(i * step)] for i in range(count)]


def make_identities(root: Path, n: int) -> None:
    """A CA with a loopback server certificate and one signed identity per silo."""
    init_ca(root / "ca", ["localhost", "127.0.0.1"])
    for name in silo_names(n):
        sign_request(request_identity(name, root / "id" / name), root / "ca")


def free_port() -> int:
    """A loopback port free now (the harness is the only thing binding ports here)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_plan(root: Path, case: Case, *, rounds: int, port: int, survivors: int,
               upload_memory_mb: int) -> Path:
    """A FedAvg plan for the case's silos; nothing in it trains (the silos are synthetic).

    Round 1 waits for every silo; later rounds open with the survivors of round 1.
    """
    names = silo_names(case.silos)
    folder = root / case.name
    text = f"""
[federation]
id = "{case.name}"
algorithm = "fedavg"
rounds = {rounds}
seed = 7
min_silos = {survivors}
silos = [{", ".join(f'"{s}"' for s in names)}]

[server]
listen = "127.0.0.1:{port}"
ca_cert = "{root / 'ca' / 'ca.crt'}"
server_cert = "{root / 'ca' / 'server.crt'}"
server_key = "{root / 'ca' / 'server.key'}"
state_dir = "{folder / 'coordinator'}"
upload_memory_mb = {upload_memory_mb}

[timeouts]
join_s = 900
round_s = 3600
stage_s = 900
report_s = 300

[aggregation]
neighbours = {case.neighbours}
"""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "plan.toml"
    path.write_text(text)
    return path


def wait_listening(port: int, process: subprocess.Popen, timeout: float = 120) -> None:
    """Until the coordinator accepts TCP on its port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the coordinator exited with {process.returncode} before "
                               "listening")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"the coordinator did not listen on port {port} in {timeout:g} s")


def records(path: Path) -> list[dict[str, Any]]:
    """The records of an audit log."""
    return [record for _, record in read_records(path)]


def moment(record: dict[str, Any]) -> float:
    """An audit record's time as seconds since the epoch."""
    return datetime.datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).timestamp()


def stage_spans(audit: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """Round 1 as (stage, start, end) moments: each secure stage from the previous close."""
    opened = next(r for r in audit if r["event"] == "round_opened" and r.get("round") == 1)
    spans, last = [], moment(opened)
    for record in audit:
        if record["event"] == "stage_closed" and record.get("round") == 1:
            spans.append((record["stage"], last, moment(record)))
            last = moment(record)
    return spans


def stage_peaks(audit: list[dict[str, Any]], timeline: list[tuple[float, int]]
                ) -> dict[str, float]:
    """The coordinator's largest resident MB sampled during each stage of round 1."""
    spans = stage_spans(audit)
    bounds = [("before", 0.0, spans[0][1]), *spans, ("after", spans[-1][2], float("inf"))]
    return {name: round(max((rss for t, rss in timeline if start <= t < end), default=0)
                        / 1e6, 1) for name, start, end in bounds}


def stage_seconds(audit: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds from round 1's opening to each secure stage's close, stage by stage."""
    spans = stage_spans(audit)
    out = {name: round(end - start, 3) for name, start, end in spans}
    completed = next(r for r in audit if r["event"] == "round_completed" and r["round"] == 1)
    out["round"] = round(moment(completed) - spans[0][1], 3)
    return out


def silo_bytes(state: Path, names: list[str]) -> dict[str, float]:
    """Mean bytes a surviving silo sent and received, from the silos' own audit logs."""
    sent, received = [], []
    for name in names:
        log = records(state / name / "audit.jsonl")
        sent.append(sum(r.get("bytes", 0) for r in log if r["event"].startswith("sent_")))
        received.append(sum(r.get("bytes", 0) for r in log
                            if r["event"].startswith("received_")))
    return {"sent": float(np.mean(sent)), "received": float(np.mean(received))}


def expected_state(plan_path: Path, survivors: list[str], length: int) -> np.ndarray:
    """The fixed-point weighted mean of the survivors' vectors, as the coordinator decodes it."""
    agg = load_plan(plan_path).public.aggregation
    spec = FixedPointSpec(agg.clip, agg.fraction_bits, agg.ring_bits, agg.max_sample_count)
    total = np.zeros(length + 1, dtype=spec.dtype)
    for name in survivors:
        total += spec.encode(synthetic_vector(name, length), synthetic_weight(name))
    mean, _ = spec.decode_mean(total)
    return mean


def silo_outcomes(out: Path) -> dict[str, str]:
    """How each silo of a protocol_silos.py process ended, from the whole lines it printed."""
    text = out.read_text()
    outcome: dict[str, str] = {}
    for line in text[:text.rfind("\n") + 1].splitlines():     # a last, partial line waits
        outcome.update(json.loads(line))
    return outcome


def watch_silos(workers: list[subprocess.Popen], outputs: list[tuple[Path, Path]],
                coordinator: subprocess.Popen, timeout_s: float) -> dict[str, str]:
    """Each silo's outcome once every silo process has ended; RuntimeError at the first sign of
    failure (a silo that failed, a silo process or the coordinator that exited with an error),
    with the others still running: they would otherwise wait out the plan's timeouts for a
    silo that will never come."""
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [worker.poll() for worker in workers]    # before the outputs: all in them
        outcome = {s: o for out, _ in outputs for s, o in silo_outcomes(out).items()}
        failed = {s: o for s, o in outcome.items() if o not in ("finished", "dropped")}
        if failed:
            raise RuntimeError(f"{len(failed)} silos failed, the first: "
                               f"{dict(list(failed.items())[:3])}")
        for code, (_, err) in zip(codes, outputs, strict=True):
            if code not in (None, 0):
                raise RuntimeError(f"a silo process exited with {code}: "
                                   f"{err.read_text()[-2000:]}")
        if all(code == 0 for code in codes):
            return outcome
        if (code := coordinator.poll()) not in (None, 0):
            raise RuntimeError(f"the coordinator exited with {code} while silos ran")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the silo processes did not end within {timeout_s:g} s")
        time.sleep(0.1)


def run_case(root: Path, case: Case, *, rounds: int, per_process: int, drop: float,
             upload_memory_mb: int) -> dict[str, Any]:
    """Run one federation for the case and measure it."""
    names = silo_names(case.silos)
    gone = dropping(names, drop)
    port = free_port()
    plan = write_plan(root, case, rounds=rounds, port=port, survivors=len(names) - len(gone),
                      upload_memory_mb=upload_memory_mb)
    folder = plan.parent
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    with open(folder / "coordinator.log", "w") as log:
        coordinator = subprocess.Popen(
            [sys.executable, "-m", "trellis.coordinator.cli", "serve", "--plan", str(plan),
             "--quiet", "--linger", "1"], stdout=log, stderr=subprocess.STDOUT, env=env)
    sampler = ProcessSampler(coordinator.pid)
    workers: list[subprocess.Popen] = []
    began = time.perf_counter()
    try:
        wait_listening(port, coordinator)
        outputs: list[tuple[Path, Path]] = []
        for start in range(0, len(names), per_process):
            chunk = names[start:start + per_process]
            out, err = folder / f"silos-{start}.out", folder / f"silos-{start}.err"
            outputs.append((out, err))
            with open(out, "w") as stdout, open(err, "w") as stderr:
                workers.append(subprocess.Popen(
                    [sys.executable, str(ROOT / "bench" / "protocol_silos.py"),
                     "--target", f"127.0.0.1:{port}", "--identities", str(root / "id"),
                     "--state", str(folder / "silos"), "--length", str(case.length),
                     "--silos", *chunk, "--drop", *[s for s in chunk if s in gone]],
                    stdout=stdout, stderr=stderr, text=True, env=env))
        outcome = watch_silos(workers, outputs, coordinator, timeout_s=3600)
        if missing := sorted(set(names) - set(outcome)):
            raise RuntimeError(f"silo processes ended without saying how {missing[:5]} ended")
        code = coordinator.wait(timeout=600)
        wall = time.perf_counter() - began
    finally:
        for process in (*workers, coordinator):
            if process.poll() is None:
                process.kill()
    sampler.join()
    failed = {s: o for s, o in outcome.items() if o not in ("finished", "dropped")}
    if code != 0 or failed:
        tail = (folder / "coordinator.log").read_text()[-2000:]
        raise RuntimeError(f"{case.name}: coordinator exit {code}, silos failed: "
                           f"{dict(list(failed.items())[:5])}\n{tail}")
    survivors = [s for s in names if s not in gone]
    # The vectors never change, so every round's aggregate is the survivors' mean.
    state = np.load(folder / "coordinator" / f"global_state-{rounds}.npy")
    exact = bool(np.array_equal(state, expected_state(plan, survivors, case.length)
                                .astype(state.dtype)))
    audit = records(folder / "coordinator" / "audit.jsonl")
    return {"silos": case.silos, "length": case.length, "protocol": case.protocol,
            "neighbours": case.neighbours, "dropped": len(gone),
            "dropped_as_planned": sorted(s for s, o in outcome.items() if o == "dropped")
            == sorted(gone),
            "rounds": rounds, "processes": len(workers),
            "stage_s": stage_seconds(audit), "stage_peak_mb": stage_peaks(audit, sampler.timeline),
            "wall_s": round(wall, 2),
            "coordinator_peak_mb": round(sampler.peak_bytes / 1e6, 1),
            "coordinator_cpu_s": round(sampler.cpu_s, 2),
            "coordinator_threads": sampler.threads,
            "vector_mb": round(case.length * np.dtype(state.dtype).itemsize / 1e6, 2),
            "silo_bytes": silo_bytes(folder / "silos", survivors),
            "exact": exact}


def main() -> None:
    """Run every case, print a line each, write the results file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--silos", type=int, nargs="+", default=[50, 100, 200])
    parser.add_argument("--length", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--protocols", nargs="+", default=["secagg+", "bonawitz"],
                        choices=["secagg+", "bonawitz"])
    parser.add_argument("--skip", nargs="*", default=[],
                        help="cases to leave out, as protocol:N:d (e.g. bonawitz:200:1000000)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--per-process", type=int, default=40, help="silos per process")
    parser.add_argument("--drop", type=float, default=0.1,
                        help="fraction of silos leaving after their key shares")
    parser.add_argument("--upload-memory-mb", type=int, default=256,
                        help="the plan's [server] upload_memory_mb")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "bench" / "results" / "secagg_scale.json")
    args = parser.parse_args()
    cases = [Case(n, d, p) for p in args.protocols for d in args.length for n in args.silos
             if f"{p}:{n}:{d}" not in args.skip]
    rows = []
    with tempfile.TemporaryDirectory(prefix="trellis-scale-") as folder:
        root = Path(folder)
        began = time.perf_counter()
        make_identities(root, max(args.silos))
        print(f"{max(args.silos)} silo identities in {time.perf_counter() - began:.1f} s",
              flush=True)
        for case in cases:
            row = run_case(root, case, rounds=args.rounds, per_process=args.per_process,
                           drop=args.drop, upload_memory_mb=args.upload_memory_mb)
            rows.append(row)
            stages = " ".join(f"{k} {v:.2f}" for k, v in row["stage_s"].items())
            peaks = " ".join(f"{k} {v:.0f}" for k, v in row["stage_peak_mb"].items())
            print(f"{case.protocol:8s} N={case.silos:4d} k={row['neighbours']:3d} "
                  f"d={case.length:8d}: coordinator peak {row['coordinator_peak_mb']:.0f} MB, "
                  f"cpu {row['coordinator_cpu_s']:.1f} s; stages s [{stages}]; MB [{peaks}]; "
                  f"per silo sent "
                  f"{row['silo_bytes']['sent'] / 1e6:.1f} MB, received "
                  f"{row['silo_bytes']['received'] / 1e6:.1f} MB; exact: {row['exact']}",
                  flush=True)
    record = {"date": datetime.date.today().isoformat(), "machine": platform.processor()
              or platform.machine(), "cpus": os.cpu_count(), "per_process": args.per_process,
              "drop": args.drop, "upload_memory_mb": args.upload_memory_mb, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    if not all(row["exact"] and row["dropped_as_planned"] for row in rows):
        sys.exit("a round's aggregate was not exact, or silos did not drop as planned")


if __name__ == "__main__":
    main()
