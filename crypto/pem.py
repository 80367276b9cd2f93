"""PEM keys and certificates on disk: loaded with errors that quote nothing secret, written to
new files only, with a private key's mode set as it is created.

The low level under crypto/pki.py (the CA and identity folders), crypto/certificates.py and the
revocation list: every ECDSA P-256 key or X.509 certificate the federation reads or writes
passes through here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeGuard

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import NameOID

from .errors import PkiError


def read_pem(path: Path, what: str) -> bytes:
    """The bytes of a key or certificate file; PkiError naming `what` if it cannot be read."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise PkiError(f"cannot read {what} {path}: {exc.strerror}") from None


def load_private_key(key_pem: bytes, path: Path | None = None) -> ec.EllipticCurvePrivateKey:
    """An unencrypted PEM ECDSA P-256 private key; PkiError (naming path, never the key) if not."""
    where = f" {path}" if path is not None else ""
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        # Never chain the original error: it could quote parts of the key.
        raise PkiError(f"cannot load private key{where}: not an unencrypted PEM key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise PkiError(f"private key{where} is not an ECDSA P-256 key")
    return key


def load_certificate(cert_pem: bytes, path: Path | None = None) -> x509.Certificate:
    """A PEM X.509 certificate; PkiError (naming path) if the bytes are not one."""
    try:
        return x509.load_pem_x509_certificate(cert_pem)
    except (ValueError, TypeError):
        where = f"{path} is" if path is not None else "data is"
        raise PkiError(f"{where} not a PEM X.509 certificate") from None


def is_p256(public_key: object) -> TypeGuard[ec.EllipticCurvePublicKey]:
    """Whether a public key is an ECDSA key on P-256, the federation's one curve."""
    return isinstance(public_key, ec.EllipticCurvePublicKey) and isinstance(
        public_key.curve, ec.SECP256R1
    )


def common_name(name: x509.Name, what: str) -> str:
    """The one common name (CN) of a subject or issuer; PkiError naming `what` otherwise."""
    values = name.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(values) != 1 or not isinstance(values[0].value, str):
        raise PkiError(f"{what} must have exactly one common name (CN)")
    return values[0].value


def public_key_der(public_key: CertificatePublicKeyTypes) -> bytes:
    """A public key's DER SubjectPublicKeyInfo: equal bytes mean the same key."""
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def private_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """A private key as unencrypted PKCS#8 PEM (its file is written with mode 0600)."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def certificate_pem(cert: x509.Certificate) -> bytes:
    """A certificate as PEM."""
    return cert.public_bytes(serialization.Encoding.PEM)


def write_new(path: Path, data: bytes, mode: int) -> None:
    """Write data to a file that must not exist yet, created with mode; PkiError otherwise."""
    # O_EXCL refuses to follow or replace anything already there, and the mode is set at
    # creation so a private key is never readable by others, not even for an instant.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise PkiError(f"{path} already exists; refusing to overwrite it") from None
    except OSError as exc:
        raise PkiError(f"cannot create {path}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
