"""The CA's name rules (crypto/issuance.py): what counts as a live certificate, and a host."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from trellis.crypto.errors import PkiError
from trellis.crypto.issuance import check_name, host_collision, sign_silo_request
from trellis.crypto.pki import init_ca, request_identity
from trellis.crypto.revocation import issued_certificates


def test_an_expired_certificate_leaves_its_name_free(tmp_path: Path) -> None:
    init_ca(tmp_path / "ca", ["localhost"])
    sign_silo_request(request_identity("lab-1", tmp_path / "id"), tmp_path / "ca", days=1)
    [cert] = [c for c in issued_certificates(tmp_path / "ca") if c.name == "lab-1"]
    with pytest.raises(PkiError, match="already holds a valid certificate"):
        check_name(tmp_path / "ca", "lab-1", operator=False, now=cert.not_after)
    after = cert.not_after + timedelta(seconds=1)
    assert check_name(tmp_path / "ca", "lab-1", operator=False, now=after) == ()
    # Renewing returns the live certificate it will revoke.
    assert check_name(tmp_path / "ca", "lab-1", operator=False, renew=True) == (cert,)


@pytest.mark.parametrize("name", ["hospital-a", "lab-1.example", "127a", "localhost-b",
                                  "v1.2"])
def test_ordinary_names_are_not_hosts(name: str) -> None:
    assert host_collision(name, ["coord.example.org"]) is None


@pytest.mark.parametrize("name", ["localhost", "a.localhost", "::1", "0x7f000001", "127.1",
                                  "Coord.Example.Org"])
def test_hosts_are_recognised(name: str) -> None:
    assert host_collision(name, ["coord.example.org"]) is not None
