"""Local training of one silo on several processes (``silo join --nproc N``): rank 0's trainer
and the workers' loop.

``ParallelTrainer`` is a ``LocalTrainer``: on rank 0 the session, the driver and the agent use
it as they use one process's trainer and never learn about ranks. Each ``train()`` on rank 0
first sends the workers its whole pre-training state (weights, optimiser, random streams: the
snapshot a retried round restores), so whatever rank 0 loaded since the last round (the
coordinator's aggregate, a retry's snapshot, a resumed state) reaches every process. Then every
process runs the same epochs over the same batch order, each on its part of every global
mini-batch (silo/models/shards.py), with gradients all-reduced by DDP; afterwards the processes
check that they hold the same model. Rank 0 alone evaluates, masks and uploads; the workers hold no
identity key and talk to nobody else.

The step is the one-process step with the sums arranged so that the gradient is the
one-process gradient: every part's summed loss is divided by the whole batch's graph count and
multiplied by the number of processes, which DDP's averaging divides out again; FedProx's
proximal term is added on rank 0 alone (likewise scaled). Parts may be empty (a last batch with
fewer graphs than processes): an empty part still runs its forward and backward, so that every
collective is joined.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trellis.protos.algorithms import algorithm
from trellis.protos.plan import PublicPlan
from trellis.silo.data.tu import GraphDataset
from trellis.silo.models.batching import PackedGraphs
from trellis.silo.models.dense import forget_choice, onednn_enabled
from trellis.silo.models.shards import shard_batch
from trellis.silo.training.failures import FederationFailed
from trellis.silo.training.initial_model import InitialModel
from trellis.silo.training.ranks import Command, RankGroup, RanksFailed
from trellis.silo.training.trainer import LocalTrainer, snapshot_to_bytes


class ParallelTrainingFailed(FederationFailed):
    """A process of this silo's group failed during local training; the silo stops."""


def check_parallel_plan(plan: PublicPlan, data: object) -> None:
    """ValueError unless the plan's algorithm trains graph classifiers on a TU dataset (FedHGN's
    full-graph trainer runs in one process)."""
    row = algorithm(plan.algorithm)
    if row.trainer != "graph":
        raise ValueError(f"{plan.algorithm} trains on one whole heterogeneous graph and runs in "
                         "one process; join without --nproc (or with --nproc 1)")
    if not isinstance(data, GraphDataset):
        raise ValueError(f"{plan.algorithm} needs a TU graph-classification dataset; this "
                         "silo's data is a heterogeneous graph folder")


class ParallelTrainer(LocalTrainer):
    """A LocalTrainer whose every local round runs on all of the silo's processes."""

    def __init__(self, dataset: GraphDataset, plan: PublicPlan, silo: str,
                 device: torch.device | str, group: RankGroup,
                 initial: InitialModel | None = None) -> None:
        # Workers start without the initial model: DDP's constructor gives them rank 0's values.
        super().__init__(dataset, plan, silo, device, initial)
        self.group = group
        # Built together on every process: DDP's constructor checks that the parameters agree.
        self._ddp = DistributedDataParallel(
            self.model, device_ids=[self.device] if self.device.type == "cuda" else None,
            # Batch-norm statistics are all-reduced in the forward pass: the buffers already
            # agree, and broadcasting them would cost a collective per step.
            forward_sync_buffers=False)

    @classmethod
    def lead(cls, group: RankGroup, dataset: object, plan: PublicPlan, silo: str,
             device: torch.device, initial: InitialModel | None = None) -> ParallelTrainer:
        """Rank 0: name the plan to the workers, then build this process's trainer."""
        check_parallel_plan(plan, dataset)
        assert isinstance(dataset, GraphDataset)
        # The workers take rank 0's dense path: padded row counts, and so the dropout draws,
        # must be the same on every process.
        onednn = device.type == "cpu" and onednn_enabled()      # no probe on a GPU
        spec = {"plan": plan.to_json(), "silo": silo, "onednn": onednn}
        try:
            group.send(Command.PLAN, json.dumps(spec).encode())
            group.busy = True
            trainer = cls(dataset, plan, silo, device, group, initial)
        except RanksFailed as exc:
            raise ParallelTrainingFailed(str(exc)) from None
        except RuntimeError as exc:         # DDP's checks across the processes
            raise ParallelTrainingFailed(group.describe_failure(
                "building the model on every process", exc)) from None
        group.busy = False
        return trainer

    # -- rank 0 ---------------------------------------------------------------------------------
    def train(self) -> dict[str, float]:
        """Rank 0: send the state to the workers, and train one local round with them."""
        if self.group.rank != 0:
            raise RuntimeError("only rank 0 starts a round; workers follow")
        where = f"local training on {self.group.world} processes"
        try:
            self.group.send(Command.TRAIN, snapshot_to_bytes(self.snapshot()))
            self.group.busy = True
            result = self._train_everywhere()
        except RanksFailed as exc:
            raise ParallelTrainingFailed(str(exc)) from None
        except RuntimeError as exc:         # torch.distributed's errors are RuntimeErrors
            raise ParallelTrainingFailed(self.group.describe_failure(where, exc)) from None
        self.group.busy = False
        return result

    # -- a worker -------------------------------------------------------------------------------
    def follow(self, state: bytes) -> None:
        """A worker: take rank 0's state and train the round with it."""
        self.restore(torch.load(io.BytesIO(state), weights_only=True, map_location="cpu"))
        self._train_everywhere()

    # -- every process --------------------------------------------------------------------------
    def _train_everywhere(self) -> dict[str, float]:
        result = super().train()
        differing = self.group.same_everywhere(self._digest())
        if differing:
            raise RuntimeError(f"after training, rank(s) {differing} hold another model than "
                               "rank 0")
        return result

    def _digest(self) -> bytes:
        """SHA-256 of every weight and buffer, in state-dict order."""
        digest = hashlib.sha256()
        for tensor in self.model.state_dict().values():
            digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8)
                          .numpy().tobytes())
        return digest.digest()

    def _train_batch(self, packed: PackedGraphs, ids: torch.Tensor, device_ids: torch.Tensor
                     ) -> tuple[torch.Tensor, int]:
        """This process's part of one global mini-batch: one DDP step; the whole batch's loss
        (float64; ``device_ids``: unused, this process takes a part of ``ids``)."""
        group = self.group
        local, shard = shard_batch(packed.host_node_ptr, ids, group.rank, group.world,
                                   self._row_multiple, group.stats)
        total = shard.graphs.real
        batch = packed.select(local, self._row_multiple)
        self.optimizer.zero_grad()
        out = self._ddp(batch.x, batch.adjacency, batch.batch, batch.num_graphs, batch.stc_enc,
                        batch.gcn_adjacency, shard=shard)
        summed = nn.functional.nll_loss(out, batch.y, reduction="sum")
        loss = summed * (group.world / total)
        proximal = 0.0
        if self.spec.proximal and self._anchor is not None:
            params = dict(self.model.named_parameters())
            prox = sum(((params[n] - a) ** 2).sum()
                       for n, a in zip(self.layout.names, self._anchor, strict=True))
            proximal = 0.5 * self.plan.training.mu * float(prox)
            if group.rank == 0:
                loss = loss + 0.5 * self.plan.training.mu * group.world * prox
        loss.backward()
        self.optimizer.step()
        whole = summed.detach().reshape(1).clone()
        group.all_reduce(whole)
        return torch.tensor(float(whole) / total + proximal, dtype=torch.float64), total


def serve(group: RankGroup, load_data: Callable[[], GraphDataset],
          log: Callable[[str], Any] = print) -> None:
    """A worker: build the trainer rank 0 names, train each round it starts, until STOP."""
    trainer: ParallelTrainer | None = None
    while True:
        command, payload = group.receive()
        if command is Command.STOP:
            return
        if command is Command.PLAN:
            spec = json.loads(payload)
            _take_dense_path(bool(spec["onednn"]))
            plan = PublicPlan.from_json(spec["plan"])
            trainer = ParallelTrainer(load_data(), plan, spec["silo"], group.device, group)
            log(f"ready to train {plan.algorithm} for {spec['silo']}")
        elif command is Command.TRAIN:
            if trainer is None:
                raise RuntimeError("rank 0 asked for training before naming its plan")
            trainer.follow(payload)


def _take_dense_path(onednn: bool) -> None:
    """Use rank 0's dense path from now on in this process."""
    import os

    os.environ["TRELLIS_ONEDNN"] = "1" if onednn else "0"
    forget_choice()
