"""Tests for crypto.audit_crosscheck: pairing a silo's uploads with the coordinator's receipts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trellis.crypto.audit import AuditLog
from trellis.crypto.audit_crosscheck import cross_check, read_records
from trellis.crypto.errors import AuditError

A, B, C, D = ("a" * 64, "b" * 64, "c" * 64, "d" * 64)


def numbered(*records: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    return list(enumerate(records, start=1))


def silo_log(*uploads: dict[str, Any], federation: str = "fed") -> list[tuple[int, dict]]:
    return numbered({"writer": "silo-a", "event": "joined", "federation": federation},
                    *({"writer": "silo-a", **u} for u in uploads))


def coordinator_log(*receipts: dict[str, Any]) -> list[tuple[int, dict]]:
    return numbered({"writer": "coordinator", "event": "serve", "federation": "fed"},
                    {"writer": "coordinator", "event": "connected", "silo": "silo-a"},
                    *({"writer": "coordinator", **r} for r in receipts))


def sent(event: str, round_: int, sha: str, attempt: int = 1) -> dict[str, Any]:
    return {"event": event, "round": round_, "attempt": attempt, "sha256": sha}


def received(event: str, phase: str, round_: int, sha: str, silo: str = "silo-a",
             attempt: int = 1) -> dict[str, Any]:
    return {"event": event, "phase": phase, "silo": silo, "round": round_, "attempt": attempt,
            "sha256": sha}


def test_every_kind_of_upload_pairs_with_its_receipt() -> None:
    result = cross_check(
        silo_log(sent("sealed_group_secrets", 0, A), sent("sent_envelope", 1, B),
                 sent("sent_tensor", 1, C), sent("sent_encrypted_update", 1, D)),
        coordinator_log(received("received_blobs", "GROUP_SEAL", 0, A),
                        received("received_blobs", "MASKED_INPUT", 1, B),
                        received("received_tensor", "MASKED_INPUT", 1, C),
                        received("received_blobs", "ENCRYPT_UPDATE", 1, D),
                        # Another silo's receipts are not this silo's business.
                        received("received_tensor", "MASKED_INPUT", 1, A, silo="silo-b")))
    assert result.ok and result.silo == "silo-a" and result.matched == 4


def test_differing_digest_and_one_sided_uploads_are_each_reported() -> None:
    result = cross_check(
        silo_log(sent("sent_tensor", 1, A), sent("sent_tensor", 2, B),
                 sent("sent_tensor", 3, C)),
        coordinator_log(received("received_tensor", "MASKED_INPUT", 1, A),
                        received("received_tensor", "MASKED_INPUT", 2, D),
                        received("received_tensor", "MASKED_INPUT", 3, C, attempt=2)))
    assert result.matched == 1 and not result.ok
    assert [d.describe() for d in result.discrepancies] == [
        f"round 2 attempt 1 masked_input: the silo sent sha256 {B} (silo log line 3) but the "
        f"coordinator recorded {D} (coordinator log line 4)",
        f"round 3 attempt 1 masked_input: in the silo's log (line 4, sha256 {C}) but not in the "
        "coordinator's",
        f"round 3 attempt 2 masked_input: in the coordinator's log (line 5, sha256 {C}) but not "
        "in the silo's",
    ]
    assert result.discrepancies[0].to_json()["coordinator_sha256"] == D


def test_only_the_coordinators_federation_is_compared() -> None:
    records = silo_log(sent("sent_tensor", 1, A), federation="earlier") + [
        (4, {"writer": "silo-a", "event": "joined", "federation": "fed"}),
        (5, {"writer": "silo-a", **sent("sent_tensor", 1, B)})]
    result = cross_check(records, coordinator_log(
        received("received_tensor", "MASKED_INPUT", 1, B)))
    assert result.ok and result.matched == 1


def test_logs_of_another_federation_or_given_in_the_wrong_order() -> None:
    stranger = cross_check(numbered({"writer": "silo-z", "event": "joined", "federation": "fed"}),
                           coordinator_log())
    assert stranger.problems == ["the coordinator's log never names silo 'silo-z': are these "
                                 "logs of the same federation (fed)?"]
    with pytest.raises(AuditError, match="give the silo's log first"):
        cross_check(coordinator_log(), silo_log())
    with pytest.raises(AuditError, match="not by the coordinator"):
        cross_check(silo_log(), silo_log())
    with pytest.raises(AuditError, match="the silo's log has no records"):
        cross_check([], coordinator_log())


def test_an_upload_record_without_its_round_is_reported() -> None:
    result = cross_check(silo_log({"event": "sealed_group_secrets", "sha256": A}),
                         coordinator_log())
    assert result.problems == ["silo log line 2: sealed_group_secrets record lacks its round, "
                               "attempt or sha256 (written by an older version?)"]


def test_records_are_read_from_a_real_log(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, writer="silo-a") as log:
        log.append("joined", federation="fed")
        log.append("sent_tensor", round=1, attempt=1, sha256=A)
    path.write_bytes(path.read_bytes() + b"{cut\n")
    records = read_records(path)
    assert [(n, r["event"]) for n, r in records] == [(1, "joined"), (2, "sent_tensor"),
                                                      (3, "close")]
    with pytest.raises(AuditError, match="cannot read audit log"):
        read_records(tmp_path / "missing.jsonl")


def test_logs_of_two_different_federations_stop_with_one_line_naming_both() -> None:
    # The same silo name in both logs, so before this check every one of the coordinator's
    # receipts came out as an upload missing from the silo's log: one MISMATCH each.
    coordinator = numbered({"writer": "coordinator", "event": "serve", "federation": "fed-b"},
                           {"writer": "coordinator", "event": "connected", "silo": "silo-a"},
                           *({"writer": "coordinator",
                              **received("received_tensor", "MASKED_INPUT", r, A)}
                             for r in range(1, 31)))
    silo = silo_log(*(sent("sent_tensor", r, A) for r in range(1, 31)), federation="fed-a")
    with pytest.raises(AuditError) as raised:
        cross_check(silo, coordinator)
    assert str(raised.value) == (
        "these logs are of different federations: the silo's log is of 'fed-a', the "
        "coordinator's of 'fed-b'; cross-check a silo's log against the coordinator log of "
        "the federation it joined")


def test_logs_of_two_different_runs_of_one_federation_stop_with_one_line() -> None:
    silo = numbered({"writer": "silo-a", "event": "joined", "federation": "fed", "run_id": "r1"},
                    {"writer": "silo-a", **sent("sent_tensor", 1, A)})
    coordinator = numbered({"writer": "coordinator", "event": "serve", "federation": "fed",
                            "run_id": "r2"},
                           {"writer": "coordinator",
                            **received("received_tensor", "MASKED_INPUT", 1, A)})
    with pytest.raises(AuditError, match="these logs are of different runs of federation "
                                         "'fed': the silo's log is of run 'r1', the "
                                         "coordinator's of run 'r2'"):
        cross_check(silo, coordinator)
    # A run recorded on one side only cannot be compared, so it is not held against the logs.
    unrecorded = [(n, {k: v for k, v in r.items() if k != "run_id"}) for n, r in coordinator]
    assert cross_check(silo, unrecorded).ok


def test_an_upload_the_silo_died_before_recording_is_listed_as_interrupted() -> None:
    # Killed during round 3's masked-input call: the coordinator accepted the tensor, the silo
    # never saw the answer, restarted, resumed and sent round 4.
    silo = silo_log(sent("sent_tensor", 2, A), {"event": "sent_keys", "round": 3, "attempt": 1},
                    {"event": "resumed", "round": 3, "attempt": 1},
                    {"event": "joined", "federation": "fed"}, sent("sent_tensor", 4, C))
    coordinator = coordinator_log(received("received_tensor", "MASKED_INPUT", 2, A),
                                  received("received_tensor", "MASKED_INPUT", 3, B),
                                  received("received_tensor", "MASKED_INPUT", 4, C))
    result = cross_check(silo, coordinator)
    assert result.ok and result.matched == 2 and not result.discrepancies
    [interrupted] = result.interrupted
    assert (interrupted.upload.round, interrupted.upload.sha256, interrupted.restart_line) == (
        3, B, 4)
    assert "restart at line 4" in interrupted.describe()


def test_a_coordinator_only_upload_the_silo_log_does_not_explain_still_fails() -> None:
    # The silo restarted, but its records had moved past round 3 before the restart; and a
    # silo that never restarted explains nothing.
    silo = silo_log({"event": "sent_keys", "round": 3, "attempt": 1}, sent("sent_tensor", 4, C),
                    {"event": "resumed", "round": 5, "attempt": 1})
    coordinator = coordinator_log(received("received_tensor", "MASKED_INPUT", 3, B),
                                  received("received_tensor", "MASKED_INPUT", 4, C))
    result = cross_check(silo, coordinator)
    assert not result.ok and not result.interrupted
    assert [(d.round, d.silo) for d in result.discrepancies] == [(3, None)]
    never_restarted = cross_check(silo_log({"event": "sent_keys", "round": 3, "attempt": 1}),
                                  coordinator_log(received("received_tensor", "MASKED_INPUT",
                                                           3, B)))
    assert not never_restarted.ok and not never_restarted.interrupted
