"""Several independent secure aggregations in one round: one per GCFL cluster.

Masks are agreed only among the members of one group, and each group's aggregate is unmasked on
its own, so the coordinator learns one sum per cluster and nothing across clusters. The groups
move through the stages in lockstep; the round machine talks to this object exactly as to one
``SecAggServer``, and every per-silo call is routed to the silo's group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trellis.crypto.errors import ProtocolError
from trellis.crypto.keyagreement import RoundContext
from trellis.crypto.secagg import RelayedAdvert, SecAggConfig, TooFewSurvivors
from trellis.crypto.secagg_server import SecAggServer, ServerStage


class SecAggGroups:
    """Per-group SecAggServers behind the single-server interface the round machine uses."""

    def __init__(self, context: RoundContext, configs: Sequence[SecAggConfig],
                 groups: Sequence[tuple[str, ...]], length: int | None,
                 dtype: type[np.unsignedinteger[Any]]) -> None:
        if len(configs) != len(groups) or not groups:
            raise ValueError("one secure-aggregation configuration per non-empty group")
        self.groups = [tuple(sorted(g)) for g in groups]
        self.servers = [SecAggServer(context, c, g, length, dtype)
                        for c, g in zip(configs, self.groups, strict=True)]
        self._of = {silo: i for i, g in enumerate(self.groups) for silo in g}
        if len(self._of) != sum(len(g) for g in self.groups):
            raise ValueError("a silo may belong to one aggregation group only")

    def server_of(self, silo: str) -> SecAggServer:
        """The aggregation the silo belongs to."""
        try:
            return self.servers[self._of[silo]]
        except KeyError:
            raise ProtocolError(f"{silo} belongs to no aggregation group") from None

    # -- the SecAggServer interface, fanned out -------------------------------------------------
    @property
    def stage(self) -> ServerStage:
        """The common stage."""
        return self.servers[0].stage

    @property
    def length(self) -> int | None:
        """Vector length (with the weight) shared by every group."""
        return self.servers[0].length

    @length.setter
    def length(self, value: int) -> None:
        for server in self.servers:
            server.length = value

    @property
    def dropped(self) -> set[str]:
        """Silos dropped in any group."""
        return set().union(*(s.dropped for s in self.servers))

    @property
    def survivors(self) -> tuple[str, ...]:
        """Silos whose masked input counts, over all groups."""
        return tuple(sorted(x for s in self.servers for x in s.survivors))

    @property
    def reveals(self) -> dict[str, Any]:
        """Revealed shares received, over all groups."""
        return {k: v for s in self.servers for k, v in s.reveals.items()}

    def expected(self) -> tuple[str, ...]:
        """Silos the current stage expects."""
        return tuple(sorted(x for s in self.servers for x in s.expected()))

    def answered(self) -> set[str]:
        """Silos that answered the current stage."""
        return set().union(*(s.answered() for s in self.servers))

    def waiting_for(self) -> set[str]:
        """Silos the current stage still waits for."""
        return set().union(*(s.waiting_for() for s in self.servers))

    def stage_complete(self) -> bool:
        """Every group can close its stage."""
        return all(s.stage_complete() for s in self.servers)

    def hopeless(self) -> TooFewSurvivors | None:
        """The first group that can no longer reach its threshold."""
        return next((h for h in (s.hopeless() for s in self.servers) if h is not None), None)

    def drop(self, silo: str) -> None:
        """A silo vanished."""
        self.server_of(silo).drop(silo)

    def close_stage(self) -> ServerStage:
        """Close the stage in every group (they stay in lockstep)."""
        stages = {s.close_stage() for s in self.servers}
        if len(stages) != 1:
            raise ProtocolError("aggregation groups left lockstep: " + ", ".join(
                sorted(x.value for x in stages)))
        return stages.pop()

    def relayed_adverts(self, silo: str) -> list[RelayedAdvert]:
        """The adverts of the silo's own group."""
        return self.server_of(silo).relayed_adverts()

    def unmask(self) -> dict[tuple[str, ...], np.ndarray]:
        """Each group's aggregate, keyed by the group's members."""
        return {g: s.unmask() for g, s in zip(self.groups, self.servers, strict=True)}
