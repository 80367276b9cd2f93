"""Signed X25519 key adverts and pairwise key derivation (DESIGN.md §4.3, §5; Bonawitz et al. §4).

Each silo advertises two ephemeral X25519 public keys per round attempt -- one to encrypt the
Shamir shares it sends to peers, one to agree pairwise masks -- and signs both with the private
key of its certificate, bound to the federation, round and attempt, so that the coordinator that
relays the adverts cannot substitute keys. Pairwise secrets are stretched with HKDF-SHA256 into
one key per purpose.
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from trellis.crypto import certificates
from trellis.crypto.errors import ProtocolError, VerificationFailed

PUBLIC_KEY_BYTES = 32


@dataclass(frozen=True)
class RoundContext:
    """What a key advert and every mask derived from it are bound to."""

    federation: str
    round: int
    attempt: int

    def label(self) -> bytes:
        """Canonical byte string of this context, for signatures and key derivation."""
        return f"trellis/v1|{self.federation}|{self.round}|{self.attempt}".encode()


@dataclass(frozen=True)
class KeyAdvert:
    """A silo's two ephemeral public keys for one round attempt, signed by its certificate key."""

    silo: str
    cipher_key: bytes
    mask_key: bytes
    signature: bytes

    def signed_payload(self, context: RoundContext) -> bytes:
        """The exact bytes the signature covers."""
        return (context.label() + b"|advert|" + self.silo.encode() + b"|" + self.cipher_key
                + b"|" + self.mask_key)


class EphemeralKeyPair:
    """An X25519 key pair used for one round attempt only."""

    def __init__(self, private_key: X25519PrivateKey | None = None) -> None:
        self._private = private_key or X25519PrivateKey.generate()

    @property
    def public_bytes(self) -> bytes:
        """Raw 32-byte public key."""
        return self._private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    def secret_bytes(self) -> bytes:
        """Raw 32-byte private key, only to be Shamir-shared (never logged or sent in clear)."""
        return self._private.private_bytes(serialization.Encoding.Raw,
                                           serialization.PrivateFormat.Raw,
                                           serialization.NoEncryption())

    @classmethod
    def from_secret_bytes(cls, secret: bytes) -> EphemeralKeyPair:
        """Rebuild a key pair from a reconstructed 32-byte private key."""
        if len(secret) != PUBLIC_KEY_BYTES:
            raise ProtocolError("a private key must be 32 bytes")
        return cls(X25519PrivateKey.from_private_bytes(secret))

    def agree(self, peer_public: bytes) -> bytes:
        """X25519 shared secret with a peer's raw public key."""
        if len(peer_public) != PUBLIC_KEY_BYTES:
            raise ProtocolError("peer public key must be 32 bytes")
        return self._private.exchange(X25519PublicKey.from_public_bytes(peer_public))

    def __repr__(self) -> str:
        return "EphemeralKeyPair(<secret>)"


def make_advert(silo: str, cipher_keys: EphemeralKeyPair, mask_keys: EphemeralKeyPair,
                context: RoundContext, certificate_key_pem: bytes) -> KeyAdvert:
    """Sign this silo's two ephemeral public keys for the given round context."""
    unsigned = KeyAdvert(silo, cipher_keys.public_bytes, mask_keys.public_bytes, b"")
    signature = certificates.sign_bytes(certificate_key_pem, unsigned.signed_payload(context))
    return KeyAdvert(silo, cipher_keys.public_bytes, mask_keys.public_bytes, signature)


def verify_advert(
    advert: KeyAdvert, certificate_pem: bytes, ca_pem: bytes, context: RoundContext
) -> None:
    """Check that the advert was signed for this context by the certificate of the silo it names."""
    try:
        subject = certificates.verify_certificate(certificate_pem, ca_pem)
    except VerificationFailed as exc:
        raise ProtocolError(f"certificate presented for {advert.silo!r} is not valid") from exc
    if subject != advert.silo:
        raise ProtocolError(f"advert names {advert.silo!r} but the certificate is {subject!r}")
    if len(advert.cipher_key) != PUBLIC_KEY_BYTES or len(advert.mask_key) != PUBLIC_KEY_BYTES:
        raise ProtocolError(f"advert of {advert.silo!r} has a malformed public key")
    if advert.cipher_key == advert.mask_key:
        raise ProtocolError(f"advert of {advert.silo!r} reuses one key for both purposes")
    try:
        certificates.verify_bytes(certificate_pem, advert.signed_payload(context), advert.signature)
    except VerificationFailed as exc:
        raise ProtocolError(f"key advert of {advert.silo!r} has an invalid signature") from exc


def derive_key(shared_secret: bytes, context: RoundContext, purpose: str, a: str, b: str) -> bytes:
    """HKDF-SHA256 a 32-byte key for one purpose between silos a and b (order-independent)."""
    low, high = sorted((a, b))
    info = context.label() + f"|{purpose}|{low}|{high}".encode()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared_secret)
