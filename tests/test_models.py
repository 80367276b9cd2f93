"""Model wiring and the declared-shareable rule (STYLE.md principle 12)."""

from __future__ import annotations

import pytest
import torch

from silo.algorithms import ALGORITHM_SPECS, algorithm_spec
from silo.models import GIN, DualChannelGIN


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
    # ALGORITHMS.md §2.2: 2,112 + 12,480 values.
    assert _sizes(model, shared) == 2112 + 12480
    local = [n for n, _ in model.named_parameters() if n not in shared]
    assert all(n.split(".")[0] in {"pre", "graph_convs", "Whp", "post", "readout"} for n in local)


def test_fedavg_shares_only_gin_layers_never_input_or_readout() -> None:
    model = GIN(n_feat=37, n_classes=2)
    shared = algorithm_spec("fedavg").shared_names(n for n, _ in model.named_parameters())
    assert shared and all(n.startswith("graph_convs.") for n in shared)
    assert _sizes(model, shared) == 24960  # ALGORITHMS.md §3.1
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
    with pytest.raises(ValueError, match="valid: " + ", ".join(ALGORITHM_SPECS)):
        algorithm_spec("fedsgd")
