"""``silo status``: what a silo has done, from its own files only (no coordinator is asked).

Reads the silo's state folder: the audit log (the federation joined, what was sent: count and
bytes of every upload, the metrics reported), ``metrics.jsonl`` (rounds done and the last
round's own figures), ``resume.pt`` (where a restarted silo would go on) and ``final_model.pt``
(its label), and verifies the audit log, with the silo's certificate when one is given.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from trellis.crypto.audit import AuditError, verify_audit_log
from trellis.crypto.errors import CryptoError
from trellis.silo.operations.metrics_file import METRICS_FILE, read_metrics
from trellis.silo.training.model_file import FINAL_MODEL, read_metadata

AUDIT_FILE = "audit.jsonl"
RESUME = "resume.pt"
# Audit events of payloads that left the silo, and what each is called in the summary.
UPLOADS = {"sent_tensor": "masked inputs", "sent_shares": "key shares",
           "sent_envelope": "coefficient envelopes", "sealed_group_secrets": "group-key seals",
           "sent_encrypted_update": "encrypted updates"}


def silo_status(state_dir: Path, identity: Path | None = None) -> dict[str, Any]:
    """The silo's status as a JSON-ready dict (ValueError when the folder is no silo's); with
    `identity`, the silo's identity folder, its audit log's signatures are checked too."""
    audit_path = state_dir / AUDIT_FILE
    if not state_dir.is_dir():
        raise ValueError(f"--state-dir {state_dir}: no such folder")
    if not audit_path.is_file():
        raise ValueError(f"--state-dir {state_dir}: no {AUDIT_FILE}; is this the folder `silo "
                         "join --state-dir` wrote?")
    records = _records(audit_path)
    silo = next((r.get("writer") for r in records if r.get("writer")), None)
    certificate = None
    if identity is not None:
        certificate = identity / f"{silo}.crt"
        if not certificate.is_file():
            raise ValueError(f"--identity {identity}: no {silo}.crt, the certificate of the "
                             f"silo that wrote {audit_path}")
    joined = [r for r in records if r.get("event") == "joined"]
    plan = joined[-1] if joined else {}
    metrics = read_metrics(state_dir / METRICS_FILE)
    final = _final_model(state_dir / FINAL_MODEL)
    audit = _verify(audit_path, certificate)
    status = "finished" if final is not None and final["run_matches"] else (
        "running" if audit["open"] else ("not started" if not joined else "stopped"))
    return {
        "state_dir": str(state_dir),
        "silo": silo,
        "status": status,
        "federation": plan.get("federation"),
        "algorithm": plan.get("algorithm"),
        "rounds_total": plan.get("rounds"),
        "rounds_done": max((m["round"] for m in metrics), default=0),
        "last_round": metrics[-1] if metrics else None,
        "sent": _sent(records),
        "resume": _resume(state_dir / RESUME),
        "final_model": final,
        "audit": audit,
    }


def format_status(status: dict[str, Any]) -> str:
    """The status as the lines `silo status` prints."""
    total = status["rounds_total"]
    lines = [f"silo {status['silo']} in {status['state_dir']}: {status['status']}",
             f"federation {status['federation']} ({status['algorithm']}): "
             f"{status['rounds_done']} of {total if total is not None else '?'} rounds done"]
    last = status["last_round"]
    if last:
        figures = ", ".join(f"{k} {_number(v)}" for k, v in sorted(last.items())
                            if k not in ("round", "time"))
        lines.append(f"round {last['round']} (at {last['time']}): {figures}")
    sent = status["sent"]
    parts = ", ".join(f"{n} {what} ({_size(b)})" for what, (n, b) in sent["by_kind"].items())
    lines.append(f"sent: {sent['uploads']} uploads, {_size(sent['bytes'])}"
                 + (f" ({parts})" if parts else "")
                 + f"; {sent['metrics_reports']} metrics reports"
                 + (f" ({', '.join(sent['metric_names'])})" if sent["metric_names"]
                    else " (no values)"))
    final = status["final_model"]
    if final is not None:
        label = final["label"]
        figures = ", ".join(f"{k} {_number(v)}" for k, v in sorted(label["metrics"].items()))
        other = "" if final["run_matches"] else " (of an earlier run)"
        lines.append(f"final model{other}: {final['path']}, round {label['round']}, saved "
                     f"{label['saved_at']}" + (f": {figures}" if figures else ""))
    elif status["resume"] is not None:
        lines.append(f"not finished; a restarted silo goes on from round "
                     f"{status['resume']['round']} ({RESUME})")
    audit = status["audit"]
    if audit["ok"]:
        how = ("signatures verified" if audit["signatures_checked"]
               else "chain verified, signatures not checked (pass --identity)")
        lines.append(f"audit log: {audit['records']} records, {how}"
                     + ("; open (the silo is running)" if audit["open"] else ""))
    else:
        lines.append(f"audit log: DOES NOT VERIFY: {audit['problems'][0]}"
                     + (f" (+{len(audit['problems']) - 1} more)" if len(audit["problems"]) > 1
                        else ""))
    return "\n".join(lines)


def _records(path: Path) -> list[dict[str, Any]]:
    records = []
    for line in path.read_bytes().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue        # the verification below names it
        if isinstance(record, dict):
            records.append(record)
    return records


def _sent(records: list[dict[str, Any]]) -> dict[str, Any]:
    by_kind: dict[str, list[int]] = {}
    for record in records:
        what = UPLOADS.get(str(record.get("event")))
        if what is not None:
            counts = by_kind.setdefault(what, [0, 0])
            counts[0] += 1
            counts[1] += int(record.get("bytes", 0))
    reports = [r for r in records if r.get("event") == "sent_metrics"]
    names = sorted({k for r in reports for k in r.get("metrics", {})})
    return {"uploads": sum(n for n, _ in by_kind.values()),
            "bytes": sum(b for _, b in by_kind.values()),
            "by_kind": {k: tuple(v) for k, v in by_kind.items()},
            "metrics_reports": len(reports), "metric_names": names}


def _final_model(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        label = read_metadata(path)
    except Exception as exc:  # noqa: BLE001 - a damaged file: report it, do not stop
        return {"path": str(path), "label": {"round": "?", "saved_at": "?", "metrics": {}},
                "run_matches": False, "problem": str(exc)}
    resume = _resume(path.with_name(RESUME))
    # A final model kept from an earlier run while this silo takes part in a new one.
    matches = resume is None or bool(resume["finished"])
    return {"path": str(path), "label": {k: label.get(k) for k in (
        "federation", "run_id", "algorithm", "round", "saved_at", "metrics")},
            "run_matches": matches}


def _resume(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        saved = torch.load(path, weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - a damaged file: `silo join` says so when it resumes
        return None
    return {"round": int(saved.get("round", 0)), "finished": bool(saved.get("finished"))}


def _verify(path: Path, certificate: Path | None) -> dict[str, Any]:
    cert_pem = certificate.read_bytes() if certificate is not None else None
    try:
        report = verify_audit_log(path, cert_pem=cert_pem)
    except (AuditError, CryptoError) as exc:
        return {"ok": False, "open": False, "records": 0, "signatures_checked": False,
                "problems": [str(exc)]}
    return {"ok": report.ok, "open": report.open, "records": report.records,
            "signatures_checked": report.signatures_checked, "problems": report.problems}


def _number(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _size(count: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    return f"{count:.1f} GiB"
