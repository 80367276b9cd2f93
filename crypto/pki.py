"""Federation identities: a private CA issuing ECDSA P-256 certificates to coordinator and silos.

Longer than 400 lines on purpose: the CA, the silos' keys and requests, loading and checking
identities, and the throwaway identities of simulations share the same certificate rules.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeGuard

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .errors import PkiError, VerificationFailed

CA_KEY = "ca.key"
CA_CERT = "ca.crt"
SERVER_KEY = "server.key"
SERVER_CERT = "server.crt"
SERVER_NAME = "coordinator"
ISSUED_DIR = "issued"      # a copy of every certificate the CA issued, named by serial
# Marks an operator's certificate (`coordinator pki operator`): the coordinator's Admin service
# answers only certificates that carry it, and its Federation service refuses them. A UUID OID
# (ITU-T X.667, arc 2.25) of our own: silo certificates are issued with clientAuth alone,
# whatever their request asks for, so no silo certificate can ever carry it.
OPERATOR_USAGE = x509.ObjectIdentifier("2.25.166862062333821896239460993548764220041")

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_DNS_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_DNS_RE = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*")
# "ca" would collide with the ca.crt copied next to every silo certificate, and a silo
# called "coordinator" would be indistinguishable from the server in logs and audit trails.
_RESERVED_NAMES = frozenset({"ca", SERVER_NAME})
# Certificates start slightly in the past so that a peer whose clock lags a little
# does not reject a freshly issued certificate.
_BACKDATE = timedelta(minutes=5)
_VERIFY_MESSAGE = "certificate is not valid for this federation"
_SIGNATURE_MESSAGE = "signature does not verify"


@dataclass(frozen=True, repr=False)
class Identity:
    """A named key pair with its certificate and the federation CA certificate (all PEM)."""

    name: str
    key_pem: bytes
    cert_pem: bytes
    ca_pem: bytes

    @property
    def fingerprint(self) -> str:
        """SHA-256 fingerprint of this identity's certificate."""
        return certificate_fingerprint(self.cert_pem)

    def __repr__(self) -> str:
        return f"Identity(name={self.name!r}, fingerprint={self.fingerprint!r})"


def init_ca(
    ca_dir: Path, hosts: Sequence[str], *, federation: str = "trellis", days: int = 3650
) -> None:
    """Create the federation CA and the coordinator's server certificate in ca_dir."""
    ca_dir = Path(ca_dir)
    if isinstance(hosts, str):
        raise PkiError("hosts must be a sequence of host names or IP addresses, not one string")
    if not hosts:
        raise PkiError("at least one coordinator host name or IP address is required")
    sans = [_host_to_san(host) for host in hosts]
    if not federation or len(federation) > 40 or not federation.isprintable():
        raise PkiError(f"federation name {federation!r} must be 1 to 40 printable characters")
    _check_days(days)
    targets = [ca_dir / name for name in (CA_KEY, CA_CERT, SERVER_KEY, SERVER_CERT)]
    for target in targets:
        if target.exists():
            raise PkiError(f"{target} already exists; refusing to overwrite an existing CA")

    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, federation),
            x509.NameAttribute(NameOID.COMMON_NAME, f"{federation} federation CA"),
        ]
    )
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key(), now, days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage(digital_signature=False, key_cert_sign=True, crl_sign=True), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        _leaf_builder(SERVER_NAME, server_key.public_key(), ca_cert, now, days)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    ca_dir.mkdir(parents=True, exist_ok=True)
    if (ca_dir / ISSUED_DIR).exists() and any((ca_dir / ISSUED_DIR).iterdir()):
        raise PkiError(f"{ca_dir / ISSUED_DIR} already holds certificates of another CA")
    contents = [
        (_private_pem(ca_key), 0o600),
        (_cert_pem(ca_cert), 0o644),
        (_private_pem(server_key), 0o600),
        (_cert_pem(server_cert), 0o644),
    ]
    written: list[Path] = []
    try:
        for target, (data, mode) in zip(targets, contents, strict=True):
            _write_new(target, data, mode)
            written.append(target)
        written.append(_record_issued(ca_dir, server_cert))
    except BaseException:
        # Leave no half-initialised CA behind (e.g. another process raced us).
        for target in written:
            target.unlink(missing_ok=True)
        raise


def request_identity(name: str, id_dir: Path) -> Path:
    """Create a silo key pair and a certificate signing request for name; return the CSR path."""
    _check_name(name)
    id_dir = Path(id_dir)
    key_path = id_dir / f"{name}.key"
    csr_path = id_dir / f"{name}.csr"
    cert_path = id_dir / f"{name}.crt"
    for existing in (key_path, cert_path):
        if existing.exists():
            raise PkiError(f"{existing} already exists; refusing to overwrite an identity")
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .sign(key, hashes.SHA256())
    )
    id_dir.mkdir(parents=True, exist_ok=True)
    _write_new(key_path, _private_pem(key), 0o600)
    # A leftover CSR without its key is useless, so it is replaced rather than refused.
    csr_path.write_bytes(csr.public_bytes(serialization.Encoding.PEM))
    return csr_path


def renew_identity(id_dir: Path) -> tuple[Path, Path]:
    """Retire a silo's key and certificate and make a new key and CSR for the same name.

    Returns (the new CSR, the folder the old key and certificate were moved to). The old
    certificate stays valid until the coordinator operator revokes it by serial or file.
    """
    id_dir = Path(id_dir)
    keys = sorted(p for p in id_dir.glob("*.key") if p.with_suffix(".crt").exists())
    if len(keys) != 1:
        raise PkiError(f"{id_dir} must hold exactly one identity (<name>.key with <name>.crt) to "
                       f"renew; found {len(keys)}")
    key_path = keys[0]
    cert_path = key_path.with_suffix(".crt")
    name = key_path.stem
    serial = _load_cert(_read(cert_path, "certificate"), cert_path).serial_number
    retired = id_dir / "retired" / f"{name}-{serial:x}"
    if retired.exists():
        raise PkiError(f"{retired} already exists; this certificate was retired before")
    retired.mkdir(parents=True)
    for old in (key_path, cert_path):
        os.replace(old, retired / old.name)
    key_path.with_suffix(".csr").unlink(missing_ok=True)
    return request_identity(name, id_dir), retired


def sign_request(
    csr_path: Path, ca_dir: Path, *, days: int = 825, out_dir: Path | None = None
) -> Path:
    """Issue a client certificate for a silo's CSR; write it and ca.crt to out_dir."""
    return _sign(csr_path, ca_dir, days=days, out_dir=out_dir, operator=False)


def issue_operator(ca_dir: Path, name: str, out_dir: Path, *, days: int = 365) -> Path:
    """Make an operator's key and a certificate marked OPERATOR_USAGE in out_dir (with ca.crt).

    An operator certificate opens the coordinator's Admin service (status) and nothing of the
    federation: it never counts as a silo, whatever its name.
    """
    csr = request_identity(name, out_dir)
    try:
        return _sign(csr, ca_dir, days=days, out_dir=None, operator=True)
    except BaseException:
        (Path(out_dir) / f"{name}.key").unlink(missing_ok=True)
        raise
    finally:
        csr.unlink(missing_ok=True)


def is_operator_certificate(cert_pem: bytes) -> bool:
    """Whether a PEM certificate is marked as an operator's (OPERATOR_USAGE)."""
    try:
        usage = _load_cert(cert_pem).extensions.get_extension_for_class(x509.ExtendedKeyUsage)
    except (PkiError, x509.ExtensionNotFound, ValueError):
        return False
    return OPERATOR_USAGE in usage.value


def _sign(csr_path: Path, ca_dir: Path, *, days: int, out_dir: Path | None,
          operator: bool) -> Path:
    """Issue a client certificate (an operator's with OPERATOR_USAGE) for a CSR."""
    csr_path = Path(csr_path)
    ca_dir = Path(ca_dir)
    _check_days(days)
    try:
        csr = x509.load_pem_x509_csr(csr_path.read_bytes())
    except OSError as exc:
        raise PkiError(f"cannot read certificate request {csr_path}: {exc.strerror}") from None
    except ValueError:
        raise PkiError(f"{csr_path} is not a PEM certificate signing request") from None
    if not csr.is_signature_valid:
        raise VerificationFailed("certificate request signature does not verify")
    name = _common_name(csr.subject, f"certificate request {csr_path}")
    _check_name(name)
    public_key = csr.public_key()
    if not _is_p256(public_key):
        raise PkiError(f"certificate request {csr_path} must carry an ECDSA P-256 public key")

    ca_key = _load_private_key(_read(ca_dir / CA_KEY, "CA private key"), ca_dir / CA_KEY)
    ca_cert_pem = _read(ca_dir / CA_CERT, "CA certificate")
    ca_cert = _load_cert(ca_cert_pem, ca_dir / CA_CERT)
    if _public_bytes(ca_key.public_key()) != _public_bytes(ca_cert.public_key()):
        raise PkiError(f"{ca_dir / CA_KEY} does not match {ca_dir / CA_CERT}")

    out_dir = Path(out_dir) if out_dir is not None else csr_path.parent
    cert_path = out_dir / f"{name}.crt"
    ca_copy = out_dir / CA_CERT
    if cert_path.exists():
        raise PkiError(f"{cert_path} already exists; refusing to overwrite a certificate")
    copy_ca = True
    if ca_copy.exists():
        if ca_copy.read_bytes() != ca_cert_pem:
            raise PkiError(f"{ca_copy} exists and holds a different CA certificate")
        copy_ca = False

    cert = (
        _leaf_builder(name, public_key, ca_cert, datetime.now(UTC), days)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH,
                                              *([OPERATOR_USAGE] if operator else [])]),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_new(cert_path, _cert_pem(cert), 0o644)
    # Kept by the CA so that `pki list` shows it and `pki revoke` can find it by name.
    _record_issued(ca_dir, cert)
    if copy_ca:
        _write_new(ca_copy, ca_cert_pem, 0o644)
    return cert_path


def load_identity(id_dir: Path) -> Identity:
    """Load the one silo identity (<name>.key, <name>.crt, ca.crt) in id_dir and check it."""
    id_dir = Path(id_dir)
    if not id_dir.is_dir():
        raise PkiError(f"identity folder {id_dir} does not exist")
    keys = sorted(p for p in id_dir.glob("*.key") if p.stem != "ca")
    if not keys:
        raise PkiError(f"no private key in {id_dir}: create one with a certificate request first")
    complete = [key for key in keys if key.with_suffix(".crt").exists()]
    if not complete:
        key = keys[0]
        csr = key.with_suffix(".csr")
        hint = (
            f"send {csr} to the coordinator operator for signing"
            if csr.exists()
            else "create a new certificate request"
        )
        raise PkiError(f"no certificate {key.with_suffix('.crt')}: {hint}")
    if len(complete) > 1:
        names = ", ".join(key.stem for key in complete)
        raise PkiError(f"several identities in {id_dir} ({names}); keep one per folder")
    key_path = complete[0]
    return load_identity_files(key_path, key_path.with_suffix(".crt"), id_dir / CA_CERT)


def throwaway_identities(names: Sequence[str], folder: Path) -> dict[str, Identity]:
    """Create a CA and one signed identity per silo under folder (simulations, demos, tests)."""
    ca_dir = Path(folder) / "ca"
    init_ca(ca_dir, ["localhost", "127.0.0.1"])
    identities = {}
    for name in names:
        id_dir = Path(folder) / "silos" / name
        sign_request(request_identity(name, id_dir), ca_dir)
        identities[name] = load_identity(id_dir)
    return identities


def load_server_identity(ca_dir: Path) -> Identity:
    """Load the coordinator's identity (server.key, server.crt, ca.crt) from ca_dir and check it."""
    ca_dir = Path(ca_dir)
    return load_identity_files(ca_dir / SERVER_KEY, ca_dir / SERVER_CERT, ca_dir / CA_CERT)


def certificate_subject(cert_pem: bytes) -> str:
    """Return the subject common name of a PEM certificate."""
    return _common_name(_load_cert(cert_pem).subject, "certificate")


def certificate_hosts(cert_pem: bytes) -> list[str]:
    """The DNS names and IP addresses a PEM certificate is valid for (its subjectAltName)."""
    try:
        san = _load_cert(cert_pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return [*san.value.get_values_for_type(x509.DNSName),
            *(str(ip) for ip in san.value.get_values_for_type(x509.IPAddress))]


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


def certificate_fingerprint(cert_pem: bytes) -> str:
    """Return "sha256:" followed by the hex SHA-256 of the certificate's DER encoding."""
    der = _load_cert(cert_pem).public_bytes(serialization.Encoding.DER)
    return "sha256:" + hashlib.sha256(der).hexdigest()


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
            raise VerificationFailed(_VERIFY_MESSAGE)
        if not isinstance(cert.signature_hash_algorithm, hashes.SHA256):
            raise VerificationFailed(_VERIFY_MESSAGE)
        if cert.issuer != ca.subject:
            raise VerificationFailed(_VERIFY_MESSAGE)
        ca_key.verify(
            cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm)
        )
        if not _is_ca(ca) or _is_ca(cert):
            raise VerificationFailed(_VERIFY_MESSAGE)
        for checked in (cert, ca):
            if not checked.not_valid_before_utc <= now <= checked.not_valid_after_utc:
                raise VerificationFailed(_VERIFY_MESSAGE)
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if len(names) != 1 or not isinstance(names[0].value, str):
            raise VerificationFailed(_VERIFY_MESSAGE)
        return names[0].value
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm, x509.ExtensionNotFound):
        raise VerificationFailed(_VERIFY_MESSAGE) from None


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


def sign_bytes(key_pem: bytes, data: bytes) -> bytes:
    """Sign data with an ECDSA P-256 private key (SHA-256); return a DER signature."""
    key = _load_private_key(key_pem)
    return key.sign(data, ec.ECDSA(hashes.SHA256()))


def verify_bytes(cert_pem: bytes, data: bytes, signature: bytes) -> None:
    """Check a signature made by sign_bytes against the certificate's public key."""
    try:
        public_key = x509.load_pem_x509_certificate(cert_pem).public_key()
        if not _is_p256(public_key):
            raise VerificationFailed(_SIGNATURE_MESSAGE)
        public_key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        raise VerificationFailed(_SIGNATURE_MESSAGE) from None


def load_identity_files(key_path: Path, cert_path: Path, ca_path: Path) -> Identity:
    """Load a key, its certificate and the CA certificate; check that they fit together."""
    for path, what in ((key_path, "private key"), (cert_path, "certificate")):
        if not path.exists():
            raise PkiError(f"no {what} {path}")
    if not ca_path.exists():
        raise PkiError(
            f"no CA certificate {ca_path}: it comes with the signed certificate "
            "from the coordinator operator"
        )
    if os.name == "posix" and key_path.stat().st_mode & 0o077:
        raise PkiError(
            f"private key {key_path} is readable by other users; run: chmod 600 {key_path}"
        )
    key_pem = _read(key_path, "private key")
    cert_pem = _read(cert_path, "certificate")
    ca_pem = _read(ca_path, "CA certificate")
    key = _load_private_key(key_pem, key_path)
    cert = _load_cert(cert_pem, cert_path)
    if _public_bytes(key.public_key()) != _public_bytes(cert.public_key()):
        raise VerificationFailed(
            f"private key {key_path} does not match certificate {cert_path}: the certificate "
            "was issued for another key (a key re-created after signing?); keep the key the "
            "request was made with, or make a new request and have it signed")
    try:
        name = verify_certificate(cert_pem, ca_pem)
    except VerificationFailed:
        reason = explain_certificate(cert_pem, ca_pem, what=f"certificate {cert_path}")
        raise VerificationFailed(f"{reason or _VERIFY_MESSAGE}; {_hint(reason, ca_path)}"
                                 ) from None
    return Identity(name=name, key_pem=key_pem, cert_pem=cert_pem, ca_pem=ca_pem)


def _hint(reason: str, ca_path: Path) -> str:
    if "expired" in reason:
        return ("have it renewed: `silo pki renew` makes a new key and request for the "
                "coordinator operator to sign (`coordinator pki init` for the server's own)")
    if "not valid until" in reason:
        return "wait until then, or correct this machine's clock"
    return (f"the certificate and {ca_path} must come from the same federation: use the "
            "ca.crt returned with the signed certificate")


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    now: datetime,
    days: int,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def _leaf_builder(
    name: str,
    public_key: ec.EllipticCurvePublicKey,
    ca_cert: x509.Certificate,
    now: datetime,
    days: int,
) -> x509.CertificateBuilder:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    ca_public_key = ca_cert.public_key()
    if not isinstance(ca_public_key, ec.EllipticCurvePublicKey):
        raise PkiError("the CA certificate must carry an ECDSA public key")
    return (
        _builder(subject, ca_cert.subject, public_key, now, days)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_public_key), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            _key_usage(digital_signature=True, key_cert_sign=False, crl_sign=False), critical=True
        )
    )


def _key_usage(*, digital_signature: bool, key_cert_sign: bool, crl_sign: bool) -> x509.KeyUsage:
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


def _host_to_san(host: str) -> x509.GeneralName:
    if not isinstance(host, str) or not host or host != host.strip():
        raise PkiError(f"invalid coordinator host {host!r}")
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if len(host) > 253 or _DNS_RE.fullmatch(host) is None:
        raise PkiError(f"invalid coordinator host {host!r}: use an IP address or an ASCII DNS name")
    return x509.DNSName(host)


def _check_name(name: str) -> None:
    if not isinstance(name, str) or _NAME_RE.fullmatch(name) is None:
        raise PkiError(
            f"invalid identity name {name!r}: use 1 to 64 characters from A-Z, a-z, 0-9, "
            "'.', '_' and '-', starting with a letter or digit"
        )
    if name.lower() in _RESERVED_NAMES:
        raise PkiError(f"identity name {name!r} is reserved")


def _check_days(days: int) -> None:
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise PkiError(f"validity must be a positive number of days, got {days!r}")


def _common_name(name: x509.Name, what: str) -> str:
    values = name.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(values) != 1 or not isinstance(values[0].value, str):
        raise PkiError(f"{what} must have exactly one common name (CN)")
    return values[0].value


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _is_p256(public_key: object) -> TypeGuard[ec.EllipticCurvePublicKey]:
    return isinstance(public_key, ec.EllipticCurvePublicKey) and isinstance(
        public_key.curve, ec.SECP256R1
    )


def _load_private_key(key_pem: bytes, path: Path | None = None) -> ec.EllipticCurvePrivateKey:
    where = f" {path}" if path is not None else ""
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        # Never chain the original error: it could quote parts of the key.
        raise PkiError(f"cannot load private key{where}: not an unencrypted PEM key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise PkiError(f"private key{where} is not an ECDSA P-256 key")
    return key


def _load_cert(cert_pem: bytes, path: Path | None = None) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(cert_pem)
    except (ValueError, TypeError):
        where = f"{path} is" if path is not None else "data is"
        raise PkiError(f"{where} not a PEM X.509 certificate") from None


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise PkiError(f"cannot read {what} {path}: {exc.strerror}") from None


def _public_bytes(public_key: CertificatePublicKeyTypes) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _record_issued(ca_dir: Path, cert: x509.Certificate) -> Path:
    folder = ca_dir / ISSUED_DIR
    folder.mkdir(exist_ok=True)
    path = folder / f"{cert.serial_number:x}.crt"
    _write_new(path, _cert_pem(cert), 0o644)
    return path


def _write_new(path: Path, data: bytes, mode: int) -> None:
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
