"""`coordinator pki sign` and `pki operator` on a real CA folder with real CSRs: one valid
certificate per name unless renewed (the renewal revokes the old one), silo and operator names
apart, and no certificate named like a host. Every refusal is one line, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trellis.coordinator.cli.app import app
from trellis.crypto.pki import init_ca, renew_identity, request_identity
from trellis.crypto.revocation import certificate_serial, issued_certificates, read_crl

runner = CliRunner()


def _cli(*args: object) -> tuple[int, str]:
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    init_ca(tmp_path / "ca", ["coord.example.org", "192.0.2.7", "localhost"])
    return tmp_path / "ca"


def _csr(folder: Path, name: str) -> Path:
    return request_identity(name, folder)


def _sign(csr: Path, ca: Path, *extra: object) -> tuple[int, str]:
    return _cli("pki", "sign", csr, "--ca", ca, *extra)


def _one_line_error(code: int, output: str) -> str:
    assert code == 2, output
    [line] = output.strip().splitlines()
    assert line.startswith("error: ") and "Traceback" not in output
    return line


def test_a_second_certificate_for_a_name_with_a_valid_one_is_refused(ca: Path,
                                                                     tmp_path: Path) -> None:
    code, out = _sign(_csr(tmp_path / "real", "hospital-a"), ca)
    assert code == 0, out
    [first] = [c for c in issued_certificates(ca) if c.name == "hospital-a"]
    # Another key asks for the same name (an impostor, or a re-keyed silo that forgot --renew).
    second = _csr(tmp_path / "other", "hospital-a")
    line = _one_line_error(*_sign(second, ca))
    assert f"'hospital-a' already holds a valid certificate (serial {first.serial_hex}, " \
           f"expires {first.not_after:%Y-%m-%d})" in line
    assert "coordinator pki sign CSR ... --renew" in line
    assert f"coordinator pki revoke --serial {first.serial_hex} --ca {ca}" in line
    assert not (tmp_path / "other" / "hospital-a.crt").exists()
    assert len(issued_certificates(ca)) == 2 and not (ca / "crl.pem").exists()
    # A name differing only in case is the same name.
    _one_line_error(*_sign(_csr(tmp_path / "case", "Hospital-A"), ca))
    # Once the old one is revoked, the name is free again.
    code, out = _cli("pki", "revoke", "--serial", first.serial_hex, "--ca", ca)
    assert code == 0, out
    code, out = _sign(second, ca)
    assert code == 0 and (tmp_path / "other" / "hospital-a.crt").exists(), out


def test_renewing_issues_the_new_certificate_and_revokes_the_old_one(ca: Path,
                                                                    tmp_path: Path) -> None:
    identity = tmp_path / "id"
    assert _sign(_csr(identity, "hospital-a"), ca)[0] == 0
    _sign(_csr(tmp_path / "pharma", "pharma-b"), ca)
    old = certificate_serial((identity / "hospital-a.crt").read_bytes())
    csr, retired = renew_identity(identity)          # what `silo pki renew` does
    code, out = _sign(csr, ca, "--renew")
    assert code == 0, out
    assert f"revoked the certificate it replaces: hospital-a (serial {old:x})" in out
    new = certificate_serial((identity / "hospital-a.crt").read_bytes())
    crl = read_crl(ca)
    assert new != old and crl.revoked_at(old) is not None and crl.revoked_at(new) is None
    assert len(crl) == 1                              # pharma-b's certificate untouched
    code, out = _cli("pki", "list", "--ca", ca, "--json")
    status = {r["serial"]: r["status"] for r in json.loads(out) if r["name"] == "hospital-a"}
    assert status[f"{old:x}"].startswith("revoked ") and status[f"{new:x}"] == "valid"
    # Renewing a name with no valid certificate (e.g. an expired one) just issues.
    code, out = _sign(_csr(tmp_path / "fresh", "social-c"), ca, "--renew")
    assert code == 0 and "revoked" not in out, out


def test_silo_and_operator_names_stay_apart(ca: Path, tmp_path: Path) -> None:
    code, out = _cli("pki", "operator", "--name", "ops-alice", "--ca", ca, "--out",
                     tmp_path / "ops")
    assert code == 0, out
    line = _one_line_error(*_sign(_csr(tmp_path / "silo", "ops-alice"), ca))
    assert "'ops-alice' already names an operator certificate issued by this CA" in line
    assert "give the silo a name of its own" in line
    assert not (tmp_path / "silo" / "ops-alice.crt").exists()

    assert _sign(_csr(tmp_path / "a", "hospital-a"), ca)[0] == 0
    for name in ("hospital-a", "HOSPITAL-A"):
        line = _one_line_error(*_cli("pki", "operator", "--name", name, "--ca", ca, "--out",
                                     tmp_path / f"op-{name}"))
        assert f"'{name}' already names a silo certificate issued by this CA" in line
        assert not (tmp_path / f"op-{name}").exists() or not any(
            (tmp_path / f"op-{name}").iterdir())     # no key left behind
    # One operator certificate per name too, unless renewed.
    line = _one_line_error(*_cli("pki", "operator", "--name", "ops-alice", "--ca", ca,
                                 "--out", tmp_path / "ops2"))
    assert "'ops-alice' already holds a valid certificate" in line
    code, out = _cli("pki", "operator", "--name", "ops-alice", "--ca", ca, "--out",
                     tmp_path / "ops3", "--renew")
    assert code == 0 and "revoked the certificate it replaces: ops-alice" in out, out


@pytest.mark.parametrize("name, why", [
    ("localhost", "localhost names this machine"),
    ("LocalHost", "localhost names this machine"),
    ("db.localhost", "localhost names this machine"),
    ("127.0.0.1", "it is an IP address"),
    ("10.1.2.3", "it is an IP address"),
    ("2130706433", "it is an IP address"),           # 127.0.0.1 as a resolver reads it
    ("192.0.2.7", "it is an IP address"),
    ("coord.example.org", "the coordinator's server certificate (server.crt) names it"),
    ("COORD.example.org", "the coordinator's server certificate (server.crt) names it"),
])
def test_names_of_hosts_are_refused_for_silos_and_operators(ca: Path, tmp_path: Path,
                                                           name: str, why: str) -> None:
    line = _one_line_error(*_sign(_csr(tmp_path / "silo", name), ca))
    assert f"{name!r} is a host's name ({why}" in line and "give the silo a name" in line
    line = _one_line_error(*_cli("pki", "operator", "--name", name, "--ca", ca, "--out",
                                 tmp_path / "ops"))
    assert f"{name!r} is a host's name ({why}" in line and "give the operator a name" in line
    assert [c.name for c in issued_certificates(ca)] == ["coordinator"]
