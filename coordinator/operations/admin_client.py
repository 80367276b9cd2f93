"""The operator's side of the Admin service: ask a running coordinator for its status."""

from __future__ import annotations

import grpc

from trellis.crypto.pki import Identity
from trellis.protos import codec
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos.status import FederationStatus


class AdminRefused(ValueError):
    """The coordinator refused the operator's certificate (fix the identity; retrying won't)."""


class AdminUnreachable(RuntimeError):
    """The coordinator could not be reached or failed to answer."""


def check_target(target: str) -> None:
    """Refuse a --coordinator value without a port (gRPC would dial 443)."""
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--coordinator {target!r}: expected host:port, e.g. "
                         "coord.example.org:50051")


def fetch_status(target: str, identity: Identity, timeout_s: float = 10.0) -> FederationStatus:
    """The status of the coordinator at target, asked with an operator's identity."""
    credentials = grpc.ssl_channel_credentials(root_certificates=identity.ca_pem,
                                               private_key=identity.key_pem,
                                               certificate_chain=identity.cert_pem)
    with grpc.secure_channel(target, credentials) as channel:
        stub = pb_grpc.AdminStub(channel)
        try:
            reply = stub.Status(codec.status_request(), timeout=timeout_s)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
            if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                raise AdminRefused(f"the coordinator refused {identity.name!r}: {details}"
                                   ) from None
            if code is grpc.StatusCode.UNIMPLEMENTED:
                raise AdminRefused(f"the service at {target} has no Admin service: is it a "
                                   "Trellis coordinator of this version?") from None
            raise AdminUnreachable(f"no status from the coordinator at {target} within "
                                   f"{timeout_s:g} s: {code.name} {details}") from None
    return codec.status_from_pb(reply)
