"""Federation certificates read and checked, and signatures made with their keys.

One opaque VerificationFailed for every certificate or signature that does not verify (STYLE.md
6); explain_certificate gives the operator the reason in words, from public facts only.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .errors import PkiError, VerificationFailed
from .pem import common_name, is_p256, load_certificate, load_private_key

INVALID_CERTIFICATE = "certificate is not valid for this federation"
_SIGNATURE_MESSAGE = "signature does not verify"


def certificate_fingerprint(cert_pem: bytes) -> str:
    """Return "sha256:" followed by the hex SHA-256 of the certificate's DER encoding."""
    der = load_certificate(cert_pem).public_bytes(serialization.Encoding.DER)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def certificate_subject(cert_pem: bytes) -> str:
    """Return the subject common name of a PEM certificate."""
    return common_name(load_certificate(cert_pem).subject, "certificate")


def certificate_hosts(cert_pem: bytes) -> list[str]:
    """The DNS names and IP addresses a PEM certificate is valid for (its subjectAltName)."""
    try:
        extensions = load_certificate(cert_pem).extensions
        san = extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return [*san.value.get_values_for_type(x509.DNSName),
            *(str(ip) for ip in san.value.get_values_for_type(x509.IPAddress))]


def verify_certificate(cert_pem: bytes, ca_pem: bytes, *, now: datetime | None = None) -> str:
    """Check that cert_pem was issued by ca_pem and is valid at now; return its common name."""
    if now is None:
        now = datetime.now(UTC)
    elif now.tzinfo is None:
        raise PkiError("now must be a timezone-aware datetime")
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        ca = x509.load_pem_x509_certificate(ca_pem)
        ca_key = ca.public_key()
        if not isinstance(ca_key, ec.EllipticCurvePublicKey):
            raise VerificationFailed(INVALID_CERTIFICATE)
        if not isinstance(cert.signature_hash_algorithm, hashes.SHA256):
            raise VerificationFailed(INVALID_CERTIFICATE)
        if cert.issuer != ca.subject:
            raise VerificationFailed(INVALID_CERTIFICATE)
        ca_key.verify(
            cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm)
        )
        if not _is_ca(ca) or _is_ca(cert):
            raise VerificationFailed(INVALID_CERTIFICATE)
        for checked in (cert, ca):
            if not checked.not_valid_before_utc <= now <= checked.not_valid_after_utc:
                raise VerificationFailed(INVALID_CERTIFICATE)
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if len(names) != 1 or not isinstance(names[0].value, str):
            raise VerificationFailed(INVALID_CERTIFICATE)
        return names[0].value
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm, x509.ExtensionNotFound):
        raise VerificationFailed(INVALID_CERTIFICATE) from None


def explain_certificate(cert_pem: bytes, ca_pem: bytes, *, what: str = "certificate",
                        now: datetime | None = None) -> str:
    """Why cert_pem is not valid under ca_pem, in words an operator can act on ("" if it is)."""
    now = now or datetime.now(UTC)
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        ca = x509.load_pem_x509_certificate(ca_pem)
    except ValueError:
        return f"{what} is not a PEM X.509 certificate"
    for checked, label in ((cert, what), (ca, f"the CA certificate that {what} is checked by")):
        window = (f"valid from {checked.not_valid_before_utc:%Y-%m-%d %H:%M} to "
                  f"{checked.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
        if now > checked.not_valid_after_utc:
            return (f"{label} expired on {checked.not_valid_after_utc:%Y-%m-%d %H:%M} UTC "
                    f"({window})")
        if now < checked.not_valid_before_utc:
            return (f"{label} is not valid until {checked.not_valid_before_utc:%Y-%m-%d %H:%M} "
                    f"UTC ({window}); check this machine's clock")
    if cert.issuer != ca.subject:
        return (f"{what} was issued by {_issuer_label(cert.issuer)}, not by this federation's "
                f"CA {_issuer_label(ca.subject)}")
    try:
        verify_certificate(cert_pem, ca_pem, now=now)
    except VerificationFailed:
        return (f"{what} names this federation's CA {_issuer_label(ca.subject)} as issuer but "
                "its signature does not verify: it comes from another CA of the same name")
    return ""


def _issuer_label(name: x509.Name) -> str:
    values = name.get_attributes_for_oid(NameOID.COMMON_NAME)
    return repr(str(values[0].value)) if values else repr(name.rfc4514_string())


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def sign_bytes(key_pem: bytes, data: bytes) -> bytes:
    """Sign data with an ECDSA P-256 private key (SHA-256); return a DER signature."""
    key = load_private_key(key_pem)
    return key.sign(data, ec.ECDSA(hashes.SHA256()))


def verify_bytes(cert_pem: bytes, data: bytes, signature: bytes) -> None:
    """Check a signature made by sign_bytes against the certificate's public key."""
    try:
        public_key = x509.load_pem_x509_certificate(cert_pem).public_key()
        if not is_p256(public_key):
            raise VerificationFailed(_SIGNATURE_MESSAGE)
        public_key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        raise VerificationFailed(_SIGNATURE_MESSAGE) from None


def holds_private_key(data: bytes) -> bool:
    """Whether bytes are, or contain, a private key (PEM or DER, encrypted or not).

    For refusing to ship a file: the marker alone is enough, and anything that parses as a key
    counts, even an encrypted one.
    """
    if b"PRIVATE KEY" in data:
        return True
    for load in (serialization.load_pem_private_key, serialization.load_der_private_key):
        try:
            load(data, password=None)
        except TypeError:
            return True           # parses as an encrypted key: a key all the same
        except (ValueError, UnsupportedAlgorithm):
            continue
        return True
    return False
