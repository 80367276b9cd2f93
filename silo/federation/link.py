"""What a silo's driver needs from the coordinator, independent of the transport.

Two links implement it: the gRPC link of ``silo join`` (silo/federation/grpc_link.py) and the
in-process link of ``coordinator simulate`` (coordinator/simulation/sequential.py), so a simulated
silo runs the same driver, line for line, as a deployed one (DESIGN.md §3). Every call carries the
envelope of the attempt it belongs to; a coordinator that has moved on answers with
``RoundMovedOn``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from trellis.protos.messages import (
    Envelope,
    KeyAdvertisement,
    KeyBundle,
    MetricsReport,
    RevealedShares,
    SealedShares,
    SignedSurvivors,
    UnmaskInstruction,
)


class RoundMovedOn(Exception):
    """The coordinator refused a call because the attempt it belongs to is over (aborted,
    re-opened, or the silo was left out of it); the silo drops the attempt and follows the next
    instruction. Also raised for a message the coordinator already has."""


class CoordinatorLink(Protocol):
    """The calls a silo makes during a federation, in the order of DESIGN.md §4."""

    # -- a round: state, secure aggregation (Bonawitz et al. 2017), metrics -------------------
    def fetch_state(self, env: Envelope) -> np.ndarray | None:
        """The shared state to load for this round (None: keep the current values)."""

    def fetch_pool(self, env: Envelope) -> list[bytes]:
        """FedHGN: the other silos' sealed coefficient envelopes, shuffled."""

    def advertise(self, advert: KeyAdvertisement) -> None:
        """Send this attempt's signed public keys."""

    def fetch_keys(self, env: Envelope) -> KeyBundle:
        """The adverts of every silo of the attempt."""

    def upload_shares(self, sealed: SealedShares) -> None:
        """Send the sealed Shamir shares of this silo's secrets, one per holder."""

    def fetch_shares(self, env: Envelope) -> SealedShares:
        """The sealed shares other silos addressed to this one."""

    def upload_envelope(self, env: Envelope, envelope: bytes) -> None:
        """FedHGN: send this attempt's sealed coefficient envelope (before the masked input)."""

    def upload_masked(self, env: Envelope, masked: np.ndarray,
                      statistics: Mapping[str, float]) -> None:
        """Send the masked input (and GCFL's plain update norms)."""

    def sign_survivors(self, signed: SignedSurvivors) -> None:
        """Send the signature over the survivor list."""

    def fetch_unmask(self, env: Envelope) -> UnmaskInstruction:
        """What this silo must reveal, with the survivors' signatures."""

    def reveal(self, revealed: RevealedShares) -> None:
        """Send the revealed shares."""

    def report(self, report: MetricsReport) -> bool:
        """Send a completed round's metrics; False if the coordinator already has them."""

    # -- silo group key (before round 1) and GCFL's split under CKKS --------------------------
    def setup_advert(self, env: Envelope, advert: bytes) -> None:
        """Send this silo's signed setup key."""

    def setup_bundle(self, env: Envelope) -> dict[str, tuple[bytes, bytes]]:
        """Leader: every silo's setup advert with its certificate."""

    def upload_group_seal(self, env: Envelope, boxes: Mapping[str, bytes],
                          public_context: bytes) -> None:
        """Leader: the group secrets sealed for each peer, and the CKKS public context."""

    def fetch_group_box(self, env: Envelope) -> tuple[bytes, bytes, bytes]:
        """Member: its sealed box, the leader's advert and the leader's certificate."""

    def confirm_group_open(self, env: Envelope) -> None:
        """Member: the box is open."""

    def upload_encrypted_update(self, env: Envelope, ciphertexts: Sequence[bytes]) -> None:
        """GCFL: this round's normalised update under the group's CKKS key."""

    def fetch_blinded(self, env: Envelope) -> dict[tuple[str, str], bytes]:
        """GCFL: the blinded inner products this silo must decrypt."""

    def upload_similarities(self, env: Envelope,
                            values: Mapping[tuple[str, str], float]) -> None:
        """GCFL: the decrypted blinded values."""
