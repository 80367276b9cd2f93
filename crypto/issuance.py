"""Who may hold a name: what the CA checks before it issues a silo's or an operator's certificate.

A name has one live certificate: while one is valid (not revoked, not expired) the CA issues
another for that name only as a renewal, which revokes the old one as soon as the new one is
written, so a second holder can never take a silo's place in a federation. Silo and operator
names stay apart (`pki revoke NAME` revokes every certificate of a name, and logs and audit
trails name callers by it), and no certificate is named like a host: `localhost`, an IP
address, or a name in the coordinator's own server certificate.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from .certificates import certificate_hosts
from .errors import PkiError
from .pki import SERVER_CERT, is_operator_certificate, issue_operator, request_name, sign_request
from .revocation import IssuedCertificate, issued_certificates, read_crl, revoke


@dataclass(frozen=True)
class Issuance:
    """A certificate just issued, and the certificates of its name that it replaced (revoked)."""

    cert: Path
    replaced: tuple[IssuedCertificate, ...] = ()


def sign_silo_request(csr_path: Path, ca_dir: Path, *, days: int = 825,
                      out_dir: Path | None = None, renew: bool = False) -> Issuance:
    """Issue a silo's certificate from its CSR if the name is free (or, renewing, replace it)."""
    name = request_name(csr_path)
    replaced = check_name(ca_dir, name, operator=False, renew=renew)
    cert = sign_request(csr_path, ca_dir, days=days, out_dir=out_dir)
    return Issuance(cert, _revoke_replaced(ca_dir, cert, replaced))


def issue_operator_identity(ca_dir: Path, name: str, out_dir: Path, *, days: int = 365,
                            renew: bool = False) -> Issuance:
    """Issue an operator's key and certificate if the name is free (or, renewing, replace it)."""
    replaced = check_name(ca_dir, name, operator=True, renew=renew)
    cert = issue_operator(ca_dir, name, out_dir, days=days)
    return Issuance(cert, _revoke_replaced(ca_dir, cert, replaced))


def check_name(ca_dir: Path, name: str, *, operator: bool, renew: bool = False,
               now: datetime | None = None) -> tuple[IssuedCertificate, ...]:
    """Refuse a name the CA may not issue now; return the live certificates a renewal replaces."""
    ca_dir = Path(ca_dir)
    role, other = ("operator", "silo") if operator else ("silo", "operator")
    _check_not_a_host(ca_dir, name, role)
    now = now or datetime.now(UTC)
    crl = read_crl(ca_dir)
    same_name = [c for c in issued_certificates(ca_dir) if c.name.lower() == name.lower()]
    for c in same_name:
        if _is_operator(c) != operator:
            raise PkiError(
                f"{name!r} already names {_article(other)} {other} certificate issued by this CA "
                f"(serial {c.serial_hex}); give the {role} a name of its own (one name never "
                "serves both roles: `coordinator pki revoke NAME` revokes every certificate of "
                "a name)")
    live = tuple(c for c in same_name
                 if crl.revoked_at(c.serial) is None and now <= c.not_after)
    if live and not renew:
        held = live[-1]
        command = ("coordinator pki operator --name NAME ... --renew" if operator
                   else "coordinator pki sign CSR ... --renew")
        raise PkiError(
            f"{name!r} already holds a valid certificate (serial {held.serial_hex}, expires "
            f"{held.not_after:%Y-%m-%d}); one certificate per name: re-key with `{command}` "
            "(it revokes the old one once the new one is issued), or first run "
            f"`coordinator pki revoke --serial {held.serial_hex} --ca {ca_dir}`")
    return live


def host_collision(name: str, server_hosts: list[str]) -> str | None:
    """Why name could be taken for a host (localhost, an IP address, the coordinator's), or None."""
    lowered = name.lower()
    if lowered == "localhost" or lowered.endswith(".localhost"):
        return "localhost names this machine"
    if _is_ip_literal(name):
        return "it is an IP address"
    if lowered in {h.lower() for h in server_hosts}:
        return f"the coordinator's server certificate ({SERVER_CERT}) names it as its host"
    return None


def _check_not_a_host(ca_dir: Path, name: str, role: str) -> None:
    server = ca_dir / SERVER_CERT
    try:
        hosts = certificate_hosts(server.read_bytes()) if server.exists() else []
    except OSError as exc:
        raise PkiError(f"cannot read {server}: {exc.strerror}") from None
    why = host_collision(name, hosts)
    if why is not None:
        raise PkiError(f"{name!r} is a host's name ({why}); a {role} certificate named like a "
                       f"host could pass for one, so give the {role} a name of its own")


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    # inet_aton also reads the short forms resolvers accept ("127.1", "2130706433").
    try:
        socket.inet_aton(name)
        return True
    except OSError:
        return False


def _is_operator(cert: IssuedCertificate) -> bool:
    try:
        return is_operator_certificate(cert.path.read_bytes())
    except OSError as exc:
        raise PkiError(f"cannot read {cert.path}: {exc.strerror}") from None


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _revoke_replaced(ca_dir: Path, cert: Path, replaced: tuple[IssuedCertificate, ...]
                     ) -> tuple[IssuedCertificate, ...]:
    """Revoke what a renewal replaced, now that its successor exists."""
    if not replaced:
        return ()
    try:
        revoke(ca_dir, {c.serial for c in replaced})
    except PkiError as exc:
        serials = ", ".join(c.serial_hex for c in replaced)
        raise PkiError(f"issued {cert} but could not revoke the certificate it replaces "
                       f"(serial {serials}): {exc}; revoke it now with `coordinator pki revoke "
                       f"--serial SERIAL --ca {ca_dir}`") from None
    return replaced
