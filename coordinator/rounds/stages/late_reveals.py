"""Share reveals that come after their attempt was unmasked: late, answered, not refused.

Unmasking closes as soon as every secret has a threshold of shares (stages/secure_aggregation.py),
so the slowest survivors' reveals, and even their requests for what to reveal, routinely arrive
after the round has moved on: part of a healthy run, not a protocol violation. The machine keeps
what those survivors were asked (a few names and signatures, never the masked inputs), answers
them, and records each reveal as late (a ``late_reveal`` event: audit record and metric, no
refusal). Their shares are checked and dropped: they are shares of the survivors' seeds and the
dropped silos' keys of that attempt, which the coordinator has already reconstructed, so they
tell it nothing new.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trellis.coordinator.rounds.errors import Duplicate, InvalidPayload
from trellis.coordinator.rounds.stages.base import Event
from trellis.crypto.keyagreement import RoundContext
from trellis.crypto.secagg import RevealedShare, ShareKind, UnmaskRequest
from trellis.protos.messages import Envelope, Phase, UnmaskInstruction


@dataclass
class UnmaskedAttempt:
    """An unmasked attempt's survivors whose share reveals had not arrived when it closed."""

    context: RoundContext
    requests: dict[str, UnmaskRequest]        # what each of them was asked to reveal
    revealed: set[str] = field(default_factory=set)

    def expects(self, silo: str, env: Envelope) -> bool:
        """Whether this message is one of those survivors' unmask-stage calls for it."""
        c = self.context
        return (silo in self.requests and (env.federation, env.round, env.attempt) == (
            c.federation, c.round, c.attempt))

    def unmask_request(self, silo: str) -> UnmaskInstruction:
        """What the silo was asked to reveal, as the stage would have told it in time."""
        c = self.context
        return UnmaskInstruction(Envelope(c.federation, c.round, c.attempt, Phase.UNMASK),
                                 self.requests[silo])

    def reveal(self, silo: str, shares: tuple[RevealedShare, ...]) -> list[Event]:
        """Accept a late reveal: exactly what was asked, once; recorded, then dropped."""
        if silo in self.revealed:
            raise Duplicate(f"{silo} already revealed its shares of round "
                            f"{self.context.round} attempt {self.context.attempt}")
        request = self.requests[silo]
        asked = {(o, ShareKind.MASK_SEED) for o in request.seed_shares_of} | {
            (o, ShareKind.MASK_KEY) for o in request.key_shares_of}
        got = {(r.owner, r.kind) for r in shares}
        if len(got) != len(shares) or got != asked:
            raise InvalidPayload(f"{silo} revealed other shares than it was asked for")
        self.revealed.add(silo)
        return [Event("late_reveal", {"silo": silo, "round": self.context.round,
                                      "attempt": self.context.attempt, "count": len(shares)})]
