"""`coordinator status`: where a federation stands, from the running service or its state folder.

A snapshot (FederationStatus) is taken from the round machine; the coordinator keeps the latest
one in ``state_dir/status.json`` (coordinator/serving/live_files.py) and answers the Admin service's
Status RPC with a fresh one. Whether the coordinator still runs is not in the snapshot: a
killed process cannot say so. The reader decides it from ``state_dir/coordinator.lock``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trellis.coordinator.rounds.machine import RoundMachine, Stage
from trellis.coordinator.state.exclusive import lock_holder
from trellis.protos.metrics import mean_over_silos
from trellis.protos.metrics_plan import FEDERATION
from trellis.protos.status import FederationStatus, RefusedCaller

STATUS_FILE = "status.json"
# The order operators look for first; other metrics follow alphabetically.
_FIRST_METRICS = ("test_acc", "val_acc")


def snapshot(machine: RoundMachine, *, connected: Iterable[str],
             refused: Mapping[str, str], started_at: float, elapsed_s: float,
             pid: int) -> FederationStatus:
    """The federation's status now, from the machine (call it under the core's lock)."""
    plan = machine.plan
    history = machine.history
    completed = machine.completed_history
    last = completed[-1] if completed else None
    reported = next((r for r in reversed(history) if r.metrics), None)
    durations = [r.finished - r.started for r in completed]
    current = (machine.final_round if machine.stage in (Stage.FINISHING, Stage.DONE)
               else min(machine.round, plan.public.rounds))
    return FederationStatus(
        federation=plan.federation, algorithm=plan.public.algorithm, run_id=machine.run_id,
        round=current, rounds=plan.public.rounds, rounds_completed=len(completed),
        stage=machine.stage.value, connected=tuple(sorted(connected)),
        dropped=tuple(last.dropped) if last is not None else (),
        refused=tuple(RefusedCaller(s, refused[s]) for s in sorted(refused)),
        metrics_round=reported.round if reported is not None else 0,
        # Summed metrics ([metrics] aggregate): one federation-wide entry, no reporting silo.
        reported=(len(reported.metrics) if reported is not None
                  and FEDERATION not in reported.metrics else 0),
        metrics=mean_over_silos(reported.metrics.values()) if reported is not None else {},
        started_at=started_at, updated_at=time.time(), elapsed_s=round(elapsed_s, 3),
        round_mean_s=round(sum(durations) / len(durations), 3) if durations else 0.0,
        pid=pid, failure=machine.failure,
        plan=str(plan.source) if plan.source is not None else "")


def read_status(state_dir: Path) -> FederationStatus:
    """The last status the coordinator of state_dir wrote; ValueError says what is missing."""
    path = state_dir / STATUS_FILE
    if not state_dir.is_dir():
        raise ValueError(f"no such state directory: {state_dir}; give the plan's "
                         "server.state_dir")
    try:
        return FederationStatus.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        raise ValueError(f"no {STATUS_FILE} in {state_dir}: no coordinator has served this "
                         "state directory yet (give the plan's server.state_dir)") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None


def liveness(status: FederationStatus, running_pid: int | None) -> str:
    """'finished', 'failed: ...', 'running' or 'stopped (...)', for a coordinator whose lock
    is held by running_pid (None: no coordinator holds the state directory)."""
    if status.stage == Stage.DONE.value:
        return "finished"
    if status.stage == Stage.FAILED.value:
        return f"failed: {status.failure}"
    if running_pid is not None:
        return "running"
    plan = status.plan or "plan.toml"
    return f"stopped (not running; `coordinator serve --plan {plan}` resumes)"


def local_view(state_dir: Path) -> tuple[FederationStatus, str, float]:
    """(status, liveness, elapsed seconds) of the coordinator of a state directory."""
    status = read_status(state_dir)
    pid = lock_holder(state_dir)
    state = liveness(status, pid)
    # A running coordinator's file may be up to a throttle interval old: count from its start.
    elapsed = time.time() - status.started_at if state == "running" else status.elapsed_s
    return status, state, elapsed


def to_json(status: FederationStatus, state: str, elapsed_s: float) -> dict[str, Any]:
    """`coordinator status --json`: the snapshot with liveness, elapsed time and estimate."""
    doc = {**status.to_json(), "state": state, "elapsed_s": round(elapsed_s, 3),
           "eta_s": _eta(status, state)}
    if state != "running":
        # The snapshot was taken while the silos were still attached: nobody is now.
        doc["connected"], doc["connected_at_end"] = [], list(status.connected)
    return doc


def _eta(status: FederationStatus, state: str) -> float | None:
    if state != "running":
        return None if state.startswith("stopped") or status.eta_s is None else 0.0
    return None if status.eta_s is None else round(status.eta_s, 3)


def format_status(status: FederationStatus, state: str, elapsed_s: float) -> str:
    """A short aligned block for the operator."""
    pid = f" (pid {status.pid})" if state == "running" and status.pid else ""
    rows = [("federation", f"{status.federation} ({status.algorithm}, run {status.run_id})"),
            ("state", state + pid),
            ("round", f"{status.round} of {status.rounds}, stage {status.stage} "
                      f"({status.rounds_completed} completed)"),
            ("connected", _names(status.connected, "no silo") if state == "running" else
             _at_the_end(status.connected)),
            ("dropped", (_names(status.dropped, "none") + " in the last round"
                         if status.rounds_completed else "no round completed yet")),
            ("refused", ", ".join(f"{r.subject} ({r.reason})" for r in status.refused)
             or "nobody"),
            ("metrics", _metrics(status)),
            ("started", datetime.fromtimestamp(status.started_at, UTC)
             .strftime("%Y-%m-%d %H:%M:%S UTC") if status.started_at else "-"),
            ("elapsed", _duration(elapsed_s))]
    eta = _eta(status, state)
    if state == "running":
        rows.append(("time left", "unknown until a round completes" if eta is None else
                     f"about {_duration(eta)} ({status.rounds - status.rounds_completed} "
                     f"rounds at {_duration(status.round_mean_s)} each)"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def _names(names: tuple[str, ...], empty: str) -> str:
    return f"{len(names)}: {', '.join(names)}" if names else empty


def _at_the_end(names: tuple[str, ...]) -> str:
    # The last snapshot of an ended (or stopped) coordinator: its silos have gone since.
    return f"nobody now ({len(names)} at the end: {', '.join(names)})" if names else "nobody"


def _metrics(status: FederationStatus) -> str:
    if not status.metrics_round:
        return "none reported yet"
    order = sorted(status.metrics, key=lambda n: (n not in _FIRST_METRICS,
                                                  _FIRST_METRICS.index(n)
                                                  if n in _FIRST_METRICS else 0, n))
    values = ", ".join(f"{name} {_figure(name, status.metrics[name])}" for name in order)
    if not status.reported:
        return (f"round {status.metrics_round}, summed over the federation's silos (no silo's "
                f"own figures): {values or 'no metric'}")
    return (f"round {status.metrics_round}, mean over {status.reported} reporting silo"
            f"{'s' if status.reported != 1 else ''}: {values or 'no metric'}")


def _figure(name: str, value: float) -> str:
    """A count (val_count, test_count: nodes or graphs) as a whole number when it is one (a
    mean over silos may not be), any other metric with four decimals."""
    if name.endswith("_count"):
        return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
    return f"{value:.4f}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s"
