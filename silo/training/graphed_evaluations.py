"""A split's evaluation replayed as one CUDA graph: one launch instead of a forward's hundreds.

With training steps recorded (silo/training/graphed_steps.py), evaluation became most of a
graphed round's kernel launches on an H200 (about 2,050 a FedStar CHEM round, most of them the
validation and test forward passes). A split's evaluation batches never change (each split is
cut once and kept on the device), so no padding is needed: the whole pass over a split, its
forward passes, summed loss, correct count and the concatenated outputs, is recorded once and
replayed at every later evaluation.

- **Same tensors, updated in place.** A replay reads the parameters and buffers (batch norms'
  running statistics) it was recorded with; training steps, ``set_shared`` and a restore
  (``load_state_dict``) all write them in place, so a replay sees the model as it is now.
- **Eval mode only**: no dropout draws, so no random generator takes part.
- **Warm up, then record**: a split's first evaluation runs eagerly on the side stream the
  graphs are recorded on (the libraries' workspaces for that stream are made then); its second
  is recorded, then replayed, and so is every later one.
- **Outputs live until the next replay** of that split's graph: the caller reads them at once.

Where a pass cannot be recorded, the silo says why once and evaluates plainly from then on.
On with the training graphs' switch (``TRELLIS_CUDA_GRAPHS``: ``auto`` or ``1`` on CUDA; ``0``
never), for any model: evaluation batches are not padded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from trellis.silo.models.batching import GraphBatch
from trellis.silo.models.random_streams import RandomStreams
from trellis.silo.training.graphed_steps import (
    GraphsGivenUp,
    graphs_setting,
    on_side_stream,
    record_graph,
    touched_generators,
)

# A batch's (log-probabilities, summed loss).
BatchScorer = Callable[[GraphBatch], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class SplitScores:
    """One evaluation of a split, every tensor on the device, in split order."""

    outputs: Tensor     # [n, classes] log-probabilities
    labels: Tensor      # [n]
    loss_sum: Tensor    # float64 scalar: the summed float32 losses the host would form
    correct: Tensor     # int64 scalar


def score_split(scored: BatchScorer, batches: Sequence[GraphBatch]) -> SplitScores:
    """The plain pass over a split's batches (nothing read on the host)."""
    device = batches[0].y.device
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    outputs, labels = [], []
    for batch in batches:
        out, summed = scored(batch)
        loss_sum += summed
        correct += (out.argmax(dim=1) == batch.y).sum()
        outputs.append(out.detach())
        labels.append(batch.y)
    return SplitScores(torch.cat(outputs), torch.cat(labels), loss_sum, correct)


@dataclass
class _Held:
    """A split's graph and the tensors its replays write."""

    graph: torch.cuda.CUDAGraph
    scores: SplitScores


class GraphedEvaluations:
    """A trainer's split evaluations, each split's pass recorded as one CUDA graph at its second
    evaluation and replayed after that (``capture=False``: always the plain pass)."""

    def __init__(self, scored: BatchScorer, streams: RandomStreams, device: torch.device,
                 capture: bool = True) -> None:
        self._scored, self.device, self.capture = scored, device, capture
        self.streams = streams                # whose generators a failed recording sets right
        self._held: dict[str, _Held] = {}
        self._warmed: set[str] = set()
        self._stream: torch.cuda.Stream | None = None
        self.failure: str | None = None       # why graphs were given up, once
        self.recorded = 0                     # graphs recorded so far (a figure for benches)

    def __call__(self, which: str, batches: Sequence[GraphBatch]) -> SplitScores:
        """Split ``which``'s scores from ``batches`` (its fixed evaluation batches), replayed
        where recorded; GraphsGivenUp where recording failed (nothing evaluated: go plain)."""
        if not self.capture:
            return score_split(self._scored, batches)
        held = self._held.get(which)
        if held is not None:
            held.graph.replay()
            return held.scores
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)
        if which not in self._warmed:
            scores = on_side_stream(self._stream, lambda: score_split(self._scored, batches))
            self._warmed.add(which)
            return scores
        held = self._held[which] = self._record(batches)
        held.graph.replay()
        return held.scores

    def _record(self, batches: Sequence[GraphBatch]) -> _Held:
        """The split's pass recorded (not yet run); GraphsGivenUp, said once, where torch
        cannot record it."""
        assert self._stream is not None
        try:
            graph, scores = record_graph(
                self._stream, lambda: score_split(self._scored, batches),
                touched_generators(self.streams, self.device), None,
                "CUDA graphs of evaluation given up, evaluating on the plain path")
        except GraphsGivenUp as given_up:
            self.failure = str(given_up)
            self._held.clear()
            raise
        self.recorded += 1
        return _Held(graph, scores)


def evaluation_graphs_on(device: torch.device, compiled: bool = False) -> bool:
    """Whether evaluation on ``device`` is recorded: on CUDA unless TRELLIS_CUDA_GRAPHS=0 or the
    forward is compiled (TRELLIS_COMPILE=1: the compiler's own code, left as it is)."""
    return torch.device(device).type == "cuda" and not compiled and graphs_setting() != "0"
