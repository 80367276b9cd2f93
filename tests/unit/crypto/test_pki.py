"""Tests for crypto.pki: CA setup, silo enrolment, identity loading and signatures."""

from __future__ import annotations

import base64
import ipaddress
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID

from tests.paths import ROOT
from trellis.crypto.certificates import (
    certificate_fingerprint,
    certificate_subject,
    sign_bytes,
    verify_bytes,
    verify_certificate,
)
from trellis.crypto.errors import CryptoError, PkiError, VerificationFailed
from trellis.crypto.pki import (
    CA_CERT,
    CA_KEY,
    SERVER_CERT,
    SERVER_KEY,
    Identity,
    init_ca,
    load_identity,
    load_server_identity,
    request_identity,
    sign_request,
)

HOSTS = ["localhost", "coordinator.example.org", "127.0.0.1", "::1"]


@pytest.fixture()
def ca_dir(tmp_path: Path) -> Path:
    path = tmp_path / "ca"
    init_ca(path, HOSTS, federation="test")
    return path


def enrol(name: str, ca_dir: Path, id_dir: Path, days: int = 825) -> Identity:
    sign_request(request_identity(name, id_dir), ca_dir, days=days)
    return load_identity(id_dir)


def cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_crypto_package_is_this_repository() -> None:
    import trellis.crypto as crypto

    assert Path(crypto.__file__).resolve().parent == ROOT / "crypto"


def test_init_ca_writes_private_keys_0600(ca_dir: Path) -> None:
    for name in (CA_KEY, SERVER_KEY):
        assert (ca_dir / name).stat().st_mode & 0o777 == 0o600
    for name in (CA_KEY, CA_CERT, SERVER_KEY, SERVER_CERT):
        assert (ca_dir / name).read_bytes().startswith(b"-----BEGIN ")


def test_ca_certificate_is_a_ca(ca_dir: Path) -> None:
    ca = cert(ca_dir / CA_CERT)
    assert ca.issuer == ca.subject
    assert certificate_subject((ca_dir / CA_CERT).read_bytes()) == "test federation CA"
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca
    usage = ca.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign


def test_server_certificate_has_dns_and_ip_sans(ca_dir: Path) -> None:
    server = cert(ca_dir / SERVER_CERT)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "coordinator.example.org"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    eku = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    ca_pem = (ca_dir / CA_CERT).read_bytes()
    assert verify_certificate((ca_dir / SERVER_CERT).read_bytes(), ca_pem) == "coordinator"


def test_init_ca_refuses_to_run_twice_and_changes_nothing(ca_dir: Path) -> None:
    before = {p.relative_to(ca_dir): p.read_bytes() for p in ca_dir.rglob("*") if p.is_file()}
    with pytest.raises(PkiError, match="already exists; refusing to overwrite"):
        init_ca(ca_dir, ["localhost"])
    after = {p.relative_to(ca_dir): p.read_bytes() for p in ca_dir.rglob("*") if p.is_file()}
    assert after == before


@pytest.mark.parametrize("hosts", [[], ["bad host"], [""], ["héllo.example"]])
def test_init_ca_rejects_bad_hosts(tmp_path: Path, hosts: list[str]) -> None:
    with pytest.raises(PkiError):
        init_ca(tmp_path / "ca", hosts)
    assert not (tmp_path / "ca").exists()


def test_request_sign_load_round_trip(ca_dir: Path, tmp_path: Path) -> None:
    id_dir = tmp_path / "id"
    csr_path = request_identity("hospital-a", id_dir)
    assert csr_path == id_dir / "hospital-a.csr"
    assert (id_dir / "hospital-a.key").stat().st_mode & 0o777 == 0o600
    with pytest.raises(PkiError, match="send .*hospital-a.csr to the coordinator operator"):
        load_identity(id_dir)

    cert_path = sign_request(csr_path, ca_dir)
    assert cert_path == id_dir / "hospital-a.crt"
    assert (id_dir / CA_CERT).read_bytes() == (ca_dir / CA_CERT).read_bytes()
    issued = cert(cert_path)
    eku = issued.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert not issued.extensions.get_extension_for_class(x509.BasicConstraints).value.ca

    identity = load_identity(id_dir)
    assert identity.name == "hospital-a"
    assert identity.cert_pem == cert_path.read_bytes()
    assert identity.fingerprint == certificate_fingerprint(identity.cert_pem)
    assert identity.fingerprint.startswith("sha256:") and len(identity.fingerprint) == 71
    assert "PRIVATE" not in repr(identity) and "key_pem" not in repr(identity)
    assert verify_certificate(identity.cert_pem, identity.ca_pem) == "hospital-a"


def test_sign_request_into_other_folder_and_refuses_overwrite(ca_dir: Path, tmp_path: Path) -> None:
    csr_path = request_identity("lab_2", tmp_path / "inbox")
    out = tmp_path / "outbox"
    assert sign_request(csr_path, ca_dir, out_dir=out) == out / "lab_2.crt"
    assert (out / CA_CERT).exists()
    with pytest.raises(PkiError, match="already exists"):
        sign_request(csr_path, ca_dir, out_dir=out)


def test_request_identity_refuses_existing_key(tmp_path: Path) -> None:
    request_identity("silo1", tmp_path)
    key = (tmp_path / "silo1.key").read_bytes()
    with pytest.raises(PkiError, match="already exists"):
        request_identity("silo1", tmp_path)
    assert (tmp_path / "silo1.key").read_bytes() == key


@pytest.mark.parametrize(
    "name", ["", "-lead", ".hidden", "a" * 65, "with space", "a/b", "ünï", "ca", "Coordinator"]
)
def test_bad_names_rejected(tmp_path: Path, name: str) -> None:
    with pytest.raises(PkiError):
        request_identity(name, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_sign_request_rejects_garbage_and_missing(ca_dir: Path, tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.csr"
    bogus.write_bytes(b"not a csr")
    with pytest.raises(PkiError, match="bogus.csr"):
        sign_request(bogus, ca_dir)
    with pytest.raises(PkiError, match="missing.csr"):
        sign_request(tmp_path / "missing.csr", ca_dir)


def test_sign_request_rejects_tampered_csr(ca_dir: Path, tmp_path: Path) -> None:
    csr_path = request_identity("silo1", tmp_path / "id")
    der = bytearray(x509.load_pem_x509_csr(csr_path.read_bytes()).public_bytes(Encoding.DER))
    der[-5] ^= 0x01  # inside the signature
    body = base64.encodebytes(bytes(der)).decode()
    csr_path.write_text(
        f"-----BEGIN CERTIFICATE REQUEST-----\n{body}-----END CERTIFICATE REQUEST-----\n"
    )
    with pytest.raises((VerificationFailed, PkiError)):
        sign_request(csr_path, ca_dir)
    assert not (tmp_path / "id" / "silo1.crt").exists()


def test_verify_certificate_rejects_other_ca(ca_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-ca"
    init_ca(other, ["localhost"], federation="test")  # same subject, different key
    identity = enrol("silo1", ca_dir, tmp_path / "id")
    with pytest.raises(VerificationFailed) as info:
        verify_certificate(identity.cert_pem, (other / CA_CERT).read_bytes())
    assert str(info.value) == "certificate is not valid for this federation"


def test_verify_certificate_rejects_expired_and_not_yet_valid(ca_dir: Path, tmp_path: Path) -> None:
    identity = enrol("silo1", ca_dir, tmp_path / "id", days=1)
    now = datetime.now(UTC)
    assert verify_certificate(identity.cert_pem, identity.ca_pem, now=now) == "silo1"
    for moment in (now + timedelta(days=2), now - timedelta(days=1)):
        with pytest.raises(VerificationFailed):
            verify_certificate(identity.cert_pem, identity.ca_pem, now=moment)


def test_verify_certificate_rejects_garbage_and_ca_as_leaf(ca_dir: Path) -> None:
    ca_pem = (ca_dir / CA_CERT).read_bytes()
    with pytest.raises(VerificationFailed):
        verify_certificate(b"garbage", ca_pem)
    with pytest.raises(VerificationFailed):
        verify_certificate(ca_pem, ca_pem)


def test_load_identity_errors(ca_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(PkiError, match="does not exist"):
        load_identity(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PkiError, match="no private key"):
        load_identity(empty)

    id_dir = tmp_path / "id"
    enrol("silo1", ca_dir, id_dir)
    sign_request(request_identity("silo2", id_dir), ca_dir)
    with pytest.raises(PkiError, match="several identities"):
        load_identity(id_dir)


def test_load_identity_rejects_readable_key(ca_dir: Path, tmp_path: Path) -> None:
    id_dir = tmp_path / "id"
    enrol("silo1", ca_dir, id_dir)
    os.chmod(id_dir / "silo1.key", 0o644)
    with pytest.raises(PkiError, match="chmod 600"):
        load_identity(id_dir)


def test_load_identity_rejects_mismatched_key_and_foreign_ca(ca_dir: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    enrol("silo-a", ca_dir, a)
    enrol("silo-b", ca_dir, b)
    (a / "silo-a.key").unlink()
    (a / "silo-a.key").write_bytes((b / "silo-b.key").read_bytes())
    os.chmod(a / "silo-a.key", 0o600)
    with pytest.raises(VerificationFailed):
        load_identity(a)

    other = tmp_path / "other-ca"
    init_ca(other, ["localhost"])
    (b / CA_CERT).write_bytes((other / CA_CERT).read_bytes())
    with pytest.raises(VerificationFailed):
        load_identity(b)


def test_load_server_identity(ca_dir: Path, tmp_path: Path) -> None:
    server = load_server_identity(ca_dir)
    assert server.name == "coordinator"
    assert server.key_pem == (ca_dir / SERVER_KEY).read_bytes()
    with pytest.raises(PkiError, match="no private key"):
        load_server_identity(tmp_path / "nowhere")


def test_sign_and_verify_bytes(ca_dir: Path, tmp_path: Path) -> None:
    identity = enrol("silo1", ca_dir, tmp_path / "id")
    signature = sign_bytes(identity.key_pem, b"round 3 update")
    verify_bytes(identity.cert_pem, b"round 3 update", signature)
    with pytest.raises(VerificationFailed):
        verify_bytes(identity.cert_pem, b"round 4 update", signature)
    tampered = signature[:-1] + bytes([signature[-1] ^ 1])
    with pytest.raises(VerificationFailed):
        verify_bytes(identity.cert_pem, b"round 3 update", tampered)
    server = load_server_identity(ca_dir)
    with pytest.raises(VerificationFailed):
        verify_bytes(server.cert_pem, b"round 3 update", signature)


def test_errors_are_crypto_errors_and_hide_keys(tmp_path: Path) -> None:
    secret = b"-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1tYXRlcmlhbA==\n-----END PRIVATE KEY-----"
    with pytest.raises(PkiError) as info:
        sign_bytes(secret, b"data")
    assert isinstance(info.value, CryptoError)
    assert "c2VjcmV0" not in str(info.value) and info.value.__cause__ is None
