"""Which certificate holds each connected silo's name: one live connection per name.

Two certificates for one name come only from a CA that issued both (`coordinator pki sign`
refuses a second unless renewing, which revokes the first). The coordinator still never lets a
second holder push the connected silo out of its rounds, nor speak for it while it is connected;
the same certificate reconnecting (a restarted silo) takes its stream over as before.
"""

from __future__ import annotations

NAME_IN_USE = "another certificate is connected under this name"


class NameInUse(Exception):
    """A caller's certificate names a silo whose open stream holds a different certificate."""

    def __init__(self, silo: str, holder: str) -> None:
        super().__init__(
            f"{silo!r} is connected with another certificate ({holder[:19]}...); a second live "
            "connection under that name is refused (a re-keyed silo: the coordinator operator "
            "signs its request with `coordinator pki sign --renew`, which revokes the old one)")
        self.holder = holder


class Holders:
    """The certificate fingerprint of each silo whose control stream is open (not thread-safe:
    the core calls it under its lock)."""

    def __init__(self) -> None:
        self._by_silo: dict[str, str] = {}

    def other_than(self, silo: str, fingerprint: str) -> str | None:
        """The fingerprint holding silo's name if it is not this one; None if free or the same."""
        holder = self._by_silo.get(silo)
        return None if holder is None or holder == fingerprint else holder

    def hold(self, silo: str, fingerprint: str) -> None:
        """silo's stream is open with this certificate."""
        self._by_silo[silo] = fingerprint

    def release(self, silo: str) -> None:
        """silo's stream is closed."""
        self._by_silo.pop(silo, None)
