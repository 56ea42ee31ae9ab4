"""Residual GATv2 (Brody et al., "How Attentive are Graph Attention Networks?", ICLR 2022; PyTorch
Geometric's ``GATv2Conv``) over both edge directions, the direction given as a 1-d edge attribute.

Attention is not linear in its inputs: not *fusable* (see :mod:`pipelines.models.gnn.layers`), its config
layers run on K copies of the full graph."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipelines.models.gnn.batch import GraphBatch


class GatLayer(nn.Module):
    """Residual GATv2 over both edge directions (direction given as a 1-d edge attribute)."""

    fusable = False

    def __init__(self, hidden: int, heads: int, norm: str, dropout: float):
        super().__init__()
        from torch_geometric.nn import GATv2Conv

        self.conv = GATv2Conv(hidden, hidden // heads, heads=heads, edge_dim=1, add_self_loops=True)
        self.norm = nn.LayerNorm(hidden) if norm == "layer" else nn.Identity()
        self.dropout = nn.Dropout(dropout)

    def pre(self, x: torch.Tensor, batch: GraphBatch) -> torch.Tensor:
        m = batch.message_edges.shape[1]
        edges = torch.cat([batch.message_edges, batch.message_edges.flip(0)], dim=1)
        direction = torch.cat([x.new_zeros(m), x.new_ones(m)]).unsqueeze(-1)
        if x.dim() == 2:
            return self.conv(x, edges, direction)
        n, k, h = x.shape  # K copies of the graph: node i of copy c is row i * K + c
        edges = (edges.unsqueeze(-1) * k + torch.arange(k, device=edges.device)).reshape(2, -1)
        direction = direction.repeat_interleave(k, dim=0)
        return self.conv(x.reshape(n * k, h), edges, direction).reshape(n, k, h)

    def post(self, pre: torch.Tensor) -> torch.Tensor:
        return self.dropout(F.gelu(self.norm(pre)))

    def forward(self, x: torch.Tensor, batch: GraphBatch) -> torch.Tensor:
        return x + self.post(self.pre(x, batch))
