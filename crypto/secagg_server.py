"""The coordinator's side of secure aggregation for one round attempt (see crypto/secagg.py).

It holds only public keys, sealed shares it cannot open, the running sum of the masked vectors
(one vector, whatever the number of silos), signatures and the shares silos reveal in the
unmask stage, and turns them into the sum of the survivors' inputs.
Stages advance when the caller closes them (everyone expected answered, or a deadline passed);
the caller also reports silos that vanished, so a stage never waits for a silo that is gone.
Reconstruction is batched: one Lagrange interpolation per set of revealing holders, one AES-CTR
keystream per mask, accumulated in place.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence

import numpy as np

from trellis.crypto import certificates
from trellis.crypto.errors import ProtocolError, VerificationFailed
from trellis.crypto.keyagreement import EphemeralKeyPair, KeyAdvert, RoundContext
from trellis.crypto.neighbours import Graph, neighbour_graph, share_holders
from trellis.crypto.prg import apply_masks
from trellis.crypto.secagg import (
    KEY_SHARE_BYTES,
    SEALED_SHARE_BYTES,
    SECRET_BYTES,
    EncryptedShare,
    RelayedAdvert,
    RevealedShare,
    SecAggConfig,
    ShareKind,
    SurvivorSignature,
    TooFewSurvivors,
    UnmaskRequest,
    holder_coordinates,
    pair_mask_key,
    self_mask_key,
    survivors_payload,
)
from trellis.crypto.shamir import SHARE_DTYPE, combine


class ServerStage(enum.Enum):
    """What the coordinator is collecting."""

    ADVERTISE = "advertise"
    SHARE = "share"
    INPUT = "input"
    CONSISTENCY = "consistency"
    UNMASK = "unmask"
    DONE = "done"


_LABELS = {ServerStage.ADVERTISE: "advertise keys", ServerStage.SHARE: "share keys",
           ServerStage.INPUT: "masked input", ServerStage.CONSISTENCY: "consistency check",
           ServerStage.UNMASK: "unmask"}


class SecAggServer:
    """Bookkeeping and unmasking of one attempt; every method checks stage and sender."""

    def __init__(self, context: RoundContext, config: SecAggConfig, participants: Sequence[str],
                 length: int | None, dtype: type[np.unsignedinteger]) -> None:
        self.context = context
        self.config = config
        self.participants = tuple(sorted(participants))
        self.length = length
        self.dtype = np.dtype(dtype)
        self.stage = ServerStage.ADVERTISE
        self.dropped: set[str] = set()
        self.adverts: dict[str, RelayedAdvert] = {}
        self.roster: tuple[str, ...] = ()                 # U1
        self.graph: Graph = {}
        self.shares: dict[str, tuple[EncryptedShare, ...]] = {}
        self.sharers: tuple[str, ...] = ()                # U2
        # Masked inputs are summed as they arrive: the attempt holds one vector, not one per
        # silo. Exact, because every input accepted at this stage is in U3 (a late one is
        # refused) and the ring sum is order-free.
        self.inputs: set[str] = set()
        self._input_sum: np.ndarray | None = None
        self.survivors: tuple[str, ...] = ()              # U3
        self.signatures: dict[str, bytes] = {}
        self.signers: tuple[str, ...] = ()                # U4
        self.reveals: dict[str, dict[tuple[str, ShareKind], bytes]] = {}
        self.holders: dict[str, tuple[str, ...]] = {}     # owner -> silos holding its shares
        self._inbox: dict[str, list[EncryptedShare]] = {}  # receiver -> shares sent to it
        self._needed: set[tuple[str, ShareKind]] = set()   # secrets the unmasking needs
        self._revealed: dict[tuple[str, ShareKind], int] = {}

    # -- progress -----------------------------------------------------------------------------
    def expected(self) -> tuple[str, ...]:
        """Silos whose message the current stage waits for."""
        return {ServerStage.ADVERTISE: self.participants, ServerStage.SHARE: self.roster,
                ServerStage.INPUT: self.sharers, ServerStage.CONSISTENCY: self.survivors,
                ServerStage.UNMASK: self.signers}.get(self.stage, ())

    def answered(self) -> set[str]:
        """Silos that have answered the current stage."""
        received: dict[ServerStage, Collection[str]] = {
            ServerStage.ADVERTISE: self.adverts, ServerStage.SHARE: self.shares,
            ServerStage.INPUT: self.inputs, ServerStage.CONSISTENCY: self.signatures,
            ServerStage.UNMASK: self.reveals}
        return set(received.get(self.stage, {}))

    def waiting_for(self) -> set[str]:
        """Expected silos that have neither answered nor vanished."""
        return set(self.expected()) - self.answered() - self.dropped

    def stage_complete(self) -> bool:
        """Whether nothing more can arrive for this stage (or, when unmasking, none is needed)."""
        if self.stage is ServerStage.UNMASK and self._enough_reveals():
            return True
        return not self.waiting_for()

    def hopeless(self) -> TooFewSurvivors | None:
        """Why this stage can no longer reach the threshold whatever still arrives, if so."""
        if self.stage in (ServerStage.UNMASK, ServerStage.DONE):
            return None
        possible = len(self.answered() | self.waiting_for())
        if possible >= self.config.threshold:
            return None
        return TooFewSurvivors(_LABELS[self.stage], possible, self.config.threshold,
                               "too many silos gone")

    def drop(self, silo: str) -> None:
        """A silo vanished: stop waiting for it (it stays in the sets it already reached)."""
        self.dropped.add(silo)

    def close_stage(self) -> ServerStage:
        """Fix the set of silos that answered and move on; TooFewSurvivors if below threshold."""
        t = self.config.threshold
        if self.stage is ServerStage.ADVERTISE:
            self.roster = self._at_least(sorted(self.adverts), _LABELS[ServerStage.ADVERTISE])
            self.graph = neighbour_graph(self.roster, self.config.neighbours,
                                         self.config.graph_seed, self.context.label())
            self.holders = {s: share_holders(self.graph, s) for s in self.roster}
            self.stage = ServerStage.SHARE
        elif self.stage is ServerStage.SHARE:
            self.sharers = self._at_least(sorted(self.shares), _LABELS[ServerStage.SHARE])
            for sender in self.sharers:
                for share in self.shares[sender]:
                    self._inbox.setdefault(share.receiver, []).append(share)
            self.stage = ServerStage.INPUT
        elif self.stage is ServerStage.INPUT:
            self.survivors = self._at_least(sorted(self.inputs), _LABELS[ServerStage.INPUT])
            self.stage = ServerStage.CONSISTENCY
        elif self.stage is ServerStage.CONSISTENCY:
            self.signers = self._at_least(sorted(self.signatures),
                                          _LABELS[ServerStage.CONSISTENCY])
            survivors = set(self.survivors)
            for owner in self.sharers:
                if owner in survivors:
                    self._needed.add((owner, ShareKind.MASK_SEED))
                elif self.graph[owner] & survivors:
                    # A dropped silo with no surviving neighbour left no mask in the sum.
                    self._needed.add((owner, ShareKind.MASK_KEY))
            self.stage = ServerStage.UNMASK
        elif self.stage is ServerStage.UNMASK:
            if not self._enough_reveals():
                raise TooFewSurvivors("unmask", len(self.reveals), t,
                                      "some secret has fewer than t revealed shares")
            self.stage = ServerStage.DONE
        else:
            raise ProtocolError("the protocol is already complete")
        return self.stage

    # -- stage 0 ------------------------------------------------------------------------------
    def add_advert(self, silo: str, advert: KeyAdvert, certificate_pem: bytes) -> None:
        """A participant's signed keys, checked against the certificate it connected with.

        Its peers verify the advert again against the CA (they need not trust the coordinator);
        checking here too means one silo's forged or garbled advert is refused to that silo
        instead of being relayed and stopping every honest peer at key sharing.
        """
        self._sender(silo, ServerStage.ADVERTISE, self.participants, self.adverts)
        if advert.silo != silo:
            raise ProtocolError(f"{silo} sent an advert naming {advert.silo!r}")
        if len(advert.cipher_key) != 32 or len(advert.mask_key) != 32 or not advert.signature:
            raise ProtocolError("a key advert needs two 32-byte public keys and a signature")
        if advert.cipher_key == advert.mask_key:
            raise ProtocolError(f"the key advert of {silo} reuses one key for both purposes")
        try:
            certificates.verify_bytes(certificate_pem, advert.signed_payload(self.context),
                             advert.signature)
        except VerificationFailed:
            raise ProtocolError(f"the key advert of {silo} is not signed by its certificate for "
                                f"{self.context.describe()}") from None
        self.adverts[silo] = RelayedAdvert(advert, certificate_pem)

    def relayed_adverts(self) -> list[RelayedAdvert]:
        """Stage-1 bundle: the adverts of U1, in roster order."""
        self._stage_at_least(ServerStage.SHARE)
        return [self.adverts[s] for s in self.roster]

    # -- stage 1 ------------------------------------------------------------------------------
    def add_shares(self, silo: str, shares: Sequence[EncryptedShare]) -> None:
        """A silo's sealed shares: exactly one for each other holder of its secrets."""
        self._sender(silo, ServerStage.SHARE, self.roster, self.shares)
        wanted = set(self.holders[silo]) - {silo}
        receivers = [s.receiver for s in shares]
        if any(s.sender != silo for s in shares):
            raise ProtocolError(f"{silo} sent shares in another silo's name")
        if len(set(receivers)) != len(receivers) or set(receivers) != wanted:
            raise ProtocolError(f"{silo} must send exactly one share to each of its "
                                f"{len(wanted)} neighbours")
        if any(len(s.box) != SEALED_SHARE_BYTES for s in shares):
            raise ProtocolError(f"a sealed share must be {SEALED_SHARE_BYTES} bytes")
        self.shares[silo] = tuple(shares)

    def shares_for(self, silo: str) -> list[EncryptedShare]:
        """Stage-2 bundle: the sealed shares U2 members sent to this silo."""
        self._stage_at_least(ServerStage.INPUT)
        if silo not in self.sharers:
            raise ProtocolError(f"{silo} did not share keys in this attempt")
        return list(self._inbox.get(silo, ()))

    # -- stage 2 ------------------------------------------------------------------------------
    def add_masked_input(self, silo: str, vector: np.ndarray) -> None:
        """A U2 member's masked vector of the agreed ring and length."""
        self._sender(silo, ServerStage.INPUT, self.sharers, self.inputs)
        if self.length is None:
            raise ProtocolError("the vector length was never declared")
        if vector.dtype != self.dtype or vector.shape != (self.length,):
            raise ProtocolError(f"masked input must be {self.dtype.name} of shape "
                                f"({self.length},), got {vector.dtype.name} {vector.shape}")
        if self._input_sum is None:
            self._input_sum = np.zeros(self.length, dtype=self.dtype)
        self._input_sum += vector          # unsigned: wraps modulo the ring, as masking needs
        self.inputs.add(silo)

    @property
    def input_sum(self) -> np.ndarray | None:
        """The ring sum of the masked inputs received so far (masks still on), read-only."""
        if self._input_sum is None:
            return None
        view = self._input_sum.view()
        view.flags.writeable = False
        return view

    # -- stage 3 ------------------------------------------------------------------------------
    def add_signature(self, silo: str, signature: bytes) -> None:
        """A U3 member's signature over U3, checked against the certificate it connected with."""
        self._sender(silo, ServerStage.CONSISTENCY, self.survivors, self.signatures)
        try:
            certificates.verify_bytes(self.adverts[silo].certificate_pem,
                             survivors_payload(self.context, self.survivors), signature)
        except VerificationFailed:
            raise ProtocolError(f"{silo}'s signature over the survivor list is invalid for "
                                f"{self.context.describe()}") from None
        self.signatures[silo] = signature

    # -- stage 4 ------------------------------------------------------------------------------
    def unmask_request(self, silo: str) -> UnmaskRequest:
        """What this U4 member must reveal: seed shares of U3, key shares of U2 \\ U3."""
        self._stage_at_least(ServerStage.UNMASK)
        if silo not in self.signers:
            raise ProtocolError(f"{silo} did not sign the survivor list in this attempt")
        owners = [o for o in self.sharers if o == silo or o in self.graph[silo]]
        survivors = set(self.survivors)
        return UnmaskRequest(
            survivors=self.survivors,
            seed_shares_of=tuple(o for o in owners if o in survivors),
            key_shares_of=tuple(o for o in owners if o not in survivors),
            signatures=tuple(SurvivorSignature(s, self.signatures[s]) for s in self.signers))

    def add_reveal(self, silo: str, revealed: Sequence[RevealedShare]) -> None:
        """A U4 member's revealed shares: exactly what its unmask request asked for."""
        self._sender(silo, ServerStage.UNMASK, self.signers, self.reveals)
        request = self.unmask_request(silo)
        asked = {(o, ShareKind.MASK_SEED) for o in request.seed_shares_of} | {
            (o, ShareKind.MASK_KEY) for o in request.key_shares_of}
        got = {(r.owner, r.kind): r.share for r in revealed}
        if len(got) != len(revealed) or set(got) != asked:
            raise ProtocolError(f"{silo} revealed other shares than it was asked for")
        if any(len(share) != KEY_SHARE_BYTES for share in got.values()):
            raise ProtocolError(f"a revealed share must be {KEY_SHARE_BYTES} bytes")
        self.reveals[silo] = got
        for key in got:
            self._revealed[key] = self._revealed.get(key, 0) + 1

    def unmask(self) -> np.ndarray:
        """Ring sum of U3's inputs, with self masks and dropped silos' pairwise masks removed."""
        if self.stage is not ServerStage.DONE or self.length is None:
            raise ProtocolError(f"cannot unmask at stage {self.stage.value}")
        if self._input_sum is None:
            raise ProtocolError("the masked inputs were unmasked already (or none arrived)")
        total, self._input_sum = self._input_sum, None   # unmasked in place, then let go
        survivors = set(self.survivors)
        dropped = [s for s in self.sharers if (s, ShareKind.MASK_KEY) in self._needed]
        seeds = self._reconstruct(list(self.survivors), ShareKind.MASK_SEED)
        keys = self._reconstruct(dropped, ShareKind.MASK_KEY)
        subtract = [self_mask_key(seeds[s], self.context, s) for s in self.survivors]
        add: list[bytes] = []
        for gone in dropped:
            pair = EphemeralKeyPair.from_secret_bytes(keys[gone])
            if pair.public_bytes != self.adverts[gone].advert.mask_key:
                raise ProtocolError(f"the key shares of {gone} do not match its advert")
            for peer in sorted(self.graph[gone] & survivors):
                key = pair_mask_key(pair.agree(self.adverts[peer].advert.mask_key),
                                    self.context, gone, peer)
                # The survivor added the mask if it ranks first, subtracted it otherwise.
                (subtract if peer < gone else add).append(key)
        apply_masks(total, add, subtract)
        return total

    # -- internals ----------------------------------------------------------------------------
    def _reconstruct(self, owners: list[str], kind: ShareKind) -> dict[str, bytes]:
        x = holder_coordinates(self.roster)
        t = self.config.threshold
        groups: dict[tuple[str, ...], list[str]] = {}
        for owner in owners:
            holders = [h for h in self.holders[owner]
                       if (owner, kind) in self.reveals.get(h, {})]
            if len(holders) < t:
                raise TooFewSurvivors("unmask", len(holders), t,
                                      f"shares revealed for one {kind.value}")
            groups.setdefault(tuple(holders[:t]), []).append(owner)
        secrets: dict[str, bytes] = {}
        for chosen, members in groups.items():
            batch = np.stack([
                np.stack([np.frombuffer(self.reveals[h][(o, kind)], dtype=SHARE_DTYPE)
                          for h in chosen]) for o in members])
            values = combine([x[h] for h in chosen], batch)
            if np.any(values >= 1 << 16):
                raise ProtocolError(f"revealed {kind.value} shares are inconsistent")
            for owner, limbs in zip(members, values, strict=True):
                secrets[owner] = limbs.astype("<u2").tobytes()
                assert len(secrets[owner]) == SECRET_BYTES
        return secrets

    def _enough_reveals(self) -> bool:
        t = self.config.threshold
        return all(self._revealed.get(key, 0) >= t for key in self._needed)

    def _at_least(self, names: list[str], stage: str) -> tuple[str, ...]:
        if len(names) < self.config.threshold:
            raise TooFewSurvivors(stage, len(names), self.config.threshold)
        return tuple(names)

    def _sender(self, silo: str, stage: ServerStage, members: Sequence[str],
                received: Collection[str]) -> None:
        if self.stage is not stage:
            raise ProtocolError(f"{stage.value} message at stage {self.stage.value}")
        if silo not in members:
            raise ProtocolError(f"{silo} is not expected at stage {stage.value}")
        if silo in received:
            raise ProtocolError(f"{silo} already answered stage {stage.value}")

    def _stage_at_least(self, stage: ServerStage) -> None:
        order = list(ServerStage)
        if order.index(self.stage) < order.index(stage):
            raise ProtocolError(f"not available before stage {stage.value}")
