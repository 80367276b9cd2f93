"""The certificates the federation's CA issues: ECDSA P-256, SHA-256, backdated a little, a CA
that signs only certificates (and CRLs) and leaves that only sign, coordinator hosts as IP
addresses or ASCII DNS names, and a positive validity in days.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .errors import PkiError

_DNS_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_DNS_RE = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*")
# Certificates start slightly in the past so that a peer whose clock lags a little
# does not reject a freshly issued certificate.
BACKDATE = timedelta(minutes=5)


def certificate_builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    now: datetime,
    days: int,
) -> x509.CertificateBuilder:
    """A certificate of subject by issuer for public_key, valid from just before now for days."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def leaf_builder(
    name: str,
    public_key: ec.EllipticCurvePublicKey,
    ca_cert: x509.Certificate,
    now: datetime,
    days: int,
) -> x509.CertificateBuilder:
    """An end-entity certificate (not a CA, signing only) named name, issued by ca_cert."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    ca_public_key = ca_cert.public_key()
    if not isinstance(ca_public_key, ec.EllipticCurvePublicKey):
        raise PkiError("the CA certificate must carry an ECDSA public key")
    return (
        certificate_builder(subject, ca_cert.subject, public_key, now, days)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_public_key), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            key_usage(digital_signature=True, key_cert_sign=False, crl_sign=False), critical=True
        )
    )


def key_usage(*, digital_signature: bool, key_cert_sign: bool, crl_sign: bool) -> x509.KeyUsage:
    """The key usage extension: only the usages asked for, every other one off."""
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=crl_sign,
        encipher_only=False,
        decipher_only=False,
    )


def host_to_san(host: str) -> x509.GeneralName:
    """A coordinator host as a subjectAltName entry: an IP address or an ASCII DNS name."""
    if not isinstance(host, str) or not host or host != host.strip():
        raise PkiError(f"invalid coordinator host {host!r}")
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if len(host) > 253 or _DNS_RE.fullmatch(host) is None:
        raise PkiError(f"invalid coordinator host {host!r}: use an IP address or an ASCII DNS name")
    return x509.DNSName(host)


def check_days(days: int) -> None:
    """Refuse a validity that is not a positive whole number of days (PkiError)."""
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise PkiError(f"validity must be a positive number of days, got {days!r}")
