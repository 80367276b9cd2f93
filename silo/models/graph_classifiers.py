"""Graph classification models of the reference code, with its parameter names.

``GIN`` is the baseline of docs/algorithms.md §1.3 (GCFL's and FedStar's Local);
``DualChannelGIN`` is FedStar's ``GIN_dc`` (§2.2): a local GIN feature channel fed at every
layer by a shareable GCN structure channel; ``DualDenseGIN`` is FedDense's dual-densely
connected model (§4.3/§4.4).

PyG semantics kept: ``GINConv`` with eps = 0 (not trained) and sum aggregation; ``GCNConv`` with
self loops and symmetric normalisation; sum pooling. Modules with PyG's names and initialisation
hold the parameters (silo/models/convolutions.py; the names match the reference), but message
passing is done here as one sparse product per layer
(silo/models/propagation.py): PyG's generic ``propagate`` machinery, and any gather/scatter of
per-edge messages, costs more than the arithmetic for small molecules. The edges may be given as a
``[2, E]`` list or as a prebuilt ``Adjacency``; silo/models/batching.py builds those, and the GCN
normalisation, once per graph.

Over 400 lines because the layer functions at the top (GIN and GCN steps, dropout, tanh, with
their hand-written backwards) exist only for these three models' speed: they are changed,
benchmarked and tested together with the models that call them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
from torch.nn import functional as F

from trellis.protos.plan import MODEL_NORMS, ModelConfig
from trellis.silo.models.convolutions import GCNConv, GINConv
from trellis.silo.models.dense import Linear, linear, split_linear
from trellis.silo.models.padding_masks import active_padding, masked_batch_norm
from trellis.silo.models.parameter_taps import active_tap, add_bias
from trellis.silo.models.propagation import Adjacency, gcn_weights
from trellis.silo.models.shards import (
    BatchShard,
    RowSpan,
    batch_norm,
    graph_rows,
    keep_mask,
    node_rows,
    own_rows,
)


def _gin_mlp(in_dim: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(Linear(in_dim, hidden), nn.ReLU(), Linear(hidden, hidden))


def dropout(x: Tensor, p: float, training: bool, rows: RowSpan | None = None) -> Tensor:
    """Inverted dropout with a cheap mask (silo/models/shards.py ``keep_mask``): about 3.5x faster
    on CPU than ``torch.rand_like``.

    ``rows``: x is one process's part of a sharded batch (``silo join --nproc``); the mask is
    drawn for the whole batch and this part's rows are kept, as one process would draw them.
    """
    if not training or p == 0.0:
        return x
    # The scaled keep-mask is the one tensor autograd saves.
    return x * _keep(x, p, rows).mul_(1.0 / (1.0 - p))


def _keep(x: Tensor, p: float, rows: RowSpan | None) -> Tensor:
    """The keep mask (0 or 1) for x, or for x's rows of a sharded batch's mask."""
    if torch.compiler.is_compiling():
        # Drawn outside a compiled graph (silo/models/compiled.py), by the plain path's own ops:
        # the same masks from the same random state (and the compiler mistraces the byte view).
        if _keep_uncompiled is None:
            raise RuntimeError("compiled dropout needs prepare_compiled_dropout() first "
                               "(silo/models/compiled.py's compiled_forward_and_loss calls it)")
        return _keep_uncompiled(x, p, rows)
    return _draw_keep(x, p, rows)


def _draw_keep(x: Tensor, p: float, rows: RowSpan | None) -> Tensor:
    if rows is None:
        return keep_mask(x, p)
    return own_rows(keep_mask(x, p, rows.rows), rows, x.size(0))


# The draw that compiled graphs call out to. Made only when a compiled path is prepared:
# torch.compiler.disable imports torch._dynamo, over a second of CPU in every process otherwise.
_keep_uncompiled: Callable[[Tensor, float, RowSpan | None], Tensor] | None = None


def prepare_compiled_dropout() -> None:
    """Make the dropout draw that compiled graphs leave to the plain path (once a process)."""
    global _keep_uncompiled
    if _keep_uncompiled is None:
        _keep_uncompiled = torch.compiler.disable(_draw_keep)


def tanh(x: Tensor) -> Tensor:
    """``tanh`` as ``2 sigmoid(2x) - 1``: about 5x faster on CPU than torch's, error under 2e-7.

    torch's CPU tanh does not vectorise well (0.5 ms for a batch of NCI1 nodes against 0.06 ms
    for sigmoid). FedStar's and FedDense's structure channels apply it to every node at every
    layer (FedStar's ordinary training through ``gcn_tanh``, which folds in more).
    """
    return _Tanh.apply(x)


class _Tanh(torch.autograd.Function):
    """Forward through sigmoid; backward ``1 - tanh^2`` from the saved output, as torch's."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        out = torch.sigmoid(x * 2).mul_(2).sub_(1)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[override]
        (out,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, out)


def gcn_tanh(conv: GCNConv, x: Tensor, weight: Tensor, adjacency: Adjacency,
             product_bias: Tensor | None = None) -> Tensor:
    """``tanh(gcn_layer_from_product(conv, linear(x, weight, product_bias), adjacency))``: the
    structure channel of FedStar's model, ``weight`` the layer's (or one folded into it).

    ``tanh(u) = 2 sigmoid(2 u) - 1``: with the factor 2 taken into the (small) weights and
    biases, the sum over neighbours, the bias, the sigmoid and its affine map run in one
    function on one tensor, three passes over it where the layer-by-layer form makes five
    and two new tensors. Its backward is one pass plus the products. Only for ordinary
    training: a parameter tap (silo/models/parameter_taps.py) must see the weight as it is.
    """
    y2 = linear(x, weight * 2, None if product_bias is None else product_bias * 2)
    bias = None if conv.bias is None else conv.bias * 2
    return _GcnTanh.apply(y2, bias, adjacency)


_MINUS_ONE = torch.tensor(-1.0)


class _GcnTanh(torch.autograd.Function):
    """``2 sigmoid(A y2 + b2) - 1``, which is ``tanh((A y2 + b2) / 2)``; A is constant."""

    @staticmethod
    def forward(ctx, y2: Tensor, b2: Tensor | None,  # type: ignore[override]
                adjacency: Adjacency) -> Tensor:
        out = adjacency.times(y2)
        if b2 is not None:
            out.add_(b2)
        torch.sigmoid(out, out=out)
        if torch.compiler.is_compiling():
            # The compiler fuses these itself, and its fake tensors refuse the CPU scalar below
            # beside a CUDA tensor ("cross-device copies are not allowed").
            out.mul_(2).sub_(1)
        else:
            # One pass for 2 s - 1; a CPU scalar tensor is accepted on any device without a copy.
            torch.add(_MINUS_ONE, out, alpha=2, out=out)
        ctx.save_for_backward(out)
        ctx.adjacency = adjacency
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor  # type: ignore[override]
                 ) -> tuple[Tensor | None, Tensor | None, None]:
        (out,) = ctx.saved_tensors
        # grad (1 - out^2) is twice the gradient at A y2 + b2 (d tanh(v/2)/dv = (1 - out^2)/2);
        # the half is taken in the sparse product's scale and on the bias's short sum.
        twice = torch.ops.aten.tanh_backward(grad, out)
        grad_y2 = ctx.adjacency.transpose_times(twice, 0.5) if ctx.needs_input_grad[0] else None
        grad_b2 = twice.sum(0).mul_(0.5) if ctx.needs_input_grad[1] else None
        return grad_y2, grad_b2, None


def sum_pool(x: Tensor, batch: Tensor, num_graphs: int) -> Tensor:
    """Per-graph sum of node vectors (PyG ``global_add_pool``); rows of graph ``num_graphs``
    (padding, silo/models/batching.py) are left out."""
    return x.new_zeros(num_graphs + 1, x.size(1)).index_add_(0, batch, x)[:num_graphs]


def node_counts(batch: Tensor, num_graphs: int) -> Tensor:
    """Nodes per graph, padding rows left out."""
    if batch.device.type != "cpu":
        # bincount waits for the GPU (it reads the largest id to size its output).
        return batch.new_zeros(num_graphs + 1).index_add_(
            0, batch, torch.ones_like(batch))[:num_graphs]
    return torch.bincount(batch, minlength=num_graphs + 1)[:num_graphs]


def gin_layer(conv: GINConv, x: Tensor, adjacency: Adjacency) -> Tensor:
    """``mlp((1 + eps) x_v + sum of neighbour x_u)``, messages flowing source -> target.

    The MLP's first layer is linear, so it is applied before the neighbourhood sum (bias added
    once after it): the same value, with messages of the hidden width instead of the input's.
    """
    first = conv.nn[0]
    if not isinstance(first, nn.Linear):
        raise TypeError("gin_layer expects a GIN MLP that starts with nn.Linear")
    return gin_layer_from_product(conv, linear(x, first.weight), adjacency)


def gin_layer_from_product(conv: GINConv, y: Tensor, adjacency: Adjacency) -> Tensor:
    """``gin_layer`` given ``y``, the product of its input with the MLP's first weight (no bias)."""
    return conv.nn[1:](_gin_sum(conv, y, adjacency))


def _gin_sum(conv: GINConv, y: Tensor, adjacency: Adjacency) -> Tensor:
    """``(1 + eps) y_v + sum of neighbour y_u``, plus the MLP's first bias: a fresh tensor that
    autograd does not keep (safe to change in place)."""
    h = adjacency(y)
    if isinstance(conv.eps, nn.Parameter) or conv.initial_eps != 0:
        h = h + (1 + conv.eps) * y
    else:
        h.add_(y)
    first = conv.nn[0]
    bias = first.bias if isinstance(first, nn.Linear) else None
    return add_bias(h, bias, in_place=True) if bias is not None else h


def _gin_mlp_in_place(conv: GINConv, y: Tensor, adjacency: Adjacency) -> Tensor:
    """``gin_layer_from_product(conv, y, adjacency)`` before its last ReLU, for a plain GIN MLP
    (Linear, ReLU, Linear): a fresh tensor autograd does not keep, for ``relu_dropout``.

    The inner ReLU's input (a message-passing sum) is not kept by autograd either, so it is
    rectified in place. Only for ordinary training: a parameter tap (silo/models/parameter_taps.py)
    must see each product's output as made.
    """
    modules = list(conv.nn)
    last = modules[-1]
    if len(modules) != 3 or not isinstance(modules[1], nn.ReLU) or not isinstance(last, nn.Linear):
        raise TypeError("expected a GIN MLP of Linear, ReLU, Linear")
    return linear(_gin_sum(conv, y, adjacency).relu_(), last.weight, last.bias)


def relu_dropout(z: Tensor, p: float, training: bool, rows: RowSpan | None = None) -> Tensor:
    """``dropout(relu(z))`` for a fresh ``z`` that autograd does not keep (a product's output),
    computed in place in ``z``.

    Autograd keeps only the result: where it is positive the gradient passes, scaled. Neither
    the mask nor a rectified copy is kept, and the output is ``z`` itself, not a new
    [rows, width] tensor.
    """
    if not training or p == 0.0:
        return z.relu_()
    return _ReluDropout.apply(z, _keep(z, p, rows), 1.0 / (1.0 - p))


class _ReluDropout(torch.autograd.Function):
    """``relu(z) * keep * scale`` in place in ``z``; ``keep`` holds 0 or 1."""

    @staticmethod
    def forward(ctx, z: Tensor, keep: Tensor, scale: float) -> Tensor:  # type: ignore[override]
        out = z.relu_().mul_(keep.mul_(scale))
        ctx.mark_dirty(z)
        ctx.save_for_backward(out)
        ctx.scale = scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        (out,) = ctx.saved_tensors
        # A value survives both exactly where the result is positive.
        return torch.ops.aten.threshold_backward(grad, out, 0).mul_(ctx.scale), None, None


def gcn_normalisation(edge_index: Tensor, num_nodes: int) -> Adjacency:
    """Edges plus one self loop per node, weighted ``deg^-1/2 (A + I) deg^-1/2`` (PyG gcn_norm)."""
    loops = torch.arange(num_nodes, device=edge_index.device)
    edge_weight, loop_weight = gcn_weights(edge_index[0], edge_index[1], num_nodes)
    return Adjacency.from_edges(torch.cat([edge_index, torch.stack([loops, loops])], dim=1),
                                num_nodes, torch.cat([edge_weight, loop_weight]))


def gcn_layer(conv: GCNConv, x: Tensor, adjacency: Adjacency) -> Tensor:
    """``sum_u norm_uv (x_u W) + b`` over the normalised edges (self loops included)."""
    return gcn_layer_from_product(conv, linear(x, conv.lin.weight, conv.lin.bias), adjacency)


def gcn_layer_from_product(conv: GCNConv, y: Tensor, adjacency: Adjacency) -> Tensor:
    """``gcn_layer`` given ``y``, the product of its input with its weight."""
    out = adjacency(y)
    return add_bias(out, conv.bias) if conv.bias is not None else out


def as_adjacency(edges: Tensor | Adjacency, num_nodes: int) -> Adjacency:
    """A ``[2, E]`` edge list as an ``Adjacency``; an ``Adjacency`` as it is."""
    if isinstance(edges, Adjacency):
        if edges.num_nodes != num_nodes:
            raise ValueError(f"the adjacency has {edges.num_nodes} nodes; the features have "
                             f"{num_nodes} rows")
        return edges
    return Adjacency.from_edges(edges, num_nodes)


def _gcn_adjacency(edges: Tensor | Adjacency, num_nodes: int,
                   gcn: Adjacency | None) -> Adjacency:
    if gcn is not None:
        return gcn
    edge_index = edges.edge_index if isinstance(edges, Adjacency) else edges
    return gcn_normalisation(edge_index, num_nodes)


class GIN(nn.Module):
    """Plain GIN: pre -> 3 x (GINConv, ReLU, dropout) -> sum pool -> post -> readout.

    Input ``x`` [N, n_feat], output log-probabilities [B, n_classes].
    """

    # Zero padding rows (silo/models/batching.py) never reach a real node or a pooled graph.
    accepts_padded_rows = True

    def __init__(self, n_feat: int, n_classes: int, hidden: int = 64, layers: int = 3,
                 dropout: float = 0.5) -> None:
        super().__init__()
        self.n_feat, self.n_classes, self.hidden = n_feat, n_classes, hidden
        self.n_layers, self.dropout = layers, dropout
        self.pre = nn.Sequential(Linear(n_feat, hidden))
        self.graph_convs = nn.ModuleList(GINConv(_gin_mlp(hidden, hidden)) for _ in range(layers))
        self.post = nn.Sequential(Linear(hidden, hidden), nn.ReLU())
        self.readout = nn.Sequential(Linear(hidden, n_classes))

    def forward(self, x: Tensor, edge_index: Tensor | Adjacency, batch: Tensor,
                num_graphs: int, stc_enc: Tensor | None = None,
                gcn: Adjacency | None = None, shard: BatchShard | None = None) -> Tensor:
        """Log-probabilities per graph (``shard``: this process's part of a sharded batch)."""
        adjacency = as_adjacency(edge_index, x.size(0))
        h = self.pre(x)
        for conv in cast(list[GINConv], self.graph_convs):
            h = dropout(torch.relu(gin_layer(conv, h, adjacency)), self.dropout, self.training,
                        node_rows(shard))
        g = sum_pool(h, batch, num_graphs)
        g = dropout(self.post(g), self.dropout, self.training, graph_rows(shard))
        return torch.log_softmax(self.readout(g), dim=1)


class DualChannelGIN(nn.Module):
    """FedStar's GIN_dc: local GIN feature channel + shareable GCN structure channel.

    Per layer the feature GIN sees ``[h_{l-1} || g_{l-1}]``; the structure channel is
    ``g_l = tanh(GCNConv(g_{l-1}))`` with no dropout. ``Whp`` maps ``[h_L || g_L]`` per node
    before sum pooling, as in the reference code (docs/algorithms.md §7 FedStar item 4).
    """

    accepts_padded_rows = True

    def __init__(self, n_feat: int, n_classes: int, n_se: int = 32, hidden: int = 64,
                 layers: int = 3, dropout: float = 0.5) -> None:
        super().__init__()
        self.n_feat, self.n_classes, self.n_se, self.hidden = n_feat, n_classes, n_se, hidden
        self.n_layers, self.dropout = layers, dropout
        self.pre = nn.Sequential(Linear(n_feat, hidden))
        self.embedding_s = Linear(n_se, hidden)
        self.graph_convs = nn.ModuleList(
            GINConv(_gin_mlp(2 * hidden, hidden)) for _ in range(layers)
        )
        self.graph_convs_s_gcn = nn.ModuleList(GCNConv(hidden, hidden) for _ in range(layers))
        self.Whp = Linear(2 * hidden, hidden)
        self.post = nn.Sequential(Linear(hidden, hidden), nn.ReLU())
        self.readout = nn.Sequential(Linear(hidden, n_classes))

    def forward(self, x: Tensor, edge_index: Tensor | Adjacency, batch: Tensor,
                num_graphs: int, stc_enc: Tensor | None = None,
                gcn: Adjacency | None = None, shard: BatchShard | None = None) -> Tensor:
        """Log-probabilities per graph; ``stc_enc`` [N, n_se] is required."""
        if stc_enc is None:
            raise ValueError("DualChannelGIN needs structure embeddings (stc_enc)")
        adjacency = as_adjacency(edge_index, x.size(0))
        gcn = _gcn_adjacency(adjacency, x.size(0), gcn)
        convs = cast(list[tuple[GINConv, GCNConv]],
                     list(zip(self.graph_convs, self.graph_convs_s_gcn, strict=True)))
        # Whp is affine and applied per node before a sum: pooling first and adding the bias
        # once per node gives the same value with a fraction of the multiplications.
        nodes = node_counts(batch, num_graphs).to(x.dtype).unsqueeze(1)
        if active_tap() is None:
            h, g = self._first_layer(x, stc_enc, adjacency, gcn, shard)
            for conv, conv_s in convs[1:]:
                h, g = self._next_layer(conv, conv_s, h, g, adjacency, gcn, shard)
            # Each channel pooled on its own: no [nodes, 2 hidden] copy of both, forwards or
            # in the gradient.
            z = split_linear(sum_pool(h, batch, num_graphs), sum_pool(g, batch, num_graphs),
                             self.Whp.weight)
        else:
            # Per-graph gradients (silo/privacy/per_graph_gradients.py) need every parameter to
            # enter through its own reported product, and each reported output left as it was made:
            # layer by layer, no folded weights, nothing in place.
            h, g = self.pre(x), self.embedding_s(stc_enc)
            for conv, conv_s in convs:
                h = dropout(torch.relu(gin_layer(conv, torch.cat((h, g), dim=-1), adjacency)),
                            self.dropout, self.training, node_rows(shard))
                g = tanh(gcn_layer(conv_s, g, gcn))
            z = linear(sum_pool(torch.cat((h, g), dim=-1), batch, num_graphs), self.Whp.weight)
        z = add_bias(z, self.Whp.bias, nodes)
        z = dropout(self.post(z), self.dropout, self.training, graph_rows(shard))
        return torch.log_softmax(self.readout(z), dim=1)

    def _first_layer(self, x: Tensor, stc_enc: Tensor, adjacency: Adjacency, gcn: Adjacency,
                     shard: BatchShard | None) -> tuple[Tensor, Tensor]:
        """Layer 1's outputs ``(h_1, g_1)`` with ``pre`` and ``embedding_s`` folded into its
        products.

        ``pre`` and ``embedding_s`` are affine and feed nothing but layer 1's two products, so
        their weights are multiplied into that layer's (a hidden x n_feat and a hidden x n_se
        matrix, a few hundred thousand multiplications per step): every node then goes through
        one n_feat-wide and two n_se-wide products instead of ``pre``, ``embedding_s``, a
        2 hidden-wide GIN product and a hidden-wide GCN one, and its input rows need no
        gradient. A fifth of a FedStar step's multiplications, forwards and backwards; the
        values are the same up to float rounding (the products are associated differently).
        """
        conv, conv_s, pre = self.graph_convs[0], self.graph_convs_s_gcn[0], self.pre[0]
        assert isinstance(conv, GINConv) and isinstance(conv_s, GCNConv)  # built so above
        assert isinstance(pre, nn.Linear)
        first = conv.nn[0]
        if not isinstance(first, nn.Linear):
            raise TypeError("the GIN MLP must start with nn.Linear")
        w_gin, w_gcn = first.weight, conv_s.lin.weight
        w_h, w_g = w_gin[:, :self.hidden], w_gin[:, self.hidden:]   # on [h_0 || g_0]
        emb = self.embedding_s
        # [h_0 || g_0] W^T with h_0 = x P^T + p and g_0 = s E^T + e.
        y = linear(x, w_h @ pre.weight, w_h @ pre.bias + w_g @ emb.bias)
        y = y.add_(linear(stc_enc, w_g @ emb.weight))   # fresh: autograd keeps neither
        h = relu_dropout(_gin_mlp_in_place(conv, y, adjacency), self.dropout, self.training,
                         node_rows(shard))
        g = gcn_tanh(conv_s, stc_enc, w_gcn @ emb.weight, gcn, w_gcn @ emb.bias)
        return h, g

    def _next_layer(self, conv: nn.Module, conv_s: nn.Module, h: Tensor, g: Tensor,
                    adjacency: Adjacency, gcn: Adjacency, shard: BatchShard | None
                    ) -> tuple[Tensor, Tensor]:
        """Layer l >= 2's outputs ``(h_l, g_l)``, the same values as the layer-by-layer form.

        The GIN's first product on ``[h || g]`` is taken as ``h W_h^T + g W_g^T``: the
        concatenated copy of both channels (and its split in the backward pass) is never made.
        """
        assert isinstance(conv, GINConv) and isinstance(conv_s, GCNConv)  # built so above
        first = conv.nn[0]
        if not isinstance(first, nn.Linear):
            raise TypeError("the GIN MLP must start with nn.Linear")
        y = split_linear(h, g, first.weight)
        h = relu_dropout(_gin_mlp_in_place(conv, y, adjacency), self.dropout, self.training,
                         node_rows(shard))
        return h, gcn_tanh(conv_s, g, conv_s.lin.weight, gcn)


def norm_layer(kind: str, width: int) -> nn.BatchNorm1d | nn.LayerNorm:
    """FedDense's normalisation (plan ``model.norm``): "batch" or "layer".

    "layer" normalises every row (a node, or a pooled graph) by its own statistics, so no graph
    of a batch changes another's output or gradient: what per-graph DP-SGD needs
    (silo/privacy/per_graph_gradients.py). A per-row LayerNorm rather than GroupNorm: on [rows,
    channels] GroupNorm with one group is the same normalisation, and LayerNorm says so plainly.
    """
    if kind == "batch":
        return nn.BatchNorm1d(width)
    if kind == "layer":
        return nn.LayerNorm(width)
    raise ValueError(f"no normalisation called {kind!r}; valid choices: "
                     + ", ".join(MODEL_NORMS))


def _normalise(norm: nn.Module, x: Tensor, rows: RowSpan | None) -> Tensor:
    if isinstance(norm, nn.BatchNorm1d):
        masks = active_padding()
        if masks is not None:                # a padded batch: statistics of its real rows
            return masked_batch_norm(norm, x, masks.nodes)
        return batch_norm(norm, x, rows)
    return norm(x)                       # per row: sharded rows need nothing from other processes


class DenseTransition(nn.Module):
    """FedDense's H_x / H_s: norm (BatchNorm1d or LayerNorm) -> ReLU -> dropout,
    width-preserving (§4.4)."""

    def __init__(self, width: int, dropout: float, norm: str = "batch") -> None:
        super().__init__()
        self.norm = norm_layer(norm, width)
        self.dropout = dropout

    def forward(self, x: Tensor, rows: RowSpan | None = None) -> Tensor:
        """Normalise, rectify and drop out the concatenated earlier layers (``rows``: x is
        one process's node rows of a sharded batch)."""
        return dropout(torch.relu(_normalise(self.norm, x, rows)), self.dropout, self.training,
                       rows)


def _graph_norm(norm: nn.Module, z: Tensor, training: bool,
                rows: RowSpan | None = None) -> Tensor:
    """Normalise graph vectors; in a training batch a lone graph uses BatchNorm's running
    statistics (a LayerNorm needs no other graph).

    A mini-batch of one graph happens whenever a silo's training count is one more than a
    multiple of the batch size; batch statistics of one row do not exist. In a sharded batch
    (``rows``) the whole batch's graph count decides, so that every process decides alike.
    """
    if not isinstance(norm, nn.BatchNorm1d):
        return norm(z)
    masks = active_padding()
    if masks is not None:                    # a padded batch: statistics of its real graphs
        return masked_batch_norm(norm, z, masks.graphs)
    if training and (z.size(0) if rows is None else rows.real) < 2:
        return F.batch_norm(z, norm.running_mean, norm.running_var, norm.weight, norm.bias,
                            training=False, eps=norm.eps)
    return batch_norm(norm, z, rows)


class DualDenseGIN(nn.Module):
    """FedDense's dual-densely connected model (docs/algorithms.md §4.3, instantiated as §4.4).

    Structural channel (shared): ``s0 = Lin_s(stc)``, ``s_l = tanh(GCN_l(s_{l-1}))``. Feature
    channel (local): layer l sees ``[H_x(x_0..x_{l-1}) || H_s(s_0..s_{l-1})]`` (width 2 l r) and
    a GIN maps it to width r. Readout: sum pool of ``[x_1..x_L || s_1..s_L]`` (6r for L = 3),
    BatchNorm1d over the pooled graph vectors (``norm="layer"``: LayerNorm in every H and
    here, for per-graph DP-SGD), then Linear(2Lr, r) -> ReLU -> dropout ->
    Linear(r, C). Every hidden width is ``r``. The paper leaves H, the GNN types and the head
    open; these are our documented choices (docs/feddense.md).
    """

    # BatchNorm statistics are taken over all node rows: padding rows would change them, but
    # for a batch whose real rows are masked (silo/models/padding_masks.py).
    accepts_padded_rows = False
    takes_padding_masks = True

    def __init__(self, n_feat: int, n_classes: int, n_se: int = 32, width: int = 32,
                 layers: int = 3, dropout: float = 0.5, norm: str = "batch") -> None:
        super().__init__()
        self.n_feat, self.n_classes, self.n_se, self.width = n_feat, n_classes, n_se, width
        self.n_layers, self.dropout, self.norm = layers, dropout, norm
        r = width
        self.Lin_x = Linear(n_feat, r)
        self.Lin_s = Linear(n_se, r)
        self.GCNConv_s = nn.ModuleList(GCNConv(r, r) for _ in range(layers))
        self.H_x = nn.ModuleList(DenseTransition(layer * r, dropout, norm)
                                 for layer in range(1, layers + 1))
        self.H_s = nn.ModuleList(DenseTransition(layer * r, dropout, norm)
                                 for layer in range(1, layers + 1))
        self.GINConv_x = nn.ModuleList(GINConv(_gin_mlp(2 * layer * r, r))
                                       for layer in range(1, layers + 1))
        # Sums over graphs of a few hundred nodes (DD) reach the thousands; without this
        # normalisation the head saturates at once and DD and ENZYMES never leave chance.
        self.readout_norm = norm_layer(norm, 2 * layers * r)
        self.head_hidden = Linear(2 * layers * r, r)
        self.head_out = Linear(r, n_classes)

    def forward(self, x: Tensor, edge_index: Tensor | Adjacency, batch: Tensor,
                num_graphs: int, stc_enc: Tensor | None = None,
                gcn: Adjacency | None = None, shard: BatchShard | None = None) -> Tensor:
        """Log-probabilities per graph; ``stc_enc`` [N, n_se] is required."""
        if stc_enc is None:
            raise ValueError("DualDenseGIN needs structure embeddings (stc_enc)")
        # Checked on the CPU only, where reading a value costs no wait (the trainer pads rows
        # on the CPU alone).
        if (batch.device.type == "cpu" and batch.numel() and int(batch[-1]) >= num_graphs
                and active_padding() is None):
            raise ValueError("DualDenseGIN cannot take padded node rows (its BatchNorm would "
                             "count them)")
        adjacency = as_adjacency(edge_index, x.size(0))
        gcn = _gcn_adjacency(adjacency, x.size(0), gcn)
        xs = [self.Lin_x(x)]
        ss = [self.Lin_s(stc_enc)]
        for layer in range(self.n_layers):
            a = self.H_x[layer](torch.cat(xs, dim=-1), node_rows(shard))
            b = self.H_s[layer](torch.cat(ss, dim=-1), node_rows(shard))
            xs.append(gin_layer(cast(GINConv, self.GINConv_x[layer]), torch.cat((a, b), dim=-1),
                                adjacency))
            ss.append(tanh(gcn_layer(cast(GCNConv, self.GCNConv_s[layer]), ss[-1], gcn)))
        z = _graph_norm(self.readout_norm, sum_pool(torch.cat(xs[1:] + ss[1:], dim=-1), batch,
                                                    num_graphs), self.training, graph_rows(shard))
        z = dropout(torch.relu(self.head_hidden(z)), self.dropout, self.training,
                    graph_rows(shard))
        return torch.log_softmax(self.head_out(z), dim=1)


@dataclass(frozen=True)
class GraphModel:
    """A graph-classification model a row of protos/algorithms.py can name (its `model`)."""

    build: Callable[[int, int, ModelConfig], nn.Module]   # (feature width, classes, [model])
    gcn_adjacency: bool      # batches carry the GCN-normalised adjacency (a GCN channel)


# The trainer hook of each graph-classification algorithm.
GRAPH_MODELS: dict[str, GraphModel] = {
    "gin": GraphModel(lambda n_feat, n_classes, m: GIN(n_feat, n_classes, m.hidden, m.layers,
                                                       m.dropout), gcn_adjacency=False),
    "dual_channel_gin": GraphModel(lambda n_feat, n_classes, m: DualChannelGIN(
        n_feat, n_classes, m.n_rw + m.n_dg, m.hidden, m.layers, m.dropout), gcn_adjacency=True),
    "dual_dense_gin": GraphModel(lambda n_feat, n_classes, m: DualDenseGIN(
        n_feat, n_classes, m.n_rw + m.n_dg, m.width, m.layers, m.dropout, m.norm),
        gcn_adjacency=True),
}


def graph_model(name: str) -> GraphModel:
    """The registered model a row names, failing with the registered choices."""
    try:
        return GRAPH_MODELS[name]
    except KeyError:
        raise ValueError(f"no graph model called {name!r}; registered: "
                         + ", ".join(GRAPH_MODELS)) from None
