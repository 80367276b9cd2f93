"""Operator certificates: marked by their own usage OID, which no silo certificate can carry."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from trellis.crypto.errors import PkiError
from trellis.crypto.pki import (
    ISSUED_DIR,
    OPERATOR_USAGE,
    init_ca,
    is_operator_certificate,
    issue_operator,
    load_identity,
    request_identity,
    sign_request,
)


@pytest.fixture()
def ca_dir(tmp_path: Path) -> Path:
    path = tmp_path / "ca"
    init_ca(path, ["localhost"], federation="test")
    return path


def test_operator_identity_is_complete_marked_and_recorded(ca_dir: Path, tmp_path: Path
                                                           ) -> None:
    cert_path = issue_operator(ca_dir, "ops-alice", tmp_path / "ops")
    identity = load_identity(tmp_path / "ops")
    assert identity.name == "ops-alice" and cert_path == tmp_path / "ops" / "ops-alice.crt"
    assert is_operator_certificate(identity.cert_pem)
    usage = x509.load_pem_x509_certificate(identity.cert_pem).extensions.get_extension_for_class(
        x509.ExtendedKeyUsage).value
    # clientAuth too: TLS must accept it as a client certificate.
    assert set(usage) == {ExtendedKeyUsageOID.CLIENT_AUTH, OPERATOR_USAGE}
    assert not (tmp_path / "ops" / "ops-alice.csr").exists()
    assert (tmp_path / "ops" / "ops-alice.key").stat().st_mode & 0o077 == 0
    recorded = [p.read_bytes() for p in (ca_dir / ISSUED_DIR).glob("*.crt")]
    assert identity.cert_pem in recorded


def test_a_silo_certificate_is_never_an_operators_even_if_its_request_asks(
        ca_dir: Path, tmp_path: Path) -> None:
    plain = sign_request(request_identity("lab-a", tmp_path / "a"), ca_dir)
    assert not is_operator_certificate(plain.read_bytes())
    # A CSR that asks for the operator usage gets a silo certificate all the same.
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sneaky")]))
           .add_extension(x509.ExtendedKeyUsage([OPERATOR_USAGE]), critical=False)
           .sign(key, hashes.SHA256()))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "sneaky.csr").write_bytes(csr.public_bytes(Encoding.PEM))
    issued = sign_request(tmp_path / "b" / "sneaky.csr", ca_dir)
    assert not is_operator_certificate(issued.read_bytes())
    assert not is_operator_certificate(b"not a certificate")


def test_operator_refuses_reserved_names_and_existing_keys(ca_dir: Path, tmp_path: Path
                                                           ) -> None:
    with pytest.raises(PkiError, match="reserved"):
        issue_operator(ca_dir, "coordinator", tmp_path / "x")
    issue_operator(ca_dir, "ops", tmp_path / "ops")
    with pytest.raises(PkiError, match="already exists"):
        issue_operator(ca_dir, "ops", tmp_path / "ops")


def test_operator_from_a_missing_ca_leaves_no_key(tmp_path: Path) -> None:
    with pytest.raises(PkiError, match="CA private key"):
        issue_operator(tmp_path / "no-ca", "ops", tmp_path / "ops")
    assert list((tmp_path / "ops").iterdir()) == []
