"""Whether a silo's state folder holds a federation that finished here, for ``silo join``.

A second ``docker-compose up`` (Compose v1) after a finished federation starts the silos although
the coordinator exited at once (it found its federation finished): without this, each silo would
retry the absent coordinator for its whole --connect-timeout. When the silo never reached a
coordinator in this process, none answers for FINISHED_GRACE_S, and its folder says the federation
it holds finished, the agent stops with NothingToJoin (exit 0) instead.

Finished means all of: ``final_model.pt`` is there and labelled; ``resume.pt``, if there, is
marked finished and belongs to that model's federation and run; and the audit log records no
``joined`` after its last ``saved_model`` (a silo that joined again since, to an extended run or
another federation, holds an unfinished one). Whatever cannot be read counts as not finished: the
silo then keeps today's behaviour and retries.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from trellis.crypto.audit_crosscheck import read_records
from trellis.crypto.errors import AuditError
from trellis.silo.training.model_file import FINAL_MODEL, read_metadata

# Seconds of retrying before a silo holding a finished federation gives up on an absent
# coordinator: long enough for one that is merely restarting to be reached.
FINISHED_GRACE_S = 10.0


@dataclass(frozen=True)
class FinishedHere:
    """The federation a state folder holds, finished: its name, run, when its model was saved."""

    federation: str
    run_id: str
    saved_at: str
    model: Path
    audit_log: Path


class NothingToJoin(Exception):  # noqa: N818 - an outcome, not an error: the command exits 0
    """No coordinator answers, and the federation this silo holds finished: nothing to join."""

    def __init__(self, done: FinishedHere, target: str) -> None:
        super().__init__(
            f"federation {done.federation} finished here on {done.saved_at} (final model: "
            f"{done.model}; audit log: {done.audit_log}) and no coordinator answers at "
            f"{target}: nothing to join. A new federation needs its own --state-dir")
        self.done = done


def finished_here(state_dir: Path, resume_file: str, log: Path) -> FinishedHere | None:
    """The finished federation `state_dir` holds (`log`: its audit log), or None: none,
    unfinished, or unreadable."""
    model = state_dir / FINAL_MODEL
    try:
        label = read_metadata(model)
    except Exception:  # noqa: BLE001 - missing, damaged or unlabelled: not known to be finished
        return None
    federation, run_id = label.get("federation"), label.get("run_id")
    if not isinstance(federation, str) or not isinstance(run_id, str):
        return None
    resume = state_dir / resume_file
    if resume.exists():
        try:
            saved = torch.load(resume, weights_only=True, mmap=True)
        except Exception:  # noqa: BLE001 - torch.load raises several types for a damaged file
            return None
        if not (isinstance(saved, dict) and saved.get("finished")
                and (saved.get("federation"), saved.get("run_id")) == (federation, run_id)):
            return None
    try:
        events = [record.get("event") for _, record in read_records(log)]
    except AuditError:
        events = []
    joined = max((i for i, e in enumerate(events) if e == "joined"), default=-1)
    saved_model = max((i for i, e in enumerate(events) if e == "saved_model"), default=-1)
    if joined > saved_model:
        return None
    return FinishedHere(federation, run_id, str(label.get("saved_at", "an unknown date")),
                        model, log)
