"""Model wiring and the declared-shareable rule (STYLE.md principle 12)."""

from __future__ import annotations

import re

import pytest
import torch

from trellis.protos.algorithms import ALGORITHMS
from trellis.protos.algorithms import algorithm as algorithm_spec
from trellis.silo.models.graph_classifiers import GIN, DualChannelGIN, DualDenseGIN


def _sizes(model: torch.nn.Module, names: list[str]) -> int:
    params = dict(model.named_parameters())
    return sum(params[n].numel() for n in names)


def test_fedstar_shares_exactly_the_structure_encoder() -> None:
    model = DualChannelGIN(n_feat=7, n_classes=2)
    spec = algorithm_spec("fedstar")
    shared = spec.shared_names(n for n, _ in model.named_parameters())
    assert shared == sorted(
        ["embedding_s.weight", "embedding_s.bias"]
        + [f"graph_convs_s_gcn.{i}.{p}" for i in range(3) for p in ("lin.weight", "bias")])
    # docs/algorithms.md §2.2: 2,112 + 12,480 values.
    assert _sizes(model, shared) == 2112 + 12480
    local = [n for n, _ in model.named_parameters() if n not in shared]
    assert all(n.split(".")[0] in {"pre", "graph_convs", "Whp", "post", "readout"} for n in local)


def test_fedavg_shares_only_gin_layers_never_input_or_readout() -> None:
    model = GIN(n_feat=37, n_classes=2)
    shared = algorithm_spec("fedavg").shared_names(n for n, _ in model.named_parameters())
    assert shared and all(n.startswith("graph_convs.") for n in shared)
    assert _sizes(model, shared) == 24960  # docs/algorithms.md §3.1
    assert algorithm_spec("local").shared_names(n for n, _ in model.named_parameters()) == []


def test_prefix_rule_is_exact_not_substring() -> None:
    spec = algorithm_spec("fedstar")
    assert not spec.is_shared("graph_convs.0.nn.0.weight")     # contains no '_s' module prefix
    assert not spec.is_shared("embedding_sx.weight")
    assert spec.is_shared("embedding_s.weight")


@pytest.mark.parametrize("n_feat,n_classes", [(7, 2), (3, 6)])
def test_forward_shapes(n_feat: int, n_classes: int) -> None:
    x = torch.randn(5, n_feat)
    edge_index = torch.tensor([[0, 1, 1, 2, 3, 4], [1, 0, 2, 1, 4, 3]])
    batch = torch.tensor([0, 0, 0, 1, 1])
    stc = torch.randn(5, 32)
    for model in (GIN(n_feat, n_classes), DualChannelGIN(n_feat, n_classes)):
        out = model(x, edge_index, batch, 2, stc)
        assert out.shape == (2, n_classes)
        assert torch.allclose(out.exp().sum(dim=1), torch.ones(2), atol=1e-5)
    with pytest.raises(ValueError, match="structure embeddings"):
        DualChannelGIN(n_feat, n_classes)(x, edge_index, batch, 2, None)


def test_unknown_algorithm_lists_choices() -> None:
    with pytest.raises(ValueError, match=re.escape("valid: " + ", ".join(ALGORITHMS))):
        algorithm_spec("fedsgd")


def _two_graph_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(9, 7)
    edge_index = torch.tensor([[0, 1, 1, 2, 3, 4, 5, 6, 6, 7],
                               [1, 0, 2, 1, 4, 3, 6, 5, 7, 6]])
    batch = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])     # node 8 is isolated
    return x, edge_index, batch, torch.randn(9, 32)


def test_own_message_passing_equals_pyg_propagate() -> None:
    """Our index_add GIN/GCN layers and pool-then-Whp give PyG's GIN_dc output exactly."""
    import copy

    import torch.nn.functional as F
    from torch_geometric.nn import GCNConv, GINConv, global_add_pool

    torch.manual_seed(0)
    model = DualChannelGIN(7, 2).eval()
    x, edge_index, batch, stc = _two_graph_batch()
    ours = model(x, edge_index, batch, 3, stc)
    h, g = model.pre(x), model.embedding_s(stc)
    for conv, conv_s in zip(model.graph_convs, model.graph_convs_s_gcn, strict=True):
        # PyG's own layers, given the parameters ours hold (their state dicts are PyG's).
        gin = GINConv(copy.deepcopy(conv.nn))
        gin.load_state_dict(conv.state_dict())
        gcn = GCNConv(conv_s.in_channels, conv_s.out_channels)
        gcn.load_state_dict(conv_s.state_dict())
        h = F.relu(gin(torch.cat((h, g), -1), edge_index))
        g = torch.tanh(gcn(g, edge_index))
    z = global_add_pool(model.Whp(torch.cat((h, g), -1)), batch)
    reference = F.log_softmax(model.readout(model.post(z)), dim=1)
    assert torch.allclose(ours, reference, atol=1e-5)


def test_dual_dense_wiring_shapes_and_shared_channel() -> None:
    """FedDense (docs/algorithms.md §4.3): layer l of the feature channel sees 2*l*r inputs."""
    r = 16
    model = DualDenseGIN(n_feat=7, n_classes=3, width=r)
    for layer in range(3):
        assert model.GINConv_x[layer].nn[0].in_features == 2 * (layer + 1) * r
        assert model.H_x[layer].norm.num_features == (layer + 1) * r
        assert model.H_s[layer].norm.num_features == (layer + 1) * r
    assert model.head_hidden.in_features == 6 * r
    x, edge_index, batch, stc = _two_graph_batch()
    out = model.train()(x, edge_index, batch, 3, stc)
    assert out.shape == (3, 3)
    shared = algorithm_spec("feddense").shared_names(n for n, _ in model.named_parameters())
    assert shared == sorted(["Lin_s.weight", "Lin_s.bias"]
                            + [f"GCNConv_s.{i}.{p}" for i in range(3) for p in ("lin.weight",
                                                                                   "bias")])
    # Structural channel only: 32*r + r + 3*(r*r + r) values; BN statistics never leave.
    assert _sizes(model, shared) == 32 * r + r + 3 * (r * r + r)


def test_dual_dense_normalises_pooled_graphs_and_takes_a_lone_graph() -> None:
    """The head sees batch-normalised graph sums; a one-graph training batch still trains."""
    model = DualDenseGIN(n_feat=7, n_classes=3, width=8).train()
    x, edge_index, batch, stc = _two_graph_batch()
    seen: list[torch.Tensor] = []
    model.head_hidden.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    model(x, edge_index, batch, 3, stc)
    assert torch.allclose(seen[-1].mean(0), torch.zeros(48), atol=1e-5)
    # Only graph 0 (batch id 0): statistics of one row do not exist, the running ones are used.
    rows = batch == 0
    keep = rows[edge_index[0]] & rows[edge_index[1]]
    running = model.readout_norm.running_mean.clone()
    out = model(x[rows], edge_index[:, keep], batch[rows], 1, stc[rows])
    assert out.shape == (1, 3) and torch.isfinite(out).all()
    assert torch.equal(model.readout_norm.running_mean, running)
    out.sum().backward()
    assert model.head_hidden.weight.grad is not None


def test_packed_batches_match_pyg_collation() -> None:
    """Mini-batches cut from packed graphs equal PyG's Batch.from_data_list, GCN norms included."""
    from torch_geometric.data import Batch, Data
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    from trellis.silo.models.batching import PackedGraphs

    gen = torch.Generator().manual_seed(3)
    graphs = []
    for size in (3, 1, 5, 4, 2):
        edges = torch.randint(0, size, (2, 2 * size), generator=gen)
        edges = edges[:, edges[0] != edges[1]]
        edges = torch.unique(torch.cat([edges, edges.flip(0)], 1), dim=1)
        graphs.append(Data(x=torch.randn(size, 4, generator=gen), edge_index=edges,
                           y=torch.tensor([size % 2]), stc_enc=torch.randn(size, 32,
                                                                           generator=gen)))
    packed = PackedGraphs(graphs, structure=True, gcn=True)
    ids = torch.tensor([4, 0, 2])
    ours = packed.select(ids)
    reference = Batch.from_data_list([graphs[i] for i in ids])
    assert torch.equal(ours.x, reference.x) and torch.equal(ours.batch, reference.batch)
    # Ours are sorted by target (for the CSR products); PyG's by source: the same edges.
    assert torch.equal(_sorted_edges(ours.edge_index), _sorted_edges(reference.edge_index))
    assert torch.equal(ours.stc_enc, reference.stc_enc)
    assert torch.equal(ours.y, reference.y.view(-1))
    ref_edges, ref_weight = gcn_norm(reference.edge_index, num_nodes=reference.num_nodes)
    dense_ours = torch.zeros(reference.num_nodes, reference.num_nodes)
    dense_ref = torch.zeros_like(dense_ours)
    gcn = ours.gcn_adjacency
    dense_ours[gcn.dst, gcn.src] = gcn.weight
    dense_ref[ref_edges[1], ref_edges[0]] = ref_weight
    assert torch.allclose(dense_ours, dense_ref)


def _sorted_edges(edge_index: torch.Tensor) -> torch.Tensor:
    order = torch.argsort(edge_index[0] * (int(edge_index.max()) + 1) + edge_index[1])
    return edge_index[:, order]


@pytest.mark.parametrize("p", [0.5, 0.25, 0.3])
def test_dropout_keeps_each_value_with_probability_one_minus_p(p: float) -> None:
    """Byte masks (256 p whole) and uniform masks (otherwise) both drop a p share, unbiased."""
    from trellis.silo.models.graph_classifiers import dropout

    torch.manual_seed(11)
    x = torch.ones(400, 250, requires_grad=True)
    out = dropout(x, p, training=True)
    dropped = float((out == 0).float().mean())
    # 100,000 draws: the binomial standard deviation is below 0.0016; allow 4 of them.
    assert abs(dropped - p) < 0.0064
    assert torch.allclose(out[out != 0], torch.full_like(out[out != 0], 1 / (1 - p)))
    out.sum().backward()
    assert x.grad is not None and torch.equal(x.grad, out.detach())
    assert dropout(x, p, training=False) is x
    # Different draws at different positions: no repeated byte pattern across the tensor.
    rows = (out.detach() != 0).float()
    assert not torch.equal(rows[0], rows[1])


@pytest.mark.parametrize("bias", [True, False])
def test_gcn_tanh_equals_tanh_of_the_gcn_layer(bias: bool) -> None:
    """The structure channel's fused layer (one function, the factor 2 in its weights) gives
    tanh(gcn_layer) and its gradients; in double precision it passes gradcheck."""
    from torch_geometric.nn import GCNConv

    from trellis.silo.models.graph_classifiers import (
        _GcnTanh,
        gcn_layer,
        gcn_normalisation,
        gcn_tanh,
        tanh,
    )

    torch.manual_seed(4)
    conv = GCNConv(6, 5, bias=bias)
    if bias:
        torch.nn.init.normal_(conv.bias)
    edges = torch.tensor([[0, 1, 1, 2, 3, 4], [1, 0, 2, 1, 4, 3]])
    gcn = gcn_normalisation(edges, 5)
    g = torch.randn(5, 6, requires_grad=True)
    fused = gcn_tanh(conv, g, conv.lin.weight, gcn)
    plain = tanh(gcn_layer(conv, g, gcn))
    assert torch.allclose(fused, plain, atol=1e-6)
    params = [g, conv.lin.weight] + ([conv.bias] if bias else [])
    upstream = torch.randn(5, 5)
    got = torch.autograd.grad(fused, params, upstream)
    want = torch.autograd.grad(plain, params, upstream)
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    y2 = torch.randn(5, 5, dtype=torch.float64, requires_grad=True)
    b2 = torch.randn(5, dtype=torch.float64, requires_grad=True) if bias else None
    gcn64 = gcn_normalisation(edges, 5)
    gcn64.matrix = gcn64.transpose = gcn64.matrix.to(torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: _GcnTanh.apply(a, b, gcn64), (y2, b2))


@pytest.mark.parametrize("p", [0.5, 0.3])
def test_relu_dropout_in_place_equals_dropout_of_relu(p: float) -> None:
    """The in-place ReLU and dropout of a fresh product: the same draws, values and
    gradients as dropout(relu(z)); outside training only the ReLU."""
    from trellis.silo.models.graph_classifiers import dropout, relu_dropout

    torch.manual_seed(3)
    z = torch.randn(50, 8, requires_grad=True)
    upstream = torch.randn(50, 8)
    torch.manual_seed(7)
    plain = dropout(torch.relu(z), p, training=True)
    (grad_plain,) = torch.autograd.grad(plain, z, upstream)
    torch.manual_seed(7)
    fused = relu_dropout(z * 1.0, p, training=True)
    (grad_fused,) = torch.autograd.grad(fused, z, upstream)
    assert torch.equal(fused, plain) and torch.equal(grad_fused, grad_plain)
    assert 0 < int((fused == 0).sum()) - int((z <= 0).sum()) < z.numel()
    assert torch.equal(relu_dropout(z.detach() * 1.0, p, training=False), torch.relu(z))


def test_half_dropout_spends_one_random_bit_per_value() -> None:
    """At p = 0.5 each value is decided by its own bit of the random stream: the mask is
    exactly those bits, and the generator moves on by one 64-bit draw per 64 values."""
    import numpy as np

    from trellis.silo.models.shards import keep_mask

    n = 1000 * 37                                  # not a multiple of 64
    torch.manual_seed(5)
    keep = keep_mask(torch.ones(1000, 37), 0.5)
    after = torch.rand(4)
    torch.manual_seed(5)
    words = torch.empty(-(-n // 64), dtype=torch.int64).random_(-2 ** 63, 2 ** 63 - 1)
    assert torch.equal(torch.rand(4), after)
    raw = words.view(torch.uint8).numpy()[:-(-n // 8)]
    bits = np.unpackbits(raw, bitorder="little").reshape(-1, 8).T.reshape(-1)[:n]
    assert keep.dtype == torch.float32 and keep.shape == (1000, 37)
    assert torch.equal(keep.flatten(), torch.from_numpy(bits).float())
    assert abs(float(keep.mean()) - 0.5) < 0.01


def test_fast_tanh_matches_torch_in_value_and_gradient() -> None:
    from trellis.silo.models.graph_classifiers import tanh

    x = torch.linspace(-12, 12, 20001, dtype=torch.float32, requires_grad=True)
    ours = tanh(x)
    (grad_ours,) = torch.autograd.grad(ours.sum(), x)
    reference = torch.tanh(x)
    (grad_ref,) = torch.autograd.grad(reference.sum(), x)
    assert (ours - reference).abs().max() < 2e-7
    assert (grad_ours - grad_ref).abs().max() < 5e-7


def _pyg_layers_sharing(conv: torch.nn.Module, conv_s: torch.nn.Module
                        ) -> tuple[torch.nn.Module, torch.nn.Module]:
    """PyG's GINConv and GCNConv computing with our layers' very parameters (gradients reach
    them). Built on copies first: PyG's constructors draw the parameters again."""
    import copy

    from torch_geometric.nn import GCNConv, GINConv

    gin = GINConv(copy.deepcopy(conv.nn))
    gin.nn = conv.nn
    gcn = GCNConv(conv_s.in_channels, conv_s.out_channels)
    gcn.lin.weight, gcn.bias = conv_s.lin.weight, conv_s.bias
    return gin, gcn


def test_gradients_equal_those_of_pyg_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Training-mode gradients (dropout off) through our sparse, oneDNN and fused pieces equal
    those through PyG's GINConv/GCNConv, torch.tanh and torch's own linear products."""
    import torch.nn.functional as F
    from torch_geometric.nn import global_add_pool

    from trellis.silo.models import dense

    torch.manual_seed(1)
    model = DualChannelGIN(7, 2, dropout=0.0).train()
    x, edge_index, batch, stc = _two_graph_batch()
    x, stc = x.repeat(40, 1), stc.repeat(40, 1)            # more rows than one oneDNN block
    edge_index = torch.cat([edge_index + 9 * k for k in range(40)], dim=1)
    batch = torch.cat([batch + 3 * k for k in range(40)])
    y = torch.randint(0, 2, (120,))

    layers = [_pyg_layers_sharing(conv, conv_s)
              for conv, conv_s in zip(model.graph_convs, model.graph_convs_s_gcn, strict=True)]

    def reference() -> torch.Tensor:
        h, g = model.pre(x), model.embedding_s(stc)
        for gin, gcn in layers:
            h = F.relu(gin(torch.cat((h, g), -1), edge_index))
            g = torch.tanh(gcn(g, edge_index))
        z = global_add_pool(torch.nn.functional.linear(torch.cat((h, g), -1), model.Whp.weight,
                                                       model.Whp.bias), batch)
        return F.log_softmax(model.readout(model.post(z)), dim=1)

    params = list(model.parameters())
    ours = torch.autograd.grad(F.nll_loss(model(x, edge_index, batch, 120, stc), y), params)
    monkeypatch.setattr(dense, "_LINEAR", None)               # torch's products from here on
    theirs = torch.autograd.grad(F.nll_loss(reference(), y), params)
    for (name, _), a, b in zip(model.named_parameters(), ours, theirs, strict=True):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), name


def test_padded_batches_give_the_same_outputs_and_feddense_refuses_them() -> None:
    """Zero rows added to a batch (silo/models/batching.py row_multiple) change no graph's
    output."""
    from torch_geometric.data import Data

    from trellis.silo.models.batching import PackedGraphs

    gen = torch.Generator().manual_seed(6)
    graphs = []
    for size in (5, 9, 3, 7):
        edges = torch.randint(0, size, (2, 2 * size), generator=gen)
        graphs.append(Data(x=torch.randn(size, 7, generator=gen), edge_index=edges,
                           y=torch.tensor([size % 2]),
                           stc_enc=torch.randn(size, 32, generator=gen)))
    packed = PackedGraphs(graphs, structure=True, gcn=True)
    ids = torch.tensor([2, 0, 3])
    plain, padded = packed.select(ids), packed.select(ids, row_multiple=64)
    assert padded.x.size(0) == 64 and plain.x.size(0) == 15
    assert torch.equal(padded.x[15:], torch.zeros(49, 7)) and (padded.batch[15:] == 3).all()
    torch.manual_seed(0)
    for model in (GIN(7, 2).eval(), DualChannelGIN(7, 2).eval()):
        outs = [model(b.x, b.adjacency, b.batch, b.num_graphs, b.stc_enc, b.gcn_adjacency)
                for b in (plain, padded)]
        assert torch.allclose(outs[0], outs[1], atol=1e-5)
    dense_model = DualDenseGIN(7, 2).eval()
    with pytest.raises(ValueError, match="cannot take padded node rows"):
        dense_model(padded.x, padded.adjacency, padded.batch, 3, padded.stc_enc)


@pytest.mark.parametrize("row", [r for r in ALGORITHMS.values()], ids=lambda r: r.name)
def test_every_row_names_a_registered_trainer_and_its_shared_groups_exist(row) -> None:
    """A typo in a row's `shares` must fail here, not silently share nothing."""
    from trellis.protos.plan import ModelConfig
    from trellis.silo.models.graph_classifiers import GRAPH_MODELS
    from trellis.silo.models.hgn import BasisRGCN
    from trellis.silo.training.trainers import TRAINERS

    assert row.trainer in TRAINERS
    if row.trainer == "graph":
        assert row.model in GRAPH_MODELS
        model = GRAPH_MODELS[row.model].build(7, 2, ModelConfig())
    else:
        bases = 2 if row.model == "basis_rgcn" else 0
        model = BasisRGCN({"a": 3}, ("a",), 1, 2, 8, bases)
    modules = {name for name, _ in model.named_modules()}
    assert set(row.shares) <= modules
    names = [n for n, _ in model.named_parameters()]
    assert bool(row.shared_names(names)) == row.aggregates


class _SilentTap:
    """A parameter tap that takes every report and keeps nothing: it only makes one active."""

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               out: torch.Tensor) -> None:
        pass

    def bias(self, out: torch.Tensor, bias: torch.Tensor, scale: torch.Tensor | None) -> None:
        pass


@pytest.mark.parametrize("drop", [0.0, 0.5])
def test_folded_first_layer_equals_the_layer_by_layer_forward_and_gradients(drop: float) -> None:
    """Without a tap FedStar's model folds pre and embedding_s into layer 1's products, splits
    later layers' first product instead of concatenating and rectifies in place; with one
    (per-graph gradients) it runs layer by layer: the same values and gradients, dropout
    masks included (the same draws in the same order)."""
    import torch.nn.functional as F

    from trellis.silo.models.parameter_taps import tapping

    torch.manual_seed(2)
    model = DualChannelGIN(7, 2, dropout=drop).train()
    x, edge_index, batch, stc = _two_graph_batch()
    y = torch.tensor([0, 1, 1])
    params = list(model.parameters())

    def run() -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        torch.manual_seed(5)
        out = model(x, edge_index, batch, 3, stc)
        return out, torch.autograd.grad(F.nll_loss(out, y), params)

    folded, folded_grads = run()
    with tapping(_SilentTap()):
        plain, plain_grads = run()
    assert torch.allclose(folded, plain, atol=1e-5)
    for (name, _), a, b in zip(model.named_parameters(), folded_grads, plain_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), name
