"""Graph classification models of the reference code, with its parameter names.

``GIN`` is the baseline of ALGORITHMS.md §1.3 (GCFL's and FedStar's Local); ``DualChannelGIN`` is
FedStar's ``GIN_dc`` (§2.2): a local GIN feature channel fed at every layer by a shareable GCN
structure channel. PyG semantics relied on: ``GINConv`` with eps = 0 (not trained) and sum
aggregation; ``GCNConv`` with self loops and symmetric normalisation; sum pooling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GCNConv, GINConv, global_add_pool


def _gin_mlp(in_dim: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden))


class GIN(nn.Module):
    """Plain GIN: pre -> 3 x (GINConv, ReLU, dropout) -> sum pool -> post -> readout.

    Input ``x`` [N, n_feat], output log-probabilities [B, n_classes].
    """

    def __init__(self, n_feat: int, n_classes: int, hidden: int = 64, layers: int = 3,
                 dropout: float = 0.5) -> None:
        super().__init__()
        self.n_feat, self.n_classes, self.hidden = n_feat, n_classes, hidden
        self.n_layers, self.dropout = layers, dropout
        self.pre = nn.Sequential(nn.Linear(n_feat, hidden))
        self.graph_convs = nn.ModuleList(GINConv(_gin_mlp(hidden, hidden)) for _ in range(layers))
        self.post = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU())
        self.readout = nn.Sequential(nn.Linear(hidden, n_classes))

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor, num_graphs: int,
                stc_enc: Tensor | None = None) -> Tensor:
        """Log-probabilities per graph."""
        h = self.pre(x)
        for conv in self.graph_convs:
            h = F.dropout(F.relu(conv(h, edge_index)), self.dropout, self.training)
        g = global_add_pool(h, batch, size=num_graphs)
        g = F.dropout(self.post(g), self.dropout, self.training)
        return F.log_softmax(self.readout(g), dim=1)


class DualChannelGIN(nn.Module):
    """FedStar's GIN_dc: local GIN feature channel + shareable GCN structure channel.

    Per layer the feature GIN sees ``[h_{l-1} || g_{l-1}]``; the structure channel is
    ``g_l = tanh(GCNConv(g_{l-1}))`` with no dropout. ``Whp`` maps ``[h_L || g_L]`` per node
    before sum pooling, as in the reference code (ALGORITHMS.md §7 FedStar item 4).
    """

    def __init__(self, n_feat: int, n_classes: int, n_se: int = 32, hidden: int = 64,
                 layers: int = 3, dropout: float = 0.5) -> None:
        super().__init__()
        self.n_feat, self.n_classes, self.n_se, self.hidden = n_feat, n_classes, n_se, hidden
        self.n_layers, self.dropout = layers, dropout
        self.pre = nn.Sequential(nn.Linear(n_feat, hidden))
        self.embedding_s = nn.Linear(n_se, hidden)
        self.graph_convs = nn.ModuleList(
            GINConv(_gin_mlp(2 * hidden, hidden)) for _ in range(layers)
        )
        self.graph_convs_s_gcn = nn.ModuleList(GCNConv(hidden, hidden) for _ in range(layers))
        self.Whp = nn.Linear(2 * hidden, hidden)
        self.post = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU())
        self.readout = nn.Sequential(nn.Linear(hidden, n_classes))

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor, num_graphs: int,
                stc_enc: Tensor | None = None) -> Tensor:
        """Log-probabilities per graph; ``stc_enc`` [N, n_se] is required."""
        if stc_enc is None:
            raise ValueError("DualChannelGIN needs structure embeddings (stc_enc)")
        h = self.pre(x)
        g = self.embedding_s(stc_enc)
        for conv, conv_s in zip(self.graph_convs, self.graph_convs_s_gcn, strict=True):
            h = F.dropout(F.relu(conv(torch.cat((h, g), dim=-1), edge_index)), self.dropout,
                          self.training)
            g = torch.tanh(conv_s(g, edge_index))
        z = self.Whp(torch.cat((h, g), dim=-1))
        z = global_add_pool(z, batch, size=num_graphs)
        z = F.dropout(self.post(z), self.dropout, self.training)
        return F.log_softmax(self.readout(z), dim=1)
