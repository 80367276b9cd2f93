"""Who is calling a standing coordinator: an admitted silo (Site service) or an operator (Admin).

Identity is the TLS client certificate, never a field of a message. A refused caller is written
to the deployment's audit log and gets PERMISSION_DENIED with one line saying what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc

from trellis.coordinator.jobs.deployment import DeploymentConfig
from trellis.coordinator.serving.admin import is_operator
from trellis.coordinator.serving.aio_edge import Refused
from trellis.coordinator.serving.crl_watch import CrlWatch
from trellis.crypto.audit import AuditLog


class Callers:
    """Checks callers against the deployment and the revocation list."""

    def __init__(self, deployment: DeploymentConfig, audit: AuditLog, crl: CrlWatch | None) -> None:
        self.deployment = deployment
        self.audit = audit
        self.crl = crl

    def silo(self, auth: Mapping[str, Any], service: str = "Site") -> tuple[str, bytes]:
        """The calling silo's name and certificate (Refused if it is not an admitted silo)."""
        subject, cert = _certificate(auth)
        if is_operator(cert):
            self._refuse(subject, service, "an operator's certificate, not a silo's",
                         f"{subject!r} holds an operator's certificate, which opens the Admin "
                         "service only; a silo connects with its own certificate")
        if subject not in self.deployment.silos:
            self._refuse(subject, service, "not admitted by the deployment",
                         f"certificate subject {subject!r} is not admitted by deployment "
                         f"{self.deployment.name}; ask its operator to add it to "
                         "deployment.silos")
        self._refuse_if_revoked(subject, cert, service)
        return subject, cert

    def operator(self, auth: Mapping[str, Any]) -> tuple[str, bytes]:
        """The calling operator's name and certificate (Refused otherwise)."""
        subject, cert = _certificate(auth)
        if not is_operator(cert):
            self._refuse(subject, "Admin", "not an operator's certificate",
                         f"certificate subject {subject!r} is not an operator's: the Admin "
                         "service answers only certificates from `coordinator pki operator`")
        self._refuse_if_revoked(subject, cert, "Admin")
        return subject, cert

    def _refuse_if_revoked(self, subject: str, cert: bytes, service: str) -> None:
        revoked = self.crl.revoked_at(cert) if self.crl is not None else None
        if revoked is None:
            return
        serial, when = revoked
        self._refuse(subject, service, "certificate revoked",
                     f"the certificate of {subject!r} (serial {serial:x}) was revoked on "
                     f"{when:%Y-%m-%d %H:%M} UTC", serial=f"{serial:x}")

    def _refuse(self, subject: str, service: str, reason: str, details: str,
                **fields: Any) -> None:
        self.audit.append("refused", subject=subject, service=service, reason=reason, **fields)
        raise Refused(grpc.StatusCode.PERMISSION_DENIED, details)


def _certificate(auth: Mapping[str, Any]) -> tuple[str, bytes]:
    names = auth.get("x509_common_name") or []
    certs = auth.get("x509_pem_cert") or []
    if len(names) != 1 or len(certs) != 1:
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, "a client certificate is required")
    return names[0].decode(), certs[0]
