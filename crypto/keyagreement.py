"""Signed X25519 key adverts and pairwise key derivation (DESIGN.md §4.3, §5; Bonawitz et al. §4).

Each silo advertises two ephemeral X25519 public keys per round attempt -- one to encrypt the
Shamir shares it sends to peers, one to agree pairwise masks -- and signs both with the private
key of its certificate, bound to the federation, the run, round and attempt (`RoundContext`), so
that the coordinator that relays the adverts can neither substitute keys nor replay those of an
earlier run of the same federation. Pairwise secrets are stretched with HKDF-SHA256 into one key
per purpose.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from trellis.crypto import certificates
from trellis.crypto.errors import ProtocolError, VerificationFailed

PUBLIC_KEY_BYTES = 32
# Version 2 added the run and the job and length-prefixes every field; a signature made over a
# version-1 label ("trellis/v1|federation|round|attempt") never verifies under version 2.
CONTEXT_VERSION = 2
_CONTEXT_TAG = b"trellis/context"


def encode_fields(kind: str, fields: tuple[tuple[str, str], ...]) -> bytes:
    """Versioned, unambiguous encoding of named text fields (every name and value length-prefixed).

    Lengths rather than separators: a federation id containing "|" cannot make two different
    contexts encode alike, and a later field (the job) adds a name instead of shifting bytes.
    """
    parts = [_CONTEXT_TAG, struct.pack(">H", CONTEXT_VERSION), _text(kind)]
    for name, value in fields:
        parts += [_text(name), _text(value)]
    return b"".join(parts)


def _text(value: str) -> bytes:
    data = value.encode()
    return struct.pack(">I", len(data)) + data


@dataclass(frozen=True)
class RoundContext:
    """What a key advert, every signature over it and every mask derived from it are bound to.

    `run` is the coordinator's run of the federation (drawn at a fresh start, kept across its
    restarts, told to silos on joining): an advert or survivor list signed in one run never
    verifies in another run of the same federation id. `job` is empty until jobs exist.
    """

    federation: str
    round: int
    attempt: int
    run: str = field(kw_only=True)
    job: str = field(default="", kw_only=True)
    # Encoded once: every pairwise mask and signature of an attempt asks for it.
    _label: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_label", encode_fields(
            "round", (("federation", self.federation), ("run", self.run), ("job", self.job),
                      ("round", str(self.round)), ("attempt", str(self.attempt)))))

    def label(self) -> bytes:
        """Canonical byte string of this context, for signatures and key derivation."""
        return self._label

    def describe(self) -> str:
        """The context in words, for an error a person reads."""
        job = f", job {self.job!r}" if self.job else ""
        return (f"federation {self.federation!r}, run {self.run!r}{job}, round {self.round}, "
                f"attempt {self.attempt}")


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
        raise ProtocolError(f"key advert of {advert.silo!r} has an invalid signature for "
                            f"{context.describe()}: forged, or signed for another run, round "
                            "or attempt (a replay)") from exc


def derive_key(shared_secret: bytes, context: RoundContext, purpose: str, a: str, b: str) -> bytes:
    """HKDF-SHA256 a 32-byte key for one purpose between silos a and b (order-independent)."""
    low, high = sorted((a, b))
    info = context.label() + f"|{purpose}|{low}|{high}".encode()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared_secret)
