"""Plain domain types for what travels on the wire; the codec maps them to and from protobuf."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from trellis.crypto.secagg import EncryptedShare, RevealedShare, UnmaskRequest

# The protocol silo agents and the coordinator speak; a silo attends with it and the
# coordinator refuses an older one. 0.2: `local` rounds run no secure aggregation. 0.3: every
# signed context carries the run id (crypto/keyagreement.py RoundContext, version 2), so an
# older agent's signatures would never verify.
PROTOCOL_VERSION = "trellis/0.3"
_VERSION = re.compile(r"trellis/(\d+)\.(\d+)")


class AgentTooOld(ValueError):
    """A silo attended without the protocol version, with a malformed one, or an older one."""


def check_agent_version(agent_version: str) -> None:
    """Refuse (AgentTooOld) an attend that carries no, a malformed or an older protocol version."""
    ours = _version_numbers(PROTOCOL_VERSION)
    theirs = _version_numbers(agent_version)
    if theirs is not None and ours is not None and theirs >= ours:
        return
    said = (f"sent the malformed version {agent_version[:40]!r}" if agent_version and
            theirs is None else f"speaks {agent_version}" if agent_version
            else "sent no version")
    raise AgentTooOld(f"this coordinator speaks protocol {PROTOCOL_VERSION} and the silo's agent "
                      f"{said}; upgrade Trellis on the silo to a release speaking "
                      f"{PROTOCOL_VERSION} or later and join again")


def _version_numbers(version: str) -> tuple[int, int] | None:
    match = _VERSION.fullmatch(version)
    return None if match is None else (int(match[1]), int(match[2]))


class Phase(enum.IntEnum):
    """Protocol phase carried by every message (mirrors the .proto enum)."""

    UNSPECIFIED = 0
    JOIN = 1
    WAITING = 2
    ROUND_OPEN = 3
    ADVERTISE_KEY = 4
    KEYS_READY = 5
    MASKED_INPUT = 6
    ROUND_ABORTED = 7
    REPORT = 8
    FINISHED = 9
    FETCH_STATE = 10
    SHARE_KEYS = 11
    SHARES_READY = 12
    CONSISTENCY_CHECK = 13
    SIGN_SURVIVORS = 14
    UNMASK = 15
    REVEAL_SHARES = 16
    GROUP_SETUP = 17
    GROUP_SEAL = 18
    GROUP_OPEN = 19
    ENCRYPT_UPDATE = 20
    DECRYPT_SIMILARITY = 21


@dataclass(frozen=True)
class Envelope:
    """Where a message belongs: federation, round, attempt and phase."""

    federation: str
    round: int
    attempt: int
    phase: Phase

    def describe(self) -> str:
        """Short human-readable position, for error messages and logs."""
        return f"round {self.round} attempt {self.attempt} phase {self.phase.name}"


@dataclass(frozen=True)
class Instruction:
    """What the coordinator tells a silo to do now."""

    envelope: Envelope
    participants: tuple[str, ...] = ()
    public_plan_json: str = ""
    message: str = ""
    total_rounds: int = 0
    run_id: str = ""              # on JOIN: a restarted coordinator keeps it, a fresh run draws
                                  # one; every signature of the run is bound to it


@dataclass(frozen=True)
class KeyAdvertisement:
    """A silo's two signed ephemeral keys for one round attempt, as uploaded."""

    envelope: Envelope
    cipher_key: bytes
    mask_key: bytes
    signature: bytes
    shared_length: int


@dataclass(frozen=True)
class SignedKey:
    """A peer's advert as relayed by the coordinator, with the certificate to check it."""

    silo: str
    cipher_key: bytes
    mask_key: bytes
    signature: bytes
    certificate_pem: bytes


@dataclass(frozen=True)
class KeyBundle:
    """All participants' adverts for one round attempt."""

    envelope: Envelope
    keys: tuple[SignedKey, ...]


@dataclass(frozen=True)
class MetricsReport:
    """Metrics a silo chose to report for a round."""

    envelope: Envelope
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SealedShares:
    """Encrypted Shamir shares: uploaded by their sender, fetched by their receiver."""

    envelope: Envelope
    shares: tuple[EncryptedShare, ...]


@dataclass(frozen=True)
class SignedSurvivors:
    """A silo's signature over the survivor list of its instruction."""

    envelope: Envelope
    signature: bytes


@dataclass(frozen=True)
class UnmaskInstruction:
    """What the coordinator asks a silo to reveal, in its envelope."""

    envelope: Envelope
    request: UnmaskRequest


@dataclass(frozen=True)
class RevealedShares:
    """The shares a silo reveals in the unmask stage."""

    envelope: Envelope
    shares: tuple[RevealedShare, ...]
