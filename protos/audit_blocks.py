"""The report section both sides' audit reports share: how their own log verified.

Here, beside the renderer (protos/document.py), because the silo's and the coordinator's
reports both need it and may not import each other; it reads crypto's verification result.
"""

from __future__ import annotations

from trellis.crypto.audit import AuditReport
from trellis.protos.document import Facts, Section, Verdict


def verification_section(report: AuditReport, signer: str | None) -> Section:
    """The verdict on a log, then what was checked: signatures (by `signer`), head, ending."""
    if report.ok:
        verdict = Verdict(True, f"the log verifies: {report.records} records, hash chain "
                                "intact" + (", signatures valid" if signer else ""))
    else:
        verdict = Verdict(False, f"verification FAILED: {len(report.problems)} problem(s); "
                                 "what this report lists from the log cannot be trusted as is",
                          tuple(report.problems))
    if signer is None:
        signatures = ("not checked: no certificate was given, so anyone able to rewrite the "
                      "whole log could have")
    else:
        signatures = f"checked against {signer}"
    if report.head is not None:
        head = (f"{report.head_file}: at least {report.head.count} records, signed at "
                f"{report.head.ts}")
    elif report.head_file is not None:
        head = f"{report.head_file}: unreadable"
    else:
        head = ("none beside the log: lines cut after its last signed record could not be "
                "told; archive audit.jsonl.head with the log")
    if report.closed:
        ending = "closed by its writer"
    elif report.open:
        ending = "open: its writer is still running (report again once it has finished)"
    else:
        ending = "no closing record"
    facts = Facts((("log", str(report.path)), ("records", str(report.records)),
                   ("signed checkpoints", str(report.checkpoints)),
                   ("signatures", signatures), ("signed head", head), ("ending", ending)))
    return Section("Verification of this log", (verdict, facts))
