"""Dense layers through oneDNN (silo/models/dense.py) against torch's own linear, values and
gradients."""

from __future__ import annotations

import json

import pytest
import torch

from trellis.silo.models import dense
from trellis.silo.models.dense import Linear, linear


@pytest.fixture(autouse=True)
def onednn_path(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """The oneDNN path, forced whatever this processor's probe says (the numerics are what is
    tested here); the cache goes to a folder of the test's own."""
    monkeypatch.setenv("TRELLIS_ONEDNN", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    dense.forget_choice()
    yield
    dense.forget_choice()


@pytest.mark.parametrize("rows", [5, dense.ROWS, 3 * dense.ROWS + 17])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_equals_torch_in_value_and_all_gradients(rows: int, with_bias: bool) -> None:
    """Fewer rows than a block, whole blocks, and blocks plus a remainder."""
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 48, generator=gen, requires_grad=True)
    weight = torch.randn(20, 48, generator=gen, requires_grad=True)
    bias = torch.randn(20, generator=gen, requires_grad=True) if with_bias else None
    upstream = torch.randn(rows, 20, generator=gen)
    inputs = [x, weight] + ([bias] if bias is not None else [])

    ours = linear(x, weight, bias)
    reference = torch.nn.functional.linear(x, weight, bias)
    assert torch.allclose(ours, reference, atol=1e-4)
    for got, want in zip(torch.autograd.grad(ours, inputs, upstream),
                         torch.autograd.grad(reference, inputs, upstream), strict=True):
        assert torch.allclose(got, want, atol=1e-3, rtol=1e-5)


def test_onednn_is_used_when_chosen_and_skipped_where_it_does_not_apply() -> None:
    assert dense.onednn_enabled(), "this torch has no usable oneDNN linear op"
    x = torch.randn(300, 8, requires_grad=True)
    weight = torch.randn(4, 8, requires_grad=True)
    assert type(linear(x, weight).grad_fn).__name__ == "_OneDnnLinearBackward"
    wide = linear(x.double(), weight.double())          # float64: torch's own path
    assert wide.dtype == torch.float64 and type(wide.grad_fn).__name__ != "_OneDnnLinearBackward"
    batched = linear(torch.randn(2, 300, 8), weight)    # 3-D input: torch's own path
    assert batched.shape == (2, 300, 4)


def test_non_contiguous_input_and_frozen_input() -> None:
    gen = torch.Generator().manual_seed(2)
    base = torch.randn(40, 2 * dense.ROWS + 3, generator=gen)
    x = base.t()                                           # a transposed view
    weight = torch.randn(6, 40, generator=gen, requires_grad=True)
    out = linear(x, weight)
    assert torch.allclose(out, x @ weight.t(), atol=1e-4)
    (grad_w,) = torch.autograd.grad(out.sum(), [weight])
    assert torch.allclose(grad_w, torch.ones(x.size(0), 6).t() @ x, atol=1e-3)


def _packed(t: torch.Tensor) -> bool:
    """Rows or columns stored one after another, with no gaps (a plain or transposed matrix)."""
    return t.is_contiguous() or t.t().is_contiguous()


def test_onednn_is_only_given_packed_matrices(monkeypatch: pytest.MonkeyPatch) -> None:
    """A column block of a wider weight (FedStar's split first GIN product) reaches oneDNN
    packed: a strided weight took it down a path over fifty times slower (106 s against 1.6 s
    a CHEM round). FedStar's model, forwards and backwards, gives it nothing else either."""
    from trellis.silo.models.graph_classifiers import DualChannelGIN

    assert dense.onednn_enabled()
    op, given = dense._LINEAR, []

    def recording(x, weight, *args):
        given.append((tuple(x.shape), _packed(x), _packed(weight)))
        return op(x, weight, *args)

    monkeypatch.setattr(dense, "_LINEAR", recording)
    wide = torch.randn(6, 16, requires_grad=True)
    x = torch.randn(2 * dense.ROWS, 8, requires_grad=True)
    out = linear(x, wide[:, 8:])
    assert torch.allclose(out, x @ wide[:, 8:].t(), atol=1e-4)
    (grad,) = torch.autograd.grad(out.sum(), [wide])
    assert torch.allclose(grad[:, 8:], torch.ones(x.size(0), 6).t() @ x, atol=1e-3)
    assert torch.count_nonzero(grad[:, :8]) == 0

    model = DualChannelGIN(7, 2, hidden=16).train()
    nodes = 2 * dense.ROWS
    ring = torch.arange(nodes)
    edges = torch.stack([ring, (ring + 1) % nodes])
    batch = torch.zeros(nodes, dtype=torch.long)
    model(torch.randn(nodes, 7), edges, batch, 1, torch.randn(nodes, 32)).sum().backward()
    assert given and all(x_ok and w_ok for _, x_ok, w_ok in given), given


def test_linear_module_keeps_nn_linear_parameters_and_initialisation() -> None:
    torch.manual_seed(4)
    ours = Linear(7, 3)
    torch.manual_seed(4)
    theirs = torch.nn.Linear(7, 3)
    assert isinstance(ours, torch.nn.Linear)
    assert [n for n, _ in ours.named_parameters()] == ["weight", "bias"]
    assert torch.equal(ours.weight, theirs.weight) and torch.equal(ours.bias, theirs.bias)
    x = torch.randn(dense.ROWS + 1, 7)
    assert torch.allclose(ours(x), theirs(x), atol=1e-5)


def test_the_probe_runs_once_per_processor_and_every_process_reads_its_result(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("TRELLIS_ONEDNN", "auto")
    first = dense.dense_path()
    cache = tmp_path / "cache" / "trellis" / dense.CACHE_FILE
    (key, ratio), = json.loads(cache.read_text()).items()
    assert torch.__version__ in key and ratio > 0
    assert first.onednn == (ratio < dense.FASTER) and "probed now, cached in" in first.reason

    def no_probe() -> float:
        raise AssertionError("probed again although the cache has this processor")

    monkeypatch.setattr(dense, "_probe_ratio", no_probe)
    dense.forget_choice()
    again = dense.dense_path()
    assert again.onednn == first.onednn and "measured before" in again.reason


@pytest.mark.parametrize(("ratio", "onednn"), [(0.5, True), (dense.FASTER, False), (1.3, False)])
def test_onednn_is_taken_only_when_clearly_faster(
        monkeypatch: pytest.MonkeyPatch, ratio: float, onednn: bool) -> None:
    monkeypatch.setenv("TRELLIS_ONEDNN", "auto")
    monkeypatch.setattr(dense, "_probe_ratio", lambda: ratio)
    chosen = dense.dense_path()
    assert chosen.onednn is onednn and f"{ratio:.2f}x" in chosen.reason
    x = torch.randn(300, 8, requires_grad=True)
    backward = type(linear(x, torch.randn(4, 8, requires_grad=True)).grad_fn).__name__
    assert (backward == "_OneDnnLinearBackward") is onednn


def test_a_damaged_cache_is_measured_again_and_the_override_wins(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    cache = tmp_path / "cache" / "trellis" / dense.CACHE_FILE
    cache.parent.mkdir(parents=True)
    cache.write_text("{not json")
    monkeypatch.setenv("TRELLIS_ONEDNN", "auto")
    monkeypatch.setattr(dense, "_probe_ratio", lambda: 0.5)
    assert dense.dense_path().onednn
    assert list(json.loads(cache.read_text()).values()) == [0.5]
    monkeypatch.setenv("TRELLIS_ONEDNN", "0")
    dense.forget_choice()
    assert dense.dense_path() == dense.DensePath(False, "torch (TRELLIS_ONEDNN=0)")
    monkeypatch.setenv("TRELLIS_ONEDNN", "yes")
    dense.forget_choice()
    with pytest.raises(ValueError, match="TRELLIS_ONEDNN='yes': expected 1"):
        dense.dense_path()


@pytest.mark.parametrize("path", ["0", "1"])
def test_split_linear_equals_the_product_of_the_concatenation(
        path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``[a || b] W^T`` without the concatenation, on both paths: the same value and the same
    gradients for a, b and the whole weight; torch's path passes gradcheck in double."""
    monkeypatch.setenv("TRELLIS_ONEDNN", path)
    assert dense.onednn_enabled() == (path == "1")
    torch.manual_seed(9)
    rows = dense.ROWS + 44             # oneDNN's whole block and torch's tail
    a = torch.randn(rows, 5, requires_grad=True)
    b = torch.randn(rows, 3, requires_grad=True)
    weight = torch.randn(4, 8, requires_grad=True)
    upstream = torch.randn(rows, 4)
    ours = dense.split_linear(a, b, weight)
    plain = torch.cat([a, b], dim=1) @ weight.t()
    assert torch.allclose(ours, plain, atol=1e-5)
    got = torch.autograd.grad(ours, (a, b, weight), upstream)
    want = torch.autograd.grad(plain, (a, b, weight), upstream)
    for x, y in zip(got, want, strict=True):
        assert torch.allclose(x, y, atol=1e-4)
    with pytest.raises(ValueError, match="the weight takes 8"):
        dense.split_linear(a, b[:, :2], weight)
    doubles = [t.detach().double().requires_grad_() for t in (a[:6], b[:6], weight)]
    assert torch.autograd.gradcheck(dense.split_linear, doubles)
