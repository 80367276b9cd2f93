"""The fused (torch.compile) path: chosen per device with its override, and numerically the
plain path (silo/models/compiled.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_geometric.data import Data

from trellis.silo.models.batching import PackedGraphs
from trellis.silo.models.compiled import (
    FusedPath,
    compile_setting,
    compiled_forward_and_loss,
    forward_and_loss,
    fused_path,
)
from trellis.silo.models.graph_classifiers import GIN, DualChannelGIN, DualDenseGIN

CUDA = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="needs a CUDA GPU: Inductor's GPU kernels")


def test_auto_takes_the_plain_path_on_every_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled only where asked: on an H200 it measured slower (silo/models/compiled.py)."""
    monkeypatch.delenv("TRELLIS_COMPILE", raising=False)
    assert fused_path("cuda") == FusedPath(False, "plain (torch.compile does not pay on cuda)")
    assert not fused_path(torch.device("cuda", 1)).compiled
    assert fused_path("cpu") == FusedPath(False, "plain (torch.compile does not pay on cpu)")
    monkeypatch.setenv("TRELLIS_COMPILE", "auto")
    assert not fused_path("cuda").compiled and not fused_path("cpu").compiled


def test_the_override_forces_either_path_and_a_typo_is_one_clear_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRELLIS_COMPILE", "0")
    assert fused_path("cuda") == FusedPath(False, "plain (TRELLIS_COMPILE=0)")
    monkeypatch.setenv("TRELLIS_COMPILE", " 1 ")
    assert fused_path("cpu") == FusedPath(True, "torch.compile (TRELLIS_COMPILE=1)")
    monkeypatch.setenv("TRELLIS_COMPILE", "yes")
    with pytest.raises(ValueError, match="TRELLIS_COMPILE='yes': expected 1 .torch.compile., "
                                         "0 .plain forward. or auto"):
        compile_setting()


def _batch(device: str, n_feat: int = 4):
    gen = torch.Generator().manual_seed(2)
    graphs = []
    for size in (3, 5, 2, 6, 4, 7, 1, 5):
        edges = torch.randint(0, size, (2, 2 * size), generator=gen)
        edges = edges[:, edges[0] != edges[1]]
        edges = torch.unique(torch.cat([edges, edges.flip(0)], 1), dim=1)
        graphs.append(Data(x=torch.randn(size, n_feat, generator=gen), edge_index=edges,
                           y=torch.tensor([size % 2]), stc_enc=torch.randn(size, 6,
                                                                           generator=gen)))
    packed = PackedGraphs(graphs, structure=True, gcn=True).to(device)
    return packed.select(torch.arange(len(graphs)))


def _outputs_and_gradients(step, model: nn.Module, batch, seed: int
                           ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One training-mode forward and backward, dropout drawn from ``seed``."""
    model.zero_grad(set_to_none=True)
    with torch.random.fork_rng(devices=[batch.x.device] if batch.x.is_cuda else []):
        torch.manual_seed(seed)
        out, loss = step(model, batch.x, batch.adjacency, batch.batch, batch.num_graphs,
                         batch.stc_enc, batch.gcn_adjacency, batch.y, "mean")
        loss.backward()
    return out.detach(), [torch.zeros(0) if p.grad is None else p.grad.detach().clone()
                          for p in model.parameters()]


def _assert_compiled_equals_plain(model: nn.Module, device: str, backend: str) -> None:
    model.to(device).train()
    batch = _batch(device, model.n_feat)
    compiled = compiled_forward_and_loss(backend)
    for seed in (1, 2):                   # the second call reuses the compiled kernels
        plain_out, plain_grads = _outputs_and_gradients(forward_and_loss, model, batch, seed)
        fused_out, fused_grads = _outputs_and_gradients(compiled, model, batch, seed)
        # Same dropout masks (drawn by torch's own ops), so the same values to float rounding.
        assert torch.allclose(fused_out, plain_out, rtol=1e-4, atol=1e-5)
        for fused, plain in zip(fused_grads, plain_grads, strict=True):
            assert torch.allclose(fused, plain, rtol=1e-3, atol=1e-5)


def test_the_traced_path_gives_the_plain_outputs_and_gradients_on_the_cpu() -> None:
    """FedStar's model traced and differentiated as the compiler does (graph breaks, autograd,
    the dropout draws), without generating kernels: Inductor's C++ kernels for even a small GIN
    take over three minutes to build on a 2-core machine. The CUDA test below runs Inductor
    itself, on every model."""
    _assert_compiled_equals_plain(_model("fedstar"), "cpu", "aot_eager")


# FedDense compiled by Inductor on CUDA gave other outputs and gradients than the plain path on
# an H200 (torch 2.11, bench/results/gpu.json's run); traced on the CPU (aot_eager) they agree,
# and the cause is not found. The compiled path is opt-in only (TRELLIS_COMPILE=1), and
# docs/silo-operators.md says so; strict, so that a fix shows here.
_FEDDENSE_ON_CUDA = pytest.mark.xfail(strict=True, reason="Inductor's FedDense differs from the "
                                      "plain path on CUDA (H200, torch 2.11)")


@CUDA
@pytest.mark.parametrize("model", ["gin", "fedstar",
                                   pytest.param("feddense", marks=_FEDDENSE_ON_CUDA)])
def test_the_compiled_path_gives_the_plain_outputs_and_gradients_on_cuda(model: str) -> None:
    _assert_compiled_equals_plain(_model(model), "cuda", "inductor")


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return {"gin": lambda: GIN(4, 3, hidden=16, dropout=0.5),
            "fedstar": lambda: DualChannelGIN(4, 3, n_se=6, hidden=16),
            "feddense": lambda: DualDenseGIN(4, 3, n_se=6, width=16)}[name]()
