"""Errors the round logic raises for messages that do not fit; the gRPC edge maps their kind."""

from __future__ import annotations


class RoundError(Exception):
    """A message refused by the round logic; `kind` selects the status code at the edge."""

    kind = "invalid"


class OutOfPhase(RoundError):
    """The message belongs to another round, attempt or phase than the coordinator's."""

    kind = "out_of_phase"


class Duplicate(RoundError):
    """The message was already received (a replay)."""

    kind = "duplicate"


class NotParticipant(RoundError):
    """The sender does not take part in this round attempt."""

    kind = "not_participant"


class InvalidPayload(RoundError):
    """The message is well placed but its content is wrong (shape, dtype, values)."""

    kind = "invalid"
