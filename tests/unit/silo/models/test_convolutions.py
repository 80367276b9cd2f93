"""The layers' parameter holders against PyG's GINConv and GCNConv: same names, same buffers,
same values from the same seed, and a PyG-built model's weights load
(silo/models/convolutions.py)."""

from __future__ import annotations

import pytest
import torch
import torch_geometric.nn as pyg
from torch import nn

from trellis.protos.plan import ModelConfig
from trellis.silo.models import convolutions as ours
from trellis.silo.models import graph_classifiers
from trellis.silo.models.graph_classifiers import graph_model


def _mlp(width: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(2 * width, width), nn.ReLU(), nn.Linear(width, width))


def _same_state(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for name in sa:
        assert sa[name].shape == sb[name].shape, name
        assert torch.equal(sa[name], sb[name]), name


@pytest.mark.parametrize("seed", [0, 7])
def test_gin_holds_pygs_parameters_drawn_the_same(seed: int) -> None:
    torch.manual_seed(seed)
    theirs = pyg.GINConv(_mlp(5))
    after_theirs = torch.rand(1)
    torch.manual_seed(seed)
    mine = ours.GINConv(_mlp(5))
    _same_state(mine, theirs)
    assert list(mine.state_dict()) == ["eps", "nn.0.weight", "nn.0.bias", "nn.2.weight",
                                       "nn.2.bias"]
    assert torch.equal(torch.rand(1), after_theirs)      # the stream left where PyG left it
    assert mine.initial_eps == 0.0 and not isinstance(mine.eps, nn.Parameter)


@pytest.mark.parametrize("bias", [True, False])
def test_gcn_holds_pygs_parameters_drawn_the_same(bias: bool) -> None:
    torch.manual_seed(3)
    theirs = pyg.GCNConv(6, 4, bias=bias)
    after_theirs = torch.rand(1)
    torch.manual_seed(3)
    mine = ours.GCNConv(6, 4, bias=bias)
    _same_state(mine, theirs)
    assert torch.equal(torch.rand(1), after_theirs)
    assert mine.lin.bias is None and (mine.bias is None) == (not bias)
    assert [n for n, _ in mine.named_parameters()] == (["bias", "lin.weight"] if bias
                                                        else ["lin.weight"])


@pytest.mark.parametrize("model", ["gin", "dual_channel_gin", "dual_dense_gin"])
def test_a_model_built_with_pygs_layers_has_the_same_weights_and_loads(
        model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each model as PyG's layers would have built it: same names, same values from one seed;
    and the state of one loads into the other (a model saved before the switch)."""
    build = graph_model(model).build
    torch.manual_seed(11)
    mine = build(7, 2, ModelConfig())
    monkeypatch.setattr(graph_classifiers, "GINConv", pyg.GINConv)
    monkeypatch.setattr(graph_classifiers, "GCNConv", pyg.GCNConv)
    torch.manual_seed(11)
    theirs = build(7, 2, ModelConfig())
    assert any(isinstance(m, pyg.GINConv) for m in theirs.modules())
    _same_state(mine, theirs)
    fresh = build(7, 2, ModelConfig())
    monkeypatch.undo()
    reloaded = build(7, 2, ModelConfig())
    reloaded.load_state_dict(fresh.state_dict())
    _same_state(reloaded, fresh)
