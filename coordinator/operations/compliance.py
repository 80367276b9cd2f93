"""The coordinator's compliance report: who was admitted, what each round did, whom it refused.

`coordinator audit report` builds this report model (protos/document.py) from the state folder:
the audit log (admitted names and the plan's hash from `serve`, certificate fingerprints from
`connected`, rounds from `round_opened`/`round_aborted`/`round_completed`, uploads from the
`received_*` receipts, GCFL's splits from `clusters` and the update norms from the receipts,
`refused` and `revocation_list` records) and results.json, which the report checks against the
log and which says why a FedHGN run stopped early. With the CA folder, the log's signatures
are checked with server.crt and each fingerprint is matched with the certificates the CA
issued.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from trellis.coordinator.operations.run_report import early_stop_reason
from trellis.crypto.audit import AuditReport, verify_audit_log
from trellis.crypto.audit_crosscheck import Record, read_records
from trellis.crypto.certificates import certificate_fingerprint
from trellis.crypto.pki import SERVER_CERT
from trellis.crypto.revocation import issued_certificates, read_crl
from trellis.protos.audit_blocks import verification_section
from trellis.protos.document import Block, Document, Facts, Paragraph, Section, Table, Verdict

AUDIT_LOG = "audit.jsonl"
RESULTS = "results.json"
_ENVELOPE = frozenset({"seq", "ts", "writer", "prev", "event"})
_RUNS = ("serve", "extended", "results_written", "federation_done", "federation_failed",
         "checkpoint_failed")


@dataclass
class _Round:
    completed: dict[str, Any] | None = None
    line: int = 0
    opened: list[dict[str, Any]] = field(default_factory=list)
    aborted: list[tuple[int, dict[str, Any]]] = field(default_factory=list)


def report_state_dir(state_dir: Path, ca: Path | None, *, generated: str, now: datetime
                     ) -> tuple[Document, AuditReport]:
    """Verify the coordinator's audit log (with the CA folder's server.crt) and report it."""
    log = state_dir / AUDIT_LOG
    cert = ca / SERVER_CERT if ca is not None else None
    cert_pem = cert.read_bytes() if cert is not None else None
    verification = verify_audit_log(log, cert_pem=cert_pem)
    signer = None if cert_pem is None else f"{cert} ({certificate_fingerprint(cert_pem)})"
    results_path = state_dir / RESULTS
    results = json.loads(results_path.read_text()) if results_path.is_file() else None
    issued = _issued(ca, now) if ca is not None else None
    document = compliance_report(read_records(log), verification, results, signer=signer,
                                 issued=issued, generated=generated)
    return document, verification


def _issued(ca: Path, now: datetime) -> dict[str, str]:
    """Fingerprint -> what the CA says of that certificate (serial and status)."""
    crl = read_crl(ca)
    return {certificate_fingerprint(c.path.read_bytes()):
            f"serial {c.serial_hex}, {c.status(crl, now)}" for c in issued_certificates(ca)}


def compliance_report(records: list[Record], verification: AuditReport,
                      results: dict[str, Any] | None, *, signer: str | None,
                      issued: dict[str, str] | None, generated: str) -> Document:
    """The report of the coordinator's log `records` (verified as `verification`)."""
    serves = [r for _, r in records if r.get("event") == "serve"]
    last = serves[-1] if serves else {}
    federation = str(last.get("federation", "unknown"))
    admitted: list[str] = []
    for serve in serves:
        admitted += [str(s) for s in serve.get("admitted") or [] if str(s) not in admitted]
    outcome = "no results.json (the coordinator has not finished)" if results is None else (
        f"{results.get('status')}, {results.get('rounds_completed')} of "
        f"{results.get('rounds_planned')} rounds" + (
            f": {results['failure']}" if results.get("failure") else ""))
    intro: tuple[Block, ...] = (Facts((
        ("federation", federation), ("algorithm", str(last.get("algorithm", ""))),
        ("rounds planned", str(last.get("rounds", ""))),
        ("public plan SHA-256", str(last.get("plan_sha256", "not recorded"))),
        ("outcome", outcome), ("admitted silos", ", ".join(admitted) or "none"))),
        Paragraph("Read from the coordinator's own audit log and results.json. The log names "
                  "peers, rounds, tensor sizes and SHA-256 digests of what was received, "
                  "never values. Each silo's `silo audit report` lists the same digests for "
                  "what it sent."))
    rounds = _rounds(records)
    sections = [verification_section(verification, signer),
                _identities(records, admitted, issued),
                _rounds_section(rounds, results),
                _uploads(records),
                *_clusters(records),
                _by_event(records, "Refusals", "refused", ("subject", "serial", "reason"),
                          "no connection was refused"),
                _by_event(records, "Revocation-list changes", "revocation_list", ("change",),
                          "the revocation list did not change while the coordinator ran"),
                _runs(records)]
    return Document(f"Compliance report of federation {federation}", tuple(sections),
                    footer=f"generated {generated} from {verification.path}", intro=intro)


def _identities(records: list[Record], admitted: list[str], issued: dict[str, str] | None
                ) -> Section:
    seen: dict[str, dict[str, list[str]]] = {}
    for _, r in records:
        if r.get("event") == "connected":
            prints = seen.setdefault(str(r.get("silo")), {})
            prints.setdefault(str(r.get("certificate")), []).append(str(r.get("ts", "")))
    columns = ["silo", "admitted by the plan", "certificate fingerprint", "connections",
               "first connected"]
    if issued is not None:
        columns.append("issued by the CA")
    rows = []
    for silo in admitted + sorted(set(seen) - set(admitted)):
        prints = seen.get(silo) or {"": []}
        for fingerprint, times in prints.items():
            row = [silo, "yes" if silo in admitted else "NO",
                   fingerprint or "never connected", str(len(times)), min(times, default="")]
            if issued is not None:
                row.append(issued.get(fingerprint, "not issued by this CA") if fingerprint
                           else "")
            rows.append(tuple(row))
    return Section("Admitted identities", (
        Paragraph("Each certificate a silo connected with, by the SHA-256 of its DER encoding "
                  "(a silo that renewed its certificate shows one line per certificate)."),
        Table(tuple(columns), tuple(rows), empty="no silo is admitted")))


def _rounds(records: list[Record]) -> dict[int, _Round]:
    rounds: dict[int, _Round] = {}
    for line, r in records:
        event = r.get("event")
        if event not in ("round_opened", "round_aborted", "round_completed"):
            continue
        entry = rounds.setdefault(_int(r.get("round")), _Round())
        if event == "round_opened":
            entry.opened.append(r)
        elif event == "round_aborted":
            entry.aborted.append((line, r))
        else:
            entry.completed, entry.line = r, line
    return rounds


def _rounds_section(rounds: dict[int, _Round], results: dict[str, Any] | None) -> Section:
    rows, aborted = [], []
    for number, entry in sorted(rounds.items()):
        done = entry.completed
        rows.append((str(number), _s(done.get("attempt")) if done else "",
                     _names(done.get("participants")) if done else "not completed",
                     _names(done.get("dropped")) if done else "",
                     str(len(entry.aborted)), _s(done.get("seconds")) if done else "",
                     str(entry.line) if done else ""))
        opened = {_int(o.get("attempt")): o for o in entry.opened}
        for line, r in entry.aborted:
            started = opened.get(_int(r.get("attempt")), {})
            aborted.append((str(number), _s(r.get("attempt")),
                            _names(started.get("participants")), _s(r.get("reason")),
                            str(line)))
    blocks: list[Block] = [
        Paragraph("Dropped: silos whose input is not in the round's aggregate (they left "
                  "after the round opened)."),
        Table(("round", "completed in attempt", "participants", "dropped", "aborted attempts",
               "seconds", "log line"), tuple(rows), empty="no round was opened"),
        Paragraph("Aborted attempts (a round is retried without the silos that were late):"),
        Table(("round", "attempt", "opened with", "reason", "log line"), tuple(aborted),
              empty="no attempt was aborted")]
    if results is not None:
        blocks.append(_agreement(rounds, results))
        stop = early_stop_reason(results)
        if stop is not None:
            blocks.append(Paragraph(stop))
    return Section("Rounds", tuple(blocks))


def _agreement(rounds: dict[int, _Round], results: dict[str, Any]) -> Verdict:
    """Whether results.json says of each round what the log says."""
    problems = []
    for entry in results.get("rounds") or []:
        number = _int(entry.get("round"))
        done = rounds.get(number, _Round()).completed
        if done is None:
            problems.append(f"round {number} is in results.json but not completed in the log")
            continue
        for key in ("participants", "dropped"):
            if list(entry.get(key) or []) != list(done.get(key) or []):
                problems.append(f"round {number}: results.json says {key} "
                                f"{_names(entry.get(key))}, the log {_names(done.get(key))}")
    listed = {_int(e.get("round")) for e in results.get("rounds") or []}
    for number, entry in sorted(rounds.items()):
        if entry.completed is not None and number not in listed:
            problems.append(f"round {number} is completed in the log but not in results.json")
    if problems:
        return Verdict(False, "results.json and the audit log disagree", tuple(problems))
    return Verdict(True, "results.json agrees with the audit log on every round's "
                         "participants and dropouts")


def _uploads(records: list[Record]) -> Section:
    rows = []
    for line, r in records:
        event = r.get("event")
        if event == "received_tensor":
            what = f"{_s(r.get('tensor')).replace('_', ' ')} ({_s(r.get('dtype'))})"
            shape = " x ".join(str(n) for n in r.get("shape") or [])
        elif event == "received_blobs":
            what, shape = f"{r.get('count', '?')} sealed blob(s)", ""
        else:
            continue
        rows.append((_s(r.get("round")), _s(r.get("attempt")), _s(r.get("silo")),
                     _s(r.get("phase")), what, shape, _s(r.get("bytes")), _s(r.get("sha256")),
                     str(line)))
    return Section("Uploads received", (
        Paragraph("Every upload the coordinator accepted, by the SHA-256 of its payload."),
        Table(("round", "attempt", "silo", "phase", "what", "shape", "bytes", "SHA-256",
               "log line"), tuple(rows), empty="nothing was received")))


def _clusters(records: list[Record]) -> list[Section]:
    """GCFL: each split the coordinator made and every update norm it received in plain."""
    splits, norms, seen = [], [], set()
    for line, r in records:
        split = r.get("split") if r.get("event") == "clusters" else None
        if isinstance(split, dict):
            into = " / ".join(_names(side) for side in split.get("into") or [])
            splits.append((_s(r.get("round")), _names(split.get("members")), into,
                           _s(split.get("mean_norm")), _s(split.get("max_norm")), str(line)))
        stats = r.get("statistics") if r.get("event") == "received_tensor" else None
        key = (r.get("round"), r.get("attempt"), r.get("silo"))
        if isinstance(stats, dict) and key not in seen:
            seen.add(key)
            norms.append((_s(r.get("round")), _s(r.get("attempt")), _s(r.get("silo")),
                          _s(stats.get("update_norm")), _s(stats.get("grad_norm")), str(line)))
    if not splits and not norms:
        return []
    return [Section("Clusters", (
        Paragraph("GCFL splits a cluster when its mean update is small and a member's is "
                  "large; a split decided in round t takes effect in round t + 1."),
        Table(("round", "cluster", "split into", "mean update norm", "max update norm",
               "log line"), tuple(splits), empty="no cluster split"),
        Paragraph("Update norms the coordinator received in plain with each silo's masked "
                  "update (the split test's inputs; nothing else of an update is seen):"),
        Table(("round", "attempt", "silo", "update norm", "gradient norm", "log line"),
              tuple(norms), empty="no norm was received")))]


def _by_event(records: list[Record], title: str, event: str, keys: tuple[str, ...],
              empty: str) -> Section:
    rows = tuple((_s(r.get("ts")), *(_s(r.get(k)) for k in keys), str(line))
                 for line, r in records if r.get("event") == event)
    return Section(title, (Table(("time", *keys, "log line"), rows, empty=empty),))


def _runs(records: list[Record]) -> Section:
    rows = tuple((_s(r.get("ts")), str(r.get("event")),
                  ", ".join(f"{k}={_plain(v)}" for k, v in r.items() if k not in _ENVELOPE),
                  str(line)) for line, r in records if r.get("event") in _RUNS)
    return Section("Coordinator runs", (
        Table(("time", "event", "details", "log line"), rows, empty="none recorded"),))


def record_int(value: Any) -> int:
    """An audit record's value as an int (0 when it is none or not one)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def record_text(value: Any) -> str:
    """An audit record's value as text ("" for none)."""
    return "" if value is None else str(value)


def record_names(names: Any) -> str:
    """An audit record's list of names, comma-separated ("none" when empty)."""
    if not isinstance(names, list) or not names:
        return "none"
    return ", ".join(str(n) for n in names)


# Short names for the many table cells above.
_int, _s, _names = record_int, record_text, record_names


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)
