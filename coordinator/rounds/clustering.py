"""GCFL / GCFL+ client clustering (Xie et al., NeurIPS 2021): min cuts, DTW and the split rule.

Pure numpy stand-ins for the reference code's networkx.stoer_wagner and
dtaidistance.dtw, the rule deciding when a cluster splits, and the cluster bookkeeping the
coordinator checkpoints. No I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trellis.protos.algorithms import MIN_SPLIT_ROUND, MIN_SPLIT_SIZE

# Cosine similarity + 1 can come out a few ulps below zero; anything closer to zero than this
# is rounding noise, not a negative weight.
_NEGATIVE_TOLERANCE = 1e-12

# --- Stoer-Wagner minimum cut ---------------------------------------------------------------


def _validated_weights(weights: np.ndarray) -> np.ndarray:
    """A float64 symmetric copy of `weights` with a zero diagonal, or ValueError."""
    w = np.array(weights, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise ValueError(f"weights must be a square matrix, got shape {w.shape}")
    n = w.shape[0]
    if n < 2:
        raise ValueError(f"weights must describe at least 2 vertices, got {n}")
    if not np.all(np.isfinite(w)):
        raise ValueError("weights must be finite")
    if not np.allclose(w, w.T):
        raise ValueError("weights must be symmetric")
    np.fill_diagonal(w, 0.0)  # self loops never cross a cut
    if np.any(w < -_NEGATIVE_TOLERANCE):
        raise ValueError(f"weights must be non-negative, minimum is {w.min():g}")
    w = np.clip((w + w.T) / 2.0, 0.0, None)
    return w


def _maximum_adjacency_order(w: np.ndarray, active: np.ndarray) -> tuple[int, int]:
    """The last two vertices (s, t) of one maximum adjacency ordering of the active vertices."""
    start = int(np.flatnonzero(active)[0])
    taken = ~active
    taken[start] = True
    connection = w[start].copy()
    s, t = start, start
    for _ in range(int(active.sum()) - 1):
        # argmax takes the lowest index among ties, which makes the result deterministic
        t, s = int(np.argmax(np.where(taken, -np.inf, connection))), t
        taken[t] = True
        connection += w[t]
    return s, t


def stoer_wagner(weights: np.ndarray) -> tuple[float, tuple[int, ...], tuple[int, ...]]:
    """Global minimum cut (value, side with vertex 0, other side) of a weighted complete graph."""
    original = _validated_weights(weights)
    n = original.shape[0]
    w = original.copy()
    active = np.ones(n, dtype=bool)
    members: list[list[int]] = [[i] for i in range(n)]
    best_value, best_side = math.inf, members[0]
    for _ in range(n - 1):
        s, t = _maximum_adjacency_order(w, active)
        cut_of_phase = float(w[t, active].sum())
        if cut_of_phase < best_value:
            best_value, best_side = cut_of_phase, list(members[t])
        w[s] += w[t]
        w[:, s] += w[:, t]
        w[s, s] = 0.0
        active[t] = False
        members[s].extend(members[t])
    in_side = np.zeros(n, dtype=bool)
    in_side[best_side] = True
    if not in_side[0]:
        in_side = ~in_side
    side_a, side_b = np.flatnonzero(in_side), np.flatnonzero(~in_side)
    # recomputed on the original weights: exact for the returned sides, free of merge round-off
    value = float(original[np.ix_(side_a, side_b)].sum())
    return value, tuple(int(i) for i in side_a), tuple(int(i) for i in side_b)


# --- Dynamic time warping -------------------------------------------------------------------


def _sequence(values: np.ndarray | Sequence[float], name: str) -> np.ndarray:
    """`values` as a non-empty finite 1-D float64 array, or ValueError."""
    seq = np.asarray(values, dtype=np.float64)
    if seq.ndim != 1 or seq.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {seq.shape}")
    if not np.all(np.isfinite(seq)):
        raise ValueError(f"{name} must be finite")
    return seq


def dtw_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Windowless DTW distance as dtaidistance.dtw.distance: sqrt of summed squared differences."""
    x, y = _sequence(a, "a").tolist(), _sequence(b, "b").tolist()
    # row -1 of the accumulated cost, padded by a column -1: only cell (0, 0) starts a path
    previous = [0.0] + [math.inf] * len(y)
    for xi in x:
        current = [math.inf] * (len(y) + 1)
        for j, yj in enumerate(y, start=1):
            best = min(previous[j], current[j - 1], previous[j - 1])
            current[j] = (xi - yj) ** 2 + best
        previous = current
    return math.sqrt(previous[-1])


def dtw_matrix(sequences: Sequence[np.ndarray]) -> np.ndarray:
    """Symmetric pairwise DTW distances with a zero diagonal (dtaidistance.dtw.distance_matrix)."""
    n = len(sequences)
    distances = np.zeros((n, n), dtype=np.float64)
    for i in range(n):
        for j in range(i + 1, n):
            distances[i, j] = distances[j, i] = dtw_distance(sequences[i], sequences[j])
    return distances


def _scaled_by_std(values: np.ndarray) -> np.ndarray:
    """`values` divided by their population std when that is positive."""
    std = float(values.std())
    return values / std if std > 0 else values


def standardize(seq: np.ndarray) -> np.ndarray:
    """`seq` divided by its population std when that is positive, not centred (GCFL Eq. 20)."""
    return _scaled_by_std(_sequence(seq, "seq"))


# --- Split rule ------------------------------------------------------------------------------


def split_reasons(
    mean_norm: float, max_norm: float, size: int, round: int, eps1: float, eps2: float
) -> list[str]:
    """The GCFL split conditions a cluster does not meet (empty: the cluster splits)."""
    if not (math.isfinite(mean_norm) and math.isfinite(max_norm)):
        raise ValueError(f"update norms must be finite, got mean {mean_norm}, max {max_norm}")
    reasons = []
    if not mean_norm < eps1:
        reasons.append(f"mean update norm {mean_norm:.4g} >= eps1 {eps1:.4g}")
    if not max_norm > eps2:
        reasons.append(f"max update norm {max_norm:.4g} <= eps2 {eps2:.4g}")
    if size < MIN_SPLIT_SIZE:
        reasons.append(f"cluster size {size} < {MIN_SPLIT_SIZE}")
    if round < MIN_SPLIT_ROUND:
        reasons.append(f"round {round} < {MIN_SPLIT_ROUND}")
    return reasons


def split_due(
    mean_norm: float, max_norm: float, size: int, round: int, eps1: float, eps2: float
) -> bool:
    """Whether GCFL splits the cluster this round (all four conditions met)."""
    return not split_reasons(mean_norm, max_norm, size, round, eps1, eps2)


# --- Cluster bookkeeping ----------------------------------------------------------------------


def _check_partition(clusters: Sequence[tuple[str, ...]]) -> None:
    """ValueError unless the clusters are non-empty, sorted and pairwise disjoint."""
    seen: set[str] = set()
    for index, cluster in enumerate(clusters):
        if not cluster:
            raise ValueError(f"cluster {index} is empty")
        if list(cluster) != sorted(set(cluster)):
            raise ValueError(f"cluster {index} must be sorted without duplicates: {cluster}")
        shared = seen.intersection(cluster)
        if shared:
            raise ValueError(f"silos in more than one cluster: {sorted(shared)}")
        seen.update(cluster)


@dataclass
class ClusterState:
    """GCFL cluster assignment and GCFL+ update-norm sequences; list order = creation order."""

    clusters: list[tuple[str, ...]]
    sequences: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_partition(self.clusters)

    def cluster_of(self, silo: str) -> int:
        """Index of the cluster holding `silo`."""
        for index, cluster in enumerate(self.clusters):
            if silo in cluster:
                return index
        raise ValueError(f"silo {silo!r} is in no cluster")

    def split(self, index: int, side_a: tuple[str, ...], side_b: tuple[str, ...]) -> None:
        """Replace cluster `index` by `side_a` in place and append `side_b` as a new cluster."""
        if not 0 <= index < len(self.clusters):
            raise ValueError(f"no cluster {index}; there are {len(self.clusters)}")
        a, b, cluster = set(side_a), set(side_b), set(self.clusters[index])
        if not a or not b:
            raise ValueError("both sides of a split must be non-empty")
        if a & b:
            raise ValueError(f"split sides overlap: {sorted(a & b)}")
        if a | b != cluster or len(side_a) + len(side_b) != len(cluster):
            raise ValueError(f"split sides {side_a} / {side_b} do not partition cluster {index}")
        self.clusters[index] = tuple(sorted(a))
        self.clusters.append(tuple(sorted(b)))

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict for checkpoints."""
        return {
            "clusters": [list(cluster) for cluster in self.clusters],
            "sequences": {silo: list(seq) for silo, seq in self.sequences.items()},
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ClusterState:
        """The state `to_json` wrote."""
        try:
            clusters = [tuple(str(silo) for silo in cluster) for cluster in d["clusters"]]
            sequences = {
                str(silo): [float(v) for v in seq] for silo, seq in d.get("sequences", {}).items()
            }
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed cluster state: {exc!r}") from exc
        return cls(clusters=clusters, sequences=sequences)


# --- Cuts on silo names -----------------------------------------------------------------------


def _check_members(members: Sequence[str]) -> None:
    """ValueError unless there are at least two distinct members."""
    if len(members) < 2:
        raise ValueError(f"a split needs at least 2 members, got {len(members)}")
    if len(set(members)) != len(members):
        raise ValueError(f"members must be distinct: {list(members)}")


def _named_cut(
    members: Sequence[str], weights: np.ndarray
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The min cut of `weights` as sorted member names, the side with the smallest name first."""
    _, side_a, side_b = stoer_wagner(weights)
    named_a = tuple(sorted(members[i] for i in side_a))
    named_b = tuple(sorted(members[i] for i in side_b))
    # ordered by name, so the result does not depend on the order the caller lists members in
    return (named_a, named_b) if named_a[0] < named_b[0] else (named_b, named_a)


def similarity_split(
    members: Sequence[str], similarity: np.ndarray
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """GCFL: min cut of the members' similarity graph (the caller passes cosine + 1)."""
    _check_members(members)
    if np.shape(similarity) != (len(members), len(members)):
        raise ValueError(
            f"similarity must be {len(members)}x{len(members)}, got {np.shape(similarity)}"
        )
    return _named_cut(members, similarity)


def sequence_split(
    members: Sequence[str],
    sequences: Mapping[str, Sequence[float]],
    seq_length: int,
    standardize: bool = False,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """GCFL+: min cut with weights max(D) - D over DTW distances D of recent update norms."""
    _check_members(members)
    if seq_length < 1:
        raise ValueError(f"seq_length must be positive, got {seq_length}")
    missing = [silo for silo in members if silo not in sequences]
    if missing:
        raise ValueError(f"no update-norm sequence for {missing}")
    recent = [
        _sequence(list(sequences[silo])[-seq_length:], f"update-norm sequence of {silo!r}")
        for silo in members
    ]
    if standardize:
        recent = [_scaled_by_std(seq) for seq in recent]
    distances = dtw_matrix(recent)
    return _named_cut(members, distances.max() - distances)
