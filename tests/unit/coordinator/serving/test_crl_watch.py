"""The running coordinator's view of the CRL: picked up on change, never loosened."""

from __future__ import annotations

from pathlib import Path

from trellis.coordinator.serving.crl_watch import CrlWatch
from trellis.crypto.pki import init_ca, request_identity, sign_request
from trellis.crypto.revocation import CRL_FILE, revoke


def test_a_new_crl_is_applied_and_a_damaged_one_changes_nothing(tmp_path: Path) -> None:
    ca = tmp_path / "ca"
    init_ca(ca, ["localhost"])
    cert = sign_request(request_identity("silo-a", tmp_path / "id"), ca).read_bytes()
    watch = CrlWatch(ca / CRL_FILE, (ca / "ca.crt").read_bytes())
    assert watch.refresh() is None and watch.revoked_at(cert) is None
    revoke(ca, {int.from_bytes(b"\x01", "big")})
    assert "loaded (number 1, 1 revoked)" in (watch.refresh() or "")
    assert watch.revoked_at(cert) is None
    from trellis.crypto.revocation import certificate_serial

    revoke(ca, {certificate_serial(cert)})
    assert "number 2, 2 revoked" in (watch.refresh() or "")
    serial, _ = watch.revoked_at(cert) or (None, None)
    assert serial == certificate_serial(cert)
    (ca / CRL_FILE).write_bytes(b"not a crl")
    assert "ignored revocation list" in (watch.refresh() or "")
    assert watch.revoked_at(cert) is not None            # the damaged file loosened nothing
    (ca / CRL_FILE).unlink()
    assert "stay in force" in (watch.refresh() or "")
    assert watch.revoked_at(cert) is not None
