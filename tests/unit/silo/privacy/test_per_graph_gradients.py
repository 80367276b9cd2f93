"""Per-graph clipped gradient sums (record-level DP-SGD): fast path against the one-graph-at-a-time
reference, the per-graph bound, Poisson sampling and the refusal of cross-graph layers."""

from __future__ import annotations

import copy
import gc
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn
from torch_geometric.data import Data

from tests.paths import TU_ROOT
from trellis.protos.plan import ModelConfig, PlanError, load_plan
from trellis.silo.data.structure import add_structure_embeddings
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.data.tu import GraphDataset, load_tu_folder
from trellis.silo.models.batching import GraphBatch, PackedGraphs
from trellis.silo.models.graph_classifiers import GRAPH_MODELS, DualDenseGIN
from trellis.silo.privacy.per_graph_gradients import (
    ClippedSum,
    check_per_graph_model,
    clipped_gradient_sum,
    graph_nll,
    poisson_sample,
)

# The fast path must equal the reference to float32 rounding: entries within 1e-5 of the
# largest entry of the sum (plus 1e-4 relative).
ATOL_SHARE, RTOL = 1e-5, 1e-4
# The model families of fedavg, fedstar and feddense (in its per-graph normalisation).
FAMILIES = ("gin", "dual_channel_gin", "dual_dense_gin")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Many tiny backward passes: one thread is faster, and does not spin against a busy core
    (with two threads on a loaded 2-core machine one test took 160 s instead of 1)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> GraphDataset:
    """MUTAG (shared data) when present, else a synthetic molecule set of the same kind."""
    folder = TU_ROOT / "MUTAG"
    if not folder.is_dir():
        folder = write_tu_folder(tmp_path_factory.mktemp("tu"), "SYN-molecules", "molecules",
                                 60, seed=5)
    ds = load_tu_folder(folder)
    add_structure_embeddings(ds)
    return ds


def _packed(graphs: list[Data]) -> PackedGraphs:
    return PackedGraphs(graphs, structure=True, gcn=True)


def _model(family: str, ds: GraphDataset, seed: int = 0, **config: object) -> nn.Module:
    torch.manual_seed(seed)
    settings = {"dropout": 0.0, "norm": "layer"} | config
    return GRAPH_MODELS[family].build(ds.num_features, ds.num_classes,
                                      ModelConfig(**settings))  # type: ignore[arg-type]


def _flat(result: ClippedSum) -> Tensor:
    return torch.cat([g.flatten() for g in result.gradients.values()])


def _assert_same(a: ClippedSum, b: ClippedSum) -> None:
    assert a.gradients.keys() == b.gradients.keys()
    scale = float(_flat(b).abs().max())
    for name in a.gradients:
        torch.testing.assert_close(a.gradients[name], b.gradients[name], rtol=RTOL,
                                   atol=ATOL_SHARE * scale, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_fast_equals_microbatch_reference(dataset: GraphDataset, family: str, mode: str) -> None:
    """Dropout 0 (train mode) or eval mode: both methods see the same deterministic model."""
    model = _model(family, dataset)
    model.train(mode == "train")
    packed = _packed(dataset.graphs[:40])
    ids = torch.tensor([3, 0, 7, 12, 5, 21, 30, 39, 18, 11, 26, 2])
    norms = clipped_gradient_sum(model, graph_nll(model), packed, ids, 1.0,
                                 method="microbatch").norms
    # The median norm as the clip: some graphs are clipped and some are not.
    clip = float(norms.median())
    assert (norms > clip).any() and (norms < clip).any()
    reference = clipped_gradient_sum(model, graph_nll(model), packed, ids, clip,
                                     method="microbatch")
    fast = clipped_gradient_sum(model, graph_nll(model), packed, ids, clip)
    assert fast.method == "fast" and not fast.fallback
    assert fast.graphs == reference.graphs == 12
    torch.testing.assert_close(fast.norms, reference.norms, rtol=RTOL, atol=1e-6)
    assert set(fast.gradients) == {n for n, p in model.named_parameters() if p.requires_grad}
    _assert_same(fast, reference)


@pytest.mark.parametrize("method", ["fast", "microbatch"])
@pytest.mark.parametrize("family", FAMILIES)
def test_huge_clip_gives_the_plain_summed_gradient(dataset: GraphDataset, family: str,
                                                   method: str) -> None:
    model = _model(family, dataset)
    packed = _packed(dataset.graphs[:30])
    ids = torch.arange(0, 30, 3)
    result = clipped_gradient_sum(model, graph_nll(model), packed, ids, 1e12, method=method)
    losses = graph_nll(model)(packed.select(ids))
    plain = torch.autograd.grad(losses.sum(), list(model.parameters()))
    expected = ClippedSum(dict(zip((n for n, _ in model.named_parameters()), plain,
                                   strict=True)), 10, "autograd")
    _assert_same(result, expected)


def _changed(graphs: list[Data], index: int, generator: torch.Generator) -> list[Data]:
    """The same graphs with graph ``index`` replaced by another graph's structure carrying wild
    features and another label."""
    donor = copy.copy(graphs[(index + 7) % len(graphs)])
    donor.x = torch.randn(donor.x.shape, generator=generator) * 50
    donor.y = (graphs[index].y + 1) % 2
    return graphs[:index] + [donor] + graphs[index + 1:]


@pytest.mark.parametrize("method", ["fast", "microbatch"])
@pytest.mark.parametrize("family", FAMILIES)
def test_one_graph_moves_the_clipped_sum_by_at_most_twice_the_clip(
        dataset: GraphDataset, family: str, method: str) -> None:
    model = _model(family, dataset)
    graphs = dataset.graphs[:24]
    ids = torch.arange(24)
    generator = torch.Generator().manual_seed(1)
    clip = 0.5
    for index in (0, 9, 23):                     # first, middle and last graph of the batch
        before, after = _packed(graphs), _packed(_changed(graphs, index, generator))
        moved = float(torch.linalg.vector_norm(
            _flat(clipped_gradient_sum(model, graph_nll(model), before, ids, clip, method=method))
            - _flat(clipped_gradient_sum(model, graph_nll(model), after, ids, clip,
                                         method=method))))
        assert moved <= 2 * clip * (1 + 1e-5)
        # Without clipping the same change moves the sum further: the check above can fail.
        unclipped = float(torch.linalg.vector_norm(
            _flat(clipped_gradient_sum(model, graph_nll(model), before, ids, 1e12,
                                       method=method))
            - _flat(clipped_gradient_sum(model, graph_nll(model), after, ids, 1e12,
                                         method=method))))
        assert unclipped > 2 * clip


def test_batch_norm_breaks_the_bound_and_is_refused(dataset: GraphDataset) -> None:
    """Why norm = "layer": with BatchNorm one graph moves every graph's gradient."""
    model = _model("dual_dense_gin", dataset, norm="batch")
    with pytest.raises(ValueError, match=r"'H_x\.0\.norm' \(BatchNorm1d\).*model\.norm"):
        check_per_graph_model(model)
    with pytest.raises(ValueError, match="BatchNorm1d"):
        clipped_gradient_sum(model, graph_nll(model), _packed(dataset.graphs[:4]),
                             torch.arange(4), 1.0)
    for family in FAMILIES:
        check_per_graph_model(_model(family, dataset))            # norm = "layer": accepted
    with pytest.raises(ValueError, match="InstanceNorm1d"):
        check_per_graph_model(nn.Sequential(nn.Linear(3, 3), nn.InstanceNorm1d(3)))


def test_empty_sample_gives_zero_gradients(dataset: GraphDataset) -> None:
    model = _model("dual_channel_gin", dataset)
    result = clipped_gradient_sum(model, graph_nll(model), _packed(dataset.graphs[:4]),
                                  torch.zeros(0, dtype=torch.long), 1.0)
    assert result.graphs == 0
    assert result.gradients.keys() == dict(model.named_parameters()).keys()
    assert all(not g.any() for g in result.gradients.values())


def test_nothing_of_a_call_outlives_it(dataset: GraphDataset) -> None:
    """Found by a 200-round run growing by 6 MB a call: each recorded use held its output
    tensor, whose gradient hook held the use back, a cycle no collector frees."""
    from trellis.silo.privacy.per_graph_gradients import _Use

    model = _model("dual_channel_gin", dataset)
    packed = _packed(dataset.graphs[:8])
    for _ in range(3):
        clipped_gradient_sum(model, graph_nll(model), packed, torch.arange(8), 1.0)
    gc.collect()
    assert not [o for o in gc.get_objects() if isinstance(o, _Use)]


class _Tempered(nn.Module):
    """A model with a parameter used where no tap sees it (a learned temperature)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.temperature = nn.Parameter(torch.tensor(1.5))

    def forward(self, *args: object) -> Tensor:
        return torch.log_softmax(self.inner(*args) * self.temperature, dim=1)


def test_untapped_parameter_falls_back_to_the_reference_with_a_reason(
        dataset: GraphDataset) -> None:
    model = _Tempered(_model("gin", dataset))
    packed, ids = _packed(dataset.graphs[:10]), torch.arange(10)
    with pytest.warns(RuntimeWarning, match="'temperature' is used where no tap reports it"):
        fast = clipped_gradient_sum(model, graph_nll(model), packed, ids, 1.0)
    assert fast.method == "microbatch" and "temperature" in fast.fallback
    _assert_same(fast, clipped_gradient_sum(model, graph_nll(model), packed, ids, 1.0,
                                            method="microbatch"))


def test_loss_must_be_one_value_per_graph(dataset: GraphDataset) -> None:
    model = _model("gin", dataset)

    def mean_loss(batch: GraphBatch) -> Tensor:
        return graph_nll(model)(batch).mean()

    with pytest.raises(ValueError, match="one loss per graph"):
        clipped_gradient_sum(model, mean_loss, _packed(dataset.graphs[:4]), torch.arange(4), 1.0)
    with pytest.raises(ValueError, match="valid choices: fast, microbatch"):
        clipped_gradient_sum(model, graph_nll(model), _packed(dataset.graphs[:4]),
                             torch.arange(4), 1.0, method="vmap")


def test_poisson_sample_rate_order_and_determinism() -> None:
    count, rate = 20_000, 0.1
    first = poisson_sample(count, rate, torch.Generator().manual_seed(7))
    again = poisson_sample(count, rate, torch.Generator().manual_seed(7))
    assert torch.equal(first, again)
    assert not torch.equal(first, poisson_sample(count, rate, torch.Generator().manual_seed(8)))
    assert first.dtype == torch.long and bool((first.diff() > 0).all())
    assert 0 <= int(first.min()) and int(first.max()) < count
    sigma = (count * rate * (1 - rate)) ** 0.5
    assert abs(first.numel() - count * rate) < 5 * sigma           # binomial count
    # Each graph independently: the halves of the index range are sampled alike.
    low = int((first < count // 2).sum())
    assert abs(2 * low - first.numel()) < 5 * (first.numel() ** 0.5)
    generator = torch.Generator().manual_seed(0)
    assert poisson_sample(50, 0.0, generator).numel() == 0
    assert torch.equal(poisson_sample(50, 1.0, generator), torch.arange(50))
    assert poisson_sample(0, 0.5, generator).numel() == 0
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="rate"):
            poisson_sample(10, bad, generator)


PLAN = """
[federation]
id = "chem"
algorithm = "feddense"
rounds = 2
silos = ["a", "b"]

[server]
state_dir = "st"

[simulation]
data = {{ a = "data/a", b = "data/b" }}

[model]
{model}
"""


def test_plan_norm_defaults_to_batch_takes_layer_and_refuses_others(tmp_path: Path) -> None:
    path = tmp_path / "plan.toml"
    path.write_text(PLAN.format(model=""))
    assert load_plan(path).public.model.norm == "batch"
    path.write_text(PLAN.format(model='norm = "layer"'))
    plan = load_plan(path)
    assert plan.public.model.norm == "layer"
    model = GRAPH_MODELS["dual_dense_gin"].build(7, 2, plan.public.model)
    assert isinstance(model, DualDenseGIN)
    assert not any(isinstance(m, nn.BatchNorm1d) for m in model.modules())
    for bad in ('"group"', "3"):
        path.write_text(PLAN.format(model=f"norm = {bad}"))
        with pytest.raises(PlanError, match=r"model\.norm: .* valid choices: batch, layer"):
            load_plan(path)
