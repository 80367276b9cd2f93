"""Tests for crypto.audit: the hash chain, signed checkpoints, resume and tamper detection."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trellis.crypto.audit import (
    GENESIS,
    AuditLog,
    format_report,
    head_path,
    verify_audit_log,
    writer_running,
)
from trellis.crypto.errors import AuditError, CryptoError
from trellis.crypto.pki import Identity, init_ca, load_identity, request_identity, sign_request


def fixed_clock() -> Callable[[], float]:
    ticks = iter(range(1_700_000_000, 1_800_000_000))
    return lambda: float(next(ticks))


@pytest.fixture(scope="module")
def silos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Identity]:
    root = tmp_path_factory.mktemp("pki")
    init_ca(root / "ca", ["localhost"])
    identities = {}
    for name in ("silo-a", "silo-b"):
        sign_request(request_identity(name, root / name), root / "ca")
        identities[name] = load_identity(root / name)
    return identities


def write_log(
    path: Path, identity: Identity | None, records: int = 10, checkpoint_every: int = 4
) -> None:
    key = identity.key_pem if identity is not None else None
    with AuditLog(
        path,
        writer="silo-a",
        signing_key_pem=key,
        checkpoint_every=checkpoint_every,
        clock=fixed_clock(),
    ) as log:
        for round_ in range(records):
            log.append("update_sent", round=round_, tensor="encoder.w", shape=[4, 8], nbytes=128)


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def write_lines(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines))


@pytest.fixture()
def signed_log(tmp_path: Path, silos: dict[str, Identity]) -> Iterator[Path]:
    path = tmp_path / "audit.jsonl"
    write_log(path, silos["silo-a"])
    yield path


def test_log_format_and_chain(signed_log: Path) -> None:
    lines = lines_of(signed_log)
    records = [json.loads(line) for line in lines]
    assert [r["seq"] for r in records] == list(range(len(records)))
    assert records[0]["prev"] == hashlib.sha256(GENESIS.encode()).hexdigest()
    for line, record in zip(lines, records[1:], strict=False):
        assert record["prev"] == hashlib.sha256(line).hexdigest()
    for line, record in zip(lines, records, strict=True):
        assert line == json.dumps(record, separators=(",", ":"), sort_keys=True).encode()
    assert records[0]["ts"] == "2023-11-14T22:13:20.000000Z"
    assert records[0]["writer"] == "silo-a" and records[0]["shape"] == [4, 8]
    events = [r["event"] for r in records]
    # 10 records, a checkpoint after every 4, and the signed close.
    assert events.count("checkpoint") == 2 and events[-1] == "close"
    assert events[4] == "checkpoint" and records[4]["count"] == 4
    assert records[4]["head"] == records[4]["prev"]
    assert "signature" in records[-1]


def test_written_log_verifies(signed_log: Path, silos: dict[str, Identity]) -> None:
    report = verify_audit_log(signed_log, cert_pem=silos["silo-a"].cert_pem)
    assert report.ok and report.closed and report.signatures_checked
    assert report.records == 13 and report.checkpoints == 3
    assert format_report(report).endswith("OK: 13 records, chain intact")
    assert verify_audit_log(signed_log).ok


def test_unsigned_log_verifies(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write_log(path, None)
    report = verify_audit_log(path)
    assert report.ok and report.closed and report.records == 11 and report.checkpoints == 0


def test_signatures_fail_with_another_silos_cert(
    signed_log: Path, silos: dict[str, Identity]
) -> None:
    report = verify_audit_log(signed_log, cert_pem=silos["silo-b"].cert_pem)
    assert report.problems == [
        "line 5: checkpoint signature does not verify",
        "line 10: checkpoint signature does not verify",
        "line 13: close signature does not verify",
        "the signed head's signature does not verify (forged, or another writer's)",
    ]
    shown = format_report(report)
    assert "FAILED: line 5: checkpoint signature does not verify" in shown
    assert "verified" not in shown            # not even before the failures


def test_edited_middle_line_breaks_chain_at_next_line(signed_log: Path) -> None:
    lines = lines_of(signed_log)
    lines[6] = lines[6].replace(b'"nbytes":128', b'"nbytes":129')
    write_lines(signed_log, lines)
    report = verify_audit_log(signed_log)
    assert report.problems == [
        "line 8: hash chain broken (line edited, removed or reordered before this point)"
    ]


def test_deleted_middle_line_detected(signed_log: Path) -> None:
    lines = lines_of(signed_log)
    del lines[6]
    write_lines(signed_log, lines)
    problems = verify_audit_log(signed_log).problems
    assert "line 7: hash chain broken (line edited, removed or reordered before this point)" in (
        problems
    )
    assert "line 7: sequence number 7, expected 6" in problems


def test_swapped_lines_detected(signed_log: Path) -> None:
    lines = lines_of(signed_log)
    lines[2], lines[3] = lines[3], lines[2]
    write_lines(signed_log, lines)
    problems = verify_audit_log(signed_log).problems
    assert problems[0].startswith("line 3: hash chain broken")
    assert "line 3: sequence number 3, expected 2" in problems


def test_log_cut_after_its_close_fails_against_its_signed_head(
    signed_log: Path, silos: dict[str, Identity]
) -> None:
    """Before, a log cut at its end still verified ("closed: no"): nothing remembered its
    length. The head beside it does, signed like the close record it copies."""
    head = json.loads(head_path(signed_log).read_text())
    assert (head["event"], head["count"]) == ("close", 13)
    assert head["head"] == hashlib.sha256(lines_of(signed_log)[-1]).hexdigest()
    assert head["signature"] == json.loads(lines_of(signed_log)[-1])["signature"]
    write_lines(signed_log, lines_of(signed_log)[:-3])
    report = verify_audit_log(signed_log, cert_pem=silos["silo-a"].cert_pem)
    assert report.problems == [
        "log has 10 records; its signed head (written at 2023-11-14T22:13:32.000000Z) says at "
        "least 13: its end was cut off",
        "log ends without its closing entry after 10 records; expected at least 14: its end "
        "was cut off, or its writer was killed (restarting that coordinator or silo on the same "
        "state folder resumes and closes it)",
    ]
    shown = format_report(report)
    assert "closed: no\n" in shown and "FAILED: log has 10 records" in shown
    assert "verified" not in shown


def test_log_without_its_close_fails_even_without_a_head(signed_log: Path) -> None:
    write_lines(signed_log, lines_of(signed_log)[:-1])
    head_path(signed_log).unlink()
    report = verify_audit_log(signed_log)
    assert not report.open and report.problems == [
        "log ends without its closing entry after 12 records; expected at least 13: its end "
        "was cut off, or its writer was killed (restarting that coordinator or silo on the same "
        "state folder resumes and closes it)",
    ]
    assert "signed head: none (no audit.jsonl.head beside the log" in format_report(report)


def test_log_rewritten_up_to_its_head_fails(signed_log: Path, silos: dict[str, Identity]
                                            ) -> None:
    # The close line replaced by an earlier checkpoint's: the count fits, the line does not.
    lines = lines_of(signed_log)
    lines[-1] = lines[9]
    write_lines(signed_log, lines)
    problems = verify_audit_log(signed_log).problems
    assert "line 13 is not the record its signed head (written at 2023-11-14T22:13:32.000000Z)" \
        " names: the log was rewritten up to there" in problems


def test_open_log_of_a_running_writer_verifies_and_says_open(
    tmp_path: Path, silos: dict[str, Identity]
) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, writer="silo-a", signing_key_pem=silos["silo-a"].key_pem,
                   clock=fixed_clock())
    try:
        log.append("round_started", round=1)
        assert log.checkpoint() is True
        assert log.checkpoint() is False            # nothing new to sign
        log.append("round_started", round=2)
        assert writer_running(path)
        report = verify_audit_log(path, cert_pem=silos["silo-a"].cert_pem)
        assert report.ok and report.open and not report.closed and report.records == 3
        assert report.head is not None and report.head.count == 2
        assert "closed: no; open: the writer is still running" in format_report(report)
    finally:
        log.close()
    assert not writer_running(path)
    report = verify_audit_log(path, cert_pem=silos["silo-a"].cert_pem)
    assert report.ok and report.closed and not report.open and report.head.count == 4


_KILLED_WRITER = """
import os, sys
from pathlib import Path
from trellis.crypto.audit import AuditLog
log = AuditLog(Path(sys.argv[1]), writer="silo-a", signing_key_pem=Path(sys.argv[2]).read_bytes())
log.append("round_started", round=1)
log.checkpoint()
log.append("round_started", round=2)
os._exit(0)    # like kill -9: no close record, the lock goes with the process
"""


def test_killed_writer_fails_until_resumed_and_the_head_stays_consistent(
    tmp_path: Path, silos: dict[str, Identity]
) -> None:
    path = tmp_path / "audit.jsonl"
    key = tmp_path / "silo-a.key"
    key.write_bytes(silos["silo-a"].key_pem)
    cert = silos["silo-a"].cert_pem
    for _ in range(2):                      # killed twice: two runs without a close
        done = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(path), str(key)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    report = verify_audit_log(path, cert_pem=cert)
    assert report.records == 6 and report.head is not None and report.head.count == 5
    assert report.problems == [
        "log ends without its closing entry after 6 records; expected at least 7: its end was "
        "cut off, or its writer was killed (restarting that coordinator or silo on the same "
        "state folder resumes and closes it)"
    ]
    with AuditLog(path, writer="silo-a", signing_key_pem=silos["silo-a"].key_pem) as log:
        log.append("resumed", round=3)
    report = verify_audit_log(path, cert_pem=cert)
    assert report.ok and report.closed and report.records == 8 and report.head.count == 8


def test_writer_refuses_to_resume_a_log_cut_while_it_was_down(signed_log: Path) -> None:
    """Else its next head would replace the evidence of the cut."""
    write_lines(signed_log, lines_of(signed_log)[:-2])
    head_before = head_path(signed_log).read_bytes()
    with pytest.raises(AuditError, match="log has 11 records; its signed head .* says at least "
                                         "13.*move both away"):
        AuditLog(signed_log, writer="silo-a")
    assert head_path(signed_log).read_bytes() == head_before
    signed_log.unlink()                     # removed entirely: refused too
    with pytest.raises(AuditError, match="log has 0 records"):
        AuditLog(signed_log, writer="silo-a")


def test_forged_head_fails_with_a_certificate(signed_log: Path, silos: dict[str, Identity]
                                              ) -> None:
    """A head rewritten to fit a cut log: right count and hash, but not the writer's signature."""
    write_lines(signed_log, lines_of(signed_log)[:-3])
    head = json.loads(head_path(signed_log).read_text())
    head.update(count=10, head=hashlib.sha256(lines_of(signed_log)[-1]).hexdigest())
    head_path(signed_log).write_text(json.dumps(head))
    report = verify_audit_log(signed_log, cert_pem=silos["silo-a"].cert_pem)
    assert "the signed head's signature does not verify (forged, or another writer's)" in (
        report.problems)
    assert "verified" not in format_report(report)
    # The wrong certificate on an intact log: every signature fails, nothing says "verified".
    write_log(signed_log.with_name("other.jsonl"), silos["silo-a"])
    report = verify_audit_log(signed_log.with_name("other.jsonl"),
                              cert_pem=silos["silo-b"].cert_pem)
    assert not report.ok and "verified" not in format_report(report)


def test_damaged_or_foreign_head_fails(signed_log: Path, tmp_path: Path,
                                       silos: dict[str, Identity]) -> None:
    head_path(signed_log).write_text("{not json")
    assert verify_audit_log(signed_log).problems == [
        f"the audit head {head_path(signed_log)} is damaged: not valid JSON"]
    other = tmp_path / "other" / "audit.jsonl"
    with AuditLog(other, writer="silo-b", signing_key_pem=silos["silo-b"].key_pem) as log:
        log.append("joined")
    report = verify_audit_log(signed_log, head=head_path(other))
    assert "the signed head is by 'silo-b' but the log by 'silo-a'" in report.problems
    with pytest.raises(AuditError, match="cannot read the audit head"):
        verify_audit_log(signed_log, head=tmp_path / "missing.head")


def test_checkpoint_relabelled_as_close_does_not_verify(
    signed_log: Path, silos: dict[str, Identity]
) -> None:
    lines = lines_of(signed_log)[:10]  # ends with the second checkpoint
    lines[-1] = lines[-1].replace(b'"event":"checkpoint"', b'"event":"close"')
    write_lines(signed_log, lines)
    head_path(signed_log).unlink()      # as if the reviewer had no head: the signature tells
    report = verify_audit_log(signed_log, cert_pem=silos["silo-a"].cert_pem)
    assert report.problems == ["line 10: close signature does not verify"]


def test_renamed_close_event_detected_without_certificate(signed_log: Path) -> None:
    lines = lines_of(signed_log)
    lines[-1] = lines[-1].replace(b'"event":"close"', b'"event":"cl0se"')
    write_lines(signed_log, lines)
    report = verify_audit_log(signed_log)
    assert report.problems[0] == "line 13: unexpected signature on a 'cl0se' record"


def test_invalid_json_and_partial_line(signed_log: Path) -> None:
    lines = lines_of(signed_log)
    lines[2] = b"{not json"
    write_lines(signed_log, lines)
    problems = verify_audit_log(signed_log).problems
    assert problems[0] == "line 3: not valid JSON (or not a JSON object)"
    assert problems[1].startswith("line 4: hash chain broken")

    signed_log.write_bytes(signed_log.read_bytes()[:-5])
    assert f"line {len(lines)}: incomplete final line (no newline)" in (
        verify_audit_log(signed_log).problems
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"payload": b"\x00\x01"},
        {"loss": float("nan")},
        {"loss": float("inf")},
        {"nested": {"values": [1.0, float("-inf")]}},
        {"obj": object()},
        {"data": {1: "non-string key"}},
        {"seq": 3},
        {"prev": "0" * 64},
        {"signature": "forged"},
    ],
)
def test_bad_fields_rejected(tmp_path: Path, fields: dict[str, object]) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, writer="silo-a") as log:
        with pytest.raises(AuditError):
            log.append("update_sent", **fields)
        with pytest.raises(AuditError):
            log.append("close")
    assert [json.loads(line)["event"] for line in lines_of(path)] == ["close"]


def test_reopen_resumes_chain(tmp_path: Path, silos: dict[str, Identity]) -> None:
    path = tmp_path / "audit.jsonl"
    write_log(path, silos["silo-a"], records=3, checkpoint_every=100)
    with AuditLog(path, writer="silo-a", signing_key_pem=silos["silo-a"].key_pem) as log:
        record = log.append("round_started", round=4)
    assert record["seq"] == 4
    report = verify_audit_log(path, cert_pem=silos["silo-a"].cert_pem)
    assert report.ok and report.closed and report.records == 6


def test_reopen_refuses_broken_chain(signed_log: Path) -> None:
    lines = lines_of(signed_log)
    del lines[3]
    write_lines(signed_log, lines)
    with pytest.raises(AuditError, match="line 4: hash chain broken"):
        AuditLog(signed_log, writer="silo-a")


def test_second_writer_on_same_file_refused(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, writer="coordinator"):
        with pytest.raises(AuditError, match="already open"):
            AuditLog(path, writer="coordinator")


def test_closed_log_refuses_appends(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", writer="coordinator")
    log.close()
    log.close()
    with pytest.raises(AuditError, match="closed"):
        log.append("late")


def test_concurrent_appends_keep_the_chain(tmp_path: Path, silos: dict[str, Identity]) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditLog(
        path, writer="coordinator", signing_key_pem=silos["silo-a"].key_pem, checkpoint_every=7
    ) as log:
        threads = [
            threading.Thread(target=lambda i=i: [log.append("rpc", peer=i) for _ in range(10)])
            for i in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    report = verify_audit_log(path, cert_pem=silos["silo-a"].cert_pem)
    assert report.ok and report.records == 40 + 5 + 1


def test_bad_signing_key_and_settings(tmp_path: Path) -> None:
    with pytest.raises(AuditError):
        AuditLog(tmp_path / "a.jsonl", writer="x", signing_key_pem=b"not a key")
    with pytest.raises(AuditError):
        AuditLog(tmp_path / "a.jsonl", writer="x", checkpoint_every=0)
    with pytest.raises(AuditError):
        AuditLog(tmp_path / "a.jsonl", writer="")
    with pytest.raises(CryptoError):
        verify_audit_log(tmp_path / "missing.jsonl")


@pytest.fixture(scope="module")
def reference_log(
    tmp_path_factory: pytest.TempPathFactory, silos: dict[str, Identity]
) -> tuple[Path, list[str]]:
    path = tmp_path_factory.mktemp("reference") / "audit.jsonl"
    write_log(path, silos["silo-a"], records=6, checkpoint_every=3)
    return path, path.read_text().splitlines()


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_single_character_edit_is_detected(
    reference_log: tuple[Path, list[str]], silos: dict[str, Identity], data: st.DataObject
) -> None:
    path, original = reference_log
    lines = list(original)
    index = data.draw(st.integers(0, len(lines) - 1), label="line")
    line = lines[index]
    position = data.draw(st.integers(0, len(line) - 1), label="position")
    # Any character a UTF-8 file can hold (a lone surrogate cannot be written at all).
    replacement = data.draw(st.characters(codec="utf-8").filter(lambda c: c != line[position]),
                            label="char")
    lines[index] = line[:position] + replacement + line[position + 1 :]
    tampered = path.with_name("tampered.jsonl")
    tampered.write_text("".join(f"{text}\n" for text in lines), encoding="utf-8", newline="")
    assert not verify_audit_log(tampered, cert_pem=silos["silo-a"].cert_pem).ok
