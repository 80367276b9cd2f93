"""Who masks and shares with whom: the full graph (Bonawitz et al. 2017) or a SecAgg+ graph.

SecAgg+ (Bell et al., CCS 2020, §3) replaces the complete graph by a random k-regular graph:
a Harary graph H(k, n) -- each node joined to the k/2 nodes on either side of it on a ring --
whose nodes are relabelled by a random permutation. The permutation comes from a public seed
bound to the round context, so every silo and the coordinator derive the same graph and nobody
chooses it; it only has to be unpredictable before the silos' keys are fixed, not secret.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from trellis.crypto.errors import ProtocolError

Graph = dict[str, frozenset[str]]


def neighbour_graph(roster: Sequence[str], neighbours: int, seed: int, label: bytes) -> Graph:
    """Each silo's neighbours: everyone when neighbours is 0 or covers the roster, else H(k, n)."""
    names = tuple(roster)
    if len(set(names)) != len(names) or list(names) != sorted(names):
        raise ProtocolError("the roster must be sorted and free of duplicates")
    n = len(names)
    if neighbours == 0 or neighbours >= n - 1:
        return {name: frozenset(names) - {name} for name in names}
    if neighbours < 2 or neighbours % 2:
        raise ProtocolError(f"a SecAgg+ graph needs an even neighbour count >= 2, "
                            f"got {neighbours}")
    digest = hashlib.sha256(label + b"|graph|" + str(seed).encode() + b"|"
                            + "\n".join(names).encode()).digest()
    order = np.random.default_rng(int.from_bytes(digest[:16], "little")).permutation(n)
    position = {names[int(i)]: p for p, i in enumerate(order)}
    at = {p: name for name, p in position.items()}
    half = neighbours // 2
    return {name: frozenset(at[(position[name] + step) % n]
                            for step in range(-half, half + 1) if step != 0)
            for name in names}


def share_holders(graph: Graph, silo: str) -> tuple[str, ...]:
    """The silos that hold shares of this silo's secrets: itself and its neighbours, sorted."""
    return tuple(sorted(graph[silo] | {silo}))
