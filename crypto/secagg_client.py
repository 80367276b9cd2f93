"""A silo's side of secure aggregation for one round attempt (see crypto/secagg.py).

The client enforces the stage order and the exact payloads it accepts: it never sends a key,
share or mask outside its stage, answers each stage once, and refuses an unmask request that
would make it reveal both kinds of share of one silo, that lists survivors other than those it
signed, or that does not carry at least t valid consistency signatures.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Sequence

import numpy as np

from trellis.crypto import certificates
from trellis.crypto.errors import ProtocolError, VerificationFailed
from trellis.crypto.keyagreement import (
    EphemeralKeyPair,
    KeyAdvert,
    RoundContext,
    make_advert,
    verify_advert,
)
from trellis.crypto.neighbours import neighbour_graph, share_holders
from trellis.crypto.prg import apply_masks
from trellis.crypto.secagg import (
    KEY_SHARE_BYTES,
    SECRET_BYTES,
    SHARE_PAIR_BYTES,
    EncryptedShare,
    RelayedAdvert,
    RevealedShare,
    SecAggConfig,
    ShareKind,
    TooFewSurvivors,
    UnmaskRequest,
    check_roster,
    holder_coordinates,
    pair_mask_key,
    self_mask_key,
    survivors_payload,
)
from trellis.crypto.shamir import SHARE_DTYPE, split_secrets
from trellis.crypto.sharebox import open_share, seal_share


class ClientStage(enum.Enum):
    """The last thing this silo did in the attempt."""

    NEW = "new"
    ADVERTISED = "advertised"
    SHARED = "shared"
    MASKED = "masked"
    SIGNED = "signed"
    REVEALED = "revealed"


class SecAggClient:
    """One silo's keys, held shares and stage for one round attempt; used once, then dropped."""

    def __init__(self, me: str, context: RoundContext, config: SecAggConfig,
                 certificate_key_pem: bytes, ca_pem: bytes,
                 random_bytes: Callable[[int], bytes] = os.urandom) -> None:
        self.me = me
        self.context = context
        self.config = config
        self._certificate_key_pem = certificate_key_pem
        self._ca_pem = ca_pem
        self._random_bytes = random_bytes
        self._cipher_keys = EphemeralKeyPair()
        self._mask_keys: EphemeralKeyPair | None = EphemeralKeyPair()
        self._seed: bytes | None = None
        self.stage = ClientStage.NEW
        self.roster: tuple[str, ...] = ()
        self.neighbours: frozenset[str] = frozenset()
        self._adverts: dict[str, KeyAdvert] = {}
        self._certificates: dict[str, bytes] = {}
        self._held: dict[str, np.ndarray] = {}      # owner -> the share pair this silo holds
        self._signed: tuple[str, ...] | None = None

    def __repr__(self) -> str:
        return f"SecAggClient({self.me!r}, stage={self.stage.value}, <secrets>)"

    def advert(self) -> KeyAdvert:
        """Stage 0: this attempt's two public keys, signed with the certificate key."""
        self._expect(ClientStage.NEW, "advertise keys")
        assert self._mask_keys is not None
        advert = make_advert(self.me, self._cipher_keys, self._mask_keys, self.context,
                             self._certificate_key_pem)
        self.stage = ClientStage.ADVERTISED
        return advert

    def share_keys(self, relayed: Sequence[RelayedAdvert]) -> list[EncryptedShare]:
        """Stage 1: verify every advert (U1), then seal Shamir shares for each holder."""
        self._expect(ClientStage.ADVERTISED, "share keys")
        mask_keys = self._keys()
        roster = check_roster([r.advert.silo for r in relayed], "the key bundle")
        if self.me not in roster:
            raise ProtocolError("the key bundle leaves this silo out")
        threshold = self.config.threshold
        if len(roster) < threshold:
            raise TooFewSurvivors("share keys", len(roster), threshold, "silos with keys")
        for item in relayed:
            advert = item.advert
            if advert.silo == self.me:
                if (advert.cipher_key, advert.mask_key) != (self._cipher_keys.public_bytes,
                                                            mask_keys.public_bytes):
                    raise ProtocolError("the coordinator relayed other keys for this silo")
                continue
            verify_advert(advert, item.certificate_pem, self._ca_pem, self.context)
            self._adverts[advert.silo] = advert
            self._certificates[advert.silo] = item.certificate_pem
        graph = neighbour_graph(roster, self.config.neighbours, self.config.graph_seed,
                                self.context.label())
        holders = share_holders(graph, self.me)
        if len(holders) < threshold:
            raise TooFewSurvivors("share keys", len(holders), threshold, "share holders")
        self.roster, self.neighbours = roster, graph[self.me]
        self._seed = self._random_bytes(SECRET_BYTES)
        x = holder_coordinates(roster)
        rows = split_secrets([mask_keys.secret_bytes(), self._seed], [x[h] for h in holders],
                             threshold, self._random_bytes)
        sealed = []
        for holder, row in zip(holders, rows, strict=True):
            if holder == self.me:
                self._held[self.me] = row
                continue
            box = seal_share(row.tobytes(), self._cipher_keys, self._adverts[holder].cipher_key,
                             self.context, self.me, holder, self._random_bytes)
            sealed.append(EncryptedShare(self.me, holder, box))
        self.stage = ClientStage.SHARED
        return sealed

    def mask_input(self, encoded: np.ndarray, received: Sequence[EncryptedShare]) -> np.ndarray:
        """Stage 2: keep the shares sent to this silo (U2), then mask the encoded vector."""
        self._expect(ClientStage.SHARED, "send a masked input")
        mask_keys = self._keys()
        if encoded.ndim != 1 or encoded.dtype not in (np.uint32, np.uint64):
            raise ProtocolError("only flat encoded ring vectors can be masked")
        senders: set[str] = set()
        for share in received:
            if share.receiver != self.me or share.sender not in self.neighbours:
                raise ProtocolError(f"a share from {share.sender!r} to {share.receiver!r} "
                                    "was routed to this silo")
            if share.sender in senders:
                raise ProtocolError(f"two shares from {share.sender!r}")
            plain = open_share(share.box, self._cipher_keys,
                               self._adverts[share.sender].cipher_key, self.context,
                               share.sender, self.me)
            if len(plain) != SHARE_PAIR_BYTES:
                raise ProtocolError(f"share from {share.sender!r} has the wrong length")
            self._held[share.sender] = np.frombuffer(plain, dtype=SHARE_DTYPE).copy()
            senders.add(share.sender)
        if len(senders) + 1 < self.config.threshold:
            raise TooFewSurvivors("masked input", len(senders) + 1, self.config.threshold,
                                  "neighbours that shared keys")
        assert self._seed is not None
        add = [self_mask_key(self._seed, self.context, self.me)]
        subtract: list[bytes] = []
        for peer in sorted(senders):
            key = pair_mask_key(mask_keys.agree(self._adverts[peer].mask_key), self.context,
                                self.me, peer)
            (add if self.me < peer else subtract).append(key)
        masked = np.array(encoded, copy=True)
        apply_masks(masked, add, subtract)
        # From here on only shares are needed: forget the seed and the mask-agreement key.
        self._seed, self._mask_keys = None, None
        self.stage = ClientStage.MASKED
        return masked

    def sign_survivors(self, survivors: Sequence[str]) -> bytes:
        """Stage 3: sign the list of silos whose masked input the coordinator holds (U3)."""
        self._expect(ClientStage.MASKED, "sign the survivors")
        listed = check_roster(list(survivors), "the survivor list")
        if tuple(survivors) != listed:
            raise ProtocolError("the survivor list is not sorted")
        if self.me not in listed or not set(listed) <= set(self.roster):
            raise ProtocolError("the survivor list must include this silo and only silos "
                                "that advertised keys")
        if len(listed) < self.config.threshold:
            raise TooFewSurvivors("consistency check", len(listed), self.config.threshold)
        self._signed = listed
        self.stage = ClientStage.SIGNED
        return certificates.sign_bytes(self._certificate_key_pem,
                                       survivors_payload(self.context, listed))

    def reveal(self, request: UnmaskRequest) -> list[RevealedShare]:
        """Stage 4: check the request and the signatures, then reveal one kind of share per silo."""
        self._expect(ClientStage.SIGNED, "reveal shares")
        survivors = set(request.survivors)
        if request.survivors != self._signed:
            raise ProtocolError("the unmask request lists other survivors than this silo signed")
        both = set(request.seed_shares_of) & set(request.key_shares_of)
        if both:
            raise ProtocolError("refusing to reveal both the seed share and the key share of "
                                + ", ".join(sorted(both)))
        if set(request.key_shares_of) & survivors:
            raise ProtocolError("refusing to reveal the key share of a surviving silo")
        if not set(request.seed_shares_of) <= survivors:
            raise ProtocolError("refusing to reveal the seed share of a silo that dropped")
        unknown = (set(request.seed_shares_of) | set(request.key_shares_of)) - set(self._held)
        if unknown:
            raise ProtocolError("no shares held of " + ", ".join(sorted(unknown)))
        if len(set(request.seed_shares_of)) != len(request.seed_shares_of) or len(
                set(request.key_shares_of)) != len(request.key_shares_of):
            raise ProtocolError("the unmask request names a silo twice")
        self._check_signatures(request)
        self.stage = ClientStage.REVEALED
        revealed = [RevealedShare(o, ShareKind.MASK_SEED,
                                  self._held[o].tobytes()[KEY_SHARE_BYTES:])
                    for o in request.seed_shares_of]
        revealed += [RevealedShare(o, ShareKind.MASK_KEY,
                                   self._held[o].tobytes()[:KEY_SHARE_BYTES])
                     for o in request.key_shares_of]
        self._held.clear()
        return revealed

    # -- internals ----------------------------------------------------------------------------
    def _check_signatures(self, request: UnmaskRequest) -> None:
        assert self._signed is not None
        payload = survivors_payload(self.context, self._signed)
        valid: set[str] = set()
        for item in request.signatures:
            # Our own signature proves nothing to us; peers' are checked against their certs.
            certificate = self._certificates.get(item.silo)
            if item.silo not in request.survivors or item.silo in valid or certificate is None:
                continue
            try:
                certificates.verify_bytes(certificate, payload, item.signature)
            except VerificationFailed:
                continue
            valid.add(item.silo)
        needed = self.config.threshold - 1   # this silo's own signature counts implicitly
        if len(valid) < needed:
            raise ProtocolError(f"only {len(valid) + 1} valid consistency signatures over the "
                                f"survivor list for {self.context.describe()}; "
                                f"{self.config.threshold} needed")

    def _expect(self, stage: ClientStage, action: str) -> None:
        if self.stage is not stage:
            raise ProtocolError(f"cannot {action} at stage {self.stage.value}")

    def _keys(self) -> EphemeralKeyPair:
        if self._mask_keys is None:
            raise ProtocolError("the mask-agreement key is gone")
        return self._mask_keys
