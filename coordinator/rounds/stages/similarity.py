"""GCFL's cluster split under CKKS: the pairwise cosine similarity without the updates.

When the split test (coordinator/rounds/strategies.py) says a cluster must be cut, the round is
recorded but not over. SIMILARITY: each member of the clusters being split sends its normalised
update encrypted under the silo group's CKKS key; the coordinator computes every pairwise inner
product under encryption with the public context and blinds each with a random offset.
DECRYPT: one silo (the lowest-ranked present) decrypts the blinded values; the coordinator
unblinds them into each cluster's similarity matrix and the strategy cuts the cluster. So the
coordinator learns the matrix (a documented leak, DESIGN.md §2) and no silo learns anything.
A silent silo or a refused computation skips the split; the round completes either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from trellis.coordinator.rounds.errors import Duplicate, InvalidPayload, NotParticipant
from trellis.coordinator.rounds.stages.base import Event, Position, Stage, Step, check_envelope
from trellis.coordinator.rounds.strategies import ClusteredStrategy
from trellis.crypto import ckks
from trellis.crypto.errors import ProtocolError
from trellis.crypto.groupkey import leader_of
from trellis.protos.messages import Envelope, Instruction, Phase

# What the coordinator tells the silos each similarity stage waits for.
INSTRUCTS = {Stage.SIMILARITY: Phase.ENCRYPT_UPDATE, Stage.DECRYPT: Phase.DECRYPT_SIMILARITY}
CLUSTERING_STAGES = tuple(INSTRUCTS)


def check_similarity_envelope(at: Position, env: Envelope, stage: Stage) -> None:
    """A similarity message must match the stage and the round."""
    check_envelope(at, env, stage, INSTRUCTS[stage], same_round=True)


def cluster_events(round: int, clusters: ClusteredStrategy) -> list[Event]:
    """The strategy's split events since the last call, for the audit trail and progress."""
    return [Event("clusters", {"round": round, **e}) for e in clusters.drain_events()]


@dataclass
class SimilarityStep:
    """A GCFL split in progress: encrypted updates in, blinded inner products out."""

    clusters: list[tuple[str, ...]]
    ciphertexts: dict[str, list[bytes]] = field(default_factory=dict)
    blinded: dict[tuple[str, str], bytes] = field(default_factory=dict)
    offsets: dict[tuple[str, str], float] = field(default_factory=dict)
    decryptor: str = ""

    @classmethod
    def among(cls, clusters: Sequence[tuple[str, ...]], present: Iterable[str]
              ) -> SimilarityStep | None:
        """The split of these clusters among the present silos (None: no cluster of two)."""
        here = set(present)
        kept = [tuple(m for m in c if m in here) for c in clusters]
        step = cls([c for c in kept if len(c) >= 2])
        return step if step.clusters else None

    def members(self) -> set[str]:
        """Every silo asked for an encrypted update."""
        return {m for c in self.clusters for m in c}

    def requested(self, round: int) -> Event:
        """The event of the request for encrypted updates."""
        return Event("similarity_requested", {"round": round,
                                              "clusters": [list(c) for c in self.clusters]})

    def waiting_for(self, stage: Stage) -> set[str]:
        """Silos the similarity stage still waits for."""
        if stage is Stage.SIMILARITY:
            return self.members() - set(self.ciphertexts)
        if stage is Stage.DECRYPT:
            return {self.decryptor}
        return set()

    def instruction(self, at: Position, silo: str, group: tuple[str, ...],
                    total_rounds: int) -> Instruction:
        """What a silo the stage waits for should do: its cluster (or the silo group) listed."""
        listed = group
        if at.stage is Stage.SIMILARITY:
            listed = next(c for c in self.clusters if silo in c)
        return Instruction(at.envelope(INSTRUCTS[at.stage]), listed, total_rounds=total_rounds)

    # -- inputs -------------------------------------------------------------------------------
    def encrypted_update(self, round: int, silo: str, chunks: list[bytes],
                         public_context: bytes, present: Iterable[str]) -> Step:
        """A member's CKKS-encrypted normalised update (unreadable without the group key).

        The last one makes the blinded inner products and hands them to the decryptor.
        """
        if silo not in self.members():
            raise NotParticipant(f"{silo} is in no cluster being split")
        if silo in self.ciphertexts:
            raise Duplicate(f"{silo} already sent its encrypted update")
        if not chunks:
            raise InvalidPayload(f"{silo} sent an empty encrypted update")
        self.ciphertexts[silo] = list(chunks)
        events = [Event("encrypted_update", {"silo": silo, "round": round,
                                             "chunks": len(chunks)})]
        if not self.members() <= set(self.ciphertexts):
            return Step(events)
        return self._blind(round, events, public_context, present)

    def _blind(self, round: int, events: list[Event], public_context: bytes,
               present: Iterable[str]) -> Step:
        try:
            for cluster in self.clusters:
                blinded, offsets = ckks.blinded_inner_products(
                    public_context, {m: self.ciphertexts[m] for m in cluster})
                self.blinded.update(blinded)
                self.offsets.update(offsets)
        except ProtocolError as exc:
            return Step(events + [Event("split_skipped", {"round": round, "reason": str(exc)})],
                        finished=True)
        self.ciphertexts.clear()
        self.decryptor = leader_of(present)
        return Step(events + [Event("stage_closed", {"round": round,
                                                     "stage": Stage.SIMILARITY.value,
                                                     "decryptor": self.decryptor})],
                    enter=Stage.DECRYPT)

    def decrypt_request(self, silo: str) -> dict[tuple[str, str], bytes]:
        """For the decrypting silo: the blinded inner products."""
        self._decryptor(silo)
        return dict(self.blinded)

    def decrypted(self, round: int, silo: str, values: Mapping[tuple[str, str], float],
                  clusters: ClusteredStrategy) -> Step:
        """The decrypted blinded values: unblind, cut each cluster; the split is over."""
        self._decryptor(silo)
        if set(values) != set(self.offsets):
            raise InvalidPayload(f"expected {len(self.offsets)} decrypted values for the "
                                 f"requested pairs, got {len(values)}")
        try:
            for cluster in self.clusters:
                pairs = {p: v for p, v in values.items() if p[0] in cluster}
                matrix = ckks.similarity_matrix(list(cluster), pairs, self.offsets)
                clusters.apply_similarity(cluster, matrix)
        except (ProtocolError, ValueError) as exc:
            raise InvalidPayload(f"decrypted similarities refused: {exc}") from None
        return Step(cluster_events(round, clusters), finished=True)

    def _decryptor(self, silo: str) -> None:
        if silo != self.decryptor:
            raise NotParticipant(f"{silo} is not the decrypting silo ({self.decryptor})")
