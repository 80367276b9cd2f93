"""Federation identities: a private CA issuing ECDSA P-256 certificates to coordinator and silos.

The CA folder (its key, its certificate, the coordinator's, a copy of each one issued) and the
silos' identity folders (a key, its request, then its certificate and ca.crt): made, signed,
renewed and loaded here. Checking certificates and signatures is crypto/certificates.py; reading
and writing PEM files is crypto/pem.py.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .certificate_profiles import (
    certificate_builder,
    check_days,
    host_to_san,
    key_usage,
    leaf_builder,
)
from .certificates import (
    INVALID_CERTIFICATE,
    certificate_fingerprint,
    explain_certificate,
    verify_certificate,
)
from .errors import PkiError, VerificationFailed
from .pem import (
    certificate_pem,
    common_name,
    is_p256,
    load_certificate,
    load_private_key,
    private_key_pem,
    public_key_der,
    read_pem,
    write_new,
)

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
# "ca" would collide with the ca.crt copied next to every silo certificate, and a silo
# called "coordinator" would be indistinguishable from the server in logs and audit trails.
_RESERVED_NAMES = frozenset({"ca", SERVER_NAME})


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
    sans = [host_to_san(host) for host in hosts]
    if not federation or len(federation) > 40 or not federation.isprintable():
        raise PkiError(f"federation name {federation!r} must be 1 to 40 printable characters")
    check_days(days)
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
        certificate_builder(ca_name, ca_name, ca_key.public_key(), now, days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            key_usage(digital_signature=False, key_cert_sign=True, crl_sign=True), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        leaf_builder(SERVER_NAME, server_key.public_key(), ca_cert, now, days)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    ca_dir.mkdir(parents=True, exist_ok=True)
    if (ca_dir / ISSUED_DIR).exists() and any((ca_dir / ISSUED_DIR).iterdir()):
        raise PkiError(f"{ca_dir / ISSUED_DIR} already holds certificates of another CA")
    contents = [
        (private_key_pem(ca_key), 0o600),
        (certificate_pem(ca_cert), 0o644),
        (private_key_pem(server_key), 0o600),
        (certificate_pem(server_cert), 0o644),
    ]
    written: list[Path] = []
    try:
        for target, (data, mode) in zip(targets, contents, strict=True):
            write_new(target, data, mode)
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
    write_new(key_path, private_key_pem(key), 0o600)
    # A leftover CSR without its key is useless, so it is replaced rather than refused.
    csr_path.write_bytes(csr.public_bytes(serialization.Encoding.PEM))
    return csr_path


def renew_identity(id_dir: Path) -> tuple[Path, Path]:
    """Retire a silo's key and certificate and make a new key and CSR for the same name.

    Returns (the new CSR, the folder the old key and certificate were moved to). The old
    certificate stays valid until the coordinator operator signs the new request as a renewal
    (crypto/issuance.py), which revokes it.
    """
    id_dir = Path(id_dir)
    keys = sorted(p for p in id_dir.glob("*.key") if p.with_suffix(".crt").exists())
    if len(keys) != 1:
        raise PkiError(f"{id_dir} must hold exactly one identity (<name>.key with <name>.crt) to "
                       f"renew; found {len(keys)}")
    key_path = keys[0]
    cert_path = key_path.with_suffix(".crt")
    name = key_path.stem
    serial = load_certificate(read_pem(cert_path, "certificate"), cert_path).serial_number
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
        usage = load_certificate(cert_pem).extensions.get_extension_for_class(x509.ExtendedKeyUsage)
    except (PkiError, x509.ExtensionNotFound, ValueError):
        return False
    return OPERATOR_USAGE in usage.value


def _sign(csr_path: Path, ca_dir: Path, *, days: int, out_dir: Path | None,
          operator: bool) -> Path:
    """Issue a client certificate (an operator's with OPERATOR_USAGE) for a CSR."""
    csr_path = Path(csr_path)
    ca_dir = Path(ca_dir)
    check_days(days)
    csr, name = _load_request(csr_path)
    public_key = csr.public_key()
    if not is_p256(public_key):
        raise PkiError(f"certificate request {csr_path} must carry an ECDSA P-256 public key")

    ca_key = load_private_key(read_pem(ca_dir / CA_KEY, "CA private key"), ca_dir / CA_KEY)
    ca_cert_pem = read_pem(ca_dir / CA_CERT, "CA certificate")
    ca_cert = load_certificate(ca_cert_pem, ca_dir / CA_CERT)
    if public_key_der(ca_key.public_key()) != public_key_der(ca_cert.public_key()):
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
        leaf_builder(name, public_key, ca_cert, datetime.now(UTC), days)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH,
                                              *([OPERATOR_USAGE] if operator else [])]),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    write_new(cert_path, certificate_pem(cert), 0o644)
    # Kept by the CA so that `pki list` shows it and `pki revoke` can find it by name.
    _record_issued(ca_dir, cert)
    if copy_ca:
        write_new(ca_copy, ca_cert_pem, 0o644)
    return cert_path


def request_name(csr_path: Path) -> str:
    """The checked name a certificate signing request asks for (its signature verified)."""
    return _load_request(Path(csr_path))[1]


def _load_request(csr_path: Path) -> tuple[x509.CertificateSigningRequest, str]:
    try:
        csr = x509.load_pem_x509_csr(csr_path.read_bytes())
    except OSError as exc:
        raise PkiError(f"cannot read certificate request {csr_path}: {exc.strerror}") from None
    except ValueError:
        raise PkiError(f"{csr_path} is not a PEM certificate signing request") from None
    if not csr.is_signature_valid:
        raise VerificationFailed("certificate request signature does not verify")
    name = common_name(csr.subject, f"certificate request {csr_path}")
    _check_name(name)
    return csr, name


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
    key_pem = read_pem(key_path, "private key")
    cert_pem = read_pem(cert_path, "certificate")
    ca_pem = read_pem(ca_path, "CA certificate")
    key = load_private_key(key_pem, key_path)
    cert = load_certificate(cert_pem, cert_path)
    if public_key_der(key.public_key()) != public_key_der(cert.public_key()):
        raise VerificationFailed(
            f"private key {key_path} does not match certificate {cert_path}: the certificate "
            "was issued for another key (a key re-created after signing?); keep the key the "
            "request was made with, or make a new request and have it signed")
    try:
        name = verify_certificate(cert_pem, ca_pem)
    except VerificationFailed:
        reason = explain_certificate(cert_pem, ca_pem, what=f"certificate {cert_path}")
        raise VerificationFailed(f"{reason or INVALID_CERTIFICATE}; {_hint(reason, ca_path)}"
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


def _check_name(name: str) -> None:
    if not isinstance(name, str) or _NAME_RE.fullmatch(name) is None:
        raise PkiError(
            f"invalid identity name {name!r}: use 1 to 64 characters from A-Z, a-z, 0-9, "
            "'.', '_' and '-', starting with a letter or digit"
        )
    if name.lower() in _RESERVED_NAMES:
        raise PkiError(f"identity name {name!r} is reserved")


def _record_issued(ca_dir: Path, cert: x509.Certificate) -> Path:
    folder = ca_dir / ISSUED_DIR
    folder.mkdir(exist_ok=True)
    path = folder / f"{cert.serial_number:x}.crt"
    write_new(path, certificate_pem(cert), 0o644)
    return path
