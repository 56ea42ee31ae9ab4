"""Residual bidirectional GraphSAGE (Hamilton et al., "Inductive Representation Learning on Large Graphs",
NeurIPS 2017: mean aggregation with a separate root weight), with messages along both edge directions
(producer -> consumer and back) and a per-node LayerNorm.

Linear up to its normalisation, so it is *fusable* (see :mod:`pipelines.models.gnn.layers`): a config
layer's pre-activation is the shared graph's plus ``W * delta`` on the rows where configs differ."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipelines.models.gnn.batch import GraphBatch, Level
from pipelines.models.gnn.ops import weighted_gather_sum


class SageLayer(nn.Module):
    """Residual bidirectional GraphSAGE: root + mean over producers + mean over consumers, norm, GELU."""

    fusable = True

    def __init__(self, hidden: int, norm: str, dropout: float):
        super().__init__()
        self.lin_root = nn.Linear(hidden, hidden)
        self.lin_in = nn.Linear(hidden, hidden, bias=False)  # messages producer -> consumer
        self.lin_out = nn.Linear(hidden, hidden, bias=False)  # messages consumer -> producer
        self.norm = nn.LayerNorm(hidden) if norm == "layer" else nn.Identity()
        self.dropout = nn.Dropout(dropout)

    def pre(self, x: torch.Tensor, batch: GraphBatch) -> torch.Tensor:
        """Pre-activation on the full graph; x is (N, H) or (N, K, H)."""
        src, dst = batch.message_edges
        n = x.shape[0]
        # linear before aggregation (equal by linearity) so the gather moves H-wide rows once
        agg_in = weighted_gather_sum(F.linear(x, self.lin_in.weight), src, dst, batch.inv_deg_in[dst], n)
        agg_out = weighted_gather_sum(F.linear(x, self.lin_out.weight), dst, src, batch.inv_deg_out[src], n)
        return self.lin_root(x) + agg_in + agg_out

    def add_delta_pre(self, pre: torch.Tensor, delta: torch.Tensor, level: Level) -> torch.Tensor:
        """Add, in place, the change of the pre-activation on the rows of D_j caused by ``delta`` (R_{j-1}, K, H).

        ``pre`` is a fresh (|D_j|, K, H) tensor; accumulating into it avoids three more full-size
        buffers (the per-config tensors are the memory traffic that bounds a step on CPU).
        """
        dtype = pre.dtype  # bfloat16 under autocast, where F.linear may return another dtype than pre's
        pre.index_add_(0, level.root, F.linear(delta, self.lin_root.weight).to(dtype))
        forward = F.linear(delta, self.lin_in.weight).to(dtype).index_select(0, level.fwd_src)
        pre.index_add_(0, level.fwd_dst, forward * level.fwd_w.to(dtype)[:, None, None])
        backward = F.linear(delta, self.lin_out.weight).to(dtype).index_select(0, level.bwd_src)
        return pre.index_add_(0, level.bwd_dst, backward * level.bwd_w.to(dtype)[:, None, None])

    def post(self, pre: torch.Tensor) -> torch.Tensor:
        return self.dropout(F.gelu(self.norm(pre)))

    def forward(self, x: torch.Tensor, batch: GraphBatch) -> torch.Tensor:
        return x + self.post(self.pre(x, batch))
