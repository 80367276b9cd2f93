"""Fused kernels on a GPU: the model's forward pass and its loss through ``torch.compile``.

On a GPU a round of local training on small molecules is launch-bound, not compute-bound:
every layer runs dozens of small element-wise kernels (bias, ReLU, batch norm, dropout, tanh),
each a launch that costs more than its arithmetic. ``torch.compile`` (Inductor) fuses each run
of element-wise work between two matrix products into one generated kernel. The sparse products
(silo/models/propagation.py) stay torch's own: the compiler splits the graph around them.

How it is compiled, and why:
- ``dynamic=True``: every mini-batch has its own node and edge counts. Compiled for symbolic
  sizes, one set of kernels serves them all; compiled for static sizes it would recompile for
  the first batches, then give up and run plain. CUDA graphs (``mode="reduce-overhead"``) would
  need every batch padded to a few static node *and* edge counts, and a graph with sparse
  products and split regions gains little from them; not taken.
- Random numbers are drawn by torch's own ops (``fallback_random``), not by the compiler's: a
  compiled step then draws exactly the dropout masks of the plain one, from the silo's own
  random state, so a retried or resumed round redraws them.
- Several silos in one process each compile the same function for their own model: the
  recompile limit is raised so that they all stay compiled.

Not the default on any device: measured on an H200 (torch 2.11), the compiled path breaks its
graph at every custom autograd function and in-place product of the model, costs about 17 s of
compilation in each silo process's first round, and a FedDense round on CHEM took 1.47 s
compiled against 0.66 s plain; on a CPU it measured slower too (docs/silo-operators.md).
``TRELLIS_COMPILE=1`` chooses it everywhere, ``0`` or ``auto`` (or unset) the plain path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from trellis.silo.models.switches import three_way

# Silos sharing a process, each compiling the forward for its own model (and train/eval modes).
RECOMPILE_LIMIT = 256

ForwardLoss = Callable[..., tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class FusedPath:
    """Whether this device's forward pass and loss go through torch.compile, and why."""

    compiled: bool
    reason: str


def compile_setting() -> str:
    """TRELLIS_COMPILE: "1", "0" or "auto" (unset); ValueError for anything else."""
    return three_way("TRELLIS_COMPILE", "1 (torch.compile), 0 (plain forward) or auto (the "
                                        "plain path on every device)")


def fused_path(device: torch.device | str) -> FusedPath:
    """The path of a model on ``device``: compiled only where TRELLIS_COMPILE=1 says so."""
    device = torch.device(device)
    setting = compile_setting()
    if setting == "0":
        return FusedPath(False, "plain (TRELLIS_COMPILE=0)")
    if setting == "1":
        return FusedPath(True, "torch.compile (TRELLIS_COMPILE=1)")
    return FusedPath(False, f"plain (torch.compile does not pay on {device.type})")


def forward_and_loss(model: nn.Module, x: Tensor, adjacency: Any, batch: Tensor,
                     num_graphs: int, stc_enc: Tensor | None, gcn: Any, y: Tensor,
                     reduction: str) -> tuple[Tensor, Tensor]:
    """The model's log-probabilities per graph, and their negative log-likelihood."""
    out = model(x, adjacency, batch, num_graphs, stc_enc, gcn)
    return out, nn.functional.nll_loss(out, y, reduction=reduction)


def compiled_forward_and_loss(backend: str = "inductor") -> ForwardLoss:
    """``forward_and_loss`` compiled for batches of any size (see the module docstring);
    ``backend``: torch.compile's (tests take "aot_eager", which generates no kernels)."""
    import torch._dynamo
    import torch._inductor.config

    from trellis.silo.models.graph_classifiers import prepare_compiled_dropout

    prepare_compiled_dropout()
    torch._inductor.config.fallback_random = True
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit,
                                                RECOMPILE_LIMIT)
    compiled: ForwardLoss = torch.compile(forward_and_loss, dynamic=True, backend=backend)
    return compiled
