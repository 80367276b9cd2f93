"""Local training on one silo: the model, its optimiser, its data split and its RNG state.

The same trainer runs behind ``silo join`` and inside ``coordinator simulate``. It draws its
random numbers from its own generators, on the CPU and on its device
(silo/models/random_streams.py), so that silos interleaved in one process draw exactly the
numbers they would draw in separate processes, and a retried or resumed round draws those of
the first attempt, whatever else in the process draws from torch's global generators.

Over 400 lines because a LocalTrainer's state (model, optimiser, data split, random streams) is
one object that every training mode, snapshot and restore reads and moves together.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from trellis.crypto.randomness import RandomSource
from trellis.protos.algorithms import Algorithm, algorithm
from trellis.protos.plan import PublicPlan
from trellis.silo.data.split import graph_labels, silo_split
from trellis.silo.data.structure import add_structure_embeddings
from trellis.silo.data.tu import GraphDataset
from trellis.silo.models.batching import GraphBatch, PackedGraphs
from trellis.silo.models.compiled import compiled_forward_and_loss, forward_and_loss, fused_path
from trellis.silo.models.dense import ROWS, onednn_enabled
from trellis.silo.models.graph_classifiers import graph_model
from trellis.silo.models.random_streams import RandomStreams, drawing_from
from trellis.silo.models.shards import BatchShard
from trellis.silo.privacy.per_graph_gradients import clipped_gradient_sum
from trellis.silo.privacy.private_step import PrivateStep, add_noise, poisson_ids, to_integers
from trellis.silo.progress_bar import track
from trellis.silo.training.averaged_model import ModelAverage
from trellis.silo.training.classification_metrics import split_figures, split_metrics
from trellis.silo.training.devices import usable_device
from trellis.silo.training.graphed_evaluations import (
    GraphedEvaluations,
    SplitScores,
    evaluation_graphs_on,
    score_split,
)
from trellis.silo.training.graphed_steps import (
    GraphedSteps,
    GraphPath,
    GraphsGivenUp,
    graph_path,
)
from trellis.silo.training.initial_model import (
    InitialModel,
    freeze,
    start_from,
    trainable_parameters,
)
from trellis.silo.training.shared_evaluations import SharedEvaluations

# Evaluation forwards at most this many nodes at once (bounds memory on large graphs).
EVAL_NODES = 200_000
# The figures `metrics` offers per split, as `<split>_<figure>` (roc_auc for two classes only).
SPLIT_FIGURES = ("acc", "loss", "balanced_acc", "roc_auc")


def derived_seed(*parts: object) -> int:
    """A 63-bit seed derived from any printable parts (stable across processes and platforms)."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def snapshot_to_bytes(snapshot: dict[str, Any]) -> bytes:
    """A trainer snapshot as bytes for the silo's own disk."""
    buffer = io.BytesIO()
    torch.save(snapshot, buffer)
    return buffer.getvalue()


def snapshot_from_bytes(blob: bytes) -> dict[str, Any]:
    """The snapshot `snapshot_to_bytes` wrote (tensors only: no code is unpickled), on the
    CPU: restoring moves each tensor to the trainer's device, whichever wrote it."""
    return torch.load(io.BytesIO(blob), weights_only=True, map_location="cpu")


@dataclass(frozen=True)
class SharedLayout:
    """Names and shapes of the shareable tensors, in upload order."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def length(self) -> int:
        """Number of float values in the flattened shared vector."""
        return int(sum(int(np.prod(s)) for s in self.shapes))

    def flatten(self, model: nn.Module) -> np.ndarray:
        """The model's shareable tensors flattened in layout order (float32); nothing else."""
        if not self.names:
            return np.zeros(0, dtype=np.float32)
        params = dict(model.named_parameters())
        flat = torch.cat([params[n].detach().reshape(-1).cpu() for n in self.names])
        return flat.numpy().astype(np.float32, copy=True)

    def load(self, model: nn.Module, vector: np.ndarray) -> None:
        """Overwrite the model's shareable tensors in place from a flat vector."""
        vector = np.asarray(vector)
        if vector.shape != (self.length,):
            raise ValueError(f"shared vector has shape {vector.shape}, expected ({self.length},)")
        if not np.all(np.isfinite(vector)):
            raise ValueError("shared vector contains NaN or infinite values")
        params = dict(model.named_parameters())
        offset = 0
        with torch.no_grad():
            for name, shape in zip(self.names, self.shapes, strict=True):
                size = int(np.prod(shape))
                chunk = torch.from_numpy(np.ascontiguousarray(vector[offset:offset + size]))
                params[name].copy_(chunk.view(shape).to(params[name].dtype))
                offset += size


class LocalTrainer(SharedEvaluations):
    """Trains one silo's model on its own graphs and exposes only the shareable tensors."""

    def __init__(self, dataset: GraphDataset, plan: PublicPlan, silo: str,
                 device: torch.device | str = "cpu",
                 initial: InitialModel | None = None) -> None:
        self.plan = plan
        self.silo = silo
        self.spec: Algorithm = algorithm(plan.algorithm)
        self.device = usable_device(device)      # a device this machine lacks: one clear line
        # What rebuilds the model without this data (`silo predict`; kept in the final model).
        self.encoding = dataset.encoding
        self.num_features, self.num_classes = dataset.num_features, dataset.num_classes
        if self.spec.uses_structure:
            add_structure_embeddings(dataset, n_rw=plan.model.n_rw, n_dg=plan.model.n_dg)
        # A prepared split (a scaffold split) is the dataset's own and ignores the plan's seed.
        self.split = silo_split(graph_labels(dataset.graphs), dataset.split, f"silo {silo!r}",
                                seed=plan.training.split_seed)
        if not len(self.split.train):
            raise ValueError(f"silo {silo!r} has no training graphs")
        gcn = graph_model(self.spec.model).gcn_adjacency
        # Each split is packed once; mini-batches and evaluation batches are cut from it.
        self._packed = {
            name: PackedGraphs([dataset.graphs[i] for i in idx], structure=self.spec.uses_structure,
                               gcn=gcn) if len(idx) else None
            for name, idx in (("train", self.split.train), ("val", self.split.val),
                              ("test", self.split.test))
        }
        self._eval_batches: dict[str, list[GraphBatch]] = {}

        local_seed = derived_seed(plan.seed, plan.federation, silo)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(local_seed)
            self.model = self._build_model(dataset)
            # Shared groups start identical on every silo: re-initialise them from the plan seed.
            torch.manual_seed(derived_seed(plan.seed, plan.federation, "shared-init"))
            modules = dict(self.model.named_modules())
            for prefix in self.spec.shares:
                for sub in modules[prefix].modules():
                    if hasattr(sub, "reset_parameters"):
                        sub.reset_parameters()
        # The plan's public initial model (checked against it by the caller) and frozen groups.
        self.started_from = () if initial is None else start_from(self.model, initial,
                                                                  self.spec.shares)
        freeze(self.model, plan.model.frozen)
        self.model.to(self.device)
        # The splits kept on the trainer's device, packed once: batches are gathered there by
        # index, never copied from the host per step (the CPU packs stay for private training).
        self._resident = {name: None if packed is None else packed.to(self.device)
                          for name, packed in self._packed.items()}
        # Node rows padded to whole oneDNN blocks on the CPU (silo/models/dense.py), where the model
        # allows it; elsewhere padding would only add work.
        self._row_multiple = (ROWS if self.device.type == "cpu" and onednn_enabled()
                              and getattr(self.model, "accepts_padded_rows", False) else 1)
        self._shuffle = torch.Generator().manual_seed(derived_seed(local_seed, "shuffle"))
        # The silo's own streams for the models' draws (dropout), never torch's global ones.
        self._streams = RandomStreams(self.device, cpu_seed=derived_seed(local_seed, "draws"),
                                      device_seed=derived_seed(local_seed, "device-draws"))
        # Fused kernels where they pay (silo/models/compiled.py): torch.compile on a GPU.
        self.fused = fused_path(self.device)
        self._forward_loss = (compiled_forward_and_loss() if self.fused.compiled
                              else forward_and_loss)
        train = self._resident["train"]
        assert train is not None
        # Steps replayed as CUDA graphs where they can be (silo/training/graphed_steps.py).
        self.graph_path: GraphPath = graph_path(self.device, self.model, train)
        # fused: one kernel for all parameters, 4x faster per step than the default loop on CPU;
        # capturable: its step count stays on the device, as a recorded step needs.
        self.optimizer = torch.optim.Adam(trainable_parameters(self.model), lr=plan.training.lr,
                                          weight_decay=plan.training.weight_decay, fused=True,
                                          capturable=self.graph_path.on)
        self._graphed = (GraphedSteps(self.model, self.optimizer, self._padded_loss,
                                      self._streams, train,
                                      min(plan.training.batch_size, train.count))
                         if self.graph_path.on else None)
        # Each split's evaluation replayed as one CUDA graph (silo/training/graphed_evaluations.py).
        self._graphed_evaluations = (
            GraphedEvaluations(self._summed_score, self._streams, self.device)
            if evaluation_graphs_on(self.device, compiled=self.fused.compiled) else None)
        # A frozen shared group is the same on every silo and never changes: it is not sent.
        names = self.spec.shared_names(n for n, p in self.model.named_parameters()
                                       if p.requires_grad)
        params = dict(self.model.named_parameters())
        self.layout = SharedLayout(tuple(names), tuple(tuple(params[n].shape) for n in names))
        self._anchor: list[torch.Tensor] | None = None
        # [training] average: what this silo evaluates, reports and keeps (averaged_model.py).
        self._average = (ModelAverage(self.model, plan.training.average)
                         if plan.training.average else None)
        # GCFL: shared values at the start of the last training, and what it changed.
        self._initial_shared = self.get_shared()
        self._before: np.ndarray | None = None
        self.last_update: np.ndarray | None = None
        self.update_statistics: dict[str, float] = {}

    def _build_model(self, dataset: GraphDataset) -> nn.Module:
        return graph_model(self.spec.model).build(dataset.num_features, dataset.num_classes,
                                                  self.plan.model)

    @property
    def num_train(self) -> int:
        """Number of training graphs: this silo's aggregation weight."""
        return len(self.split.train)

    # -- shareable tensors -------------------------------------------------------------------
    def get_shared(self) -> np.ndarray:
        """The shareable tensors flattened in layout order (float32); nothing else."""
        return self.layout.flatten(self.model)

    def set_shared(self, vector: np.ndarray) -> None:
        """Overwrite the shareable tensors in place (Adam state is kept, as in the reference)."""
        self._forget_evaluations()
        self.layout.load(self.model, vector)
        if self._average is not None:       # a round's values arrived: the average moves
            self._average.update()

    def upload_vector(self) -> np.ndarray:
        """What this silo contributes to secure aggregation: values, or GCFL's update."""
        if self.spec.uploads != "update":
            return self.get_shared()
        if self.last_update is None:
            raise ValueError("no update to upload: the silo has not trained in this round")
        return self.last_update

    def set_cluster_state(self, cumulative_update: np.ndarray) -> None:
        """GCFL: shared values = the common initial values + the cluster's summed aggregates."""
        self.set_shared(self._initial_shared + np.asarray(cumulative_update, dtype=np.float32))

    # -- training and evaluation ---------------------------------------------------------------
    def train(self) -> dict[str, float]:
        """Run the plan's local epochs over the training graphs; returns the mean loss."""
        self._forget_evaluations()
        if self.spec.uploads == "update":
            self._before = self.get_shared()
        if self.spec.proximal:
            params = dict(self.model.named_parameters())
            if self._anchor is None:
                self._anchor = [params[n].detach().clone() for n in self.layout.names]
            else:                   # in place: a recorded step reads these very tensors
                for anchor, name in zip(self._anchor, self.layout.names, strict=True):
                    anchor.copy_(params[name].detach())
        self.model.train()
        packed = self._resident["train"]
        assert packed is not None
        size = self.plan.training.batch_size
        # Each step's loss stays on the device; all are read at once when training ends.
        losses: list[torch.Tensor] = []
        graphs: list[int] = []
        with self._own_rng():
            for epoch in range(self.plan.training.local_epochs):
                order = torch.randperm(packed.count, generator=self._shuffle)
                batches = order.split(size)
                on_device = self._to_device(order).split(size)    # one copy per epoch
                for ids, device_ids in track(zip(batches, on_device, strict=True),
                                             f"local epoch {epoch + 1}", total=len(batches)):
                    loss, count = self._train_batch(packed, ids, device_ids)
                    losses.append(loss)
                    graphs.append(count)
        total = 0.0
        # Summed on the host in step order: the same float64 sum as adding each step's loss.
        for loss_value, count in zip(torch.stack(losses).tolist(), graphs, strict=True):
            total += loss_value * count
        if self.spec.uploads == "update":
            self._record_update()
        return {"train_loss": total / max(sum(graphs), 1)}

    def _to_device(self, ids: torch.Tensor) -> torch.Tensor:
        """CPU ids on the trainer's device: a pinned, non-blocking copy to a GPU."""
        if self.device.type == "cpu":
            return ids
        if self.device.type == "cuda":
            ids = ids.pin_memory()
        return ids.to(self.device, non_blocking=True)

    def train_private(self, step: PrivateStep, source: RandomSource) -> np.ndarray:
        """Record-level DP: one DP-FedSGD step on a Poisson sample of the training graphs.

        Every trainable parameter's per-graph gradient is clipped together (the local channel
        feeds the shared one's gradient). The local slice takes its step here with the full
        noise; the shared slice's rounded, un-noised sum is returned (integer units, layout
        order) for the caller to add its noise share to. Nothing data-dependent is returned
        besides that sum: no loss, no sample size.
        """
        self._forget_evaluations()
        packed = self._packed["train"]
        assert packed is not None
        ids = torch.from_numpy(poisson_ids(packed.count, step.sampling_rate, source))
        self.model.train()
        with self._own_rng():
            clipped = clipped_gradient_sum(self.model, self._per_graph_loss, packed, ids,
                                           step.clip)
        shared_names = set(self.layout.names)
        local = [(n, p) for n, p in self.model.named_parameters()
                 if p.requires_grad and n not in shared_names]
        self.optimizer.zero_grad(set_to_none=True)
        if local:
            # The noise is drawn on the host from the silo's private source: the sum comes to
            # it, and the noised gradients go back to the parameters' device.
            flat = torch.cat([clipped.gradients[n].reshape(-1) for n, _ in local])
            noisy = add_noise(to_integers(_host_float64(flat), step.scale), step.full_sigma,
                              source)
            # Divided by the public expected batch, never the private sample size.
            grads = torch.from_numpy(noisy / (step.scale * self.plan.privacy.batch))
            offset = 0
            for _, param in local:
                size = param.numel()
                param.grad = grads[offset:offset + size].view_as(param).to(param.device,
                                                                           param.dtype)
                offset += size
            self.optimizer.step()
        if not self.layout.names:
            return np.zeros(0, np.int64)
        shared = torch.cat([clipped.gradients[n].reshape(-1) for n in self.layout.names])
        return to_integers(_host_float64(shared), step.scale)

    def _per_graph_loss(self, batch: GraphBatch) -> torch.Tensor:
        batch = batch.to(self.device)
        return nn.functional.nll_loss(self._forward(batch), batch.y, reduction="none")

    @property
    def trainable_values(self) -> int:
        """How many values the model trains: the dimension record-level noise covers."""
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def _record_update(self) -> None:
        """GCFL's per-silo statistics: update norm, and the last mini-batch's gradient norm."""
        assert self._before is not None
        self.last_update = self.get_shared() - self._before
        params = dict(self.model.named_parameters())
        grads = [g.detach().reshape(-1) for n in self.layout.names
                 if (g := params[n].grad) is not None]
        grad_norm = float(torch.linalg.vector_norm(torch.cat(grads))) if grads else 0.0
        self.update_statistics = {"update_norm": float(np.linalg.norm(self.last_update)),
                                  "grad_norm": grad_norm}

    def _train_batch(self, packed: PackedGraphs, ids: torch.Tensor, device_ids: torch.Tensor
                     ) -> tuple[torch.Tensor, int]:
        """One optimiser step on the mini-batch of graphs ``ids`` (``device_ids``: the same on
        the packed graphs' device): (its loss, still on the device; its graphs)."""
        graphed = self._graphed
        if graphed is not None and graphed.failure is None and graphed.packed is packed:
            try:
                return graphed.step(ids, device_ids), int(ids.numel())
            except GraphsGivenUp:
                self.graph_path = replace(self.graph_path, on=False,
                                          reason=f"plain steps ({graphed.failure})")
        batch = packed.select(ids, self._row_multiple, device_ids)
        return self._step(batch), batch.num_graphs

    def _step(self, batch: GraphBatch) -> torch.Tensor:
        """One optimiser step on a batch already on the device; its loss, not read here (reading
        it would make the host wait for the device)."""
        self.optimizer.zero_grad()
        _, loss = self._scored(batch, "mean")
        loss = self._with_proximal(loss)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def _with_proximal(self, loss: torch.Tensor) -> torch.Tensor:
        """FedProx: the loss plus mu/2 times the squared distance to the round's start."""
        if not (self.spec.proximal and self._anchor is not None):
            return loss
        params = dict(self.model.named_parameters())
        prox = sum(((params[n] - a) ** 2).sum()
                   for n, a in zip(self.layout.names, self._anchor, strict=True))
        return loss + 0.5 * self.plan.training.mu * prox

    def _padded_loss(self, batch: GraphBatch, weight: torch.Tensor) -> torch.Tensor:
        """A padded batch's mean loss (silo/models/static_batches.py): each graph's loss by its
        weight, 1 / real graphs, padding graphs 0."""
        out = self._forward(batch)
        losses = nn.functional.nll_loss(out, batch.y, reduction="none")
        return self._with_proximal(torch.dot(losses, weight))

    def _scored(self, batch: GraphBatch, reduction: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's log-probabilities and loss, compiled where the device's path says so."""
        return self._forward_loss(self.model, batch.x, batch.adjacency, batch.batch,
                                  batch.num_graphs, batch.stc_enc, batch.gcn_adjacency, batch.y,
                                  reduction)

    def _forward(self, batch: GraphBatch, shard: BatchShard | None = None) -> torch.Tensor:
        return self.model(batch.x, batch.adjacency, batch.batch, batch.num_graphs,
                          batch.stc_enc, batch.gcn_adjacency, shard=shard)

    def evaluate(self, which: str) -> tuple[float, float, int]:
        """(accuracy, mean loss, number of graphs) on 'train', 'val' or 'test'."""
        figures = self.evaluate_figures(which)
        return figures["acc"], figures["loss"], int(figures["count"])

    @torch.no_grad()
    def evaluate_figures(self, which: str) -> dict[str, float]:
        """acc, loss, count, balanced_acc and (two classes) roc_auc on 'train', 'val' or
        'test' (NaN, count 0 for an empty split)."""
        packed = self._resident[which]
        if packed is None:
            empty = {"acc": float("nan"), "loss": float("nan"), "count": 0.0,
                     "balanced_acc": float("nan")}
            return empty | ({"roc_auc": float("nan")} if self.num_classes == 2 else {})
        self.model.eval()
        with self._evaluated():
            scores = self._split_scores(which, packed)
        kept = (scores.labels.cpu().numpy(), scores.outputs.cpu().numpy())
        self._remember(which, kept)       # split_outputs' answer too, inside evaluations_shared
        figures = split_figures(*kept)
        return {**figures, "acc": int(scores.correct) / packed.count,
                "loss": float(scores.loss_sum) / packed.count, "count": float(packed.count)}

    @property
    def evaluation_path(self) -> str:
        """How this trainer evaluates a split: one replayed CUDA graph, or plain passes."""
        graphed = self._graphed_evaluations
        if graphed is None:
            return "plain passes"
        if graphed.failure is not None:
            return f"plain passes ({graphed.failure})"
        return "one CUDA graph per split (TRELLIS_CUDA_GRAPHS=0: plain passes)"

    def _split_scores(self, which: str, packed: PackedGraphs) -> SplitScores:
        """One pass over the split's evaluation batches, summed on the device and read by the
        caller once: replayed as a CUDA graph where one is recorded."""
        batches = self._evaluation_batches(which, packed)
        graphed = self._graphed_evaluations
        if graphed is not None and graphed.failure is None:
            try:
                return graphed(which, batches)
            except GraphsGivenUp:
                pass                      # said once; plain from now on
        return score_split(self._summed_score, batches)

    def _summed_score(self, batch: GraphBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's log-probabilities and summed loss."""
        return self._scored(batch, "sum")

    @torch.no_grad()
    def split_outputs(self, which: str) -> tuple[np.ndarray, np.ndarray]:
        """Labels and log-probabilities [n, classes] of 'val' or 'test', in split order: what
        summed evaluation counts are made of (silo/federation/evaluation_counts.py)."""
        packed = self._resident[which]
        if packed is None:
            return np.zeros(0, np.int64), np.zeros((0, self.num_classes), np.float64)
        kept = self._remembered(which)
        if kept is not None:              # this state's evaluation, made for its figures
            labels, outputs = kept
            return labels, outputs.astype(np.float64)
        self.model.eval()
        batches = self._evaluation_batches(which, packed)
        with self._evaluated():
            outputs = torch.cat([self._forward(b).double().cpu() for b in batches]).numpy()
        return torch.cat([b.y.cpu() for b in batches]).numpy(), outputs

    @torch.no_grad()
    def per_graph_losses(self, which: str) -> np.ndarray:
        """Each graph's loss on 'train', 'val' or 'test', in split order (membership audits)."""
        packed = self._resident[which]
        if packed is None:
            return np.zeros(0, np.float64)
        self.model.eval()
        with self._evaluated():
            return torch.cat([nn.functional.nll_loss(self._forward(batch), batch.y,
                                                     reduction="none").double().cpu()
                              for batch in self._evaluation_batches(which, packed)]).numpy()

    @torch.no_grad()
    def predictions(self, which: str) -> np.ndarray:
        """The predicted class index of every graph of 'train', 'val' or 'test', in split order."""
        packed = self._resident[which]
        if packed is None:
            return np.zeros(0, np.int64)
        self.model.eval()
        with self._evaluated():
            return torch.cat([self._forward(batch).argmax(dim=1).cpu()
                              for batch in self._evaluation_batches(which, packed)]).numpy()

    def _evaluated(self) -> AbstractContextManager[None]:
        """Within: the model holds what this silo evaluates (the average, if the plan asks)."""
        return nullcontext() if self._average is None else self._average.swapped_in()

    def model_recipe(self) -> dict[str, Any]:
        """What rebuilds this model without the silo's graphs (JSON-ready): task, feature width,
        classes and the feature encoding; the plan carries the rest."""
        if self.encoding is None:
            raise ValueError("this dataset was not loaded from a TU folder: its feature "
                             "encoding is unknown")
        return {"task": "graph", "num_features": self.num_features,
                "num_classes": self.num_classes, "encoding": self.encoding.to_json()}

    def _evaluation_batches(self, which: str, packed: PackedGraphs) -> list[GraphBatch]:
        """The split cut into node-bounded batches, built once and kept on the device."""
        if which not in self._eval_batches:
            sizes = packed.host_node_ptr[1:] - packed.host_node_ptr[:-1]
            batches, start, nodes = [], 0, 0
            for i, size in enumerate(sizes.tolist()):
                if nodes and nodes + size > EVAL_NODES:
                    batches.append(packed.select(torch.arange(start, i), self._row_multiple))
                    start, nodes = i, 0
                nodes += size
            batches.append(packed.select(torch.arange(start, packed.count), self._row_multiple))
            self._eval_batches[which] = batches
        return self._eval_batches[which]

    def metrics(self, names: Iterable[str] = ("val_acc", "val_loss", "test_acc", "test_loss")
                ) -> dict[str, float]:
        """The requested ones of val/test acc, loss, balanced_acc and (two classes) roc_auc;
        only the splits they need are evaluated."""
        return split_metrics(self.evaluate_figures, names, SPLIT_FIGURES)

    # -- state ---------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Everything a retried round must restore: weights, optimiser, RNG states (and the
        average over the rounds, where the plan keeps one)."""
        average = None if self._average is None else self._average.state()
        return {
            "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            "optimizer": _clone(self.optimizer.state_dict()),
            "rng": self._streams.state(),
            "shuffle": self._shuffle.get_state(),
            **({"average": average} if average is not None else {}),
        }

    def final_snapshot(self) -> dict[str, Any]:
        """The snapshot a final model file keeps: its weights are what this silo evaluated
        (the average over the rounds, where the plan keeps one)."""
        snapshot = self.snapshot()
        # The average's floating entries take the place of the model's; the integer ones
        # (batch norms' counts) are the model's own, as in an evaluation.
        snapshot["model"].update(snapshot.pop("average", {}))
        return snapshot

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Return to a snapshot taken with `snapshot()`."""
        self._forget_evaluations()
        self.model.load_state_dict(snapshot["model"])
        self.optimizer.load_state_dict(_clone(snapshot["optimizer"]))
        if self._graphed is not None:       # the graphs point at the optimiser's old state
            self._graphed.forget()
        rng = snapshot["rng"]       # a bare tensor: the CPU state, as snapshots before streams
        self._streams.load_state(rng if isinstance(rng, dict) else {"cpu": rng})
        self._shuffle.set_state(snapshot["shuffle"])
        if self._average is not None:
            self._average.load_state(snapshot.get("average"))

    def to_bytes(self) -> bytes:
        """Serialise the snapshot for the silo's own disk (never sent anywhere)."""
        return snapshot_to_bytes(self.snapshot())

    def from_bytes(self, blob: bytes) -> None:
        """Load a snapshot written by `to_bytes`."""
        self.restore(snapshot_from_bytes(blob))

    def _own_rng(self) -> AbstractContextManager[RandomStreams]:
        """The models draw from this silo's streams inside the block."""
        return drawing_from(self._streams)


def _host_float64(values: torch.Tensor) -> np.ndarray:
    """A tensor on any device as a float64 array on the host."""
    return values.detach().to("cpu", torch.float64).numpy()


def _clone(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    if isinstance(state, dict):
        return {k: _clone(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_clone(v) for v in state]
    return state
