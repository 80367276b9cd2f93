"""Round logic of each algorithm: plain functions of the round state, no I/O (STYLE.md 1).

With secure aggregation the coordinator sees only the train-size-weighted mean of the shared
vectors; a strategy turns that mean into the next global shared state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AggregateResult:
    """What secure aggregation revealed for one round."""

    round: int
    participants: tuple[str, ...]
    mean: np.ndarray        # weighted mean of the shared vectors (float64)
    total_weight: int       # sum of the participants' sample counts


class Strategy:
    """Base: an algorithm's server-side step."""

    name = "base"
    aggregates = True

    def next_global(self, result: AggregateResult) -> np.ndarray | None:
        """The global shared state silos load after this round (None: nothing to load)."""
        raise NotImplementedError


class LocalStrategy(Strategy):
    """Self-training: silos train alone; rounds only pace them and collect their metrics."""

    name = "local"
    aggregates = False

    def next_global(self, result: AggregateResult) -> np.ndarray | None:
        """Nothing is shared."""
        return None


class WeightedAverageStrategy(Strategy):
    """FedAvg / FedProx / FedStar: the shared groups become the weighted mean (FedStar Eq. 9)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def next_global(self, result: AggregateResult) -> np.ndarray | None:
        """Weighted mean, cast to the float32 the models use."""
        return result.mean.astype(np.float32)


def make_strategy(algorithm: str) -> Strategy:
    """The strategy for a plan's algorithm name."""
    if algorithm == "local":
        return LocalStrategy()
    if algorithm in ("fedavg", "fedprox", "fedstar", "feddense"):
        return WeightedAverageStrategy(algorithm)
    raise ValueError(f"no strategy for algorithm {algorithm!r}")
