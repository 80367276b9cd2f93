"""The CA's issued record and its CRL: what revoking writes, what a verifier accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from trellis.crypto.errors import PkiError, VerificationFailed
from trellis.crypto.pki import init_ca, request_identity, sign_request
from trellis.crypto.revocation import (
    CRL_FILE,
    certificate_serial,
    issued_certificates,
    load_crl,
    read_crl,
    revoke,
)


@pytest.fixture()
def ca(tmp_path: Path) -> Path:
    ca_dir = tmp_path / "ca"
    init_ca(ca_dir, ["localhost"])
    for name in ("silo-a", "silo-b"):
        sign_request(request_identity(name, tmp_path / name), ca_dir)
    return ca_dir


def test_every_issued_certificate_is_recorded_with_its_serial(ca: Path, tmp_path: Path) -> None:
    issued = issued_certificates(ca)
    assert sorted(c.name for c in issued) == ["coordinator", "silo-a", "silo-b"]
    serial = certificate_serial((tmp_path / "silo-a" / "silo-a.crt").read_bytes())
    assert any(c.serial == serial and c.path.name == f"{serial:x}.crt" for c in issued)


def test_revoking_adds_to_the_list_and_never_drops_an_entry(ca: Path) -> None:
    a, b = (c.serial for c in issued_certificates(ca) if c.name != "coordinator")
    first = revoke(ca, {a})
    second = revoke(ca, {b})
    assert first.number == 1 and second.number == 2
    assert set(read_crl(ca).revoked) == {a, b}
    assert read_crl(ca).revoked_at(a) == first.revoked_at(a)       # date kept, not renewed


def test_a_crl_from_another_ca_or_damaged_is_refused(ca: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    init_ca(other, ["localhost"])
    revoke(other, {123})
    with pytest.raises(VerificationFailed, match="not signed by this federation's CA"):
        load_crl((other / CRL_FILE).read_bytes(), (ca / "ca.crt").read_bytes())
    (ca / CRL_FILE).write_bytes(b"-----BEGIN X509 CRL-----\ngarbage\n-----END X509 CRL-----\n")
    with pytest.raises(PkiError, match="crl.pem: not a PEM certificate revocation list"):
        read_crl(ca)
