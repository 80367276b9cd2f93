"""Dense layers through oneDNN on the CPU: ``y = x W^T + b`` and both its gradients.

torch sends float32 CPU matrix products to MKL, which on AMD processors runs its AVX2 code
(about 90 GFLOP/s on one core of the machine these figures come from, an AVX-512 EPYC).
oneDNN, which torch also ships, reaches 220 GFLOP/s on the same products; the dense layers
are half of a FedStar round, so this is the largest single saving in local training.
``linear`` uses oneDNN's linear primitive (``torch.ops.mkldnn._linear_pointwise``, the op
torch's own compiler emits) forwards and for both gradients, and falls back to
``torch.nn.functional.linear`` wherever that primitive does not apply (GPU tensors, other
dtypes, a torch built without oneDNN, or ``TRELLIS_ONEDNN=0`` in the environment). Values
agree with torch's to float rounding; tests/test_dense.py compares them.

oneDNN compiles a kernel for every new matrix shape (about 0.9 ms, more than the product), and
every mini-batch has its own node count. So only the first ``ROWS * k`` rows go to oneDNN, a
handful of shapes that its cache keeps, and the remaining rows (fewer than ``ROWS``) to MKL.

Which path is faster depends on the processor: 0.77x torch's time on one AVX-512 EPYC, no gain
on another AMD machine, 1.29x on the Intel ones CI runs on. So the path is measured, once per
processor model and torch version: a probe times one padded layer forwards and backwards both
ways at one thread, and oneDNN is taken only when it needs under ``FASTER`` of torch's time (it
also costs about 120 MB and padded batches). The result is cached in
``$XDG_CACHE_HOME/trellis/dense-path.json`` (``~/.cache``), under a lock, so every process on
the machine takes the same path and a run is reproducible. ``TRELLIS_ONEDNN=1`` or ``0``
overrides the probe; ``auto`` (or unset) uses it.
"""

from __future__ import annotations

import json
import os
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from trellis.crypto.durable import lock_exclusive, write_atomic
from trellis.silo.models.parameter_taps import active_tap
from trellis.silo.models.switches import three_way


def _onednn_linear_op() -> object | None:
    """oneDNN's linear op if this torch has it and it computes a product correctly."""
    try:
        op = torch.ops.mkldnn._linear_pointwise
        if not torch.backends.mkldnn.is_available():
            return None
        x, w = torch.arange(6.0).view(2, 3), torch.ones(4, 3)
        if not torch.equal(op(x, w, None, "none", [], ""), x @ w.t()):
            return None
        return op
    except (AttributeError, RuntimeError):
        return None


ROWS = 256
FASTER = 0.85                      # oneDNN's share of torch's probe time below which it is taken
PROBE_ROWS, PROBE_WIDTH, PROBE_REPS = 3000, 64, 25     # a CHEM mini-batch through a GIN layer
CACHE_FILE = "dense-path.json"
_LINEAR: Any = None                # oneDNN's linear op while the oneDNN path is chosen
_chosen: DensePath | None = None
_choosing = threading.Lock()


@dataclass(frozen=True)
class DensePath:
    """The path this process's dense layers take on the CPU, and why."""

    onednn: bool
    reason: str


def dense_path() -> DensePath:
    """The path of this process, chosen at the first call (TRELLIS_ONEDNN, cache or probe)."""
    global _chosen
    chosen = _chosen
    if chosen is not None:
        return chosen                  # every dense layer asks: no lock once it is known
    with _choosing:
        if _chosen is None:
            _chosen = _choose()
        return _chosen


def onednn_enabled() -> bool:
    """Whether dense layers on the CPU go through oneDNN in this process."""
    return dense_path().onednn


def forget_choice() -> None:
    """Choose again at the next call (after TRELLIS_ONEDNN or the cache changed; tests)."""
    global _chosen, _LINEAR
    with _choosing:
        _chosen, _LINEAR = None, None


def onednn_setting() -> str:
    """TRELLIS_ONEDNN: "1", "0" or "auto" (unset); ValueError for anything else."""
    return three_way("TRELLIS_ONEDNN", "1 (oneDNN), 0 (torch's own products) or auto "
                                       "(measured once per processor)")


def _choose() -> DensePath:
    global _LINEAR
    setting = onednn_setting()
    if setting == "0":
        return DensePath(False, "torch (TRELLIS_ONEDNN=0)")
    op = _onednn_linear_op()
    if op is None:
        return DensePath(False, "torch (this torch has no usable oneDNN linear op)")
    _LINEAR = op
    if setting == "1":
        return DensePath(True, "oneDNN (TRELLIS_ONEDNN=1)")
    ratio, where = _measured_ratio()
    if ratio < FASTER:
        return DensePath(True, f"oneDNN (it took {ratio:.2f}x torch's time on this processor; "
                               f"{where})")
    _LINEAR = None
    return DensePath(False, f"torch (oneDNN took {ratio:.2f}x its time on this processor; "
                            f"{where})")


def _cache_path() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "trellis" / CACHE_FILE


def processor_name() -> str:
    """The processor's model name: the dense-path choice (and speed ratios) depend on it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _measured_ratio() -> tuple[float, str]:
    """oneDNN's time over torch's for this processor and torch: from the cache, else probed
    (under a lock, so that processes starting together probe once and agree)."""
    key = f"{processor_name()} | torch {torch.__version__}"
    path = _cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return _probe_ratio(), "probed now; no cache folder"
    try:
        if not lock_exclusive(lock, attempts=400):          # 20 s: another probe is slow
            return _probe_ratio(), "probed now; the cache was locked"
        cached = _read_cache(path)
        if isinstance(cached.get(key), (int, float)):
            return float(cached[key]), f"measured before, cached in {path}"
        ratio = _probe_ratio()
        cached[key] = ratio
        try:
            write_atomic(path, lambda f: f.write(json.dumps(cached, indent=2).encode()),
                         mode=0o644)
        except OSError:
            return ratio, "probed now; the cache could not be written"
        return ratio, f"probed now, cached in {path}"
    finally:
        os.close(lock)


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}                      # none yet, or damaged: probed again and rewritten
    return loaded if isinstance(loaded, dict) else {}


def _probe_ratio() -> float:
    """Best-of time of a padded oneDNN layer over torch's, forwards and backwards, 1 thread."""
    global _LINEAR
    threads = torch.get_num_threads()
    held, _LINEAR = _LINEAR, _LINEAR or _onednn_linear_op()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        padded = -(-PROBE_ROWS // ROWS) * ROWS     # the trainer pads batches for oneDNN
        weight = torch.randn(PROBE_WIDTH, PROBE_WIDTH, generator=gen, requires_grad=True)
        bias = torch.zeros(PROBE_WIDTH, requires_grad=True)
        ours = torch.randn(padded, PROBE_WIDTH, generator=gen, requires_grad=True)
        theirs = torch.randn(PROBE_ROWS, PROBE_WIDTH, generator=gen, requires_grad=True)

        def timed(step: Callable[[], None]) -> float:
            began = time.perf_counter()
            step()
            return time.perf_counter() - began

        def onednn() -> None:
            _OneDnnLinear.apply(ours, weight, bias).sum().backward()

        def plain() -> None:
            nn.functional.linear(theirs, weight, bias).sum().backward()

        best = [float("inf"), float("inf")]
        for rep in range(PROBE_REPS + 3):       # the first three compile and warm up
            a, b = timed(onednn), timed(plain)  # interleaved: load elsewhere hits both
            if rep >= 3:
                best = [min(best[0], a), min(best[1], b)]
        return best[0] / best[1]
    finally:
        torch.set_num_threads(threads)
        _LINEAR = held


def _product(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``x @ weight.T + bias``: whole blocks of ``ROWS`` rows by oneDNN, the rest by MKL."""
    main = x.size(0) - x.size(0) % ROWS
    if main == 0:
        return nn.functional.linear(x, weight, bias)
    head = _LINEAR(x[:main], weight, bias, "none", [], "")  # type: ignore[operator]
    if main == x.size(0):
        return head
    return torch.cat([head, nn.functional.linear(x[main:], weight, bias)])


def _weight_gradient(grad: Tensor, x: Tensor) -> Tensor:
    """``grad^T @ x``, summed over blocks of ``ROWS`` rows by oneDNN and the rest by MKL."""
    main = x.size(0) - x.size(0) % ROWS
    if main == 0:
        return grad.t() @ x
    total = _LINEAR(grad[:main].t(), x[:main].t(), None, "none", [], "")  # type: ignore[operator]
    if main == x.size(0):
        return total
    return total + grad[main:].t() @ x[main:]


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` for a 2-D ``x``, through oneDNN where it applies.

    The use is reported to the active parameter tap (silo/models/parameter_taps.py), if any.
    """
    if (x.device.type != "cpu" or x.dim() != 2 or x.dtype != torch.float32
            or weight.dtype != torch.float32 or not onednn_enabled()):
        out = nn.functional.linear(x, weight, bias)
    else:
        out = _OneDnnLinear.apply(x, weight, bias)
    tap = active_tap()
    if tap is not None:
        tap.linear(x, weight, bias, out)
    return out


def split_linear(a: Tensor, b: Tensor, weight: Tensor) -> Tensor:
    """``[a || b] @ weight.T`` (no bias) without the concatenated copy of ``a`` and ``b``.

    Through oneDNN where it applies, as two products; otherwise one function whose backward
    writes both halves of the weight's gradient straight into one tensor, where autograd's
    two column slices would each zero-fill a full-size gradient and add them. Not reported
    to a parameter tap: callers use it only when none is active.
    """
    split = a.size(1)
    if b.size(1) + split != weight.size(1):
        raise ValueError(f"inputs of widths {split} and {b.size(1)}; the weight takes "
                         f"{weight.size(1)}")
    if (a.device.type == "cpu" and a.dim() == b.dim() == 2
            and a.dtype == b.dtype == weight.dtype == torch.float32 and onednn_enabled()):
        return linear(a, weight[:, :split]).add_(linear(b, weight[:, split:]))
    return _SplitLinear.apply(a, b, weight)


class _SplitLinear(torch.autograd.Function):
    """``a @ W_a^T + b @ W_b^T`` for the column blocks ``W = [W_a | W_b]``."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, weight: Tensor) -> Tensor:  # type: ignore[override]
        split = a.size(1)
        ctx.save_for_backward(a, b, weight)
        # The blocks are strided views; BLAS reads them in place, and the second product
        # accumulates into the first.
        return torch.mm(a, weight[:, :split].t()).addmm_(b, weight[:, split:].t())

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor  # type: ignore[override]
                 ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        a, b, weight = ctx.saved_tensors
        split = a.size(1)
        need_a, need_b, need_w = ctx.needs_input_grad
        grad_a = grad @ weight[:, :split] if need_a else None
        grad_b = grad @ weight[:, split:] if need_b else None
        grad_w = None
        if need_w:
            grad_w = weight.new_empty(weight.shape)
            torch.mm(grad.t(), a, out=grad_w[:, :split])
            torch.mm(grad.t(), b, out=grad_w[:, split:])
        return grad_a, grad_b, grad_w


class _OneDnnLinear(torch.autograd.Function):
    """Forward and both gradients as oneDNN products (the bias gradient is a column sum)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor,  # type: ignore[override]
                bias: Tensor | None) -> Tensor:
        # A weight whose rows are not packed (a column block of a wider matrix) sends oneDNN
        # down a path over fifty times slower; a copy of the small weight costs nothing.
        weight = weight.contiguous()
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _product(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor  # type: ignore[override]
                 ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        need_x, need_w, need_b = ctx.needs_input_grad
        # grad @ W is a linear product with weight W^T.
        grad_x = _product(grad, weight.t().contiguous(), None) if need_x else None
        grad_w = _weight_gradient(grad, x) if need_w else None
        grad_b = grad.sum(0) if ctx.has_bias and need_b else None
        return grad_x, grad_w, grad_b


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, names and initialisation) computed by ``linear``."""

    def forward(self, x: Tensor) -> Tensor:
        """``x @ weight.T + bias``."""
        return linear(x, self.weight, self.bias)
