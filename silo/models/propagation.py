"""Message passing as a sparse matrix product: ``out[v] = sum over edges u -> v of w_uv y[u]``.

Gathering one message per edge and scattering it back (``index_select`` + ``index_add_``)
writes an [E, d] tensor forwards and again backwards, with random memory access both ways; on
one CPU thread that costs more than a layer's dense products. A CSR product reads each
neighbour row in place (about 10x faster for a batch of TU molecules). Its gradient is the
product with the transpose, kept as a second CSR matrix (or the same one, for symmetric edges),
so the backward pass is no scatter either.

Building CSR needs the edges sorted by target. ``Adjacency.from_edges`` sorts (for ad-hoc
use); ``silo/models/batching.py`` sorts each graph's edges once when it packs a split and builds a
batch's CSR without sorting: ``Adjacency.from_symmetric_csr`` from its parts for undirected
graphs, ``Adjacency.from_sorted`` (which only counts and offsets) for directed ones. Repeated
edges stay separate entries and are summed, as a scatter would sum them.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

# torch marks CSR as beta and says so on every construction; the products used here (CSR
# times dense, CPU and CUDA) are long-standing and covered by tests/test_propagation.py.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")


def _unchecked() -> torch.sparse.check_sparse_tensor_invariants:
    """Sparse invariant checks off, explicitly, for a construction or a copy of ours.

    Our CSR parts are valid by construction, and checking them costs a pass over the edges.
    torch >= 2.11 warns once per process ("Sparse invariant checks are implicitly disabled")
    while the process-wide setting is unset, and some versions consult it even when
    ``check_invariants=False`` is given; inside this scope it is set, and on leaving it is set
    back to what it was (False unless the process turned checks on), so the warning never comes.
    """
    return torch.sparse.check_sparse_tensor_invariants(enable=False)


class Adjacency:
    """The weighted edges of one batch as CSR matrices ``A`` (row = target) and ``A^T``."""

    def __init__(self, matrix: Tensor, transpose: Tensor, weighted: bool) -> None:
        self.matrix, self.transpose, self.weighted = matrix, transpose, weighted
        self.num_nodes = int(matrix.size(0))

    @classmethod
    def from_sorted(cls, src: Tensor, dst: Tensor, num_nodes: int, transpose_order: Tensor,
                    weight: Tensor | None = None) -> Adjacency:
        """Edges already sorted by (dst, src); ``transpose_order`` sorts them by (src, dst)
        (symmetric edges take ``from_symmetric_csr``)."""
        if src.shape != dst.shape or src.dim() != 1:
            raise ValueError(f"src and dst must be equal-length vectors, got "
                             f"{tuple(src.shape)} and {tuple(dst.shape)}")
        if weight is not None and weight.shape != src.shape:
            raise ValueError(f"weight has shape {tuple(weight.shape)}; expected "
                             f"{tuple(src.shape)}")
        values = weight if weight is not None else torch.ones(src.numel(), device=src.device)
        transpose = _csr(src.index_select(0, transpose_order),
                         dst.index_select(0, transpose_order),
                         values.index_select(0, transpose_order), num_nodes)
        return cls(_csr(dst, src, values, num_nodes), transpose, weight is not None)

    @classmethod
    def from_symmetric_csr(cls, crow: Tensor, col: Tensor, values: Tensor | None,
                           num_nodes: int) -> Adjacency:
        """CSR parts of edges known to be symmetric, so ``A^T`` is ``A`` (``crow`` and ``col``
        of one integer type; ``values`` None: every weight is one)."""
        weighted = values is not None
        if values is None:
            values = torch.ones(col.numel(), device=col.device)
        with _unchecked():
            matrix = torch.sparse_csr_tensor(crow, col, values, (num_nodes, num_nodes),
                                             check_invariants=False)
        return cls(matrix, matrix, weighted)

    @classmethod
    def from_edges(cls, edge_index: Tensor, num_nodes: int, weight: Tensor | None = None
                   ) -> Adjacency:
        """Any ``[2, E]`` edge list (source row, target row), sorted here."""
        if edge_index.dim() != 2 or edge_index.size(0) != 2:
            raise ValueError(f"edge_index must have shape [2, E], got "
                             f"{tuple(edge_index.shape)}")
        src, dst = edge_index[0].long(), edge_index[1].long()
        if weight is not None and weight.shape != src.shape:
            raise ValueError(f"weight has shape {tuple(weight.shape)}; expected "
                             f"{tuple(src.shape)}")
        if src.numel() and int(torch.maximum(src, dst).max()) >= num_nodes:
            raise ValueError(f"edge_index names node {int(torch.maximum(src, dst).max())}; "
                             f"the graph has {num_nodes} nodes")
        order = by_target(src, dst, num_nodes)
        src, dst = src[order], dst[order]
        weight = None if weight is None else weight[order]
        return cls.from_sorted(src, dst, num_nodes, by_target(dst, src, num_nodes), weight)

    @property
    def src(self) -> Tensor:
        """Each edge's source row (int64), edges sorted by (target, source)."""
        return self.matrix.col_indices().long()

    @property
    def dst(self) -> Tensor:
        """Each edge's target row (int64), edges sorted by (target, source)."""
        crow = self.matrix.crow_indices().long()
        return torch.repeat_interleave(torch.arange(self.num_nodes, device=crow.device),
                                       crow[1:] - crow[:-1],
                                       output_size=self.matrix.col_indices().numel())

    @property
    def weight(self) -> Tensor | None:
        """Each edge's weight, or None where every weight is one."""
        return self.matrix.values() if self.weighted else None

    def __call__(self, y: Tensor) -> Tensor:
        """``A @ y``: for every node, the weighted sum of its in-neighbours' rows of ``y``."""
        if y.size(0) != self.num_nodes:
            raise ValueError(f"features have {y.size(0)} rows; the graph has "
                             f"{self.num_nodes} nodes")
        return _SparseProduct.apply(y, self)

    def times(self, y: Tensor, alpha: float = 1.0) -> Tensor:
        """``alpha * A @ y`` as a new tensor, outside autograd (for hand-written backwards)."""
        return _times(self.matrix, y.contiguous(), alpha)

    def transpose_times(self, y: Tensor, alpha: float = 1.0) -> Tensor:
        """``alpha * A^T @ y`` as a new tensor, outside autograd: the gradient of ``times``."""
        return _times(self.transpose, y.contiguous(), alpha)

    @property
    def edge_index(self) -> Tensor:
        """The edges as a ``[2, E]`` list (source row, target row), sorted by target."""
        return torch.stack([self.src, self.dst])

    def to(self, device: torch.device) -> Adjacency:
        """The same adjacency on another device (itself if it is there already)."""
        device = torch.device(device)
        here = self.matrix.device
        if here == device or (device.index is None and here.type == device.type):
            return self
        symmetric = self.transpose is self.matrix
        with _unchecked():
            matrix = self.matrix.to(device)
            transpose = matrix if symmetric else self.transpose.to(device)
        return Adjacency(matrix, transpose, self.weighted)


def gcn_weights(src: Tensor, dst: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    """PyG's gcn_norm for ``A + I``: the weights of the edges and of one self loop per node.

    ``deg^-1/2 (A + I) deg^-1/2`` with ``deg`` the in-degree (at the target) plus one.
    """
    degree = torch.ones(num_nodes, device=dst.device).index_add_(
        0, dst, torch.ones(dst.numel(), device=dst.device))
    inv_sqrt = degree.pow(-0.5)
    return inv_sqrt[src] * inv_sqrt[dst], inv_sqrt * inv_sqrt


def by_target(src: Tensor, dst: Tensor, num_nodes: int) -> Tensor:
    """The permutation sorting edges by (dst, src), stable for repeated edges."""
    return torch.sort(dst * max(num_nodes, 1) + src, stable=True).indices


def _csr(rows: Tensor, cols: Tensor, values: Tensor, num_nodes: int) -> Tensor:
    # 32-bit indices where they fit: MKL takes them as they are (64-bit ones it converts on
    # every product).
    index = torch.int32 if max(num_nodes, cols.numel()) < 2 ** 31 else torch.long
    if rows.device.type != "cpu":
        # bincount waits for the GPU (it reads the largest row to size its output); the rows
        # are sorted, so each row's first edge is found by a search instead.
        crow = torch.searchsorted(rows, torch.arange(num_nodes + 1, device=rows.device),
                                  out_int32=index == torch.int32)
        return torch.sparse_csr_tensor(crow, cols.to(index), values, (num_nodes, num_nodes),
                                       check_invariants=False)
    counts = torch.bincount(rows, minlength=num_nodes)
    crow = torch.zeros(num_nodes + 1, dtype=index, device=rows.device)
    torch.cumsum(counts, 0, out=crow[1:])
    with _unchecked():
        return torch.sparse_csr_tensor(crow, cols.to(index), values, (num_nodes, num_nodes),
                                       check_invariants=False)


def _times(matrix: Tensor, dense: Tensor, alpha: float = 1.0) -> Tensor:
    """``alpha * matrix @ dense`` written straight into a new tensor (``A @ y`` zero-fills a
    buffer and copies it over: twice the memory traffic of the product itself); the scale
    costs nothing extra on the CPU."""
    if dense.device.type != "cpu":          # measured on the CPU only; GPUs get torch's path
        out = matrix @ dense
        return out if alpha == 1.0 else out.mul_(alpha)
    out = dense.new_empty(matrix.size(0), dense.size(1))
    return torch.addmm(out, matrix, dense, beta=0, alpha=alpha, out=out)


class _SparseProduct(torch.autograd.Function):
    """``A @ y`` whose gradient with respect to ``y`` is ``A^T @ grad`` (A is constant)."""

    @staticmethod
    def forward(ctx, y: Tensor, adjacency: Adjacency) -> Tensor:  # type: ignore[override]
        ctx.adjacency = adjacency
        return adjacency.times(y)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return ctx.adjacency.transpose_times(grad), None
