"""What left this silo and what reached it, round by round, read from its audit log.

`silo audit report` builds this report model (protos/document.py) for a reviewer: the plans the
silo accepted (with the plan's text where the log holds it), every upload of each round (name,
shape, dtype, bytes, how it was protected, SHA-256), everything it received, and whether its log
verifies. It reads only the log; the digests are the ones `coordinator audit cross-check`
compares with the coordinator's receipts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trellis.crypto.audit import AuditReport, verify_audit_log
from trellis.crypto.audit_crosscheck import Record, read_records
from trellis.crypto.certificates import certificate_fingerprint
from trellis.crypto.errors import PkiError
from trellis.protos.audit_blocks import verification_section
from trellis.protos.document import (
    Block,
    Document,
    Facts,
    Paragraph,
    Section,
    Table,
    Verbatim,
    Verdict,
)

SENT_COLUMNS = ("attempt", "what left", "content", "shape", "dtype", "bytes", "protection",
                "SHA-256", "log line")
RECEIVED_COLUMNS = ("attempt", "what arrived", "content", "shape", "SHA-256", "log line")
_ENVELOPE = frozenset({"seq", "ts", "writer", "prev", "event", "round", "attempt"})
_NOTABLE = ("left_attempt", "refused_unmask", "refused_to_continue", "refused_by_coordinator",
            "resumed", "saved_model", "stopped_privacy_budget")


AUDIT_LOG = "audit.jsonl"


def writer_certificate(identity: Path, log: Path) -> Path:
    """The certificate in an identity folder that signed `log`: <writer>.crt, or the only one."""
    writer = next((str(r["writer"]) for _, r in read_records(log)
                   if isinstance(r.get("writer"), str)), None)
    if writer is not None and (identity / f"{writer}.crt").is_file():
        return identity / f"{writer}.crt"
    found = sorted(p for p in identity.glob("*.crt") if p.name != "ca.crt")
    if len(found) != 1:
        named = f"{writer}.crt" if writer else "the silo's certificate"
        raise PkiError(f"no {named} in {identity} (found "
                       f"{', '.join(p.name for p in found) or 'none'}); give the identity "
                       "folder of the silo that wrote this log")
    return found[0]


def report_state_dir(state_dir: Path, identity: Path | None, *, generated: str
                     ) -> tuple[Document, AuditReport]:
    """Verify a silo state folder's audit log (with the identity's certificate) and report it."""
    log = state_dir / AUDIT_LOG
    cert = writer_certificate(identity, log) if identity is not None else None
    cert_pem = cert.read_bytes() if cert is not None else None
    verification = verify_audit_log(log, cert_pem=cert_pem)
    signer = None if cert_pem is None else f"{cert} ({certificate_fingerprint(cert_pem)})"
    return silo_report(read_records(log), verification, signer=signer,
                       generated=generated), verification


@dataclass
class _Round:
    sent: list[tuple[str, ...]] = field(default_factory=list)
    received: list[tuple[str, ...]] = field(default_factory=list)


def silo_report(records: list[Record], verification: AuditReport, *, signer: str | None,
                generated: str) -> Document:
    """The report of one silo's log: `records` as read, `verification` of the same file."""
    writer = next((str(r["writer"]) for _, r in records if isinstance(r.get("writer"), str)),
                  "unknown")
    rounds: dict[tuple[str, int], _Round] = {}
    plans: dict[tuple[str, str], list[tuple[int, dict[str, Any]]]] = {}
    refusals: list[tuple[int, dict[str, Any]]] = []
    notable: list[tuple[str, ...]] = []
    privacy: list[tuple[str, ...]] = []
    federation = ""
    for line, record in records:
        event = record.get("event")
        if event == "joined":
            federation = str(record.get("federation", ""))
            plans.setdefault((federation, str(record.get("plan_sha256", ""))), []).append(
                (line, record))
            continue
        if event == "refused_plan":
            refusals.append((line, record))
            continue
        if event == "privacy_round":
            privacy.append(_privacy_row(record, line))
            continue
        key = (federation, _int(record.get("round")))
        for maker, outbound in ((_SENT.get(str(event)), True),
                                (_RECEIVED.get(str(event)), False)):
            if maker is None:
                continue
            target = rounds.setdefault(key, _Round())
            for row in maker(record):
                full = (_attempt(record), *row, str(line))
                (target.sent if outbound else target.received).append(full)
        if event in _NOTABLE:
            notable.append((record.get("ts", ""), str(event), _round_label(key[1]),
                            _details(record), str(line)))
    sent = sum(len(r.sent) for r in rounds.values())
    federations = sorted({f for f, _ in rounds} | {f for f, _ in plans})
    intro: tuple[Block, ...] = (Facts((
        ("silo", writer), ("federations", ", ".join(federations) or "none"),
        ("rounds with traffic", str(len({k for k, r in rounds.items() if k[1] > 0}))),
        ("items that left this silo", str(sent)),
        ("bytes that left (where counted)",
         str(sum(_int(row[5]) for r in rounds.values() for row in r.sent))))),
        Paragraph("Every row below is read from the silo's own audit log; the log holds "
                  "names, shapes, sizes and SHA-256 digests, never tensor values or data. "
                  "The digests of masked inputs, sealed envelopes, group seals and encrypted "
                  "updates are those the coordinator's log records on receipt (compare with "
                  "`coordinator audit cross-check`)."))
    sections = [verification_section(verification, signer), _plans_section(plans, refusals)]
    several = len(federations) > 1
    for (fed, number), traffic in sorted(rounds.items(), key=lambda kv: (
            federations.index(kv[0][0]), kv[0][1])):
        title = _round_label(number).capitalize()
        sections.append(Section(f"{fed}: {title}" if several else title, (
            Paragraph("What left this silo:"),
            Table(SENT_COLUMNS, tuple(traffic.sent), empty="nothing left this silo"),
            Paragraph("What reached this silo:"),
            Table(RECEIVED_COLUMNS, tuple(traffic.received), empty="nothing recorded"))))
    if privacy:
        sections.append(Section("Differential privacy", (
            Paragraph("Each round this silo took part in, as its own accountant counted it: the "
                      "mechanism's public parameters, the inputs in the unmasked sum and the "
                      "epsilon spent so far on this silo's own graphs (at the plan's delta)."),
            Table(PRIVACY_COLUMNS, tuple(privacy)))))
    sections.append(Section("Other events", (Table(
        ("time", "event", "round", "details", "log line"), tuple(notable),
        empty="no retries, refusals, restarts or saved models recorded"),)))
    return Document(f"Audit report of silo {writer}", tuple(sections),
                    footer=f"generated {generated} from {verification.path}", intro=intro)


def _plans_section(plans: dict[tuple[str, str], list[tuple[int, dict[str, Any]]]],
                   refusals: list[tuple[int, dict[str, Any]]]) -> Section:
    blocks: list[Block] = []
    if not plans:
        blocks.append(Paragraph("This silo never accepted a plan."))
    for (federation, sha), joins in plans.items():
        first = joins[0][1]
        blocks.append(Facts((
            ("federation", federation), ("coordinator", str(first.get("coordinator", ""))),
            ("algorithm", str(first.get("algorithm", ""))),
            ("rounds", str(first.get("rounds", ""))), ("plan SHA-256", sha),
            ("silo policy SHA-256", str(first.get("policy_sha256", "none (no --policy)"))),
            ("joined", f"{len(joins)} time(s), first at {first.get('ts', '?')} (log line "
                       f"{joins[0][0]})"))))
        text = first.get("plan")
        if not isinstance(text, str):
            blocks.append(Paragraph("The plan's text is not in this log (written by an older "
                                    "version); only its SHA-256 is."))
            continue
        actual = hashlib.sha256(text.encode()).hexdigest()
        if actual == sha:
            blocks.append(Verdict(True, "the plan text below hashes to the recorded plan "
                                        "SHA-256"))
        else:
            blocks.append(Verdict(False, "the plan text below does not hash to the recorded "
                                         "plan SHA-256", (f"its SHA-256 is {actual}",)))
        try:
            shown = json.dumps(json.loads(text), indent=2, sort_keys=True)
        except ValueError:
            shown = text
        blocks.append(Verbatim(shown))
    if refusals:
        blocks.append(Paragraph("Plans this silo refused (nothing was sent):"))
        blocks.append(Table(("time", "federation", "algorithm", "plan SHA-256", "policy",
                             "broken clauses", "log line"), tuple(
            (str(r.get("ts", "")), str(r.get("federation", "")), str(r.get("algorithm", "")),
             str(r.get("plan_sha256", "")), str(r.get("policy", "")),
             "; ".join(_clause(v) for v in r.get("violations") or []), str(line))
            for line, r in refusals)))
    return Section("Plans accepted", tuple(blocks))


# -- one row per item, by the silo's audit events (silo/federation/driver.py)
# ------------------------------
Row = tuple[str, ...]


PRIVACY_COLUMNS = ("round", "attempt", "mechanism", "unit", "clip", "z", "share sigma",
                   "threshold t", "colluders c", "inputs", "honest shares", "floor held",
                   "sampling rate", "epsilon so far", "delta", "log line")


def _privacy_row(r: dict[str, Any], line: int) -> tuple[str, ...]:
    return (_str(r.get("round")), _str(r.get("attempt")), _str(r.get("mechanism")),
            _str(r.get("unit")), _number(r.get("clip")), _number(r.get("noise_multiplier")),
            _number(r.get("share_sigma")), _str(r.get("threshold")), _str(r.get("colluders")),
            _str(r.get("inputs")), _str(r.get("honest_shares")),
            "yes" if r.get("noise_floor_held") else "NO", _number(r.get("sampling_rate")),
            _number(r.get("epsilon")), _number(r.get("delta")), str(line))


def _sent_tensor(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = [("masked input", str(r.get("tensor", "")), _shape(r.get("shape")),
             str(r.get("dtype", "")), _str(r.get("bytes")),
             "masked (secure aggregation: the coordinator sees only the sum)",
             str(r.get("sha256", "")))]
    statistics = r.get("plain_statistics")
    if isinstance(statistics, dict) and statistics:
        rows.append(("statistics", _pairs(statistics), "", "", "",
                     "plain (the plan's clustering reveals them)", ""))
    return rows


_SENT: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
    "sent_tensor": _sent_tensor,
    "sent_envelope": lambda r: [("sealed envelope", "coefficient rows", "", "",
                                 _str(r.get("bytes")), "sealed with the silo group key",
                                 str(r.get("sha256", "")))],
    "sent_keys": lambda r: [("key advert", "cipher and mask public keys", "", "", "",
                             "public keys, signed",
                             f"cipher {r.get('cipher_key_sha256', '')}; "
                             f"mask {r.get('mask_key_sha256', '')}")],
    "sent_shares": lambda r: [("key shares", "for " + _names(r.get("receivers")), "", "",
                               _str(r.get("bytes")), "each sealed for its receiver", "")],
    "signed_survivors": lambda r: [("survivor signature", "over " + _names(r.get("survivors")),
                                    "", "", "", "signature", "")],
    "revealed_shares": lambda r: [("revealed shares",
                                   f"seed shares of {_names(r.get('seed_shares_of'))}; "
                                   f"key shares of {_names(r.get('key_shares_of'))}", "", "",
                                   "", "shares for unmasking the sum", "")],
    "sent_setup_key": lambda r: [("setup key advert", "for " + _names(r.get("silos")), "", "",
                                  "", "public key, signed", str(r.get("sha256", "")))],
    "sealed_group_secrets": lambda r: [("group seal", "boxes for " + _names(r.get("receivers"))
                                        + f"; CKKS public context "
                                        f"{_str(r.get('ckks_public_bytes'))} bytes", "", "",
                                        _str(r.get("bytes")), "each box sealed for its receiver",
                                        str(r.get("sha256", "")))],
    "sent_encrypted_update": lambda r: [("encrypted update",
                                         f"{_str(r.get('ciphertexts'))} ciphertexts", "", "",
                                         _str(r.get("bytes")), "CKKS-encrypted",
                                         str(r.get("sha256", "")))],
    "decrypted_similarities": lambda r: [("similarities", f"{_str(r.get('pairs'))} values",
                                          "", "", "", "blinded by the coordinator", "")],
    "sent_metrics": lambda r: [("metrics", _pairs(r.get("metrics")), "", "", "",
                                "plain (chosen by the silo's --report)", "")],
}
_RECEIVED: dict[str, Callable[[dict[str, Any]], list[tuple[str, ...]]]] = {
    "received_tensor": lambda r: [(str(r.get("tensor", "")), "no global state yet (the first "
                                   "round starts from the silo's own model)"
                                   if r.get("tensor") == "none" else "",
                                   _shape(r.get("shape")), str(r.get("sha256", "")))],
    "received_envelopes": lambda r: [("sealed envelope pool",
                                      f"{_str(r.get('envelopes'))} envelopes, "
                                      f"{_str(r.get('pooled_vectors'))} vectors", "",
                                      str(r.get("sha256", "")))],
    "opened_group_secrets": lambda r: [("group box", "opened", "",
                                        str(r.get("box_sha256", "")))],
    "decrypted_similarities": lambda r: [("blinded similarities", f"{_str(r.get('pairs'))} "
                                          "pairs", "", str(r.get("received_sha256", "")))],
}


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _str(value: Any) -> str:
    return "" if value is None else str(value)


def _attempt(record: dict[str, Any]) -> str:
    return _str(record.get("attempt"))


def _shape(shape: Any) -> str:
    if not isinstance(shape, list):
        return ""
    return " x ".join(str(n) for n in shape) or "scalar"


def _names(names: Any) -> str:
    if not isinstance(names, list) or not names:
        return "none"
    return ", ".join(str(n) for n in names)


def _pairs(values: Any) -> str:
    if not isinstance(values, dict) or not values:
        return "none"
    return ", ".join(f"{k}={_number(v)}" for k, v in sorted(values.items()))


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _round_label(number: int) -> str:
    return f"round {number}" if number > 0 else "setup (before round 1)"


def _details(record: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_plain(v)}" for k, v in record.items() if k not in _ENVELOPE)


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _clause(violation: Any) -> str:
    if isinstance(violation, dict):
        return (f"{violation.get('clause', '?')} allows {violation.get('allows', '?')}, the "
                f"plan {violation.get('plan', '?')}")
    return str(violation)
