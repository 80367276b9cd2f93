"""Which trainer a silo runs for a plan (the trainer hook of each algorithm row), and its data."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from trellis.protos.algorithms import NODE_TASK, algorithm
from trellis.protos.plan import PublicPlan
from trellis.silo.data.datasets import load_graph_folder
from trellis.silo.data.hetero import HeteroGraph, is_hetero_folder, load_hetero_folder
from trellis.silo.data.prepared.folder import is_prepared_folder, read_manifest
from trellis.silo.data.tu import GraphDataset
from trellis.silo.training.hgn_trainer import HeteroTrainer, HGNConfig
from trellis.silo.training.initial_model import (
    InitialModel,
    InitialModelMismatch,
    initial_problem,
)
from trellis.silo.training.trainer import LocalTrainer


def load_silo_data(folder: Path) -> GraphDataset | HeteroGraph:
    """A heterogeneous graph folder (meta.json + arrays.npz), or else a prepared folder or TU
    dataset of graphs."""
    folder = Path(folder)
    if is_hetero_folder(folder):
        if is_prepared_folder(folder):
            read_manifest(folder)       # a prepared RDF graph: refuse another format version
        return load_hetero_folder(folder)
    return load_graph_folder(folder)


def hgn_config(plan: PublicPlan) -> HGNConfig:
    """The trainer settings of a FedHGN-family plan (docs/algorithms.md §5.5, §5.6)."""
    h = plan.hetero
    row = algorithm(plan.algorithm)
    basis = row.model == "basis_rgcn"
    return HGNConfig(hidden=h.hidden, num_bases=h.bases if basis else 0, lr=h.lr,
                     local_epochs=h.local_epochs,
                     align_weight=h.align_weight if basis else 0.0,
                     mu=h.mu if row.proximal else 0.0, shares=row.shares)


def make_hetero_trainer(data: GraphDataset | HeteroGraph, plan: PublicPlan, silo: str,
                        relations: Sequence[str] | None = None,
                        device: object = "cpu") -> HeteroTrainer:
    """The trainer a silo runs for a FedHGN-family plan; refuses a TU dataset clearly."""
    if algorithm(plan.algorithm).task != NODE_TASK:
        raise ValueError(f"{plan.algorithm} is not a heterogeneous-graph algorithm")
    if not isinstance(data, HeteroGraph):
        raise ValueError(f"{plan.algorithm} needs a heterogeneous graph folder (meta.json and "
                         "arrays.npz, docs/hetero-format.md); this silo's data is a TU dataset")
    return HeteroTrainer(data, hgn_config(plan), plan.seed, plan.federation, silo,
                         plan.hetero.classes, relations=relations,
                         device=device)  # type: ignore[arg-type]


def _graph_trainer(data: GraphDataset | HeteroGraph, plan: PublicPlan, silo: str,
                   device: object = "cpu", relations: Sequence[str] | None = None,
                   initial: InitialModel | None = None) -> LocalTrainer:
    if not isinstance(data, GraphDataset):
        raise ValueError(f"{plan.algorithm} needs a TU graph-classification dataset; this "
                         "silo's data is a heterogeneous graph folder")
    return LocalTrainer(data, plan, silo, device, initial)  # type: ignore[arg-type]


def _hetero_trainer(data: GraphDataset | HeteroGraph, plan: PublicPlan, silo: str,
                    device: object = "cpu", relations: Sequence[str] | None = None,
                    initial: InitialModel | None = None) -> HeteroTrainer:
    return make_hetero_trainer(data, plan, silo, relations, device)


# The silo trainer hook each row of protos/algorithms.py names (its `trainer`): (data, plan,
# silo name, device, relations of a schema-matching simulation, initial model) -> a trainer.
TRAINERS: dict[str, Callable[..., LocalTrainer | HeteroTrainer]] = {
    "graph": _graph_trainer,
    "hetero": _hetero_trainer,
}


def check_initial(plan: PublicPlan, initial: InitialModel | None) -> None:
    """InitialModelMismatch unless `initial` is the model the plan names (or none, if none)."""
    problem = initial_problem(plan, None if initial is None else initial.sha256)
    if problem:
        raise InitialModelMismatch(f"{problem}; nothing was sent")


def make_trainer(data: GraphDataset | HeteroGraph, plan: PublicPlan, silo: str,
                 device: object = "cpu", relations: Sequence[str] | None = None,
                 initial: InitialModel | None = None) -> LocalTrainer | HeteroTrainer:
    """The trainer the plan's algorithm names, for this silo's data, started from `initial`
    (InitialModelMismatch unless it is the one the plan names, or none when it names none)."""
    check_initial(plan, initial)
    return TRAINERS[algorithm(plan.algorithm).trainer](data, plan, silo, device, relations,
                                                       initial)


def make_silo_trainer(data: GraphDataset | HeteroGraph, plan: PublicPlan, silo: str,
                      device: object = "cpu", initial: InitialModel | None = None
                      ) -> LocalTrainer | HeteroTrainer:
    """The trainer `silo join` runs for the plan it receives; refuses mismatched data and the
    simulation-only baselines."""
    if algorithm(plan.algorithm).simulation_only:
        raise ValueError(f"{plan.algorithm} needs schema matching and runs only in "
                         "`coordinator simulate`; this silo will not take part")
    return make_trainer(data, plan, silo, device, initial=initial)


def union_relations(graphs: Sequence[HeteroGraph]) -> tuple[str, ...]:
    """The union of relation names (the baselines' schema matching; simulation only)."""
    return tuple(sorted(set().union(*(g.relations for g in graphs))))
