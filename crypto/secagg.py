"""Secure aggregation with dropout recovery (Bonawitz et al., CCS 2017, §4; SecAgg+ graphs, Bell
et al., CCS 2020): the payloads both sides exchange and the derivations both sides must agree on.

Per round attempt, with threshold t and a (full or SecAgg+) neighbour graph over the silos that
advertised keys (U1):

0. *Advertise*: every silo sends two signed X25519 public keys (share encryption, mask agreement).
1. *Share*: every silo draws a self-mask seed b, Shamir-shares b and its mask-agreement private
   key among itself and its neighbours (t-of-holders), and sends each share AES-GCM-encrypted to
   its holder through the coordinator. The silos that do so are U2.
2. *Masked input*: y_u = x_u + PRG(b_u) + sum over neighbours v in U2 of +-PRG(s_uv).
   The silos whose y arrives are U3.
3. *Consistency*: every silo in U3 signs the list U3; the signers are U4.
4. *Unmask*: a silo in U4 checks at least t valid signatures over the U3 it signed, then reveals
   the seed shares of silos in U3 and the key shares of silos in U2 \\ U3 -- never both kinds for
   one silo -- and the coordinator reconstructs, regenerates and removes the masks.

Fewer than t silos at any stage, or a secret with fewer than t revealed shares, aborts the
attempt (`TooFewSurvivors`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from trellis.crypto.errors import ProtocolError
from trellis.crypto.keyagreement import KeyAdvert, RoundContext, derive_key
from trellis.crypto.sharebox import NONCE_BYTES, TAG_BYTES

SECRET_BYTES = 32
# One share holds both secrets' limbs: mask-agreement private key first, then the self-mask seed.
KEY_SHARE_BYTES = SECRET_BYTES * 2     # 16 limbs of 16 bits, each stored as a uint32 share
SHARE_PAIR_BYTES = 2 * KEY_SHARE_BYTES
SEALED_SHARE_BYTES = NONCE_BYTES + SHARE_PAIR_BYTES + TAG_BYTES
_PAIR_PURPOSE = "pairwise-mask"
_SELF_PURPOSE = "self-mask"


class TooFewSurvivors(ProtocolError):
    """Fewer silos than the threshold remain at some stage: the attempt must be aborted."""

    def __init__(self, stage: str, survivors: int, threshold: int, detail: str = "") -> None:
        self.stage = stage
        self.survivors = survivors
        self.threshold = threshold
        super().__init__(f"only {survivors} silo(s) left at stage {stage}, threshold is "
                         f"{threshold}" + (f" ({detail})" if detail else ""))


@dataclass(frozen=True)
class SecAggConfig:
    """Threshold and graph of the protocol; the plan fixes them, every party derives the rest."""

    threshold: int
    neighbours: int = 0        # 0: complete graph (Bonawitz); even k >= 2: SecAgg+ graph
    graph_seed: int = 0

    def __post_init__(self) -> None:
        if self.threshold < 1:
            raise ProtocolError("the threshold must be at least 1")
        if self.neighbours < 0 or (self.neighbours and self.neighbours % 2):
            raise ProtocolError("neighbours must be 0 (full graph) or an even number >= 2")


@dataclass(frozen=True)
class RelayedAdvert:
    """A peer's key advert as relayed by the coordinator, with the certificate to check it."""

    advert: KeyAdvert
    certificate_pem: bytes


@dataclass(frozen=True)
class EncryptedShare:
    """A Shamir share pair sealed from one silo to another; opaque to the coordinator."""

    sender: str
    receiver: str
    box: bytes


class ShareKind(enum.Enum):
    """Which half of a share pair is revealed in the unmask stage."""

    MASK_KEY = "mask_key"      # of a silo that dropped after sharing: recovers its pairwise masks
    MASK_SEED = "mask_seed"    # of a surviving silo: recovers its self mask


@dataclass(frozen=True)
class SurvivorSignature:
    """A silo's signature over the list of silos whose masked input is in the sum."""

    silo: str
    signature: bytes


@dataclass(frozen=True)
class UnmaskRequest:
    """What the coordinator asks one silo to reveal, with the consistency signatures (U4)."""

    survivors: tuple[str, ...]
    seed_shares_of: tuple[str, ...]
    key_shares_of: tuple[str, ...]
    signatures: tuple[SurvivorSignature, ...]


@dataclass(frozen=True)
class RevealedShare:
    """One revealed half of a share pair held by the revealing silo."""

    owner: str
    kind: ShareKind
    share: bytes


def survivors_payload(context: RoundContext, survivors: tuple[str, ...]) -> bytes:
    """The bytes a consistency signature covers."""
    return context.label() + b"|survivors|" + "\n".join(survivors).encode()


def self_mask_key(seed: bytes, context: RoundContext, silo: str) -> bytes:
    """AES key of a silo's self mask, from its full 256-bit seed."""
    return derive_key(seed, context, _SELF_PURPOSE, silo, silo)


def pair_mask_key(shared_secret: bytes, context: RoundContext, a: str, b: str) -> bytes:
    """AES key of the mask between two silos, from their full X25519 agreement."""
    return derive_key(shared_secret, context, _PAIR_PURPOSE, a, b)


def holder_coordinates(roster: tuple[str, ...]) -> dict[str, int]:
    """Shamir x-coordinate of each silo: its position in the sorted roster, plus one."""
    return {name: i + 1 for i, name in enumerate(roster)}


def check_roster(names: list[str], what: str) -> tuple[str, ...]:
    """Sorted tuple of distinct silo names, or ProtocolError."""
    if len(set(names)) != len(names):
        raise ProtocolError(f"{what} lists a silo twice")
    return tuple(sorted(names))
