"""Local FedHGN training on one silo's heterogeneous graph (docs/algorithms.md §5.4, §5.5).

Each round: a fresh SGD optimiser, `local_epochs` full-batch steps on the task loss plus
lambda times the alignment of this silo's coefficients to the pool of other silos'
coefficients. Only the schema-free tensors leave through `get_shared`. The coefficients leave
only as the rows of `coefficient_rows`, which the caller seals. Embeddings never leave.

The same trainer runs the FedAvg / FedProx baselines (§5.6): `num_bases <= 0` builds full
per-relation weights, `relations` lays them out over the union schema of all silos (which
reveals every silo's relation names: privacy-breaking by design), and `mu > 0` adds FedProx's
proximal term.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from trellis.protos.algorithms import HGN_SCHEMA_FREE
from trellis.silo.data.hetero import HeteroGraph
from trellis.silo.models.hgn import BasisRGCN, alignment_loss, build_operators
from trellis.silo.training.classification_metrics import split_figures, split_metrics
from trellis.silo.training.devices import usable_device
from trellis.silo.training.shared_evaluations import SharedEvaluations
from trellis.silo.training.trainer import (
    SPLIT_FIGURES,
    SharedLayout,
    derived_seed,
    snapshot_from_bytes,
    snapshot_to_bytes,
)


@dataclass(frozen=True)
class HGNConfig:
    """FedHGN's hyper-parameters (configs.yaml of the reference; §5.5, §5.6).

    `num_bases <= 0` selects the baselines' full-weight RGCN; `mu` is FedProx's proximal
    weight (0: FedAvg / FedHGN).
    """

    hidden: int = 64
    num_bases: int = 20
    lr: float = 0.1
    local_epochs: int = 3
    align_weight: float = 0.5
    mu: float = 0.0
    shares: tuple[str, ...] = HGN_SCHEMA_FREE   # the algorithm row's shared groups


class HeteroTrainer(SharedEvaluations):
    """Trains one silo's BasisRGCN; exposes shared tensors and coefficient rows only.

    `relations`, when given, is the federation's union relation list: the model gets one
    relation slot per name, in that order, and this silo's relations map in by name. The model
    is initialised on the CPU (the same numbers on every device) and trains on `device` with the
    graph's operators, labels and indices; what leaves comes back to the host.
    """

    def __init__(self, graph: HeteroGraph, config: HGNConfig, seed: int, federation: str,
                 silo: str, num_classes: int, *, relations: Sequence[str] | None = None,
                 device: torch.device | str = "cpu") -> None:
        self.device = usable_device(device)
        if graph.num_classes != num_classes:
            raise ValueError(f"the graph has {graph.num_classes} classes; the federation "
                             f"learns {num_classes}")
        self.graph = graph
        self.config = config
        self.relations = tuple(graph.relations if relations is None else relations)
        try:
            self.ops = build_operators(graph, self.relations).to(self.device)
        except ValueError as exc:
            raise ValueError(f"silo {silo!r}: {exc}") from None
        # Bases are schema-free, so the server's dummy has one relation (as the reference);
        # full per-relation weights are shaped by the relation list, so it has all of them.
        dummy_relations = 1 if config.num_bases > 0 else self.ops.num_relations
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derived_seed(seed, federation, silo))
            self.model = BasisRGCN(graph.num_nodes, graph.node_types, self.ops.num_relations,
                                   num_classes, config.hidden, config.num_bases)
            # Shared tensors start identical on every silo (the server's initial state).
            torch.manual_seed(derived_seed(seed, federation, "shared-init"))
            shared_init = BasisRGCN({"x": 1}, ("x",), dummy_relations, num_classes,
                                    config.hidden, config.num_bases)
        names = self.model.shared_names(config.shares)
        params = dict(self.model.named_parameters())
        self.layout = SharedLayout(tuple(names), tuple(tuple(params[n].shape) for n in names))
        init = dict(shared_init.named_parameters())
        with torch.no_grad():
            for name in names:
                params[name].copy_(init[name])
        # Initialised on the CPU (the same numbers on every device), then moved, with the data.
        self.model.to(self.device)
        self.labels = torch.from_numpy(graph.labels).to(self.device)
        self.index = {name: torch.from_numpy(idx).to(self.device) for name, idx in
                      (("train", graph.train_idx), ("val", graph.val_idx),
                       ("test", graph.test_idx))}
        self.pool: torch.Tensor | None = None
        self.reset_pool()
        # FedProx's w_global: the shared values last loaded (the initial ones until then).
        self._anchor = self._shared_tensors()
        # A private federation sends offsets from these (the same on every silo).
        self._initial_shared = self.get_shared()
        # Duck type of LocalTrainer: this trainer never uploads an update (no GCFL).
        self.update_statistics: dict[str, float] = {}
        self.last_update: np.ndarray | None = None

    @property
    def num_classes(self) -> int:
        """Classes of the target nodes (the decoder's outputs)."""
        return int(self.graph.num_classes)

    @property
    def num_train(self) -> int:
        """Training target nodes: this silo's aggregation weight."""
        return int(self.graph.train_idx.size)

    # -- what travels ------------------------------------------------------------------------
    def get_shared(self) -> np.ndarray:
        """Bases, biases and decoder, flattened in layout order (float32)."""
        return self.layout.flatten(self.model)

    def set_shared(self, vector: np.ndarray) -> None:
        """Load the aggregated shared tensors (coefficients and embeddings are untouched)."""
        self._forget_evaluations()
        self.layout.load(self.model, vector)
        self._anchor = self._shared_tensors()

    def upload_vector(self) -> np.ndarray:
        """What this silo contributes to secure aggregation."""
        return self.get_shared()

    def set_cluster_state(self, offset: np.ndarray) -> None:
        """Differential privacy: shared values = the common initial values + the offset."""
        self.set_shared(self._initial_shared + np.asarray(offset, dtype=np.float32))

    def coefficient_rows(self) -> np.ndarray:
        """This silo's coefficient vectors, one row per relation, in no meaningful order
        (an empty (0, B) array for the full-weight model, which has none)."""
        if self.model.coefficients is None:
            return np.zeros((0, max(self.config.num_bases, 0)), dtype=np.float32)
        return self.model.coefficients.detach().cpu().numpy().astype(np.float32, copy=True)

    def reset_pool(self) -> None:
        """Align to the origin, as before any other silo's coefficients have arrived.

        The reference's server starts every client's stored coefficients at zero, so in round
        1 each client aligns to the zero vector: an L2 pull on the initial coefficients that
        steadies the first rounds. Its shape bug counts that term twice; we count it once
        (docs/fedhgn.md).
        """
        self.pool = (None if self.model.coefficients is None
                     else torch.zeros(1, self.config.num_bases, device=self.device))

    def set_pool(self, rows: np.ndarray | None) -> None:
        """The other silos' coefficient rows for the alignment loss (None: no alignment)."""
        if rows is None or len(rows) == 0:
            self.pool = None
            return
        if self.model.coefficients is None:
            raise ValueError("the full-weight model has no coefficients to align")
        rows = np.asarray(rows, dtype=np.float32)
        if rows.ndim != 2 or rows.shape[1] != self.config.num_bases:
            raise ValueError(f"coefficient pool must have shape (n, {self.config.num_bases}), "
                             f"got {rows.shape}")
        if not np.all(np.isfinite(rows)):
            raise ValueError("coefficient pool contains NaN or infinite values")
        self.pool = torch.from_numpy(rows).to(self.device)

    # -- training and evaluation ---------------------------------------------------------------
    def train(self) -> dict[str, float]:
        """`local_epochs` full-batch SGD steps with a fresh optimiser (as the reference).

        The returned `train_loss` is the task loss alone, as the reference logs it: the
        alignment term is a sum over this silo's relations, so reporting it would hint at how
        many the silo has.
        """
        self._forget_evaluations()
        optimizer = torch.optim.SGD(self.model.parameters(), lr=self.config.lr)
        train = self.index["train"]
        self.model.train()
        total = 0.0
        for _ in range(self.config.local_epochs):
            optimizer.zero_grad()
            logits = self.model(self.ops)
            loss = task = F.cross_entropy(logits[train], self.labels[train])
            if self.pool is not None and self.model.coefficients is not None:
                loss = loss + self.config.align_weight * alignment_loss(
                    self.model.coefficients, self.pool)
            if self.config.mu > 0:
                loss = loss + 0.5 * self.config.mu * self.proximal_term()
            loss.backward()
            optimizer.step()
            total += float(task.detach())
        return {"train_loss": total / self.config.local_epochs}

    def proximal_term(self) -> torch.Tensor:
        """FedProx's sum of squared distances of the shared tensors to w_global (§5.6).

        For the full-weight model the shared tensors are all non-embedding parameters, the
        decoder included, as the reference. The basis model's coefficients have no global
        value and are left out.
        """
        params = dict(self.model.named_parameters())
        terms = [(params[n] - a).pow(2).sum()
                 for n, a in zip(self.layout.names, self._anchor, strict=True)]
        return torch.stack(terms).sum() if terms else torch.zeros((), device=self.device)

    def _shared_tensors(self) -> list[torch.Tensor]:
        params = dict(self.model.named_parameters())
        return [params[n].detach().clone() for n in self.layout.names]

    def evaluate(self, which: str) -> tuple[float, float, int]:
        """(accuracy, loss, number of nodes) on the validation or test target nodes."""
        figures = self.evaluate_figures(which)
        return figures["acc"], figures["loss"], int(figures["count"])

    def evaluate_figures(self, which: str) -> dict[str, float]:
        """acc, loss, count, balanced_acc and (two classes) roc_auc on the validation or test
        target nodes (NaN, count 0 without any)."""
        index = self.index[which]
        if index.numel() == 0:
            empty = {"acc": float("nan"), "loss": float("nan"), "count": 0.0,
                     "balanced_acc": float("nan")}
            return empty | ({"roc_auc": float("nan")} if self.graph.num_classes == 2 else {})
        logits, labels = self._logits()[index], self.labels[index]     # no autograd graph
        loss = float(F.cross_entropy(logits, labels))
        acc = float((logits.argmax(dim=1) == labels).float().mean())
        figures = split_figures(labels.cpu().numpy(), logits.cpu().numpy())
        return {**figures, "acc": acc, "loss": loss, "count": float(index.numel())}

    def split_outputs(self, which: str) -> tuple[np.ndarray, np.ndarray]:
        """Labels and logits [n, classes] of the validation or test target nodes: what summed
        evaluation counts are made of (silo/federation/evaluation_counts.py)."""
        index = self.index[which]
        logits = self._logits()[index] if index.numel() else torch.zeros(
            0, self.graph.num_classes)
        # On the host: the counts are made there (and a GPU tensor has no numpy view).
        return self.labels[index].cpu().numpy(), logits.double().cpu().numpy()

    def _logits(self) -> torch.Tensor:
        """Every node's logits in evaluation mode: computed once inside evaluations_shared."""
        kept = self._remembered("logits")
        if kept is not None:
            return kept
        self.model.eval()
        with torch.no_grad():
            logits = self.model(self.ops)
        self._remember("logits", logits)
        return logits

    def metrics(self, names: Iterable[str] = ("val_acc", "val_loss", "test_acc", "test_loss")
                ) -> dict[str, float]:
        """The requested ones of val/test acc, loss, count, balanced_acc and (two classes)
        roc_auc (counts as floats)."""
        return split_metrics(self.evaluate_figures, names, (*SPLIT_FIGURES, "count"))

    def model_recipe(self) -> dict[str, Any]:
        """What rebuilds this model without the silo's folder (JSON-ready; its own schema, so
        for the silo's own disk only): node types and counts, relation slots, target type."""
        return {"task": "node", "node_types": list(self.graph.node_types),
                "num_nodes": {t: int(n) for t, n in self.graph.num_nodes.items()},
                "relations": list(self.relations), "target_type": self.graph.target_type,
                "num_classes": int(self.graph.num_classes)}

    # -- state ---------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Weights and FedProx's w_global (no optimiser state or randomness between rounds)."""
        return {"model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
                "anchor": [a.clone() for a in self._anchor]}

    def final_snapshot(self) -> dict[str, Any]:
        """The snapshot a final model file keeps: the model as it is (no average here)."""
        return self.snapshot()

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Return to a snapshot taken with `snapshot()`."""
        self._forget_evaluations()
        self.model.load_state_dict(snapshot["model"])
        if "anchor" in snapshot:        # snapshots written before FedProx have none
            self._anchor = [a.to(self.device, copy=True) for a in snapshot["anchor"]]

    def to_bytes(self) -> bytes:
        """Serialise the snapshot for the silo's own disk (never sent anywhere)."""
        return snapshot_to_bytes(self.snapshot())

    def from_bytes(self, blob: bytes) -> None:
        """Load a snapshot written by `to_bytes`."""
        self.restore(snapshot_from_bytes(blob))
