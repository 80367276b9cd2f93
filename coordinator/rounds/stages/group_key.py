"""The silo group key, relayed blind (crypto/groupkey.py), before the first round.

SETUP_ADVERTISE: every silo sends a signed setup key. SETUP_SEAL: the leader (the lowest-ranked
silo) fetches them with the silos' certificates and seals the group secrets for each peer, and
for GCFL the CKKS public context (evaluation keys, never the secret key). SETUP_OPEN: every peer
fetches its box and says it opened it; then the first round opens. The coordinator only relays
opaque bytes: it can neither read the group key nor substitute a setup key, since each is signed
with the key of its silo's certificate. A silent silo fails the federation at the deadline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trellis.coordinator.rounds.errors import Duplicate, InvalidPayload, NotParticipant, OutOfPhase
from trellis.coordinator.rounds.stages.base import Event, Position, Stage, Step, check_envelope
from trellis.crypto import ckks
from trellis.crypto.errors import ProtocolError
from trellis.crypto.groupkey import SETUP_ROUND, leader_of
from trellis.protos.messages import Envelope, Instruction, Phase

# What the coordinator tells the silos each setup stage waits for (and the phase they answer).
INSTRUCTS = {Stage.SETUP_ADVERTISE: Phase.GROUP_SETUP, Stage.SETUP_SEAL: Phase.GROUP_SEAL,
             Stage.SETUP_OPEN: Phase.GROUP_OPEN}
SETUP_STAGES = tuple(INSTRUCTS)


def check_setup_envelope(at: Position, env: Envelope, stage: Stage, generation: int) -> None:
    """A setup message must match the stage and carry this setup run's number."""
    check_envelope(at, env, stage, INSTRUCTS[stage], same_round=False)
    if (env.round, env.attempt) != (SETUP_ROUND, generation):
        raise OutOfPhase(f"{env.describe()} is not from group-key setup run {generation}")


@dataclass
class GroupSetup:
    """The relayed, opaque material of the silo group key (crypto/groupkey.py)."""

    silos: tuple[str, ...]
    leader: str
    adverts: dict[str, bytes] = field(default_factory=dict)
    boxes: dict[str, bytes] = field(default_factory=dict)
    opened: set[str] = field(default_factory=set)
    public_context: bytes = b""      # CKKS evaluation keys, never the secret key

    @classmethod
    def among(cls, silos: Iterable[str]) -> GroupSetup:
        """A new setup run among these silos, led by the lowest-ranked one."""
        ranked = tuple(sorted(silos))
        return cls(ranked, leader_of(ranked))

    @property
    def complete(self) -> bool:
        """Every silo holds the group secrets."""
        return self.opened == set(self.silos)

    def started(self, generation: int) -> Event:
        """The event of this run's start."""
        return Event("group_setup_started", {"silos": list(self.silos), "leader": self.leader,
                                             "generation": generation})

    def waiting_for(self, stage: Stage) -> set[str]:
        """Silos the setup stage still waits for."""
        if stage is Stage.SETUP_ADVERTISE:
            return set(self.silos) - set(self.adverts)
        if stage is Stage.SETUP_SEAL:
            return {self.leader}
        if stage is Stage.SETUP_OPEN:
            return set(self.silos) - self.opened
        return set()

    def instruction(self, federation: str, generation: int, stage: Stage,
                    total_rounds: int) -> Instruction:
        """What a silo the setup stage waits for should do."""
        env = Envelope(federation, SETUP_ROUND, generation, INSTRUCTS[stage])
        return Instruction(env, self.silos, total_rounds=total_rounds)

    # -- inputs -------------------------------------------------------------------------------
    def add_advert(self, silo: str, advert: bytes) -> Step:
        """A silo's signed setup key, relayed to the leader unread."""
        self._member(silo)
        if silo in self.adverts:
            raise Duplicate(f"{silo} already sent its setup key")
        if not advert:
            raise InvalidPayload(f"{silo} sent an empty setup key")
        self.adverts[silo] = advert
        events = [Event("setup_key", {"silo": silo})]
        if set(self.adverts) == set(self.silos):
            return _next(events, Stage.SETUP_SEAL)
        return Step(events)

    def bundle(self, silo: str, certificates: Mapping[str, bytes]
               ) -> dict[str, tuple[bytes, bytes]]:
        """For the leader: every silo's setup advert with its certificate."""
        self._leader(silo)
        return {s: (a, certificates.get(s, b"")) for s, a in self.adverts.items()}

    def seal(self, silo: str, boxes: Mapping[str, bytes], public_context: bytes, *,
             needs_ckks: bool) -> Step:
        """The leader's sealed boxes (one per peer) and the CKKS public context."""
        self._leader(silo)
        peers = set(self.silos) - {silo}
        if set(boxes) != peers:
            raise InvalidPayload(f"the leader must seal one box for each of {sorted(peers)}; "
                                 f"got {sorted(boxes)}")
        if needs_ckks:
            try:
                ckks.check_public_context(public_context)
            except ProtocolError as exc:
                raise InvalidPayload(f"CKKS context from {silo} refused: {exc}") from None
        self.boxes, self.public_context = dict(boxes), public_context
        self.opened.add(silo)
        return _next([Event("group_sealed", {"leader": silo, "boxes": len(boxes),
                                             "context_bytes": len(public_context)})],
                     Stage.SETUP_OPEN)

    def box(self, silo: str, certificates: Mapping[str, bytes]) -> tuple[bytes, bytes, bytes]:
        """For a peer: its sealed box, the leader's advert and the leader's certificate."""
        self._member(silo)
        if silo not in self.boxes:
            raise NotParticipant(f"no sealed group secrets for {silo}")
        return (self.boxes[silo], self.adverts[self.leader],
                certificates.get(self.leader, b""))

    def open(self, silo: str) -> Step:
        """A peer opened its box; once all have, the setup is over."""
        self._member(silo)
        if silo in self.opened:
            raise Duplicate(f"{silo} already opened its group secrets")
        self.opened.add(silo)
        events = [Event("group_opened", {"silo": silo})]
        if not self.complete:
            return Step(events)
        return Step(events + [Event("group_ready", {"silos": list(self.silos)})], finished=True)

    # -- restarts -----------------------------------------------------------------------------
    def durable_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """What a restarted coordinator needs of a complete setup (members, leader, context)."""
        return ({"silos": list(self.silos), "leader": self.leader},
                {"public_context": np.frombuffer(self.public_context, np.uint8)})

    @classmethod
    def restore(cls, doc: Mapping[str, Any], public_context: np.ndarray) -> GroupSetup:
        """Take back `durable_state`: a complete setup, every box already opened."""
        silos = tuple(str(s) for s in doc["silos"])
        return cls(silos, str(doc["leader"]), opened=set(silos),
                   public_context=public_context.tobytes())

    def _member(self, silo: str) -> None:
        if silo not in self.silos:
            raise NotParticipant(f"{silo} is not part of the group-key setup")

    def _leader(self, silo: str) -> None:
        self._member(silo)
        if silo != self.leader:
            raise NotParticipant(f"{silo} is not the group-key leader ({self.leader})")


def _next(events: list[Event], stage: Stage) -> Step:
    """The setup moves on to `stage` (its event names the stage entered, round 0)."""
    return Step(events + [Event("stage_closed", {"round": 0, "stage": stage.value})], enter=stage)
