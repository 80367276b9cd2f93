"""Establishing the silo group key: the leader draws it and seals it to every peer, relayed blind.

The lowest-ranked live silo (first by name) is the leader. It draws the silo group key (and, for
GCFL, the CKKS secret context) and sends them to each peer encrypted under their pairwise key:
AES-256-GCM under HKDF-SHA256 of the X25519 agreement of the two silos' setup keys. Every setup
key is advertised in a `SetupAdvert` signed with the key of the silo's certificate, and each side
checks the other's advert against the federation CA before using the key, so the coordinator,
which only relays opaque bytes, can neither read the secrets nor substitute a key of its own.

Setup is bound to `RoundContext(federation, 0, attempt, run=run)` ("round 0"), so that its
signatures, keys and boxes cannot be confused with those of any training round, of another
attempt or of another run of the same federation.

Flow (the coordinator relays every arrow):

1. every silo: ``GroupKeyLeader`` or ``GroupKeyMember`` -> ``.advert.to_bytes()`` to all;
2. leader: ``seal_for(peer_advert, peer_certificate_pem)`` -> one box per peer;
3. member: ``open(box, leader_advert, leader_certificate_pem)`` -> ``GroupSecrets``.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from trellis.crypto import certificates, pki
from trellis.crypto.errors import PkiError, ProtocolError, VerificationFailed
from trellis.crypto.keyagreement import PUBLIC_KEY_BYTES, EphemeralKeyPair, RoundContext, derive_key
from trellis.crypto.sharebox import NONCE_BYTES, TAG_BYTES

GROUP_KEY_BYTES = 32
SETUP_ROUND = 0
_PURPOSE = "group-secrets"
_SECRETS_MAGIC = b"TGS"
_ADVERT_MAGIC = b"TSA"
_VERSION = 1
_HEADER = struct.Struct(">3sB")
_LENGTH = struct.Struct(">I")


def setup_context(federation: str, attempt: int, *, run: str, job: str = "") -> RoundContext:
    """The context group-key setup is bound to: round 0 of this run of the federation, this
    attempt."""
    return RoundContext(federation, SETUP_ROUND, attempt, run=run, job=job)


def leader_of(silos: Iterable[str]) -> str:
    """The lowest-ranked (first by name) live silo, which draws and distributes the secrets."""
    ranked = sorted(silos)
    if not ranked:
        raise ProtocolError("no live silo to lead group-key setup")
    return ranked[0]


# -- wire formats ------------------------------------------------------------------------------
def _pack(magic: bytes, fields: Iterable[bytes]) -> bytes:
    out = bytearray(_HEADER.pack(magic, _VERSION))
    for field in fields:
        out += _LENGTH.pack(len(field)) + field
    return bytes(out)


def _unpack(data: bytes, magic: bytes, count: int, what: str) -> list[bytes]:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ProtocolError(f"{what} must be bytes")
    data = bytes(data)
    if len(data) < _HEADER.size:
        raise ProtocolError(f"{what} is truncated")
    got_magic, version = _HEADER.unpack_from(data)
    if got_magic != magic:
        raise ProtocolError(f"data is not {what}")
    if version != _VERSION:
        raise ProtocolError(f"{what} has unsupported version {version}")
    fields, offset = [], _HEADER.size
    for _ in range(count):
        if len(data) - offset < _LENGTH.size:
            raise ProtocolError(f"{what} is truncated")
        (length,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        if len(data) - offset < length:
            raise ProtocolError(f"{what} is truncated")
        fields.append(data[offset:offset + length])
        offset += length
    if offset != len(data):
        raise ProtocolError(f"{what} has {len(data) - offset} trailing bytes")
    return fields


@dataclass(frozen=True, repr=False)
class GroupSecrets:
    """What the leader shares with every silo: the group key and, for GCFL, the CKKS secret."""

    group_key: bytes
    ckks_secret: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.group_key, bytes) or len(self.group_key) != GROUP_KEY_BYTES:
            raise ProtocolError(f"the group key must be {GROUP_KEY_BYTES} bytes")
        if not isinstance(self.ckks_secret, bytes):
            raise ProtocolError("the CKKS secret context must be bytes")

    @classmethod
    def generate(cls, ckks_secret: bytes = b"",
                 random_bytes: Callable[[int], bytes] = os.urandom) -> GroupSecrets:
        """Draw a fresh random group key, carrying the given serialized CKKS secret context."""
        return cls(random_bytes(GROUP_KEY_BYTES), ckks_secret)

    def to_bytes(self) -> bytes:
        """Versioned, length-prefixed encoding: b"TGS", version, group key, CKKS secret."""
        return _pack(_SECRETS_MAGIC, (self.group_key, self.ckks_secret))

    @classmethod
    def from_bytes(cls, data: bytes) -> GroupSecrets:
        """Decode `to_bytes` output; anything malformed raises ProtocolError."""
        group_key, ckks_secret = _unpack(data, _SECRETS_MAGIC, 2, "encoded group secrets")
        return cls(group_key, ckks_secret)

    def __repr__(self) -> str:
        return (f"GroupSecrets(group_key=<{len(self.group_key)} bytes>, "
                f"ckks_secret=<{len(self.ckks_secret)} bytes>)")


# -- signed setup adverts ------------------------------------------------------------------------
# A dedicated advert rather than keyagreement.KeyAdvert: setup needs one key, not two (KeyAdvert
# would force a dummy mask key, which verify_advert requires to differ), and the "|group-setup|"
# payload tag keeps a setup signature from ever verifying as a round advert, or the reverse.
@dataclass(frozen=True)
class SetupAdvert:
    """A silo's ephemeral X25519 key for group-key setup, signed by its certificate key."""

    silo: str
    public_key: bytes
    signature: bytes

    def signed_payload(self, context: RoundContext) -> bytes:
        """The exact bytes the signature covers."""
        return context.label() + b"|group-setup|" + self.silo.encode() + b"|" + self.public_key

    def to_bytes(self) -> bytes:
        """Versioned, length-prefixed encoding for the coordinator to relay."""
        return _pack(_ADVERT_MAGIC, (self.silo.encode(), self.public_key, self.signature))

    @classmethod
    def from_bytes(cls, data: bytes) -> SetupAdvert:
        """Decode `to_bytes` output (not verified: call verify_setup_advert)."""
        silo, public_key, signature = _unpack(data, _ADVERT_MAGIC, 3, "a setup advert")
        try:
            name = silo.decode()
        except UnicodeDecodeError:
            raise ProtocolError("setup advert names a silo that is not UTF-8") from None
        return cls(name, public_key, signature)


def _check_setup(context: RoundContext) -> None:
    if context.round != SETUP_ROUND:
        raise ProtocolError(f"group-key setup is bound to round {SETUP_ROUND}, "
                            f"not round {context.round}")


def make_setup_advert(silo: str, keys: EphemeralKeyPair, context: RoundContext,
                      certificate_key_pem: bytes) -> SetupAdvert:
    """Sign this silo's ephemeral setup key for the given setup context."""
    _check_setup(context)
    unsigned = SetupAdvert(silo, keys.public_bytes, b"")
    signature = certificates.sign_bytes(certificate_key_pem, unsigned.signed_payload(context))
    return SetupAdvert(silo, keys.public_bytes, signature)


def verify_setup_advert(advert: SetupAdvert, certificate_pem: bytes, ca_pem: bytes,
                        context: RoundContext) -> None:
    """Check the advert was signed for this context by a CA-issued certificate of its silo."""
    _check_setup(context)
    try:
        subject = certificates.verify_certificate(certificate_pem, ca_pem)
    except (VerificationFailed, PkiError) as exc:
        raise ProtocolError(f"certificate presented for {advert.silo!r} is not valid") from exc
    if subject != advert.silo:
        raise ProtocolError(f"setup advert names {advert.silo!r} but the certificate is "
                            f"{subject!r}")
    if len(advert.public_key) != PUBLIC_KEY_BYTES:
        raise ProtocolError(f"setup advert of {advert.silo!r} has a malformed public key")
    try:
        certificates.verify_bytes(certificate_pem, advert.signed_payload(context), advert.signature)
    except VerificationFailed as exc:
        raise ProtocolError(f"setup advert of {advert.silo!r} has an invalid signature for "
                            f"{context.describe()}: forged, or signed for another run or "
                            "attempt (a replay)") from exc


# -- sealing -------------------------------------------------------------------------------------
def _aad(context: RoundContext, leader: str, receiver: str) -> bytes:
    return context.label() + f"|group|{leader}->{receiver}".encode()


def seal_group_secrets(secrets: GroupSecrets, leader_keys: EphemeralKeyPair,
                       peer_advert: SetupAdvert, context: RoundContext, leader: str, peer: str,
                       random_bytes: Callable[[int], bytes] = os.urandom) -> bytes:
    """Encrypt the group secrets for one peer (advert already verified): nonce || ct || tag."""
    _check_setup(context)
    if peer_advert.silo != peer:
        raise ProtocolError(f"advert of {peer_advert.silo!r} cannot be used to seal for {peer!r}")
    if peer == leader:
        raise ProtocolError("the leader does not seal group secrets for itself")
    key = derive_key(leader_keys.agree(peer_advert.public_key), context, _PURPOSE, leader, peer)
    nonce = random_bytes(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, secrets.to_bytes(), _aad(context, leader, peer))


def open_group_secrets(box: bytes, my_keys: EphemeralKeyPair, leader_advert: SetupAdvert,
                       context: RoundContext, leader: str, me: str) -> GroupSecrets:
    """Decrypt the leader's box (advert already verified); tampering, misrouting: ProtocolError."""
    _check_setup(context)
    if leader_advert.silo != leader:
        raise ProtocolError(f"advert of {leader_advert.silo!r} is not the advert of the leader "
                            f"{leader!r}")
    if len(box) < NONCE_BYTES + TAG_BYTES:
        raise ProtocolError(f"group secrets from {leader!r} are truncated")
    key = derive_key(my_keys.agree(leader_advert.public_key), context, _PURPOSE, leader, me)
    try:
        plain = AESGCM(key).decrypt(box[:NONCE_BYTES], box[NONCE_BYTES:],
                                    _aad(context, leader, me))
    except InvalidTag:
        raise ProtocolError(f"group secrets from {leader!r} for {me!r} do not authenticate "
                            "(tampered, misrouted, or from another setup attempt or run)") from None
    return GroupSecrets.from_bytes(plain)


# -- the two roles -------------------------------------------------------------------------------
class _SetupParty:
    def __init__(self, identity: pki.Identity, context: RoundContext,
                 silos: Iterable[str]) -> None:
        _check_setup(context)
        self.silos = frozenset(silos)
        if identity.name not in self.silos:
            raise ProtocolError(f"{identity.name!r} is not among the live silos")
        self.identity = identity
        self.context = context
        self.leader = leader_of(self.silos)
        self._keys = EphemeralKeyPair()
        self.advert = make_setup_advert(identity.name, self._keys, context, identity.key_pem)

    def _verified(self, advert: SetupAdvert, certificate_pem: bytes) -> SetupAdvert:
        if advert.silo not in self.silos:
            raise ProtocolError(f"{advert.silo!r} is not among the live silos")
        verify_setup_advert(advert, certificate_pem, self.identity.ca_pem, self.context)
        return advert


class GroupKeyLeader(_SetupParty):
    """The leader's side: draws the group secrets and seals them for each verified peer."""

    def __init__(self, identity: pki.Identity, context: RoundContext, silos: Iterable[str],
                 *, ckks_secret: bytes = b"") -> None:
        super().__init__(identity, context, silos)
        if identity.name != self.leader:
            raise ProtocolError(f"{identity.name!r} is not the leader; {self.leader!r} is")
        self.secrets = GroupSecrets.generate(ckks_secret)

    def seal_for(self, peer_advert: SetupAdvert, peer_certificate_pem: bytes) -> bytes:
        """Verify a peer's advert against the CA, then seal the group secrets for it."""
        advert = self._verified(peer_advert, peer_certificate_pem)
        return seal_group_secrets(self.secrets, self._keys, advert, self.context, self.leader,
                                  advert.silo)

    def seal_all(self, adverts: Mapping[str, SetupAdvert],
                 certificates: Mapping[str, bytes]) -> dict[str, bytes]:
        """Seal for every peer; each must have an advert and a certificate, or none is sealed."""
        peers = sorted(self.silos - {self.leader})
        missing = [peer for peer in peers if peer not in adverts or peer not in certificates]
        if missing:
            raise ProtocolError(f"no advert or certificate from {', '.join(missing)}")
        for peer in peers:
            if adverts[peer].silo != peer:
                raise ProtocolError(f"advert filed under {peer!r} names {adverts[peer].silo!r}")
        return {peer: self.seal_for(adverts[peer], certificates[peer]) for peer in peers}


class GroupKeyMember(_SetupParty):
    """A non-leader silo's side: verifies the leader's advert, then opens its box."""

    def __init__(self, identity: pki.Identity, context: RoundContext,
                 silos: Iterable[str]) -> None:
        super().__init__(identity, context, silos)
        if identity.name == self.leader:
            raise ProtocolError(f"{identity.name!r} is the leader: use GroupKeyLeader")

    def open(self, box: bytes, leader_advert: SetupAdvert,
             leader_certificate_pem: bytes) -> GroupSecrets:
        """Verify the leader's advert against the CA, then decrypt the group secrets."""
        if leader_advert.silo != self.leader:
            raise ProtocolError(f"advert of {leader_advert.silo!r} is not the advert of the "
                                f"leader {self.leader!r}")
        advert = self._verified(leader_advert, leader_certificate_pem)
        return open_group_secrets(box, self._keys, advert, self.context, self.leader,
                                  self.identity.name)
