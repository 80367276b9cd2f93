"""The coordinator's checkpoint (DESIGN.md §6): what a restarted coordinator resumes from.

Written after every completed round and whenever an attempt opens, so that a crash at any moment
leaves one consistent checkpoint; read back by ``coordinator serve`` on the same state folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trellis.coordinator.rounds.machine import RoundMachine, RoundRecord
from trellis.protos.files import write_atomic, write_json_atomic
from trellis.protos.plan import Plan

CHECKPOINT = "checkpoint.json"
GLOBAL_STATE = "global_state.npy"       # name in checkpoints written before the state files
                                        # carried their round count (_state_names)


@dataclass(frozen=True)
class Resume:
    """Where a restarted coordinator picks up: the checkpoint of a plan's earlier run."""

    next_round: int
    global_state: np.ndarray | None
    history: list[RoundRecord]
    attempts_opened: int        # attempts of `next_round` opened before the restart
    setup_generation: int       # group-key setup runs begun before the restart
    durable: dict[str, Any] | None     # RoundMachine.durable_state(), JSON part (None: lost)
    durable_arrays: dict[str, np.ndarray]
    run_id: str


def save_checkpoint(state_dir: Path, machine: RoundMachine, *, with_state: bool = True) -> None:
    """Record completed rounds, the open attempt, the global state and the rest of the
    machine's durable state (DESIGN.md §6), so that a crash at any moment leaves one
    consistent checkpoint.

    The state files carry the number of completed rounds in their names and are written first;
    ``checkpoint.json``, written last, names the ones that belong to it, and older ones are
    removed only after it. ``with_state=False`` rewrites only the JSON document: the state files
    change only when a round completes or an attempt opens.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    history = machine.completed_history
    global_name, durable_name = _state_names(len(history))
    if with_state:
        state = machine.global_state
        if state is not None:
            write_atomic(state_dir / global_name, lambda handle: np.save(handle, state))
        doc, arrays = machine.durable_state()
        stored: dict[str, Any] = {"__doc__": np.frombuffer(json.dumps(doc).encode(), np.uint8),
                                  **arrays}
        write_atomic(state_dir / durable_name, lambda handle: np.savez(handle, **stored))
    write_json_atomic(state_dir / CHECKPOINT, {
        "federation": machine.plan.federation,
        "algorithm": machine.plan.public.algorithm,
        "plan": json.loads(machine.plan.public.to_json()),
        "run_id": machine.run_id,
        "completed_rounds": len(history),
        "state_files": {"global": global_name if machine.global_state is not None else None,
                        "durable": durable_name},
        "open_attempt": {"round": machine.round, "attempt": machine.attempt},
        "setup_generation": machine.setup_generation,
        "history": [_record_json(r) for r in history],
    })
    if with_state:
        for old in state_dir.glob("*_state-*.np[yz]"):
            if old.name not in (global_name, durable_name):
                old.unlink(missing_ok=True)


def _state_names(completed_rounds: int) -> tuple[str, str]:
    """The global-state and durable-state file names of a checkpoint."""
    return (f"global_state-{completed_rounds}.npy", f"durable_state-{completed_rounds}.npz")


def load_checkpoint(state_dir: Path, plan: Plan) -> Resume | None:
    """Where to resume this plan from its state directory's checkpoint, or None to start afresh.

    A checkpoint of another plan is refused unless it has no completed round (nothing is lost
    by starting that federation again).
    """
    path = state_dir / CHECKPOINT
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
        history_json = list(doc["history"])
        same_plan = doc.get("plan") == json.loads(plan.public.to_json()) or extends(
            doc.get("plan"), plan, len(history_json))
    except (OSError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _unreadable(path, exc) from None
    if not same_plan and history_json:
        raise ValueError(f"{path} belongs to a different plan; move it away or use a new "
                         "server.state_dir (a plan that differs only in more rounds than were "
                         "completed extends the federation)")
    if not same_plan:
        return None
    try:
        files = doc.get("state_files") or {
            "global": GLOBAL_STATE if doc.get("has_global_state") else None, "durable": None}
        state = np.load(state_dir / files["global"]) if files["global"] else None
        history = [RoundRecord(r["round"], r["attempts"], tuple(r["participants"]),
                               r["total_weight"], r["started"], r["finished"], r["metrics"],
                               tuple(r.get("dropped", ())))
                   for r in history_json]
        opened = doc.get("open_attempt") or {}
        next_round = len(history) + 1
        attempts = int(opened.get("attempt", 0)) if opened.get("round") == next_round else 0
        durable: dict[str, Any] | None = None
        arrays: dict[str, np.ndarray] = {}
        if files["durable"] and (state_dir / files["durable"]).exists():
            with np.load(state_dir / files["durable"], allow_pickle=False) as stored:
                arrays = {k: stored[k] for k in stored.files if k != "__doc__"}
                durable = json.loads(stored["__doc__"].tobytes().decode())
        elif not history:
            durable = {}           # nothing completed yet: nothing durable to lose
        return Resume(next_round, state, history, attempts, int(doc.get("setup_generation", 0)),
                      durable, arrays, str(doc.get("run_id") or ""))
    except (OSError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _unreadable(path, exc) from None


def extends(stored: Any, plan: Plan, completed: int) -> bool:
    """Whether plan is the stored public plan of a federation that completed all its rounds,
    asking for more: the operator extends it, and it goes on from its last checkpoint. (Mid-
    federation, a changed plan is refused: its silos hold state of the plan they started.)"""
    if not isinstance(stored, dict) or stored.get("rounds") != completed:
        return False
    new = json.loads(plan.public.to_json())
    return {**stored, "rounds": new["rounds"]} == new and plan.public.rounds > completed


def extended_from(state_dir: Path, plan: Plan) -> int | None:
    """The rounds completed, if plan extends the federation checkpointed in state_dir."""
    try:
        doc = json.loads((state_dir / CHECKPOINT).read_text())
        completed = len(doc["history"])
    except (OSError, KeyError, TypeError, ValueError):
        return None
    return completed if extends(doc.get("plan"), plan, completed) else None


def keep_earlier_results(state_dir: Path, completed: int) -> Path | None:
    """Move the results of the rounds before an extension aside; where they went, if any."""
    source = state_dir / RESULTS
    if not source.exists():
        return None
    target = state_dir / f"results-{completed}-rounds.json"
    source.replace(target)
    return target


def _unreadable(path: Path, exc: Exception) -> ValueError:
    return ValueError(f"{path} cannot be read back ({type(exc).__name__}: {exc}); move the "
                      "state directory away to start again")


def discard_state_files(state_dir: Path) -> None:
    """Remove the state files of an earlier run before a federation starts afresh."""
    for path in (state_dir / CHECKPOINT, state_dir / GLOBAL_STATE,
                 *state_dir.glob("*_state-*.np[yz]")):
        path.unlink(missing_ok=True)



def _record_json(record: RoundRecord) -> dict[str, Any]:
    return {"round": record.round, "attempts": record.attempts,
            "participants": list(record.participants), "total_weight": record.total_weight,
            "started": record.started, "finished": record.finished, "metrics": record.metrics,
            "dropped": list(record.dropped)}


RESULTS = "results.json"


def finished_run(state_dir: Path, plan: Plan) -> dict[str, Any] | None:
    """The results of this plan's federation if it already ran to the end in this state
    directory (its results say completed and its checkpoint is of this plan), else None.

    Serving such a state directory again would only invite silos to join a federation that is
    over; `coordinator serve` says so instead.
    """
    try:
        results = json.loads((state_dir / RESULTS).read_text())
        checkpoint = json.loads((state_dir / CHECKPOINT).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(results, dict) or not isinstance(checkpoint, dict):
        return None
    same_plan = checkpoint.get("plan") == json.loads(plan.public.to_json())
    if (results.get("status") == "completed" and same_plan
            and results.get("federation") == plan.federation
            and results.get("rounds_completed") == checkpoint.get("completed_rounds")):
        return results
    return None
