"""One graph of a graph-classification dataset, as training reads it.

The fields PyG's ``Data`` carries for these graphs (a PyG ``Data`` with them is accepted wherever
a ``Graph`` is), without importing ``torch_geometric``: that import pulls in its whole package,
``torch._dynamo`` and sympy among it, about 1.5 s of CPU in every silo process.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(eq=False)
class Graph:
    """Node features ``x`` [N, F], edges ``edge_index`` [2, E] of local node ids, class ``y``
    [1]; ``stc_enc`` [N, n_se] once structure embeddings are added (silo/data/structure.py)."""

    x: Tensor
    edge_index: Tensor
    y: Tensor
    num_nodes: int
    edge_attr: Tensor | None = None
    stc_enc: Tensor | None = None
