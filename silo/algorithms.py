"""Which model each algorithm trains and which named parameter groups may leave the silo.

This table is the silo's own rule (STYLE.md principle 12): the coordinator names an algorithm,
but the silo decides from here what it uploads, by exact module prefix -- never by substring.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class AlgorithmSpec:
    """What an algorithm means on a silo."""

    name: str
    model: str                     # "gin" | "dual_channel_gin" | "dual_dense_gin"
    shared_modules: tuple[str, ...]  # module prefixes whose parameters may be uploaded
    aggregates: bool
    proximal: bool = False
    uses_structure: bool = False
    uploads_update: bool = False   # GCFL: the change of the shared groups, not their values

    def is_shared(self, parameter_name: str) -> bool:
        """Whether a parameter belongs to a shareable group."""
        return any(parameter_name.startswith(prefix + ".") for prefix in self.shared_modules)

    def shared_names(self, parameter_names: Iterable[str]) -> list[str]:
        """The shareable parameter names, in the canonical (sorted) upload order."""
        return sorted(n for n in parameter_names if self.is_shared(n))


ALGORITHM_SPECS: dict[str, AlgorithmSpec] = {
    # Local: FedStar's "selftrain" -- plain GIN, nothing leaves the silo.
    "local": AlgorithmSpec("local", "gin", (), aggregates=False),
    # FedAvg / FedProx as in the GCFL and FedStar repositories: only the GIN layers travel,
    # since input and output layers depend on each silo's feature width and label set.
    "fedavg": AlgorithmSpec("fedavg", "gin", ("graph_convs",), aggregates=True),
    "fedprox": AlgorithmSpec("fedprox", "gin", ("graph_convs",), aggregates=True, proximal=True),
    # FedStar: only the structure encoder (ALGORITHMS.md §2.2).
    "fedstar": AlgorithmSpec("fedstar", "dual_channel_gin",
                             ("embedding_s", "graph_convs_s_gcn"), aggregates=True,
                             uses_structure=True),
    # FedDense: the whole structural channel, its input layer included (ALGORITHMS.md §4.4).
    "feddense": AlgorithmSpec("feddense", "dual_dense_gin", ("Lin_s", "GCNConv_s"),
                              aggregates=True, uses_structure=True),
    # GCFL / GCFL+: the GIN layers' updates, aggregated within a cluster (ALGORITHMS.md §3.1).
    "gcfl": AlgorithmSpec("gcfl", "gin", ("graph_convs",), aggregates=True, uploads_update=True),
    "gcfl+": AlgorithmSpec("gcfl+", "gin", ("graph_convs",), aggregates=True,
                           uploads_update=True),
}


def algorithm_spec(name: str) -> AlgorithmSpec:
    """Look up an algorithm, failing with the valid choices."""
    try:
        return ALGORITHM_SPECS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; valid: "
                         + ", ".join(ALGORITHM_SPECS)) from None
