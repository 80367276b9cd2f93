"""Revocation and renewal with real processes: a silo whose key is stolen is revoked mid-
federation and drops out while the others finish; a renewed silo's old certificate is revoked
without touching anyone else's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.support.federation import (
    make_workspace,
    port_of,
    start_coordinator,
    start_silo,
    wait_all,
    write_plan,
)
from trellis.crypto.revocation import issued_certificates, revoke


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          timeout=60)


def test_a_silo_revoked_mid_federation_drops_out_and_the_others_finish(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, graphs=40, extra=1)          # four silos; three suffice
    plan = write_plan(ws, "revoked", algorithm="fedavg", rounds=8, min_silos=3, round_s=60)
    folder = ws.root / "revoked"
    coordinator = start_coordinator(plan, tmp_path / "coordinator.log")
    silos = {s: start_silo(ws, s, port_of(plan), folder / s, tmp_path / f"{s}.log")
             for s in ws.silos}
    # Revoked once its first masked input is in: lab-d is a member of the federation by then.
    audit_path = folder / "coordinator" / "audit.jsonl"
    deadline = time.monotonic() + 180
    while not (audit_path.exists() and any(
            '"event":"received_tensor"' in line and '"silo":"lab-d"' in line
            for line in audit_path.read_text().splitlines())):
        assert time.monotonic() < deadline and coordinator.poll() is None, (
            (tmp_path / "coordinator.log").read_text())
        time.sleep(0.05)
    # Revoked in this process (the CLI takes a second to start; a round takes a third of one):
    # the same CRL `coordinator pki revoke lab-d` writes, tested below and in
    # test_operator_errors.
    revoke(ws.ca, {c.serial for c in issued_certificates(ws.ca) if c.name == "lab-d"})
    codes = dict(zip([*silos, "coordinator"], wait_all([*silos.values(), coordinator], 240),
                     strict=True))
    logs = {p.stem: p.read_text() for p in tmp_path.glob("*.log")}

    assert codes["lab-d"] == 2, logs["lab-d"]
    assert re.search(r"error: the coordinator refused this silo: the certificate of 'lab-d' "
                     r"\(serial [0-9a-f]+\) was revoked", logs["lab-d"])
    assert all(codes[s] == 0 for s in (*ws.silos, "coordinator") if s != "lab-d"), logs
    results = json.loads((folder / "coordinator" / "results.json").read_text())
    assert results["status"] == "completed" and results["rounds_completed"] == 8
    assert any("lab-d" in r["participants"] for r in results["rounds"])
    assert "lab-d" not in results["rounds"][-1]["participants"]
    audit = [json.loads(line) for line in
             (folder / "coordinator" / "audit.jsonl").read_text().splitlines()]
    assert any(e["event"] == "revocation_list" and "1 revoked" in e["change"] for e in audit)
    refused = [e for e in audit if e["event"] == "refused"]
    assert refused and all(e["subject"] == "lab-d" and e["reason"] == "certificate revoked"
                           for e in refused)
    # Once the CRL was loaded the revoked silo never attended again.
    loaded_at = next(i for i, e in enumerate(audit) if e["event"] == "revocation_list")
    assert not [e for e in audit[loaded_at:] if e.get("silo") == "lab-d"
                and e["event"] == "connected"]
    verified = _cli("trellis.coordinator.cli", "audit", "verify",
                    str(folder / "coordinator" / "audit.jsonl"), "--cert",
                    str(ws.ca / "server.crt"))
    assert verified.returncode == 0, verified.stdout


def test_a_renewed_silo_keeps_its_name_and_its_old_certificate_is_revoked_alone(
        tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, graphs=20)
    identity = ws.identity("hospital-a")
    renewed = _cli("trellis.silo.cli", "pki", "renew", "--dir", str(identity))
    assert renewed.returncode == 0, renewed.stderr
    serial = re.search(r"old certificate \(serial ([0-9a-f]+)\)", renewed.stdout).group(1)
    assert "coordinator pki sign hospital-a.csr --ca CA_DIR --renew" in renewed.stdout
    assert (identity / "hospital-a.csr").exists() and not (identity / "hospital-a.crt").exists()
    # Signed as a plain request it is refused: the old certificate is still valid.
    refused = _cli("trellis.coordinator.cli", "pki", "sign", str(identity / "hospital-a.csr"),
                   "--ca", str(ws.ca))
    assert refused.returncode == 2 and f"serial {serial}" in refused.stderr, refused.stderr
    assert not (identity / "hospital-a.crt").exists()
    # The renewal issues the new certificate and revokes the old one.
    signed = _cli("trellis.coordinator.cli", "pki", "sign", str(identity / "hospital-a.csr"),
                  "--ca", str(ws.ca), "--renew")
    assert signed.returncode == 0, signed.stderr
    assert f"revoked the certificate it replaces: hospital-a (serial {serial})" in signed.stdout
    listed = _cli("trellis.coordinator.cli", "pki", "list", "--ca", str(ws.ca), "--json")
    rows = json.loads(listed.stdout)
    status = {(r["name"], r["serial"]): r["status"] for r in rows}
    assert status.pop(("hospital-a", serial)).startswith("revoked ")
    assert sorted(name for name, _ in status) == sorted(
        ["coordinator", "hospital-a", "pharma-b", "social-c", "intruder"])
    assert set(status.values()) == {"valid"}
    # The renewed identity loads and is not the retired one.
    from trellis.crypto.pki import load_identity
    from trellis.crypto.revocation import certificate_serial

    assert format(certificate_serial(load_identity(identity).cert_pem), "x") != serial


def test_pki_revoke_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, graphs=20)
    cases = [
        (["nobody"], r"no certificate issued to 'nobody' .*issued to: "),
        (["coordinator"], r"the coordinator's own certificate is not checked"),
        (["--serial", "zz"], r"--serial 'zz': expected a hexadecimal serial"),
        (["--serial", "abc123"], r"serial abc123 was not issued by the CA"),
        (["hospital-a", "--serial", "1"], r"exactly one of them"),
    ]
    for args, message in cases:
        done = _cli("trellis.coordinator.cli", "pki", "revoke", *args, "--ca", str(ws.ca))
        assert done.returncode == 2 and re.search(message, done.stderr), (args, done.stderr)
        assert not (ws.ca / "crl.pem").exists()
