"""Per-graph clipped gradient sums for record-level DP-SGD (one graph = one record).

docs: /work/shared/reference/PRIVACY.md §3. Each graph's gradient of its own loss, over ALL
trainable parameters together, is scaled to L2 norm at most ``clip`` and the scaled gradients
are summed: one graph can then move the sum by at most ``2 clip`` (or ``clip`` when it is added
or removed), the sensitivity DP-SGD's noise is calibrated to. That holds only if no layer mixes
the graphs of a batch: ``check_per_graph_model`` refuses BatchNorm and its kin.

Two methods give the same sum:

- ``"microbatch"``: one forward and backward pass per graph. Obviously correct; the reference.
- ``"fast"``: one forward and one backward pass over the whole batch. Every use of a parameter
  is reported (silo/models/parameter_taps.py: dense products and added biases, plus LayerNorm
  modules by a forward hook) with its input rows, and a tensor hook catches the gradient of its
  output rows. Message passing never crosses graphs, so the output gradient of a node's row is the
  gradient of its own graph's loss alone, and a weight's per-graph gradient is the sum over that
  graph's rows of ``delta_n x_n^T`` (one batched product over rows padded per graph), a bias's
  the sum of ``delta_n``. The clipped sum is then ``sum_g c_g grad_g`` with
  ``c_g = min(1, clip / ||grad_g||)``.

  Chosen over ``torch.func`` (vmap of grad): our models use old-style autograd Functions
  (``_Tanh``, ``_OneDnnLinear``, ``_SparseProduct``) and sparse CSR products, which vmap does
  not take, and padding every graph to a dense adjacency would need a second model. The taps
  keep the models and their fast kernels as they are.

  Never silently wrong: the per-graph gradients must add up to the batch gradient autograd
  computes for every parameter (a use no tap reports would break that), the tapped tensors must
  not have been changed in place, and every tapped tensor's rows must map to graphs
  unambiguously. Otherwise the sum is computed by the microbatch method and the result says why
  (``fallback``), with a ``RuntimeWarning``.

Devices: the batch and every tensor made here go to the parameters' device; only the caller
moves sums to the host (silo/training/trainer.py, for the noise).

Randomness: the fast method draws dropout masks for the batch at once, the microbatch method
graph by graph, so the two agree only without dropout (eval mode or dropout 0); each graph's
mask is independent of the other graphs' data either way, which is all the bound needs.
"""

from __future__ import annotations

import math
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from trellis.silo.models.batching import GraphBatch, PackedGraphs
from trellis.silo.models.parameter_taps import tapping

METHODS = ("fast", "microbatch")
# Relative tolerance of the fast method's self-check: per-graph gradients summed in another
# order than autograd's batch gradient differ by float32 rounding, far below this.
SELF_CHECK_RTOL = 1e-3

# Layers whose output for one row depends on other rows of the batch. On [rows, channels]
# input, InstanceNorm1d normalises each channel over all rows: another BatchNorm.
_CROSS_GRAPH_LAYERS: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
)


def poisson_sample(count: int, rate: float, generator: torch.Generator) -> Tensor:
    """Each of ``count`` graphs independently with probability ``rate``: indices, increasing."""
    if count < 0:
        raise ValueError(f"count must be non-negative, got {count}")
    if not 0.0 <= rate <= 1.0 or math.isnan(rate):
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    # Poisson sampling (not a fixed batch size) is what the subsampled-Gaussian accountants
    # assume; the batch may be empty.
    chosen = torch.rand(count, generator=generator) < rate
    return chosen.nonzero().flatten()


def check_per_graph_model(model: nn.Module) -> None:
    """Refuse a model in which a layer mixes the graphs of a batch (ValueError naming it)."""
    for name, module in model.named_modules():
        if isinstance(module, _CROSS_GRAPH_LAYERS):
            raise ValueError(
                f"layer {name or '(the model)'!r} ({type(module).__name__}) normalises over all "
                "rows of a batch, so one graph changes every other graph's gradient and "
                "per-graph clipping bounds nothing; build the model with per-row normalisation "
                "(plan: model.norm = \"layer\") for DP-SGD")


@dataclass(frozen=True)
class ClippedSum:
    """The sum over graphs of each graph's gradient clipped to L2 norm ``clip``.

    ``norms`` (each graph's gradient norm before clipping) are private to the silo: they depend
    on single graphs and are for tests only, never to be released or logged.
    """

    gradients: dict[str, Tensor]       # parameter name -> summed clipped gradient
    graphs: int
    method: str                        # the method that computed it
    fallback: str = ""                 # why "fast" was asked for and "microbatch" ran
    norms: Tensor = field(default_factory=lambda: torch.zeros(0), repr=False)


def graph_nll(model: nn.Module) -> Callable[[GraphBatch], Tensor]:
    """Per-graph loss of a graph classifier: negative log-likelihood of each graph's label."""
    def loss(batch: GraphBatch) -> Tensor:
        out = model(batch.x, batch.adjacency, batch.batch, batch.num_graphs, batch.stc_enc,
                    batch.gcn_adjacency)
        return F.nll_loss(out, batch.y, reduction="none")
    return loss


def clipped_gradient_sum(model: nn.Module, per_graph_loss: Callable[[GraphBatch], Tensor],
                         packed: PackedGraphs, ids: Tensor, clip: float, *,
                         method: str = "fast") -> ClippedSum:
    """Sum over graphs ``ids`` of each graph's whole gradient scaled by min(1, clip / norm)."""
    if method not in METHODS:
        raise ValueError(f"no method called {method!r}; valid choices: " + ", ".join(METHODS))
    if not clip > 0 or math.isinf(clip):
        raise ValueError(f"clip must be a positive finite number, got {clip}")
    check_per_graph_model(model)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    ids = ids.long().flatten()
    if ids.numel() == 0:
        return ClippedSum({n: torch.zeros_like(p) for n, p in params.items()}, 0, method)
    # Batches go where the parameters are: every tensor made below follows them.
    device = next(iter(params.values())).device if params else torch.device("cpu")
    if method == "microbatch":
        return _microbatch(params, per_graph_loss, packed, ids, clip, device)
    return _fast(model, params, per_graph_loss, packed, ids, clip, device)


def _check_losses(losses: Tensor, graphs: int) -> None:
    if losses.shape != (graphs,):
        raise ValueError(f"per_graph_loss returned shape {tuple(losses.shape)}; expected one "
                         f"loss per graph ({graphs},)")


def _clip_factors(norms: Tensor, clip: float) -> Tensor:
    # clip / max(norm, clip): 1 for small gradients, and no division by a zero norm.
    return clip / torch.clamp(norms, min=clip)


def _microbatch(params: dict[str, nn.Parameter], per_graph_loss: Callable[[GraphBatch], Tensor],
                packed: PackedGraphs, ids: Tensor, clip: float, device: torch.device,
                fallback: str = "") -> ClippedSum:
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    norms = torch.zeros(ids.numel(), device=device)
    for i in range(ids.numel()):
        losses = per_graph_loss(packed.select(ids[i:i + 1]).to(device))
        _check_losses(losses, 1)
        grads = torch.autograd.grad(losses.sum(), list(params.values()), allow_unused=True)
        flat = [g for g in grads if g is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in flat])
                                        ) if flat else torch.zeros((), device=device)
        norms[i] = norm
        factor = float(_clip_factors(norm, clip))
        for name, g in zip(params, grads, strict=True):
            if g is not None:
                total[name].add_(g, alpha=factor)
    return ClippedSum(total, int(ids.numel()), "microbatch", fallback, norms)


class _Unsupported(Exception):
    """The fast method cannot vouch for this model or batch; the message says why."""


@dataclass
class _Use:
    """One reported use of parameters: its input rows and (after backward) output gradient."""

    kind: str                          # "linear", "bias" or "affine" (LayerNorm)
    weight: Tensor | None
    bias: Tensor | None
    x: Tensor | None                   # linear: input rows; affine: normalised rows
    scale: Tensor | None               # bias: per-row multiplier
    out: Tensor
    versions: tuple[int, ...]
    grad: Tensor | None = None


class _Recorder:
    """A parameter tap that keeps every use and catches its output's gradient."""

    def __init__(self) -> None:
        self.uses: list[_Use] = []

    def _keep(self, use: _Use) -> None:
        if not use.out.requires_grad:
            return                     # no trainable parameter or input behind it
        self.uses.append(use)
        # A weak reference: `use` holds the tensor, whose hook would otherwise hold `use` back,
        # a cycle through torch's C++ side that Python's collector cannot see (a leak of the
        # whole batch's activations per call).
        kept = weakref.ref(use)

        def catch(grad: Tensor) -> None:
            target = kept()
            if target is not None:
                target.grad = grad if target.grad is None else target.grad + grad
        use.out.register_hook(catch)

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> None:
        """Keep ``out = x W^T + b``."""
        self._keep(_Use("linear", weight, bias, x.detach(), None, out,
                        (x._version, out._version)))

    def bias(self, out: Tensor, bias: Tensor, scale: Tensor | None) -> None:
        """Keep ``out = h + scale * b``."""
        self._keep(_Use("bias", None, bias, None, None if scale is None else scale.detach(),
                        out, (out._version,)))

    def layer_norm(self, module: nn.Module, inputs: tuple[Tensor, ...], out: Tensor) -> None:
        """Keep a LayerNorm's ``out = x_hat * w + b`` (x_hat recomputed without affine)."""
        if not isinstance(module, nn.LayerNorm):
            return
        x = inputs[0].detach()
        x_hat = F.layer_norm(x, module.normalized_shape, eps=module.eps)
        self._keep(_Use("affine", module.weight, module.bias, x_hat, None, out,
                        (x_hat._version, out._version)))


@contextmanager
def _recording(model: nn.Module) -> Iterator[_Recorder]:
    recorder = _Recorder()
    handles = [m.register_forward_hook(recorder.layer_norm) for m in model.modules()
               if isinstance(m, nn.LayerNorm) and m.elementwise_affine]
    try:
        with tapping(recorder):
            yield recorder
    finally:
        for handle in handles:
            handle.remove()


def _fast(model: nn.Module, params: dict[str, nn.Parameter],
          per_graph_loss: Callable[[GraphBatch], Tensor], packed: PackedGraphs, ids: Tensor,
          clip: float, device: torch.device) -> ClippedSum:
    batch = packed.select(ids).to(device)
    why = ""
    try:
        per_graph = _per_graph_gradients(model, params, per_graph_loss, batch)
    except _Unsupported as unsupported:
        why = str(unsupported)
    except torch.OutOfMemoryError:
        # The padded per-graph products hold [graphs, largest graph, width] at once: on a GPU
        # a large batch may not fit where one graph at a time does.
        why = f"out of memory on {device}"
    if why:
        # Out of the handler, so the failed pass's tensors are freed before the fallback runs.
        reason = f"fast per-graph gradients unavailable: {why}; used one pass per graph"
        warnings.warn(reason, RuntimeWarning, stacklevel=3)
        del batch
        return _microbatch(params, per_graph_loss, packed, ids, clip, device, reason)
    squares = torch.stack([g.flatten(1).pow(2).sum(1) for g in per_graph.values()]).sum(0)
    norms = squares.sqrt()
    factors = _clip_factors(norms, clip)
    gradients = {n: torch.tensordot(factors, g, dims=1) for n, g in per_graph.items()}
    return ClippedSum(gradients, batch.num_graphs, "fast", "", norms)


def _per_graph_gradients(model: nn.Module, params: dict[str, nn.Parameter],
                         per_graph_loss: Callable[[GraphBatch], Tensor], batch: GraphBatch
                         ) -> dict[str, Tensor]:
    """Each parameter's gradient graph by graph, [graphs, *shape], from one batched pass."""
    with _recording(model) as recorder:
        losses = per_graph_loss(batch)
    _check_losses(losses, batch.num_graphs)
    totals = torch.autograd.grad(losses.sum(), list(params.values()), allow_unused=True)
    rows = _RowGraphs(batch)
    by_id = {id(p): n for n, p in params.items()}
    per_graph: dict[str, Tensor] = {}

    def add(param: Tensor | None, value: Tensor) -> None:
        name = by_id.get(id(param)) if param is not None else None
        if name is None:
            return                     # a frozen parameter or a plain tensor
        per_graph[name] = per_graph[name] + value if name in per_graph else value

    for use in recorder.uses:
        if use.grad is None:
            continue                   # this output does not reach the loss
        _check_versions(use)
        delta = use.grad
        graph = rows.of(delta.size(0))
        if use.kind == "linear":
            assert use.x is not None and use.weight is not None
            if delta.dim() != 2 or use.x.dim() != 2:
                raise _Unsupported("a dense product of other than 2-D rows")
            add(use.weight, rows.outer_sums(delta, use.x, graph))
            if use.bias is not None:
                add(use.bias, rows.sums(delta, graph))
        elif use.kind == "bias":
            assert use.bias is not None
            scaled = delta if use.scale is None else delta * use.scale
            add(use.bias, rows.sums(scaled.reshape(delta.size(0), -1), graph
                                    ).view(-1, *use.bias.shape))
        else:
            assert use.x is not None
            add(use.weight, rows.sums(delta * use.x, graph))
            add(use.bias, rows.sums(delta, graph))
    for (name, param), total in zip(params.items(), totals, strict=True):
        if total is None:
            per_graph.setdefault(name, param.new_zeros(batch.num_graphs, *param.shape))
            continue
        found = per_graph.get(name)
        if found is None:
            if bool(total.abs().max() > 0):
                raise _Unsupported(f"parameter {name!r} is used where no tap reports it")
            per_graph[name] = param.new_zeros(batch.num_graphs, *param.shape)
            continue
        summed = found.sum(0)
        tolerance = SELF_CHECK_RTOL * max(float(total.abs().max()), 1e-6)
        if float((summed - total).abs().max()) > tolerance:
            raise _Unsupported(f"the per-graph gradients of {name!r} do not add up to its batch "
                               "gradient (a use no tap reports)")
    return {n: per_graph[n] for n in params}


def _check_versions(use: _Use) -> None:
    tensors = ([use.x, use.out] if use.kind != "bias" else [use.out])
    current = tuple(t._version for t in tensors if t is not None)
    if current != use.versions:
        raise _Unsupported("a tapped tensor was changed in place after its use")


class _RowGraphs:
    """Which graph each row of a tapped tensor belongs to: node rows or graph rows."""

    def __init__(self, batch: GraphBatch) -> None:
        self.graphs = batch.num_graphs
        self.node_graph = batch.batch
        if self.node_graph.numel() > 1 and bool((self.node_graph.diff() < 0).any()):
            raise _Unsupported("the batch's nodes are not grouped by graph")
        counts = torch.bincount(self.node_graph, minlength=self.graphs + 1)
        self.start = torch.cumsum(counts, 0) - counts
        self.largest = int(counts[:self.graphs].max()) if self.graphs else 0
        self.identity = torch.arange(self.graphs, device=self.node_graph.device)
        # With as many node rows as graphs, a row count cannot tell node rows from graph rows;
        # it need not when the two maps are the same.
        self.ambiguous = (self.node_graph.numel() == self.graphs
                          and not torch.equal(self.node_graph, self.identity))

    def of(self, rows: int) -> Tensor:
        """The graph of each of ``rows`` rows (``graphs`` for padding rows)."""
        if rows == self.node_graph.numel() and rows == self.graphs and self.ambiguous:
            raise _Unsupported("as many node rows as graphs, with a graph of other than one "
                               "node: rows cannot be told from graphs")
        if rows == self.node_graph.numel():
            return self.node_graph
        if rows == self.graphs:
            return self.identity
        raise _Unsupported(f"a tapped tensor has {rows} rows: neither the batch's "
                           f"{self.node_graph.numel()} nodes nor its {self.graphs} graphs")

    def sums(self, values: Tensor, graph: Tensor) -> Tensor:
        """Per-graph sums of rows: [graphs, *row shape] (padding rows left out)."""
        out = values.new_zeros(self.graphs + 1, *values.shape[1:])
        return out.index_add_(0, graph, values)[:self.graphs]

    def outer_sums(self, delta: Tensor, x: Tensor, graph: Tensor) -> Tensor:
        """Per graph ``sum_n delta_n x_n^T`` over its rows: [graphs, out, in]."""
        if graph is self.identity:
            return delta.unsqueeze(2) * x.unsqueeze(1)
        # Rows padded per graph to the largest graph, then one batched product: the arithmetic
        # of the layer's own weight gradient times (largest graph / mean graph).
        real = graph < self.graphs
        g = graph[real]
        position = (torch.arange(graph.numel(), device=graph.device)[real]
                    - self.start.index_select(0, g))
        d = delta.new_zeros(self.graphs, self.largest, delta.size(1))
        a = x.new_zeros(self.graphs, self.largest, x.size(1))
        d[g, position] = delta[real]
        a[g, position] = x[real]
        return torch.bmm(d.transpose(1, 2), a)
