"""A compliance reviewer's checks on the audit logs of a real federation, through the CLI.

Real coordinator and silo processes over mTLS on loopback write their logs and signed heads;
the reviewer runs `coordinator audit verify` and `coordinator audit cross-check` as processes.
Before, a log cut at its end still verified and nothing compared the two sides' records.
The reviewed silo trains with `--nproc 2` (two processes, gloo): its rank 0 alone talks to the
coordinator, and its log must show the uploads of any other silo.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.federation import (
    SILOS,
    Workspace,
    port_of,
    start_coordinator,
    start_silo,
    wait_all,
    write_plan,
)

pytestmark = pytest.mark.slow
SILO = SILOS[0]


def audit_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trellis.coordinator.cli", "audit",
                           *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def run(workspace_factory) -> tuple[Workspace, Path]:
    """A two-round FedStar federation of three silo processes; its folder."""
    ws = workspace_factory("audit-review", graphs=40)
    plan = write_plan(ws, "review", rounds=2)
    folder = ws.root / "review"
    folder.mkdir(exist_ok=True)
    coordinator = start_coordinator(plan, folder / "coordinator.log")
    silos = [start_silo(ws, s, port_of(plan), folder / s, folder / f"{s}.log",
                        extra=["--nproc", "2"] if s == SILO else []) for s in SILOS]
    codes = wait_all([*silos, coordinator], timeout=180)
    logs = {p.name: p.read_text() for p in folder.glob("*.log")}
    assert codes == [0, 0, 0, 0], logs
    return ws, folder


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def copy_log(source: Path, target: Path) -> Path:
    """Copy a log with its signed head, as a reviewer archives them."""
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, target / source.name)
    shutil.copy(source.with_name(source.name + ".head"), target / (source.name + ".head"))
    return target / source.name


def test_both_sides_logs_verify_with_their_certificates_and_heads(run) -> None:
    ws, folder = run
    server_cert = ws.ca / "server.crt"
    silo_cert = ws.identity(SILO) / f"{SILO}.crt"
    for log, cert in ((folder / "coordinator" / "audit.jsonl", server_cert),
                      (folder / SILO / "audit.jsonl", silo_cert)):
        done = audit_cli("verify", log, "--cert", cert)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "signatures verified against the given certificate" in done.stdout
        report = json.loads(audit_cli("verify", log, "--cert", cert, "--json").stdout)
        # Closed: the head is the close record, so it counts every record of the log.
        assert report["closed"] and not report["open"]
        assert report["head"]["event"] == "close"
        assert report["head"]["count"] == report["records"] == len(records(log))
    # The coordinator's log checked against a silo's certificate: no "verified" anywhere.
    wrong = audit_cli("verify", folder / "coordinator" / "audit.jsonl", "--cert", silo_cert)
    assert wrong.returncode == 1 and "verified" not in wrong.stdout + wrong.stderr
    assert "FAILED: the signed head's signature does not verify" in wrong.stdout


def test_each_round_signs_a_head_on_both_sides(run) -> None:
    """The head is at most one round old: the coordinator signs one as it completes a round,
    before the next round's uploads; a silo signs one before each round's upload."""
    _, folder = run
    coordinator = records(folder / "coordinator" / "audit.jsonl")
    for round_ in (1, 2):
        done = next(i for i, r in enumerate(coordinator)
                    if r["event"] == "round_completed" and r["round"] == round_)
        after = [r["event"] for r in coordinator[done + 1:]]
        assert "received_tensor" not in after[:after.index("checkpoint")], after
    silo = [r["event"] for r in records(folder / SILO / "audit.jsonl")]
    uploads = [i for i, event in enumerate(silo) if event == "sent_tensor"]
    assert len(uploads) == 2
    for start, upload in zip([0, *uploads], uploads, strict=False):
        assert "checkpoint" in silo[start:upload], silo


def test_a_silo_of_two_processes_uploads_and_records_like_the_others(run) -> None:
    """`silo join --nproc 2`: the worker process talks to nobody but rank 0, so the silo's
    audit log holds the same events, round by round, as a one-process silo's."""
    _, folder = run
    assert "training with 2 processes (gloo" in (folder / f"{SILO}.log").read_text()

    def events(silo: str) -> list[tuple[str, object]]:
        return [(r["event"], r.get("round")) for r in records(folder / silo / "audit.jsonl")
                if r["event"] not in ("checkpoint", "revealed_shares")]

    # Revealing shares is skipped by whichever silo is slowest once a threshold has revealed.
    assert events(SILO) == events(SILOS[1])
    uploads = [r for r in records(folder / SILO / "audit.jsonl") if r["event"] == "sent_tensor"]
    assert [r["round"] for r in uploads] == [1, 2]


def test_a_coordinator_log_cut_at_its_end_fails_with_the_counts(run, tmp_path: Path) -> None:
    _, folder = run
    log = copy_log(folder / "coordinator" / "audit.jsonl", tmp_path)
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:-3]))
    done = audit_cli("verify", log)
    assert done.returncode == 1, done.stdout
    assert f"FAILED: log has {len(lines) - 3} records; its signed head (written at " in (
        done.stdout)
    assert f"says at least {len(lines)}: its end was cut off" in done.stdout
    assert (f"FAILED: log ends without its closing entry after {len(lines) - 3} records; "
            f"expected at least {len(lines) + 1}") in done.stdout


def test_cross_check_agrees_then_names_the_upload_whose_hash_changed(run, tmp_path: Path
                                                                     ) -> None:
    ws, folder = run
    silo_log = folder / SILO / "audit.jsonl"
    certs = ("--silo-cert", ws.identity(SILO) / f"{SILO}.crt",
             "--coordinator-cert", ws.ca / "server.crt")
    done = audit_cli("cross-check", silo_log, folder / "coordinator" / "audit.jsonl", *certs)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"silo {SILO}: 2 uploads match the coordinator's log" in done.stdout
    assert "OK: both logs verify and agree on every upload" in done.stdout

    # A coordinator log whose record of round 2's upload from this silo names another hash.
    log = copy_log(folder / "coordinator" / "audit.jsonl", tmp_path)
    lines = log.read_text().splitlines(keepends=True)
    index, receipt = next((i, json.loads(line)) for i, line in enumerate(lines)
                          if '"event":"received_tensor"' in line and f'"silo":"{SILO}"' in line
                          and '"round":2,' in line)
    sent = next(r for r in records(silo_log)
                if r["event"] == "sent_tensor" and r["round"] == 2)
    assert sent["sha256"] == receipt["sha256"]
    lines[index] = lines[index].replace(receipt["sha256"], "0" * 64)
    log.write_text("".join(lines))
    done = audit_cli("cross-check", silo_log, log, *certs)
    assert done.returncode == 1, done.stdout
    assert (f"MISMATCH: round 2 attempt {sent['attempt']} masked_input: the silo sent sha256 "
            f"{sent['sha256']} (silo log line ") in done.stdout
    assert f"but the coordinator recorded {'0' * 64} (coordinator log line {index + 1})" in (
        done.stdout)
    assert f"silo {SILO}: 1 uploads match" in done.stdout
    assert "FAILED: line" in done.stdout            # the edited copy does not verify either
    report = json.loads(audit_cli("cross-check", silo_log, log, *certs, "--json").stdout)
    assert not report["ok"] and [d["round"] for d in report["discrepancies"]] == [2]

    missing = audit_cli("cross-check", tmp_path / "nothing.jsonl", log)
    assert missing.returncode == 2 and "no such file" in missing.stderr
