"""The GNN's message-passing layers, one per file, and the contract they keep.

A layer is an ``nn.Module`` built from ``(hidden, ..., norm, dropout)`` with

- ``pre(x, batch) -> pre_activation``: messages over the whole graph; ``x`` is (N, H) or (N, K, H);
- ``post(pre) -> update``: norm, GELU, dropout, so that ``forward(x, batch) = x + post(pre(x, batch))``
  (residual);
- ``fusable``: True when ``pre`` is linear in ``x``, so that a config layer is evaluated as the shared
  graph's pre-activation plus ``add_delta_pre(pre, delta, level)`` on the rows where configs differ
  (:mod:`pipelines.models.gnn.model`, "fusion"); a layer that is not runs on K copies of the graph.

:func:`make_layer` builds the one ``gnn.conv`` names. The per-node cost head of the ``pooled+sum``
readout lives here too (``node_cost``).
"""

from __future__ import annotations

from torch import nn

from pipelines.config.gnn import GNNConfig
from pipelines.models.gnn.layers.gat import GatLayer
from pipelines.models.gnn.layers.node_cost import NodeCostHead
from pipelines.models.gnn.layers.sage import SageLayer

__all__ = ["GatLayer", "NodeCostHead", "SageLayer", "make_layer"]


def make_layer(cfg: GNNConfig) -> nn.Module:
    if cfg.conv == "gat":
        return GatLayer(cfg.hidden, cfg.gat_heads, cfg.norm, cfg.dropout)
    return SageLayer(cfg.hidden, cfg.norm, cfg.dropout)
