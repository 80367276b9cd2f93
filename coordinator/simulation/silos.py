"""The simulated silos both engines share: their data, their sessions, and a silo that trains
alone (hgn-local, hgn-central).

The sequential engine (coordinator/simulation/sequential.py) and the Ray engine's modules
(coordinator/simulation/ray_engine.py, ray_actors.py) build their silos from these, so the two
engines run the same silos; it sits under all three, and the sequential engine can hand a run
to the Ray engine without an import circle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trellis.crypto.pki import Identity
from trellis.protos.algorithms import NODE_TASK, algorithm
from trellis.protos.plan import Plan, PublicPlan
from trellis.silo.data.hetero import HeteroGraph
from trellis.silo.data.tu import GraphDataset
from trellis.silo.federation.session import SiloSession, Trainer
from trellis.silo.training.initial_model import InitialModelMismatch, read_initial_model
from trellis.silo.training.trainers import hgn_config, make_trainer

SiloData = GraphDataset | HeteroGraph


def silo_session(identity: Identity, data: SiloData, relations: Sequence[str] | None,
                 device: str = "cpu", initial: Path | None = None) -> SiloSession:
    """A simulated silo's session, which builds its trainer when it accepts the plan (from the
    public initial model at `initial`, the plan's [simulation] init_model, if any)."""
    def make(public: PublicPlan) -> Trainer:
        try:
            model = None if initial is None else read_initial_model(initial)
            return make_trainer(data, public, identity.name, device, relations=relations,
                                initial=model)
        except InitialModelMismatch as exc:
            raise ValueError(f"silo {identity.name}: {exc}") from None   # one line, exit 2

    return SiloSession(identity, make)


def check_data_kinds(plan: Plan, hetero: Mapping[str, bool]) -> None:
    """ValueError naming the silos whose data is not the kind the algorithm needs (``hetero``:
    whether each silo's data is a heterogeneous graph)."""
    needs_hetero = algorithm(plan.public.algorithm).task == NODE_TASK
    wrong = sorted(s for s in plan.silos if hetero[s] != needs_hetero)
    if wrong:
        want = ("a heterogeneous graph folder (meta.json + arrays.npz)" if needs_hetero
                else "a TU graph-classification dataset")
        raise ValueError(f"{plan.public.algorithm} needs {want} for every silo; not so for: "
                         + ", ".join(wrong))


def train_silo_alone(public: PublicPlan, name: str, graph: SiloData,
                     device: str = "cpu") -> dict[str, Any]:
    """One silo's own full-weight RGCN with early stopping (hgn-local, hgn-central), on
    ``device``."""
    from trellis.silo.training.hgn_baselines import train_alone

    assert isinstance(graph, HeteroGraph)      # checked by check_data_kinds
    h = public.hetero
    return train_alone(graph, hgn_config(public), seed=public.seed, name=name,
                       max_epochs=h.max_epochs, patience=h.patience, min_delta=h.min_delta,
                       metric=public.training.validation_metric, device=device)
