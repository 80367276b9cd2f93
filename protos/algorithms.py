"""One row per algorithm: everything either side decides about an algorithm reads it here.

What may leave a silo (named parameter groups, never a name substring), whether the round
aggregates, needs a silo group key or CKKS, personalises, which task it solves, which
coordinator strategy runs its rounds and which silo trainer hook trains it. The coordinator and
the silo both import this table, so they cannot disagree; nothing re-decides it from a name.
docs/adding-an-algorithm.md shows how a new row is added.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

GRAPH_TASK = "graph"     # graph classification on TU-format datasets
NODE_TASK = "node"       # node classification on heterogeneous graphs (FedHGN)

# GCFL / GCFL+ split rule constants (Xie et al. 2021; docs/algorithms.md §3.3): the reference code
# never splits before round 21, and only clusters with at least 3 members split.
MIN_SPLIT_ROUND = 21
MIN_SPLIT_SIZE = 3


@dataclass(frozen=True)
class GcflPreset:
    """GCFL thresholds of one experiment setting (GCFL App. D)."""

    eps1: float  # the mean update norm must fall below this (near a stationary point) ...
    eps2: float  # ... while the largest single update norm stays above this
    seq_length: int  # GCFL+: how many recent update norms the DTW distance compares


GCFL_PRESETS: dict[str, GcflPreset] = {
    "oneDS-PROTEINS": GcflPreset(0.03, 0.06, 10),
    "oneDS-IMDB-BINARY": GcflPreset(0.025, 0.045, 5),
    "oneDS-NCI1": GcflPreset(0.04, 0.08, 5),
    "MOLECULES": GcflPreset(0.07, 0.28, 5),
    "BIOCHEM": GcflPreset(0.07, 0.35, 5),
    "MIX": GcflPreset(0.08, 0.4, 5),
}


@dataclass(frozen=True)
class Algorithm:
    """The traits of one algorithm (a row of ``ALGORITHMS``)."""

    name: str
    task: str                       # GRAPH_TASK or NODE_TASK
    summary: str                    # one line for help texts and docs
    strategy: str                   # coordinator round logic (coordinator/rounds/strategies.py)
    trainer: str                    # silo trainer hook (silo/training/trainers.py)
    model: str                      # the silo's model family
    shares: tuple[str, ...] = ()    # parameter groups (module names) that may leave a silo
    # Parameter groups a plan may freeze ([model] frozen): kept at their starting values, never
    # trained (docs/configuration.md); () : none may be.
    freezable: tuple[str, ...] = ()
    aggregates: bool = True         # shared groups are summed by secure aggregation each round
    uploads: str = "values"         # "values" of the shared groups, or their "update" (GCFL)
    needs_group_key: bool = False   # a silo group key is set up before round 1
    needs_ckks: bool = False        # ... carrying a CKKS secret context (GCFL's similarity)
    # Each silo ends with a model of its own, so final metrics are per-silo models' (results.json
    # says so as "personalised"); False: one model for the whole graph.
    personalises: bool = True
    proximal: bool = False          # FedProx's term towards the last loaded shared values
    uses_structure: bool = False    # structure embeddings (random walk + degree) as input
    exchanges_envelopes: bool = False   # silos swap sealed coefficient envelopes (FedHGN)
    stops_early: bool = False       # ends when validation accuracy stops improving
    rounds: bool = True             # False: silos train alone to the end, no rounds at all
    clusters_by: str = ""           # GCFL's split test: "similarity" (CKKS) or "sequence" (DTW)
    one_silo: bool = False          # one silo holds the whole graph (centralised reference)
    matches_schemas: bool = False   # one model over the union of the silos' relation names
    simulation_only: bool = False   # sees every silo's data: `coordinator simulate` only

    @property
    def clustered(self) -> bool:
        """Whether silos are aggregated per cluster (GCFL): per-cluster state and groups."""
        return self.strategy == "clusters"

    def is_shared(self, parameter_name: str) -> bool:
        """Whether a parameter belongs to a shareable group (exact module prefix)."""
        return in_groups(parameter_name, self.shares)

    def shared_names(self, parameter_names: Iterable[str]) -> list[str]:
        """The shareable parameter names, in the canonical (sorted) upload order."""
        return sorted(n for n in parameter_names if self.is_shared(n))


def in_groups(parameter_name: str, groups: Iterable[str]) -> bool:
    """Whether a parameter belongs to one of the named modules (exact prefix, never substring)."""
    return any(parameter_name.startswith(group + ".") for group in groups)


_GIN_LAYERS = ("graph_convs",)    # input and output layers depend on each silo's features/labels
# Every group of each graph model (silo/models/graph_classifiers.py): each may be frozen.
_GIN_GROUPS = ("pre", "graph_convs", "post", "readout")
_FEDSTAR_GROUPS = ("pre", "embedding_s", "graph_convs", "graph_convs_s_gcn", "Whp", "post",
                   "readout")
_FEDDENSE_GROUPS = ("Lin_x", "Lin_s", "GCNConv_s", "H_x", "H_s", "GINConv_x", "readout_norm",
                    "head_hidden", "head_out")
# FedHGN's schema-free tensors: node embeddings and relation coefficients stay home.
HGN_SCHEMA_FREE = ("layer1", "layer2", "decoder")

ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("local", GRAPH_TASK, "self-training: each silo trains alone; nothing leaves it",
              strategy="alone", trainer="graph", model="gin", aggregates=False,
              freezable=_GIN_GROUPS),
    Algorithm("fedavg", GRAPH_TASK, "FedAvg of the GIN layers", strategy="mean",
              trainer="graph", model="gin", shares=_GIN_LAYERS, freezable=_GIN_GROUPS),
    Algorithm("fedprox", GRAPH_TASK, "FedProx: FedAvg with a proximal term", strategy="mean",
              trainer="graph", model="gin", shares=_GIN_LAYERS, proximal=True,
              freezable=_GIN_GROUPS),
    Algorithm("fedstar", GRAPH_TASK, "FedStar: only the structure encoder is shared",
              strategy="mean", trainer="graph", model="dual_channel_gin",
              shares=("embedding_s", "graph_convs_s_gcn"), uses_structure=True,
              freezable=_FEDSTAR_GROUPS),
    Algorithm("feddense", GRAPH_TASK, "FedDense: the whole structural channel is shared",
              strategy="mean", trainer="graph", model="dual_dense_gin",
              shares=("Lin_s", "GCNConv_s"), uses_structure=True,
              freezable=_FEDDENSE_GROUPS),
    Algorithm("gcfl", GRAPH_TASK, "GCFL: clusters silos by the similarity of their updates",
              strategy="clusters", trainer="graph", model="gin", shares=_GIN_LAYERS,
              uploads="update", needs_group_key=True, needs_ckks=True,
              clusters_by="similarity"),
    Algorithm("gcfl+", GRAPH_TASK, "GCFL+: clusters silos by their update-norm sequences",
              strategy="clusters", trainer="graph", model="gin", shares=_GIN_LAYERS,
              uploads="update", clusters_by="sequence"),
    Algorithm("fedhgn", NODE_TASK, "FedHGN: shared bases, private schema coefficients",
              strategy="early_stop", trainer="hetero", model="basis_rgcn",
              shares=HGN_SCHEMA_FREE, needs_group_key=True, exchanges_envelopes=True,
              stops_early=True),
    Algorithm("hgn-local", NODE_TASK, "each silo trains its own RGCN (FedHGN's baseline)",
              strategy="alone", trainer="hetero", model="rgcn", aggregates=False,
              rounds=False, simulation_only=True),
    Algorithm("hgn-central", NODE_TASK, "one RGCN on the whole graph (FedHGN's reference)",
              strategy="alone", trainer="hetero", model="rgcn", aggregates=False,
              rounds=False, one_silo=True, personalises=False, simulation_only=True),
    Algorithm("hgn-fedavg", NODE_TASK, "FedAvg of full RGCN weights over matched schemas",
              strategy="early_stop", trainer="hetero", model="rgcn", shares=HGN_SCHEMA_FREE,
              stops_early=True, matches_schemas=True, simulation_only=True),
    Algorithm("hgn-fedprox", NODE_TASK, "FedProx of full RGCN weights over matched schemas",
              strategy="early_stop", trainer="hetero", model="rgcn", shares=HGN_SCHEMA_FREE,
              proximal=True, stops_early=True, matches_schemas=True, simulation_only=True),
)}


def algorithm(name: str) -> Algorithm:
    """Look up an algorithm's row, failing with the valid choices."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; valid: " + ", ".join(ALGORITHMS)) from None
