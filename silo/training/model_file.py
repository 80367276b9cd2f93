"""The silo's final model on its own disk: written whole, labelled, never over another run's.

``final_model.pt`` is a torch file holding the trainer's snapshot (``model``, optimiser and
random streams) and ``metadata``: the federation, the coordinator's run, a hash of the plan, the
algorithm, the last round, the silo's last metrics (its own, reported or not), when it was saved
and with which versions, and what ``silo predict`` needs to rebuild the model without the
federation: the public plan (``plan``) and the trainer's ``model`` recipe (feature width,
classes and feature encoding; for FedHGN the silo's own node types and relations).
``read_metadata`` reads that label with the tensors memory-mapped, not loaded. A final model of
another run found in the state folder is moved aside under its run's name, never overwritten.
"""

from __future__ import annotations

import hashlib
import platform
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from trellis.protos.files import write_atomic
from trellis.protos.version import package_version
from trellis.silo.training.trainer import snapshot_to_bytes

FINAL_MODEL = "final_model.pt"


def model_metadata(*, federation: str, run_id: str, plan_json: str, algorithm: str,
                   round_no: int, silo: str, metrics: Mapping[str, float],
                   recipe: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The label a final model carries (JSON-ready): with `recipe` (the trainer's
    `model_recipe`) and the public plan, what rebuilds the model without the federation."""
    return {"federation": federation, "run_id": run_id, "silo": silo,
            "plan_sha256": hashlib.sha256(plan_json.encode()).hexdigest(),
            "algorithm": algorithm, "round": round_no, "metrics": dict(metrics),
            "saved_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "versions": {"trellis": package_version(), "torch": str(torch.__version__),
                         "python": platform.python_version()},
            **({"plan": plan_json, "model": dict(recipe)} if recipe is not None else {})}


def read_metadata(path: Path) -> dict[str, Any]:
    """A final model's label, without reading its tensors into memory."""
    saved = torch.load(path, weights_only=True, mmap=True)
    label = saved.get("metadata") if isinstance(saved, dict) else None
    if not isinstance(label, dict):
        raise ValueError(f"{path} carries no model metadata (written by an older version?)")
    return label


def save_final_model(state_dir: Path, snapshot: Mapping[str, Any],
                     label: Mapping[str, Any]) -> tuple[Path, Path | None]:
    """Write the final model atomically; returns its path and where another run's final model
    was moved to (None if there was none)."""
    path = state_dir / FINAL_MODEL
    moved: Path | None = None
    if path.exists():
        try:
            old = read_metadata(path)
        except Exception:  # noqa: BLE001 - unreadable or unlabelled: keep it, do not guess
            old = {"federation": "unknown", "run_id": "unlabelled"}
        if (old.get("federation"), old.get("run_id")) != (label["federation"],
                                                          label["run_id"]):
            moved = state_dir / (f"final_model-{old.get('federation')}-"
                                 f"{old.get('run_id')}.pt")
            path.replace(moved)
    blob = snapshot_to_bytes({**snapshot, "metadata": dict(label)})
    write_atomic(path, lambda handle: handle.write(blob))
    return path, moved
