"""Authenticated encryption of Shamir shares between two silos (AES-256-GCM), relayed blind.

The key is HKDF of the X25519 agreement of the sender's and receiver's advertised cipher keys;
the associated data binds the round context, the sender and the receiver, so the coordinator
can neither read a share nor redirect it to another silo or another round.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from trellis.crypto.errors import ProtocolError
from trellis.crypto.keyagreement import EphemeralKeyPair, RoundContext, derive_key

NONCE_BYTES = 12
TAG_BYTES = 16
_PURPOSE = "share-encryption"


def _aad(context: RoundContext, sender: str, receiver: str) -> bytes:
    return context.label() + f"|share|{sender}->{receiver}".encode()


def seal_share(plaintext: bytes, my_keys: EphemeralKeyPair, peer_cipher_key: bytes,
               context: RoundContext, sender: str, receiver: str,
               random_bytes: Callable[[int], bytes] = os.urandom) -> bytes:
    """Encrypt a share for a peer: nonce || ciphertext || tag."""
    key = derive_key(my_keys.agree(peer_cipher_key), context, _PURPOSE, sender, receiver)
    nonce = random_bytes(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, _aad(context, sender, receiver))


def open_share(box: bytes, my_keys: EphemeralKeyPair, peer_cipher_key: bytes,
               context: RoundContext, sender: str, receiver: str) -> bytes:
    """Decrypt a share sent by a peer; any tampering, misrouting or replay raises ProtocolError."""
    if len(box) < NONCE_BYTES + TAG_BYTES:
        raise ProtocolError(f"encrypted share from {sender!r} is truncated")
    key = derive_key(my_keys.agree(peer_cipher_key), context, _PURPOSE, sender, receiver)
    try:
        return AESGCM(key).decrypt(box[:NONCE_BYTES], box[NONCE_BYTES:],
                                   _aad(context, sender, receiver))
    except InvalidTag:
        raise ProtocolError(f"encrypted share from {sender!r} does not authenticate") from None
