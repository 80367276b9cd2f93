"""Revocation: the CA's record of what it issued, and the CRL it signs when a key is lost.

Every certificate the CA issues is kept in ``<ca>/issued/<serial>.crt`` so that the operator can
list them and revoke one by name, by file or by serial. Revoking re-signs ``<ca>/crl.pem`` (an
X.509 v2 CRL, ``cryptography``'s builder), which the coordinator watches and applies to every
connection and every call without a restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .durable import write_atomic
from .errors import PkiError, VerificationFailed
from .pem import load_certificate, load_private_key, read_pem
from .pki import CA_CERT, CA_KEY, ISSUED_DIR

CRL_FILE = "crl.pem"
# A CRL names when the next one is due; the coordinator never treats an old one as void
# (a stale CRL still revokes), so this only tells other tools how fresh it claims to be.
_CRL_VALIDITY = timedelta(days=365)


@dataclass(frozen=True)
class IssuedCertificate:
    """One certificate the CA issued, as kept in its issued/ folder."""

    name: str
    serial: int
    not_before: datetime
    not_after: datetime
    path: Path

    @property
    def serial_hex(self) -> str:
        """The serial number as the operator types it (hex, no prefix)."""
        return format(self.serial, "x")

    def status(self, crl: RevocationList, now: datetime) -> str:
        """'revoked <date>', 'expired <date>', 'not yet valid' or 'valid'."""
        revoked = crl.revoked_at(self.serial)
        if revoked is not None:
            return f"revoked {revoked:%Y-%m-%d %H:%M}Z"
        if now > self.not_after:
            return f"expired {self.not_after:%Y-%m-%d}"
        if now < self.not_before:
            return "not yet valid"
        return "valid"


@dataclass(frozen=True)
class RevocationList:
    """The serials a CRL revokes, with when; empty when the CA has revoked nothing."""

    revoked: dict[int, datetime]
    number: int = 0
    issued_at: datetime | None = None

    def revoked_at(self, serial: int) -> datetime | None:
        """When the certificate with this serial was revoked, or None."""
        return self.revoked.get(serial)

    def __len__(self) -> int:
        return len(self.revoked)


EMPTY = RevocationList({})


def issued_certificates(ca_dir: Path) -> list[IssuedCertificate]:
    """Every certificate in the CA's issued/ folder, oldest first."""
    folder = Path(ca_dir) / ISSUED_DIR
    found = []
    for path in sorted(folder.glob("*.crt")) if folder.is_dir() else []:
        cert = load_certificate(read_pem(path, "issued certificate"), path)
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        name = str(names[0].value) if names else "?"
        found.append(IssuedCertificate(name, cert.serial_number, cert.not_valid_before_utc,
                                       cert.not_valid_after_utc, path))
    return sorted(found, key=lambda c: (c.not_before, c.name))


def certificate_serial(cert_pem: bytes) -> int:
    """The serial number of a PEM certificate."""
    return load_certificate(cert_pem).serial_number


def load_crl(crl_pem: bytes, ca_pem: bytes) -> RevocationList:
    """Parse a CRL and check that the federation CA signed it; refuse anything else."""
    ca = load_certificate(ca_pem)
    try:
        crl = x509.load_pem_x509_crl(crl_pem)
    except ValueError:
        raise PkiError("not a PEM certificate revocation list") from None
    ca_key = ca.public_key()
    if crl.issuer != ca.subject or not isinstance(ca_key, ec.EllipticCurvePublicKey) or (
            not crl.is_signature_valid(ca_key)):
        raise VerificationFailed("the revocation list was not signed by this federation's CA")
    try:
        number = int(crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number)
    except x509.ExtensionNotFound:
        number = 0
    revoked = {entry.serial_number: entry.revocation_date_utc for entry in crl}
    return RevocationList(revoked, number, crl.last_update_utc)


def read_crl(ca_dir: Path) -> RevocationList:
    """The CA folder's current CRL (checked against its ca.crt), or an empty one."""
    path = Path(ca_dir) / CRL_FILE
    if not path.exists():
        return EMPTY
    try:
        return load_crl(read_pem(path, "revocation list"), read_pem(Path(ca_dir) / CA_CERT,
                                                               "CA certificate"))
    except (PkiError, VerificationFailed) as exc:
        raise PkiError(f"{path}: {exc}") from None


def revoke(ca_dir: Path, serials: set[int], *, now: datetime | None = None) -> RevocationList:
    """Add serials to the CA's CRL and re-sign it (written atomically); return the new list."""
    ca_dir = Path(ca_dir)
    # A CRL keeps whole seconds; the list returned says what the file says.
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    ca_key = load_private_key(read_pem(ca_dir / CA_KEY, "CA private key"), ca_dir / CA_KEY)
    ca_cert = load_certificate(read_pem(ca_dir / CA_CERT, "CA certificate"), ca_dir / CA_CERT)
    current = read_crl(ca_dir)
    revoked = dict(current.revoked)
    for serial in serials:
        revoked.setdefault(serial, now)
    builder = (x509.CertificateRevocationListBuilder()
               .issuer_name(ca_cert.subject)
               .last_update(now)
               .next_update(now + _CRL_VALIDITY)
               .add_extension(x509.CRLNumber(current.number + 1), critical=False))
    for serial, when in sorted(revoked.items()):
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(when).build())
    crl = builder.sign(ca_key, hashes.SHA256())
    # Written beside and renamed: the coordinator watching the file never reads half a CRL.
    pem = crl.public_bytes(serialization.Encoding.PEM)
    write_atomic(ca_dir / CRL_FILE, lambda handle: handle.write(pem), mode=0o644)
    return RevocationList(revoked, current.number + 1, now)
