"""Training steps replayed as CUDA graphs: one launch a step instead of hundreds.

Measured on an H200 (docs/benchmarks.md), a FedStar round on CHEM is launch-bound: about 380
kernel launches a step, each costing more host time than its arithmetic, and the GPU busy for a
tenth of the round. A CUDA graph records a step's kernels once and replays them with one launch.
What that takes, and how it is met here:

- **Static shapes.** A graph replays on the tensors it was recorded with, of the sizes it was
  recorded with. Each mini-batch is padded to its bucket, and each bucket has its graph,
  recorded the first time a batch of it comes (silo/models/static_batches.py).
- **The whole step in the graph**: cutting the batch from the split kept on the device (by the
  graph ids in a buffer, the one thing copied per step), forward, the loss (a weighted sum that
  leaves padding graphs out), backward and Adam's step (``capturable``: its step count and bias
  corrections stay on the device). The parameters, Adam's moments and the gradients are updated
  in place, so evaluation, ``set_shared`` and snapshots see them as after any step.
- **The silo's own random stream.** Dropout draws from the silo's CUDA generator
  (silo/models/random_streams.py), registered with each graph: every replay advances it by what
  one step draws, so a restored generator state replays the same masks, and the graph path draws
  the masks of the same padded steps taken eagerly (``capture=False``; tests compare).
- **Lazy state made outside a graph**: the first step runs eagerly on the side stream the graphs
  are recorded on (Adam's moments, cuBLAS's and cuSPARSE's workspaces are made then).
- **A restore forgets the graphs**: it replaces Adam's state tensors, which the graphs point at.

Where a graph cannot be recorded (an operation torch cannot capture on this GPU and version),
the silo says why once and trains on the plain path from then on: never a dead silo.

``TRELLIS_CUDA_GRAPHS``: ``auto`` (or unset) or ``1`` records graphs on CUDA for models whose
rows may be padded, FedDense included, whose batch norms then take the statistics of the real
rows alone (silo/models/padding_masks.py; on an H200 over 3 seeds its test accuracy 0.721
against 0.712 plain, 4x faster: docs/benchmarks.md); ``0`` never. Evaluation is recorded too
(silo/training/graphed_evaluations.py).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch import Tensor, nn

from trellis.silo.models.batching import GraphBatch, PackedGraphs
from trellis.silo.models.padding_masks import PaddingMasks, padded_by
from trellis.silo.models.random_streams import RandomStreams
from trellis.silo.models.static_batches import (
    StaticCut,
    StaticShape,
    cuts_statically,
    static_shape,
)
from trellis.silo.models.switches import three_way

LOG = logging.getLogger(__name__)

# The loss of a padded batch: (the batch, each graph slot's weight) -> a scalar.
StaticLoss = Callable[[GraphBatch, Tensor], Tensor]
# What a recorded or side-stream piece of work returns.
Done = TypeVar("Done")


def graphs_setting() -> str:
    """TRELLIS_CUDA_GRAPHS: "1", "0" or "auto" (unset); ValueError for anything else."""
    return three_way("TRELLIS_CUDA_GRAPHS", "1 or auto (training steps replayed as CUDA graphs "
                                            "on a GPU) or 0 (the plain path)")


@dataclass(frozen=True)
class GraphPath:
    """Whether a trainer's steps are replayed as CUDA graphs, and why."""

    on: bool
    reason: str


def graph_path(device: torch.device | str, model: nn.Module | None = None,
               packed: PackedGraphs | None = None) -> GraphPath:
    """The step path of ``model`` training on ``packed`` on ``device`` (None: whatever model and
    graphs the plan brings)."""
    device = torch.device(device)
    setting = graphs_setting()
    if setting == "0":
        return GraphPath(False, "plain steps (TRELLIS_CUDA_GRAPHS=0)")
    if device.type != "cuda":
        return GraphPath(False, f"plain steps (CUDA graphs need a GPU, not {device.type})")
    if (model is not None and not getattr(model, "accepts_padded_rows", False)
            and not getattr(model, "takes_padding_masks", False)):
        return GraphPath(False, f"plain steps ({type(model).__name__}'s normalisation sees "
                                "every row: its batches cannot be padded to a graph's shape)")
    if packed is not None and not cuts_statically(packed):
        return GraphPath(False, "plain steps (directed edges: the batches are not cut to static "
                                "shapes)")
    which = "" if model is not None else " where the model's batches can be padded"
    return GraphPath(True, f"CUDA graphs, one per batch shape{which} "
                           "(TRELLIS_CUDA_GRAPHS=0: plain steps)")


@dataclass
class _Recorded:
    """One bucket's cut, its graph, and what its step leaves: the loss, the gradients."""

    cut: StaticCut
    graph: torch.cuda.CUDAGraph | None         # None: taken eagerly (capture=False)
    loss: Tensor | None = None
    grads: list[tuple[nn.Parameter, Tensor]] = field(default_factory=list)


class GraphsGivenUp(RuntimeError):
    """A step could not be recorded (torch says why): train on the plain path instead."""


class GraphedSteps:
    """A trainer's padded training steps on its resident training split, each bucket's recorded
    as one CUDA graph (``capture=False``: the same steps taken eagerly, on any device)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, loss: StaticLoss,
                 streams: RandomStreams, packed: PackedGraphs, graph_slots: int,
                 capture: bool = True) -> None:
        if not cuts_statically(packed):
            raise ValueError("batches with directed edges are not cut to static shapes")
        self.model, self.optimizer, self._loss = model, optimizer, loss
        self.streams, self.packed, self.graph_slots = streams, packed, graph_slots
        self.capture = capture
        self._masked = bool(getattr(model, "takes_padding_masks", False))
        # The batch's graph ids, read by every recorded cut; empty slots name no graph.
        self._ids = torch.full((graph_slots,), packed.count, dtype=torch.long,
                               device=packed.device)
        self._recorded: dict[StaticShape, _Recorded] = {}
        self._stream: torch.cuda.Stream | None = None
        self.failure: str | None = None         # why graphs were given up, once
        self.recorded = 0                       # graphs recorded so far (a figure for benches)

    def forget(self) -> None:
        """Drop every graph (after a restore: Adam's state tensors are new)."""
        self._recorded.clear()

    def step(self, ids: torch.Tensor, device_ids: torch.Tensor) -> Tensor:
        """One optimiser step on the graphs ``ids`` (on the CPU; ``device_ids``: the same on the
        split's device); its mean loss, on the device (not read here). GraphsGivenUp where its
        graph could not be recorded (nothing taken: step plainly)."""
        shape = static_shape(self.packed, ids, self.graph_slots)
        count = ids.numel()
        self._ids[:count].copy_(device_ids)
        if count < self.graph_slots:
            self._ids[count:].fill_(self.packed.count)
        recorded = self._recorded.get(shape)
        if recorded is None:
            cut = StaticCut(self.packed, shape)
            if not self.capture:
                recorded = self._recorded[shape] = _Recorded(cut, None)
            elif self._stream is None:
                return self._warm_up(cut)
            else:
                recorded = self._recorded[shape] = self._record(cut)
        if recorded.graph is None:
            return self._take(recorded.cut)
        recorded.graph.replay()
        for param, grad in recorded.grads:             # what GCFL's statistics read
            param.grad = grad
        assert recorded.loss is not None
        return recorded.loss.clone()                   # the next replay overwrites it

    def _step(self, cut: StaticCut) -> Tensor:
        """Cut, forward, loss, backward, Adam: what a graph records (gradients start unset)."""
        batch, weight = cut(self._ids)
        # Batch norms count the real rows only (FedDense); other models take no masks.
        masking = (padded_by(PaddingMasks.of(batch.batch, weight)) if self._masked
                   else nullcontext())
        with masking:
            loss = self._loss(batch, weight)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def _take(self, cut: StaticCut) -> Tensor:
        """The padded step, eagerly on the current stream."""
        self.optimizer.zero_grad(set_to_none=True)
        return self._step(cut)

    def _warm_up(self, cut: StaticCut) -> Tensor:
        """The trainer's first padded step, eagerly on the side stream the graphs are recorded
        on: what torch makes lazily (Adam's moments, the libraries' workspaces for that
        stream) is made outside any graph. Its bucket is recorded at its next batch."""
        self._stream = torch.cuda.Stream(device=self.packed.device)
        return on_side_stream(self._stream, lambda: self._take(cut))

    def _record(self, cut: StaticCut) -> _Recorded:
        """The bucket's step recorded as a graph, not yet taken (recording runs nothing);
        GraphsGivenUp, said once, where torch cannot record it."""
        assert self._stream is not None
        params = [p for p in self.model.parameters() if p.requires_grad]
        # Gradients made inside the recording are the graph's own; each replay rewrites them.
        self.optimizer.zero_grad(set_to_none=True)
        try:
            graph, loss = record_graph(
                self._stream, lambda: self._step(cut),
                touched_generators(self.streams, self.packed.device),
                self.streams.device_generator,
                "CUDA graphs given up, training on the plain path")
        except GraphsGivenUp as given_up:
            self.failure = str(given_up)
            self.optimizer.zero_grad(set_to_none=True)
            self._recorded.clear()
            raise
        self.recorded += 1
        return _Recorded(cut, graph, loss, [(p, p.grad) for p in params if p.grad is not None])


def on_side_stream(stream: torch.cuda.Stream, work: Callable[[], Done]) -> Done:
    """``work`` run eagerly on ``stream``, after the current stream's work and before its next."""
    current = torch.cuda.current_stream(stream.device)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        done = work()
    current.wait_stream(stream)
    return done


def record_graph(stream: torch.cuda.Stream, work: Callable[[], Done],
                 generators: list[torch.Generator], own: torch.Generator | None,
                 given_up: str) -> tuple[torch.cuda.CUDAGraph, Done]:
    """``work`` recorded as a CUDA graph on ``stream`` (not run: recording runs nothing), with
    ``own``'s state registered so that replays advance it; where torch cannot record it, the
    reason logged once after ``given_up``, the graph and ``generators`` set right, and
    GraphsGivenUp with the reason."""
    graph = torch.cuda.CUDAGraph()
    if own is not None:
        graph.register_generator_state(own)
    current = torch.cuda.current_stream(stream.device)
    stream.wait_stream(current)
    try:
        with torch.cuda.stream(stream), no_collection():
            # Other threads (the agent's, a metrics scrape) may call CUDA meanwhile.
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                done = work()
            finally:
                graph.capture_end()
    except Exception as exc:                     # what torch cannot record on this GPU
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
        LOG.warning("%s: %s", given_up, reason)
        abandon_recording(graph, generators)
        raise GraphsGivenUp(reason) from None
    current.wait_stream(stream)
    return graph, done


@contextmanager
def no_collection() -> Iterator[None]:
    """A recording's surroundings: the device's pending work finished first (torch's own
    ``torch.cuda.graph`` does that too), and Python's cyclic garbage collector held off inside
    (as it was before, after), so that no collection frees CUDA or pinned host tensors from
    other streams and earlier work in the middle of a recording.

    Why: on an H200 (torch 2.11) 1 recording of about 660 failed with "operation failed due to a
    previous error during capture" (the silo then trained on plain steps, as it should). A free
    that queries an event during a recording would fail that way; the cause is not confirmed,
    and no GPU run has tried this guard yet. The recordings are short: nothing piles up."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def touched_generators(streams: RandomStreams, device: torch.device) -> list[torch.Generator]:
    """The CUDA generators a recording on ``device`` touches: the silo's, and torch's default."""
    default = torch.cuda.default_generators[device.index or 0]
    own = streams.device_generator
    return [default] if own is None else [own, default]


def abandon_recording(graph: torch.cuda.CUDAGraph, generators: list[torch.Generator]) -> None:
    """Undo what a failed recording left behind: the graph, and the generators' states, which
    torch leaves marked as recording (every later draw from them would then fail, "Offset
    increment outside graph capture"). Each generator gets a fresh state with the same seed and
    offset: its stream goes on as if nothing had been recorded."""
    try:
        graph.reset()
    except Exception as exc:                    # the generators below are what matters
        LOG.warning("a failed CUDA graph could not be reset: %s", exc)
    for generator in generators:
        fresh = torch.Generator(device=generator.device)
        fresh.set_state(generator.get_state())
        generator.graphsafe_set_state(fresh)
