"""The per-node cost head of ``readout = "pooled+sum"``: an MLP on every varying node state, summed per
graph and config (a runtime is a sum of kernel times)."""

from __future__ import annotations

import torch
from torch import nn

from pipelines.models.gnn.batch import GraphBatch
from pipelines.models.gnn.device import full_precision
from pipelines.models.gnn.ops import segment_sum


class NodeCostHead(nn.Module):
    """``readout = "pooled+sum"``: a cost per node and config, summed per graph.

    A program's runtime is roughly the sum of its kernels' times, each a nonlinear function of its own
    layouts; mean/max pooling followed by a LayerNorm and an MLP cannot express such a sum. The head
    runs on the nodes whose state differs between configs (D_L); the others add the same constant to
    every config of a graph, which a ranking ignores. The sum is divided by the graph's configurable
    node count so its scale does not grow with the graph. The last layer starts at zero: training
    starts from the pooled model's scores.
    """

    def __init__(self, hidden: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden // 2), nn.GELU(), nn.Linear(hidden // 2, 1))
        nn.init.zeros_(self.mlp[-1].weight)
        nn.init.zeros_(self.mlp[-1].bias)

    def forward(self, states: torch.Tensor, graph: torch.Tensor, batch: GraphBatch) -> torch.Tensor:
        """(B, K) per-config sum of ``self.mlp`` over ``states`` (rows, K, H), rows grouped by ``graph``."""
        with full_precision(states):  # float32 costs and sums, also under bf16 autocast (see full_precision)
            per_node = self.mlp(states.float()).squeeze(-1)  # (rows, K)
        total = segment_sum(per_node, graph, batch.num_graphs)
        return total / batch.num_config_nodes.clamp(min=1).to(total.dtype)[:, None]
