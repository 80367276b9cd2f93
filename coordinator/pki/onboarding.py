"""Silo onboarding kits: what a new silo's operator gets back with its certificate.

`coordinator pki sign SILO.csr --kit DIR --coordinator-address HOST:PORT` writes DIR (and
DIR.tar.gz beside it) with the CA certificate, the silo's signed certificate, the address to
dial, a README with the exact commands, a policy template and the service files of a standing
silo (`silo serve`). A kit never holds a private key: every file is checked before anything is
written, and the builder refuses one that is or holds a key (the silo's key never leaves its
machine; the CA's and the server's must never leave this one). The files' text is in
kit_texts.py and kit_policy.py.
"""

from __future__ import annotations

import io
import ipaddress
import tarfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import BinaryIO

from trellis.coordinator.pki.kit_policy import policy_template
from trellis.coordinator.pki.kit_texts import (
    ADDRESS_FILE,
    COMPOSE_FILE,
    ENV_FILE,
    POLICY_FILE,
    README_FILE,
    UNIT_FILE,
    compose_service,
    environment_file,
    readme_text,
    systemd_unit,
)
from trellis.crypto.certificates import (
    certificate_hosts,
    certificate_subject,
    holds_private_key,
    verify_certificate,
)
from trellis.crypto.errors import PkiError
from trellis.crypto.pki import CA_CERT
from trellis.protos.files import write_atomic
from trellis.protos.plan import PublicPlan

_WILDCARD_HOSTS = {"0.0.0.0", "::", "*", ""}


class KitError(ValueError):
    """The kit cannot be made as asked (bad address, folder in use, a key among the files)."""


@dataclass(frozen=True)
class Address:
    """Where silos dial the coordinator: a host the server certificate names, and a port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_address(text: str) -> Address:
    """Parse host:port (an IPv6 host in brackets); refuse a missing port or a wildcard host."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) <= 65535:
        raise KitError(f"--coordinator-address {text!r}: expected host:port, e.g. "
                       "coord.example.org:50051")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host in _WILDCARD_HOSTS:
        raise KitError(f"--coordinator-address {text!r}: {host or 'an empty host'} is where the "
                       "coordinator listens, not an address silos can dial; give the name or IP "
                       "in its server certificate (pki init --host)")
    return Address(host, int(port))


def check_address_in_certificate(address: Address, server_cert_pem: bytes) -> None:
    """Refuse an address whose host the coordinator's certificate does not name (TLS would)."""
    hosts = certificate_hosts(server_cert_pem)
    wanted = address.host.lower()
    try:
        wanted = str(ipaddress.ip_address(wanted))
    except ValueError:
        pass
    if wanted not in {h.lower() for h in hosts}:
        raise KitError(f"--coordinator-address {address}: the server certificate names only "
                       f"{', '.join(hosts) or 'no host'}, so silos could not verify the "
                       f"coordinator at {address.host}; use one of those or re-run pki init "
                       "with --host")


def check_empty_folder(kit_dir: Path) -> Path:
    """Refuse a kit folder that holds anything, or a path that is a file; return the tarball."""
    if kit_dir.exists() and (not kit_dir.is_dir() or any(kit_dir.iterdir())):
        raise KitError(f"--kit {kit_dir}: not an empty folder; give a new or empty one")
    tarball = tarball_path(kit_dir)
    if tarball.exists():
        raise KitError(f"--kit {kit_dir}: {tarball} already exists; move it away first")
    return tarball


def tarball_path(kit_dir: Path) -> Path:
    """DIR.tar.gz beside DIR."""
    kit_dir = Path(kit_dir)
    return kit_dir.parent / f"{kit_dir.name}.tar.gz"


def build_kit(kit_dir: Path, *, cert: Path, ca_cert: Path, address: Address,
              plan: PublicPlan | None = None) -> Path:
    """Write the kit folder and its tarball; return the tarball's path.

    `cert` is the silo's signed certificate and `ca_cert` the federation's; `plan` pre-fills the
    policy template. Nothing is written unless every file passes the private-key check.
    """
    kit_dir = Path(kit_dir)
    tarball = check_empty_folder(kit_dir)
    cert_pem, ca_pem = _read(cert), _read(ca_cert)
    try:
        name = verify_certificate(cert_pem, ca_pem)
    except PkiError as exc:
        raise KitError(f"{cert}: {exc}") from None
    if certificate_subject(cert_pem) != name:
        raise KitError(f"{cert}: subject does not match")
    files = kit_files(name, address, cert_pem=cert_pem, ca_pem=ca_pem, plan=plan,
                      folder=kit_dir.name)
    for file_name, data in files.items():
        if holds_private_key(data):
            raise KitError(f"refusing to put {file_name} in the kit: it is or holds a private key")
    kit_dir.mkdir(parents=True, exist_ok=True)
    for file_name, data in files.items():
        write_atomic(kit_dir / file_name, partial(_write, data=data))
        (kit_dir / file_name).chmod(0o644)
    archive = _tarball(kit_dir.name, files)
    write_atomic(tarball, lambda handle: handle.write(archive))
    return tarball


def kit_files(name: str, address: Address, *, cert_pem: bytes, ca_pem: bytes,
              plan: PublicPlan | None = None, folder: str = "kit") -> dict[str, bytes]:
    """Every file of a silo's kit, by name, in the order the README lists them."""
    return {
        README_FILE: readme_text(name, address, plan, folder).encode(),
        CA_CERT: ca_pem,
        f"{name}.crt": cert_pem,
        ADDRESS_FILE: f"{address}\n".encode(),
        POLICY_FILE: policy_template(name, plan).encode(),
        UNIT_FILE: systemd_unit(name).encode(),
        ENV_FILE: environment_file(name, address, plan).encode(),
        COMPOSE_FILE: compose_service(name, address, plan).encode(),
    }


def _write(handle: BinaryIO, *, data: bytes) -> None:
    handle.write(data)


def _read(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise KitError(f"cannot read {path}: {exc.strerror}") from None


def _tarball(folder: str, files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for file_name, data in files.items():
            info = tarfile.TarInfo(f"{folder}/{file_name}")
            info.size = len(data)
            info.mode = 0o644
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
