"""A healthy federation must look healthy: no "went on without" line, no refusal.

Runs `coordinator serve` and one `silo join` process per silo over mTLS on loopback (synthetic
data, a throwaway CA; tests/support/federation.py), nothing dropped or killed, for N rounds. Then
counts what would alarm an operator: silo log lines saying a round "went on without" the silo or
closed before its last step, the coordinator's refusals (its Prometheus counter, scraped after the
last round, and its audit log's "refused" records), aborted attempts and dropouts; and what is
routine: share reveals that came after unmasking closed (audit "late_reveal" records and
`trellis_coordinator_late_messages_total`). Writes bench/results/healthy_run.json.

    python bench/healthy_run.py [--rounds 60] [--silos 3] [--algorithm fedstar]
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.federation import (  # noqa: E402
    free_port,
    make_workspace,
    port_of,
    start_coordinator,
    start_silo,
    wait_all,
    write_plan,
)

OUT = ROOT / "bench" / "results" / "healthy_run.json"
TROUBLE = ("went on without", "closed before this silo's last step")
_SAMPLE = re.compile(r'^(trellis_coordinator_\w+?)(?:\{(.*)\})? (\S+)$')


def scrape(port: int) -> dict[str, float]:
    """The coordinator's counters: {"name{labels}": value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    values = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1).endswith("_total"):
            values[f"{match.group(1)}{{{match.group(2) or ''}}}"] = float(match.group(3))
    return values


def _closed(audit: Path) -> bool:
    lines = audit.read_text().strip().splitlines() if audit.is_file() else []
    return bool(lines) and json.loads(lines[-1]).get("event") == "close"


def run(work: Path, rounds: int, silos: int, algorithm: str, graphs: int) -> dict[str, Any]:
    """One federation; what its logs, audit trail and metrics say."""
    ws = make_workspace(work, graphs=graphs, extra=silos - 3)
    plan = write_plan(ws, "healthy", algorithm=algorithm, rounds=rounds, min_silos=silos,
                      round_s=600)
    folder = ws.root / "healthy"
    folder.mkdir(exist_ok=True)
    metrics_port = free_port()
    started = time.monotonic()
    coordinator = start_coordinator(plan, folder / "coordinator.log", extra=[
        "--metrics-listen", f"127.0.0.1:{metrics_port}", "--linger", "30"])
    processes = [start_silo(ws, s, port_of(plan), folder / s, folder / f"{s}.log")
                 for s in ws.silos]
    audit = folder / "coordinator" / "audit.jsonl"
    try:
        # The audit log closes after the last round, then the endpoint lingers: scrape then.
        while not _closed(audit):
            if coordinator.poll() is not None:
                raise RuntimeError((folder / "coordinator.log").read_text()[-3000:])
            time.sleep(0.5)
        counters = scrape(metrics_port)
        codes = wait_all([*processes, coordinator], timeout=120)
    finally:
        for process in (*processes, coordinator):
            if process.poll() is None:
                process.kill()
    seconds = time.monotonic() - started
    results = json.loads((folder / "coordinator" / "results.json").read_text())
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    trouble = {s: [line for line in (folder / f"{s}.log").read_text().splitlines()
                   if any(t in line for t in TROUBLE)] for s in ws.silos}
    refusal_metric = sum(v for k, v in counters.items()
                         if k.startswith("trellis_coordinator_refusals_total"))
    return {
        "date": datetime.date.today().isoformat(),
        "algorithm": algorithm, "silos": silos, "rounds": rounds, "graphs_per_silo": graphs,
        "exit_codes": codes, "status": results["status"],
        "rounds_completed": results["rounds_completed"], "seconds": round(seconds, 1),
        "went_on_without_lines": sum(1 for lines in trouble.values() for line in lines
                                     if TROUBLE[0] in line),
        "closed_before_lines": sum(1 for lines in trouble.values() for line in lines
                                   if TROUBLE[1] in line),
        "trouble_lines": {s: lines for s, lines in trouble.items() if lines},
        "refusals_metric": refusal_metric,
        "refused_audit_records": sum(1 for r in records if r.get("event") == "refused"),
        "aborted_attempts": sum(1 for r in records if r.get("event") == "round_aborted"),
        "rounds_with_dropouts": sum(1 for r in results["rounds"] if r.get("dropped")),
        "late_reveal_records": sum(1 for r in records if r.get("event") == "late_reveal"),
        "late_messages_metric": counters.get(
            'trellis_coordinator_late_messages_total{message="reveal_shares"}', 0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--silos", type=int, default=3, choices=range(3, 8))
    parser.add_argument("--algorithm", default="fedstar")
    parser.add_argument("--graphs", type=int, default=30, help="synthetic graphs per silo")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--work", type=Path, default=None,
                        help="keep the run's folders here (default: a temporary folder)")
    args = parser.parse_args()
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
        result = run(args.work, args.rounds, args.silos, args.algorithm, args.graphs)
    else:
        with tempfile.TemporaryDirectory(prefix="trellis-healthy-") as tmp:
            result = run(Path(tmp), args.rounds, args.silos, args.algorithm, args.graphs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{result['rounds_completed']}/{args.rounds} rounds in {result['seconds']} s: "
          f"{result['went_on_without_lines']} \"went on without\" lines, "
          f"{result['closed_before_lines']} \"closed before\" lines, "
          f"{result['refusals_metric']:g} refusals (metric), "
          f"{result['refused_audit_records']} refused (audit); "
          f"{result['late_reveal_records']} late reveals recorded "
          f"({result['late_messages_metric']:g} counted)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
