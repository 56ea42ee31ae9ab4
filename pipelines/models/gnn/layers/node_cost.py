"""The per-node cost head of ``readout = "pooled+sum"`` (and ``"pooled+sum+bytes"``, ``"pooled+sum+work"``):
an MLP on every varying node state, summed per graph and config (a runtime is a sum of kernel times)."""

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
    node count so its scale does not grow with the graph.

    ``by_bytes`` (``"pooled+sum+bytes"``) adds a second cost per node, weighted by the node's share of
    its graph's output bytes (``GraphBatch.final_bytes_share``): a layout's price on a memory-bound
    kernel grows with the data it moves, over orders of magnitude that an MLP on log-scaled,
    LayerNorm-ed states does not reach. The last layer starts at zero: training starts from the
    pooled model's scores.

    ``weighting = "work"`` (``"pooled+sum+work"``) weights two further costs per node by the two inputs
    of a kernel's roofline time instead (``GraphBatch.final_work_share``): its share of the bytes its
    graph's kernels move (operands and output) and of their flops (a weight gradient's output is small,
    the data it reads and its flops are not).
    """

    WEIGHTED_COSTS = {"count": 0, "bytes": 1, "work": 2}  # weighting -> costs weighted by a per-node share

    def __init__(self, hidden: int, weighting: str = "count"):
        super().__init__()
        self.weighting = weighting
        outputs = 1 + self.WEIGHTED_COSTS[weighting]
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden // 2), nn.GELU(), nn.Linear(hidden // 2, outputs))
        nn.init.zeros_(self.mlp[-1].weight)
        nn.init.zeros_(self.mlp[-1].bias)

    def forward(self, states: torch.Tensor, graph: torch.Tensor, batch: GraphBatch) -> torch.Tensor:
        """(B, K) per-config sum of ``self.mlp`` over ``states`` (rows, K, H), rows grouped by ``graph``."""
        with full_precision(states):  # float32 costs and sums, also under bf16 autocast (see full_precision)
            per_node = self.mlp(states.float())  # (rows, K, outputs)
        total = segment_sum(per_node[..., 0], graph, batch.num_graphs)
        total = total / batch.num_config_nodes.clamp(min=1).to(total.dtype)[:, None]
        if self.weighting != "count":
            shares = batch.final_bytes_share[:, None] if self.weighting == "bytes" else batch.final_work_share
            weighted = (per_node[..., 1:] * shares.to(per_node.dtype)[:, None, :]).sum(dim=-1)
            total = total + segment_sum(weighted, graph, batch.num_graphs)
        return total
