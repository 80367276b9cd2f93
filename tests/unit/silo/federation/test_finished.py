"""Whether a state folder holds a federation that finished (silo/federation/finished.py), read
from the files a silo writes: its final model, its resume file and its audit log."""

from __future__ import annotations

from pathlib import Path

import pytest

from trellis.crypto.audit import AuditLog
from trellis.protos.files import write_atomic
from trellis.silo.federation.finished import finished_here
from trellis.silo.training.model_file import model_metadata, save_final_model
from trellis.silo.training.trainer import snapshot_to_bytes

RESUME = "resume.pt"


def _model(state: Path, federation: str = "fed", run_id: str = "run-1") -> dict:
    label = model_metadata(federation=federation, run_id=run_id, plan_json="{}",
                           algorithm="fedavg", round_no=3, silo="hospital-a", metrics={})
    save_final_model(state, {}, label)
    return label


def _resume(state: Path, **fields: object) -> None:
    blob = snapshot_to_bytes(fields)
    write_atomic(state / RESUME, lambda handle: handle.write(blob))


def _audit(state: Path, *events: str) -> Path:
    log = AuditLog(state / "audit.jsonl", writer="hospital-a")
    for event in events:
        log.append(event)
    log.close()
    return log.path


def test_a_finished_federation_is_named_with_its_model_and_audit_log(tmp_path: Path) -> None:
    label = _model(tmp_path)
    _resume(tmp_path, federation="fed", run_id="run-1", finished=True)
    log = _audit(tmp_path, "joined", "saved_model")
    done = finished_here(tmp_path, RESUME, log)
    assert done is not None
    assert (done.federation, done.run_id, done.saved_at) == ("fed", "run-1", label["saved_at"])
    assert (done.model, done.audit_log) == (tmp_path / "final_model.pt", log)


@pytest.mark.parametrize("setup", [
    pytest.param(lambda s: None, id="an empty folder"),
    pytest.param(lambda s: _resume(s, federation="fed", run_id="run-1", finished=False),
                 id="a resume file of a federation under way, no final model"),
    pytest.param(lambda s: (_model(s), _resume(s, federation="fed", run_id="run-1")),
                 id="a final model, and a resume file not marked finished (extended since)"),
    pytest.param(lambda s: (_model(s, "old"), _resume(s, federation="new", run_id="run-2",
                                                      finished=True)),
                 id="a final model of another federation than the resume file's"),
    pytest.param(lambda s: (_model(s), _audit(s, "joined", "saved_model", "joined")),
                 id="joined again since the model was saved (another federation, no round yet)"),
    pytest.param(lambda s: (s / "final_model.pt").write_bytes(b"not a model"),
                 id="an unreadable final model"),
])
def test_anything_else_is_not_known_to_be_finished(tmp_path: Path, setup) -> None:
    setup(tmp_path)
    assert finished_here(tmp_path, RESUME, tmp_path / "audit.jsonl") is None
