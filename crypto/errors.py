"""Typed errors raised by crypto/; messages never contain secret material."""


class CryptoError(Exception):
    """Base class for every error raised by crypto/."""


class PkiError(CryptoError):
    """A certificate-authority or identity operation cannot be done (file exists, missing file, bad name)."""  # noqa: E501


class VerificationFailed(CryptoError):
    """One opaque error for every failed signature/certificate/chain check."""


class AuditError(CryptoError):
    """An audit log cannot be written or read."""


class EncodingError(CryptoError):
    """A vector cannot be encoded, masked or decoded (bad shape, NaN, overflow risk)."""


class ProtocolError(CryptoError):
    """A secure-aggregation message is out of stage, malformed, or from the wrong party."""
