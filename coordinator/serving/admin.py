"""gRPC transport of the Admin service: the federation's status for operators, on the same port.

Only a certificate of the federation's CA marked as an operator's (crypto/pki.py
OPERATOR_USAGE, from `coordinator pki operator`) is answered; a silo's certificate, admitted
or not, is PERMISSION_DENIED, and a revoked operator certificate too.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import grpc

from trellis.coordinator.serving.aio_edge import CorePool, Refused
from trellis.coordinator.serving.core import CoordinatorCore
from trellis.coordinator.serving.crl_watch import CrlWatch
from trellis.crypto.pki import is_operator_certificate
from trellis.protos import codec
from trellis.protos import federation_pb2_grpc as pb_grpc


@functools.lru_cache(maxsize=256)
def is_operator(cert_pem: bytes) -> bool:
    """Whether a caller's certificate is an operator's (parsed once per certificate)."""
    return is_operator_certificate(cert_pem)


class AdminServicer(pb_grpc.AdminServicer):
    """Each method: check that the caller is an operator, ask the core, encode (asyncio; the
    checks and the core run on the handlers' fixed threads)."""

    def __init__(self, core: CoordinatorCore, crl: CrlWatch | None = None,
                 pool: CorePool | None = None) -> None:
        self.core = core
        self.crl = crl
        self.pool = pool or CorePool(1)

    async def Status(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self.pool.call(context, self._operator, context.auth_context())
        return codec.status_to_pb(await self.pool.call(context, self.core.status))

    def _operator(self, auth: Mapping[str, Any]) -> str:
        names = auth.get("x509_common_name") or []
        certs = auth.get("x509_pem_cert") or []
        if len(names) != 1 or len(certs) != 1:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, "a client certificate is required")
        subject = names[0].decode()
        if not is_operator(certs[0]):
            self.core.audit.append("refused", subject=subject, service="Admin",
                                   reason="not an operator's certificate")
            raise Refused(grpc.StatusCode.PERMISSION_DENIED,
                          f"certificate subject {subject!r} is not an operator's: the Admin "
                          "service answers only certificates from `coordinator pki operator`")
        revoked = self.crl.revoked_at(certs[0]) if self.crl is not None else None
        if revoked is not None:
            serial, when = revoked
            self.core.audit.append("refused", subject=subject, service="Admin",
                                   serial=f"{serial:x}", reason="certificate revoked")
            raise Refused(grpc.StatusCode.PERMISSION_DENIED,
                          f"the operator certificate of {subject!r} (serial {serial:x}) was "
                          f"revoked on {when:%Y-%m-%d %H:%M} UTC; issue a new one with "
                          "`coordinator pki operator`")
        return subject
