"""Why a silo cannot reach its coordinator, in words an operator can act on.

gRPC reports every failure to connect as UNAVAILABLE with transport text, so an expired
certificate, a foreign CA, a host name the server's certificate does not carry and a wrong port
all look alike. When the first connection fails, the agent asks this module to repeat the steps
itself (resolve, connect, TLS handshake with this silo's identity) and to name the step that
fails. Mistakes of configuration are final (the silo stops at once, exit 2); a coordinator that is
not up yet is not (the silo keeps trying until --connect-timeout).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from trellis.crypto.certificates import explain_certificate
from trellis.crypto.pki import Identity, is_operator_certificate

# What the coordinator's TLS alert means for this silo's certificate (OpenSSL's reason names).
_ALERTS = {
    "UNKNOWN_CA": "was not issued by the coordinator's CA (this silo's certificate and ca.crt "
                  "come from another federation)",
    "CERTIFICATE_EXPIRED": "has expired, says the coordinator (check both machines' clocks)",
    "CERTIFICATE_REVOKED": "was revoked",
    "BAD_CERTIFICATE": "was refused",
    "CERTIFICATE_REQUIRED": "was not received",
}


@dataclass(frozen=True)
class Diagnosis:
    """What went wrong; `final` when retrying cannot help (a mistake of configuration)."""

    message: str
    final: bool


def split_address(target: str) -> tuple[str, int]:
    """host and port of 'host:port' or '[v6]:port'."""
    host, _, port = target.rpartition(":")
    return host.strip("[]"), int(port)


def diagnose(target: str, identity: Identity, timeout: float = 5.0) -> Diagnosis | None:
    """Repeat the connection step by step; the first step that fails, or None if all pass."""
    host, port = split_address(target)
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return Diagnosis(f"cannot resolve the host name {host!r} ({exc.strerror}); check the "
                         "name in --coordinator", final=False)
    family, _, _, _, address = addresses[0]
    try:
        raw = socket.socket(family, socket.SOCK_STREAM)
        raw.settimeout(timeout)
        raw.connect(address)
    except ConnectionRefusedError:
        raw.close()
        return Diagnosis(f"nothing is listening at {target} (connection refused); check the "
                         "port, and that `coordinator serve` is running there", final=False)
    except TimeoutError:
        raw.close()
        return Diagnosis(f"no answer from {target} within {timeout:g} s; check the address, "
                         "and that no firewall drops the port", final=False)
    except OSError as exc:
        raw.close()
        return Diagnosis(f"cannot connect to {target}: {exc.strerror}", final=False)
    with raw:
        return _check_tls(raw, host, identity, timeout)


def _check_tls(raw: socket.socket, host: str, identity: Identity,
               timeout: float) -> Diagnosis | None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE          # the certificate is judged below, in words
    context.set_alpn_protocols(["h2"])
    with tempfile.TemporaryDirectory() as folder:
        # ssl loads a client identity only from files: written private, removed at once.
        key = Path(folder) / "key.pem"
        cert = Path(folder) / "cert.pem"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(identity.key_pem)
        cert.write_bytes(identity.cert_pem)
        context.load_cert_chain(cert, key)
    try:
        tls = context.wrap_socket(raw, server_hostname=None)
    except ssl.SSLError as exc:
        return _refused(exc)
    except OSError as exc:
        return Diagnosis(f"the TLS handshake with the coordinator failed: {exc}", final=False)
    with tls:
        der = tls.getpeercert(binary_form=True)
        if der is None:
            return Diagnosis("the coordinator sent no certificate", final=True)
        server_cert = x509.load_der_x509_certificate(der)
        pem = ssl.DER_cert_to_PEM_cert(der).encode()
        reason = explain_certificate(pem, identity.ca_pem, what="the coordinator's certificate")
        if reason:
            hint = ("ask the coordinator operator for a new server certificate"
                    if "expired" in reason else
                    "check this machine's clock" if "not valid until" in reason else
                    "this silo's ca.crt is not this coordinator's CA: use the ca.crt returned "
                    "with this silo's certificate, and check that you dial the right coordinator")
            return Diagnosis(f"{reason}; {hint}", final=True)
        client = _client_holder(server_cert, pem)
        if client:
            # Not the coordinator at all (a silo's or an operator's tool at this address, or a
            # coordinator given a client certificate as server.server_cert): no retry helps,
            # and its names are no coordinator host to compare.
            return Diagnosis(
                f"the server at {_target(host, tls)} is not a coordinator: it presents {client}, "
                "not a server certificate; check the address and port in --coordinator, and "
                "that the coordinator serves the server.crt made by `coordinator pki init`",
                final=True)
        names = _server_names(server_cert)
        if not _matches(host, names):
            return Diagnosis(
                f"the coordinator's certificate names {', '.join(names) or 'no host'}, not "
                f"{host!r}: dial one of those names, or ask the operator to issue the server "
                f"certificate for {host} (coordinator pki init --host {host})", final=True)
        # TLS 1.3: the server judges this silo's certificate after the handshake; its verdict
        # arrives as an alert on the first read (or nothing, when it accepts and waits).
        tls.settimeout(min(timeout, 2.0))
        try:
            tls.recv(1)
        except ssl.SSLError as exc:
            return _refused(exc)
        except OSError:
            pass
    return None


def _refused(exc: ssl.SSLError) -> Diagnosis:
    reason = str(exc.reason or exc)
    for alert, meaning in _ALERTS.items():
        if alert in reason:
            return Diagnosis(f"the coordinator refused this silo's certificate: it {meaning} "
                             f"(TLS alert {reason})", final=True)
    return Diagnosis(f"the TLS handshake with the coordinator failed ({reason})", final=False)


def _client_holder(cert: x509.Certificate, pem: bytes) -> str:
    """Whose client certificate cert is ("" for a server certificate, or one that says
    nothing of its use)."""
    try:
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return ""
    if ExtendedKeyUsageOID.SERVER_AUTH in usage:
        return ""
    subject = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    name = f" ({str(subject[0].value)!r})" if subject else ""
    whose = "an operator's" if is_operator_certificate(pem) else "a silo's"
    return f"{whose} client certificate{name}"


def _target(host: str, tls: ssl.SSLSocket) -> str:
    port = tls.getpeername()[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _server_names(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [*san.get_values_for_type(x509.DNSName),
            *(str(ip) for ip in san.get_values_for_type(x509.IPAddress))]


def _matches(host: str, names: list[str]) -> bool:
    try:
        wanted = str(ipaddress.ip_address(host))
    except ValueError:
        wanted = host.lower().rstrip(".")
    return any(name.lower() == wanted for name in names)
