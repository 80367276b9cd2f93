"""The federation's revocation list as the running coordinator applies it, re-read on change.

`coordinator pki revoke` re-signs the CA's crl.pem; the coordinator notices the new file within a
second (its deadline ticker calls `refresh`) and applies it to every call, without a restart. A
list that cannot be read or was not signed by the federation CA is ignored with a warning and the
one in force stays: revocation is never loosened by a damaged file.
"""

from __future__ import annotations

import os
import threading
from datetime import datetime
from pathlib import Path

from trellis.crypto.errors import CryptoError
from trellis.crypto.revocation import EMPTY, RevocationList, certificate_serial, load_crl


class CrlWatch:
    """The CRL in force and the file it comes from."""

    def __init__(self, path: Path, ca_pem: bytes) -> None:
        self.path = path
        self.ca_pem = ca_pem
        self.current: RevocationList = EMPTY
        self._stamp: tuple[int, int, int] | None = None
        self._serials: dict[bytes, int] = {}
        self._lock = threading.Lock()

    def refresh(self) -> str | None:
        """Re-read the file if it changed; a line saying what happened, or None if nothing."""
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            if self._stamp is None:
                return None
            self._stamp = None
            return (f"revocation list {self.path} was removed; the {len(self.current)} "
                    "revocation(s) already loaded stay in force")
        except OSError as exc:
            return f"cannot read revocation list {self.path}: {exc.strerror}"
        stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            loaded = load_crl(self.path.read_bytes(), self.ca_pem)
        except (OSError, CryptoError) as exc:
            return (f"ignored revocation list {self.path}: {exc}; the one in force "
                    f"(number {self.current.number}, {len(self.current)} revoked) stays")
        if loaded.number < self.current.number:
            return (f"ignored revocation list {self.path}: its number {loaded.number} is older "
                    f"than the one in force ({self.current.number})")
        with self._lock:
            # Union with what is in force: a revocation is never taken back by a later file.
            merged = {**loaded.revoked, **self.current.revoked}
            self.current = RevocationList(merged, loaded.number, loaded.issued_at)
        return (f"revocation list {self.path} loaded (number {loaded.number}, "
                f"{len(merged)} revoked)")

    def revoked_at(self, cert_pem: bytes) -> tuple[int, datetime] | None:
        """(serial, when revoked) if the CRL in force revokes this certificate, else None."""
        serial = self._serials.get(cert_pem)
        if serial is None:
            serial = certificate_serial(cert_pem)
            self._serials[cert_pem] = serial
        when = self.current.revoked_at(serial)
        return None if when is None else (serial, when)
