"""Round logic of each algorithm: plain functions of the round state, no I/O (STYLE.md 1).

With secure aggregation the coordinator sees only the train-size-weighted mean of the shared
vectors; a strategy turns that mean into the next global shared state.

Over 400 lines because every algorithm's round logic sits side by side with make_strategy, the
one table that picks among them, so that the strategies' shared contract is read in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trellis.coordinator.rounds.clustering import (
    ClusterState,
    sequence_split,
    similarity_split,
    split_reasons,
)
from trellis.protos.algorithms import Algorithm, algorithm
from trellis.protos.metrics import (
    weighted_accuracy as weighted_accuracy,  # re-exported: FedHGN's tests import it from here
)
from trellis.protos.metrics import weighted_metric
from trellis.protos.plan import ClusteringConfig, HeteroConfig
from trellis.protos.privacy_plan import PrivacyConfig


@dataclass(frozen=True)
class AggregateResult:
    """What secure aggregation revealed for one round."""

    round: int
    participants: tuple[str, ...]
    mean: np.ndarray        # weighted mean of the shared vectors (float64)
    total_weight: int       # sum of the participants' sample counts
    plain_mean: np.ndarray | None = None   # unweighted mean (GCFL's split test), if uploaded
    # Differential privacy: the decoded sum of the survivors' noisy contributions (no weights,
    # no count: `mean` is then unused).
    noisy_sum: np.ndarray | None = None


def _row_trait(name: str, doc: str) -> Any:
    """A read-only attribute of a strategy that is its algorithm row's trait `name`."""
    return property(lambda self: getattr(self.algorithm, name), doc=doc)


class Strategy:
    """Base: an algorithm's server-side step. What the algorithm is (whether it clusters, needs
    a group key, stops early...) is its row of the algorithm table, never decided here."""

    def __init__(self, algorithm: Algorithm) -> None:
        self.algorithm = algorithm

    @property
    def name(self) -> str:
        """The algorithm's name."""
        return self.algorithm.name

    clustered = _row_trait("clustered", "One secure aggregation per cluster, per-silo state.")
    needs_group_key = _row_trait("needs_group_key", "A silo group key must exist before round 1.")
    needs_ckks = _row_trait("needs_ckks", "The group key carries a CKKS secret context.")
    stops_early = _row_trait("stops_early", "May end before the plan's last round.")
    exchanges_envelopes = _row_trait("exchanges_envelopes",
                                     "Silos swap sealed envelopes through the coordinator.")

    def clustering(self) -> ClusteredStrategy | None:
        """The cluster hooks the round machine calls, if this strategy clusters silos."""
        return None

    def groups(self, participants: Sequence[str]) -> list[tuple[str, ...]]:
        """The secure-aggregation groups of a round: everybody together."""
        return [tuple(sorted(participants))]

    def next_global(self, result: AggregateResult) -> np.ndarray | None:
        """The global shared state silos load after this round (None: nothing to load)."""
        raise NotImplementedError

    def should_stop(self, history: Sequence[Any]) -> bool:
        """Whether the federation ends before the plan's last round."""
        return False

    def durable_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """What a restarted coordinator needs of this strategy (JSON-ready part, arrays)."""
        return {}, {}

    def restore_durable_state(self, doc: Mapping[str, Any],
                              arrays: Mapping[str, np.ndarray]) -> None:
        """Take back what `durable_state` returned before a restart."""


class LocalStrategy(Strategy):
    """Self-training: silos train alone; rounds only pace them and collect their metrics."""

    def next_global(self, result: AggregateResult) -> np.ndarray | None:
        """Nothing is shared."""
        return None


class WeightedAverageStrategy(Strategy):
    """FedAvg / FedProx / FedStar: the shared groups become the weighted mean (FedStar Eq. 9)."""

    def next_global(self, result: AggregateResult) -> np.ndarray | None:
        """Weighted mean, cast to the float32 the models use."""
        return result.mean.astype(np.float32)


class ClusteredStrategy(Strategy):
    """GCFL / GCFL+ (docs/algorithms.md §3.3, §3.4) over cluster-wise secure aggregation.

    Silos upload their updates; each cluster's weighted mean update is added to the cluster's
    running sum, and silos load ``initial shared values + that sum``. A cluster of one keeps its
    own update (it uploads zeros, so nothing of it is revealed). Silos mask their update twice,
    weighted and unweighted, so the split test can use the reference code's unweighted mean
    (or, by plan, the paper's weighted one). One difference from the reference code, forced by
    secure aggregation: a split decided in round t takes effect in round t + 1 (the code
    re-aggregates the children at once).
    """

    def __init__(self, algorithm: Algorithm, config: ClusteringConfig,
                 silos: Sequence[str]) -> None:
        super().__init__(algorithm)
        self.config = config
        self.sequence_variant = algorithm.clusters_by == "sequence"
        self.state = ClusterState([tuple(sorted(silos))], {})
        self.cumulative: dict[tuple[str, ...], np.ndarray] = {}
        self.to_load: dict[str, np.ndarray | None] = {}
        self.splits: list[dict[str, Any]] = []
        self.norms: list[dict[str, Any]] = []     # each round's split-test inputs, per cluster
        self._events: list[dict[str, Any]] = []
        self._touched: set[tuple[str, ...]] = set()

    def clustering(self) -> ClusteredStrategy:
        """This strategy: it clusters silos."""
        return self

    def groups(self, participants: Sequence[str]) -> list[tuple[str, ...]]:
        """One aggregation per cluster, restricted to the silos taking part."""
        present = set(participants)
        groups = [tuple(m for m in c if m in present) for c in self.state.clusters]
        return [g for g in groups if g]

    def state_for(self, silo: str) -> np.ndarray | None:
        """What the silo loads at the start of the next round (None: keep its own values)."""
        value = self.to_load.get(silo)
        return None if value is None else value.astype(np.float32)

    def complete_round(self, round: int, results: Mapping[tuple[str, ...], AggregateResult],
                       statistics: Mapping[str, Mapping[str, float]]) -> list[tuple[str, ...]]:
        """Apply the cluster aggregates; return the clusters that need a similarity matrix."""
        self._touched = set()
        for group, result in results.items():
            if len(group) < 2:
                continue     # a lone silo's aggregate is zeros by construction
            cluster = self.state.clusters[self.state.cluster_of(group[0])]
            base = self.cumulative.get(cluster)
            self.cumulative[cluster] = result.mean if base is None else base + result.mean
            self._touched.add(cluster)
        if self.sequence_variant:
            key = "update_norm" if self.config.sequence == "update" else "grad_norm"
            for silo, stats in statistics.items():
                self.state.sequences.setdefault(silo, []).append(float(stats[key]))
        due = []
        split_means = {c: self._split_mean(r) for c, r in results.items()}
        mean_norms = {c: float(np.linalg.norm(m)) for c, m in split_means.items()
                      if m is not None}
        for cluster in list(self.state.clusters):
            found = [g for g in mean_norms if g and set(g) <= set(cluster)]
            norms = [statistics[s]["update_norm"] for s in cluster if s in statistics]
            if not found or not norms:
                continue
            group = found[0]
            # What the coordinator saw in plain (DESIGN.md: per-silo update norms), kept for
            # the run report beside the split test's two inputs.
            self.norms.append({"round": round, "cluster": list(cluster),
                               "mean_norm": round_(mean_norms[group]),
                               "max_norm": round_(max(norms)),
                               "update_norms": {s: round_(statistics[s]["update_norm"])
                                                for s in cluster if s in statistics}})
            reasons = split_reasons(mean_norms[group], max(norms), len(cluster), round,
                                    self.config.eps1, self.config.eps2)
            if reasons:
                continue
            if not self.sequence_variant:
                due.append(cluster)
            elif self._sequences_ready():
                side_a, side_b = sequence_split(cluster, self.state.sequences,
                                                self.config.seq_length, self.config.standardize)
                self._split(cluster, side_a, side_b, mean_norms[group], max(norms))
                self.state.sequences = {}    # the reference clears every sequence after a split
                break                        # hence at most one split per round
        return due

    def _split_mean(self, result: AggregateResult) -> np.ndarray | None:
        """The mean update whose norm the split test compares with eps1."""
        if self.config.mean_norm == "weighted":
            return result.mean
        return result.plain_mean    # None for a group under MIN_SPLIT_SIZE: it cannot split

    def _sequences_ready(self) -> bool:
        """GCFL+ splits only once every silo has a full sequence."""
        everyone = {s for c in self.state.clusters for s in c}
        return all(len(self.state.sequences.get(s, [])) >= self.config.seq_length
                   for s in everyone)

    def apply_similarity(self, cluster: tuple[str, ...], cosine: np.ndarray) -> None:
        """GCFL's cut of a cluster on ``cos + 1`` (docs/algorithms.md §3.3 step 4)."""
        side_a, side_b = similarity_split(cluster, np.clip(cosine + 1.0, 0.0, 2.0))
        self._split(cluster, side_a, side_b)

    def _split(self, cluster: tuple[str, ...], side_a: tuple[str, ...],
               side_b: tuple[str, ...], mean_norm: float | None = None,
               max_norm: float | None = None) -> None:
        index = self.state.clusters.index(cluster)
        self.state.split(index, side_a, side_b)
        parent = self.cumulative.pop(cluster, None)
        for child in (side_a, side_b):
            if parent is not None:
                self.cumulative[child] = parent.copy()
            if cluster in self._touched:
                self._touched.add(child)
        record = {"members": list(cluster), "into": [list(side_a), list(side_b)]}
        if mean_norm is not None:
            record |= {"mean_norm": round_(mean_norm), "max_norm": round_(max_norm)}
        self.splits.append(record)
        self._events.append({"split": record})

    def close_round(self, round: int) -> None:
        """Fix what each silo loads next round, and stamp this round's splits."""
        for record in self.splits:
            record.setdefault("round", round)
        self.to_load = {}
        for cluster in self.state.clusters:
            fresh = cluster in self._touched and cluster in self.cumulative
            for silo in cluster:
                self.to_load[silo] = self.cumulative[cluster] if fresh else None

    def drain_events(self) -> list[dict[str, Any]]:
        """Split events since the last call (for the audit trail and progress)."""
        events, self._events = self._events, []
        return events

    def durable_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Clusters, norm sequences, split records and each cluster's summed updates."""
        clusters = list(self.cumulative)
        arrays = {f"cumulative/{i}": self.cumulative[c] for i, c in enumerate(clusters)}
        # Between rounds (when checkpoints are taken) a silo loads its cluster's sum or keeps
        # its own values (close_round): only which of the two is recorded.
        doc = {"state": self.state.to_json(), "splits": self.splits, "norms": self.norms,
               "cumulative": [list(c) for c in clusters],
               "load_sum": sorted(s for s, v in self.to_load.items() if v is not None)}
        return doc, arrays

    def restore_durable_state(self, doc: Mapping[str, Any],
                              arrays: Mapping[str, np.ndarray]) -> None:
        """Take back the clusters and sums of `durable_state`."""
        if not doc:
            return
        self.state = ClusterState.from_json(doc["state"])
        self.splits, self.norms = list(doc["splits"]), list(doc["norms"])
        self.cumulative = {tuple(c): arrays[f"cumulative/{i}"]
                           for i, c in enumerate(doc["cumulative"])}
        self.to_load = {s: self.cumulative[self.state.clusters[self.state.cluster_of(s)]]
                        for s in doc["load_sum"]}


class PrivateSumStrategy(Strategy):
    """Differential privacy: silos upload noisy clipped sums; the coordinator keeps the shared
    state's offset from its initial values and steps it by the mean noisy update.

    Record level, the sum holds clipped per-graph gradients (one DP-FedSGD step): it is divided
    by the public expected batch of every survivor and descended. Silo level, it holds clipped
    updates: their mean is followed. Either way only public numbers divide the sum, so nothing
    the coordinator applies depends on a silo's private count of graphs. Silos load
    initial + offset; the initial values come from the plan's seed on every silo.
    """

    # No coefficient envelopes (they would reach every silo without noise: FedHGN trains without
    # its alignment term) and no early stop (it would follow plain validation figures).
    exchanges_envelopes = False
    stops_early = False

    def __init__(self, algorithm: Algorithm, privacy: PrivacyConfig) -> None:
        super().__init__(algorithm)
        self.privacy = privacy
        self.offset: np.ndarray | None = None
        self.velocity: np.ndarray | None = None

    def next_global(self, result: AggregateResult) -> np.ndarray | None:
        """The offset after one server step with the survivors' mean noisy update."""
        if result.noisy_sum is None:
            raise ValueError("a private round needs the noisy sum of its survivors")
        p = self.privacy
        per_silo = p.batch if p.unit == "record" else 1
        mean = result.noisy_sum / float(per_silo * max(len(result.participants), 1))
        direction = -mean if p.unit == "record" else mean
        if self.offset is None or self.velocity is None:
            self.offset = np.zeros_like(direction)
            self.velocity = np.zeros_like(direction)
        self.velocity = p.server_momentum * self.velocity + direction
        self.offset = self.offset + p.server_lr * self.velocity
        return self.offset.astype(np.float32)

    def durable_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The offset and the momentum, for a restarted coordinator."""
        if self.offset is None or self.velocity is None:
            return {}, {}
        return {}, {"offset": self.offset, "velocity": self.velocity}

    def restore_durable_state(self, doc: Mapping[str, Any],
                              arrays: Mapping[str, np.ndarray]) -> None:
        """Take back the offset and momentum (absent before the first round)."""
        if "offset" in arrays and "velocity" in arrays:
            self.offset = np.asarray(arrays["offset"], np.float64)
            self.velocity = np.asarray(arrays["velocity"], np.float64)


def round_(value: float | None) -> float | None:
    """Six significant decimals for records."""
    return None if value is None else float(f"{value:.6g}")


class EarlyStoppingStrategy(WeightedAverageStrategy):
    """FedHGN and its federated baselines (docs/algorithms.md §5.5): weighted mean, early stopping.

    The validation metric (accuracy unless the plan's `training.validation_metric` names
    balanced_acc or roc_auc) is weighted by each silo's validation nodes; a round improves iff it
    beats the best by at least `min_delta`, and the federation stops after `patience` rounds
    without improvement. Silos report a round's metrics when they open the next one, so the
    decision lags one round: the federation runs one round more than the reference code. That
    extra round is left out of the selection, so the selected round is the reference's. FedHGN
    silos also swap sealed coefficient envelopes, which needs the silo group key.
    """

    def __init__(self, algorithm: Algorithm, config: HeteroConfig, metric: str = "acc") -> None:
        super().__init__(algorithm)
        self.config = config
        self.metric = metric                    # one of protos/metrics.py VALIDATION_METRICS
        self.stopped_after: int | None = None   # last round scored when stopping was decided

    def should_stop(self, history: Sequence[Any]) -> bool:
        """Whether `patience` rounds with complete metrics have passed without improvement."""
        # The last round's reports come later.
        scored = weighted_rounds(history[:-1], "val", self.metric)
        best, _, stale = best_round(scored, self.config.min_delta)
        if best is not None and stale >= self.config.patience:
            self.stopped_after = scored[-1][0]
            return True
        return False

    def selection(self, history: Sequence[Any]) -> dict[str, Any]:
        """The best round by the weighted validation metric, its weighted test accuracy and,
        for a metric other than accuracy, its weighted test value of that metric."""
        if self.stopped_after is not None:
            history = [r for r in history if r.round <= self.stopped_after]
        metric = self.metric
        val = weighted_rounds(history, "val", metric)
        best, value, _ = best_round(val, self.config.min_delta)

        def test(name: str) -> float | None:
            return None if best is None else dict(weighted_rounds(history, "test", name)).get(best)

        chosen = {} if metric == "acc" else {"validation_metric": metric,
                                             f"test_{metric}": test(metric)}
        return {"best_round": best, f"val_{metric}": value, "test_acc": test("acc"), **chosen,
                "rounds_scored": len(val), "stopped_after": self.stopped_after,
                "patience": self.config.patience,
                "min_delta": self.config.min_delta}


def weighted_rounds(history: Sequence[Any], which: str, metric: str = "acc"
                    ) -> list[tuple[int, float]]:
    """(round, weighted `<which>_<metric>`) for every round whose silos reported it with
    counts."""
    out = []
    for record in history:
        value = weighted_metric(record.metrics, which, metric)
        if value is not None:
            out.append((record.round, value))
    return out


def best_round(scored: Sequence[tuple[int, float]], min_delta: float
               ) -> tuple[int | None, float | None, int]:
    """(best round, its value, rounds scored since it): improvement iff value >= best + delta."""
    best: int | None = None
    value: float | None = None
    stale = 0
    for round_, acc in scored:
        if value is None or acc >= value + min_delta:
            best, value, stale = round_, acc, 0
        else:
            stale += 1
    return best, value, stale


StrategyFactory = Callable[[Algorithm, ClusteringConfig, Sequence[str], HeteroConfig], Strategy]

# The coordinator strategy each row of protos/algorithms.py names (its `strategy`): a factory
# from (row, the plan's [clustering], the admitted silos, the plan's [fedhgn]).
STRATEGIES: dict[str, StrategyFactory] = {
    "alone": lambda row, clustering, silos, hetero: LocalStrategy(row),
    "mean": lambda row, clustering, silos, hetero: WeightedAverageStrategy(row),
    "clusters": lambda row, clustering, silos, hetero: ClusteredStrategy(row, clustering, silos),
    "early_stop": lambda row, clustering, silos, hetero: EarlyStoppingStrategy(row, hetero),
}


def make_strategy(name: str, clustering: ClusteringConfig | None = None,
                  silos: Sequence[str] = (), hetero: HeteroConfig | None = None,
                  privacy: PrivacyConfig | None = None, metric: str = "acc") -> Strategy:
    """The strategy the algorithm's row names, configured from the plan (`metric`: its
    training.validation_metric, which early stopping follows)."""
    row = algorithm(name)
    if privacy is not None and privacy.enabled and row.aggregates:
        return PrivateSumStrategy(row, privacy)
    try:
        factory = STRATEGIES[row.strategy]
    except KeyError:
        raise ValueError(f"{name}: no coordinator strategy called {row.strategy!r}") from None
    strategy = factory(row, clustering or ClusteringConfig(), silos, hetero or HeteroConfig())
    if isinstance(strategy, EarlyStoppingStrategy):
        strategy.metric = metric
    return strategy
