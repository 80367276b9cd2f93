"""Certificates with the mistakes operators make: expired, not yet valid, from another CA,
with a key that is not theirs. Issued by a real CA with the product's own certificate rules."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import DNSName, ExtendedKeyUsage, SubjectAlternativeName
from cryptography.x509.oid import ExtendedKeyUsageOID

from trellis.crypto.certificate_profiles import leaf_builder
from trellis.crypto.pem import certificate_pem, load_certificate, load_private_key, private_key_pem
from trellis.crypto.pki import (
    CA_CERT,
    CA_KEY,
    SERVER_CERT,
    SERVER_KEY,
    SERVER_NAME,
    init_ca,
    request_identity,
    sign_request,
)


def identity_valid_from(ca_dir: Path, name: str, out_dir: Path, start: datetime,
                        days: int) -> Path:
    """A silo identity folder whose certificate is valid from start for days (CA-signed)."""
    ca_key = load_private_key((ca_dir / CA_KEY).read_bytes())
    ca_cert = load_certificate((ca_dir / CA_CERT).read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (leaf_builder(name, key.public_key(), ca_cert, start, days)
            .add_extension(SubjectAlternativeName([DNSName(name)]), critical=False)
            .add_extension(ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    out_dir.mkdir(parents=True)
    (out_dir / f"{name}.key").write_bytes(private_key_pem(key))
    (out_dir / f"{name}.key").chmod(0o600)
    (out_dir / f"{name}.crt").write_bytes(certificate_pem(cert))
    shutil.copy(ca_dir / CA_CERT, out_dir / CA_CERT)
    return out_dir


def expired_identity(ca_dir: Path, name: str, out_dir: Path) -> Path:
    """Valid for 30 days, two years ago."""
    return identity_valid_from(ca_dir, name, out_dir, datetime.now(UTC) - timedelta(days=730),
                               30)


def future_identity(ca_dir: Path, name: str, out_dir: Path) -> Path:
    """Valid from next month."""
    return identity_valid_from(ca_dir, name, out_dir, datetime.now(UTC) + timedelta(days=30),
                               30)


def foreign_identity(root: Path, name: str, *, federation: str = "trellis") -> Path:
    """A whole identity (key, certificate, ca.crt) from another federation's CA."""
    ca = root / "foreign-ca"
    init_ca(ca, ["localhost", "127.0.0.1"], federation=federation)
    folder = root / "foreign-id"
    sign_request(request_identity(name, folder), ca)
    return folder


def with_certificate_from(identity: Path, other: Path, name: str, out_dir: Path) -> Path:
    """identity's ca.crt with other's key and certificate (a certificate from another CA)."""
    out_dir.mkdir(parents=True)
    for suffix in (".key", ".crt"):
        shutil.copy(other / f"{name}{suffix}", out_dir / f"{name}{suffix}")
    (out_dir / f"{name}.key").chmod(0o600)
    shutil.copy(identity / CA_CERT, out_dir / CA_CERT)
    return out_dir


def with_wrong_key(identity: Path, name: str, out_dir: Path) -> Path:
    """identity's certificate and ca.crt with a freshly made key that is not its key."""
    shutil.copytree(identity, out_dir)
    key = ec.generate_private_key(ec.SECP256R1())
    (out_dir / f"{name}.key").write_bytes(private_key_pem(key))
    return out_dir


def ca_with_expired_server(ca_dir: Path, out_dir: Path) -> Path:
    """A copy of the CA folder whose server certificate expired a year ago."""
    shutil.copytree(ca_dir, out_dir)
    ca_key = load_private_key((ca_dir / CA_KEY).read_bytes())
    ca_cert = load_certificate((ca_dir / CA_CERT).read_bytes())
    server_key = load_private_key((ca_dir / SERVER_KEY).read_bytes())
    start = datetime.now(UTC) - timedelta(days=400)
    cert = (leaf_builder(SERVER_NAME, server_key.public_key(), ca_cert, start, 30)
            .add_extension(SubjectAlternativeName([DNSName("localhost")]), critical=False)
            .add_extension(ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (out_dir / SERVER_CERT).write_bytes(certificate_pem(cert))
    return out_dir


def ca_with_wrong_server_key(ca_dir: Path, out_dir: Path) -> Path:
    """A copy of the CA folder whose server.key is not the key of server.crt."""
    shutil.copytree(ca_dir, out_dir)
    (out_dir / SERVER_KEY).write_bytes(private_key_pem(ec.generate_private_key(ec.SECP256R1())))
    return out_dir
