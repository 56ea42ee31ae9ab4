"""The ranking network: node encoder, config injection with intermediate fusion, pooling, score head.

Layout, per step (one or more graphs, K configs each):

1. ``encode`` runs once per graph, independent of configs: opcode embedding + linear projection
   of the node features, then ``free_layers`` residual message-passing layers on the full graph.
   A learned "no config" vector is added at every node; the same (shared) states are then pushed
   through the ``config_layers`` as well, which gives each node's state for a config-less graph.
2. ``score`` injects the K configs at the configurable nodes only (18 values, each embedded with a
   small shared value table plus a slot embedding, flattened, MLP; plus, with ``layout_physics``, a
   linear map of the sizes and 8x128 tile padding the chosen layouts imply, see
   ``batch.layout_physics``). After ``j`` config layers only
   nodes within ``j`` hops of a configurable node (the set ``D_j``) differ between configs, so the
   K copies are carried only on ``D_j``. The SAGE layer is linear up to its normalisation, so config
   layer ``j`` is evaluated *exactly* as ``shared pre-activation + W * delta`` with
   ``delta = state_k - shared state`` non-zero only on ``D_{j-1}``; the weight matrices touch
   K x |D_{j-1}| rows and only cheap elementwise work touches K x |D_j|. With one config layer
   (the default) the matrix work per config is K x (number of configurable nodes); the rest is
   O(K x |D_1|) elementwise, i.e. K times the pruned graph at most, never the original graph.
   With no config layer (``config_layers = 0``) only the configurable nodes differ between configs
   (``D_0``): the K copies are carried on them alone, and a layout reaches other nodes only through
   the chain-end messages below (on the largest real-size xla graph, 3.3k of 11.2k pruned nodes).
   With ``config_pairs``, each *chain end* (two configurable nodes whose layouts meet directly or
   through elementwise chains, or one and a fixed-layout node; ``batch.chain_layouts``) gets, per
   config, an MLP message over the embedded layouts of both sides and the copy they imply. The
   message is added to both endpoint nodes before the config layers (so a layout reaches the node
   it meets, however many hops apart) and summed per config into the pooled representation (a copy
   costs time wherever it is). O(ends x K): ends are about twice the configurable nodes. What each
   end sees is computed on the model's device from the step's configs (``batch.chain_layouts``);
   the MLP's first layer runs once per distinct layout and side, and its last layer is folded
   into the projection to the nodes and the pooled sum (``inject``), so the per-end-and-config work
   is a gather, a GELU and a sum per node.
3. Pooling per config: mean and max over all nodes (nodes outside ``D_L`` contribute their shared
   state once) and mean over the configurable nodes; a linear layer, optionally a transformer
   encoder layer across the K configs of a graph ("cross-config attention"), and an MLP head give
   one cost per config (LOWER = predicted FASTER). With ``readout = "pooled+sum"`` a per-node cost
   (an MLP on each state of ``D_L``) summed per graph and config is added to it: a runtime is a sum
   of kernel times, which a LayerNorm over pooled states cannot express (``NodeCostHead``).
   A CPU step is bound by its passes over the (|D_L|, K, H) states: the max takes its values and
   arg-max rows from one pass of ``max`` over row blocks that stay in cache (``ops.max_over_rows``), and
   a training step on one graph pools with one gradient pass (``ops.PoolOneGraph``), both bit-for-bit as
   the plain ops.

GATv2 is offered as an option; attention is not linear in its inputs, so its config layers run
unfused on K copies of the full graph (``score(..., fused=False)``, also used by the tests to
check the fused SAGE path). Normalisation is per node (LayerNorm): a graph-level norm would make
every node depend on every config and defeat the fusion.

Tile: all layers are config-free; the 24 config values (sign * log1p) go through an MLP and are
joined with the mean/max-pooled node states of their graph (late fusion). With ``tile_physics`` the
MLP also gets what each tile size implies against the output shape and the (8, 128) registers
(``batch.tile_physics``, the same sign * log1p).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pipelines.models.gnn.batch import (CHAIN_DIM, LAYOUT_NUM_VALUES, PHYSICS_DIM, RESHAPE_DIM, ROLES_DIM,
                                         TILE_PHYSICS_DIM, ChainLayouts, ConfigBatch, GraphBatch, chain_layouts,
                                         layout_physics, layout_roles, reshape_physics)
from pipelines.models.gnn.device import full_precision
from pipelines.models.gnn.layers import NodeCostHead, make_layer
from pipelines.models.gnn.ops import PoolOneGraph, segment_max_sorted, segment_sum
from pipelines.config.gnn import GNNConfig

# the node-cost readouts (GNNConfig.readout) and the per-node shares NodeCostHead weights costs by
READOUT_WEIGHTING = {"pooled+sum": "count", "pooled+sum+bytes": "bytes", "pooled+sum+work": "work"}

NUM_OPCODES = 121  # opcode ids 0..120
MASK_OPCODE = NUM_OPCODES  # extra embedding row: the "masked" token of pre-training
LAYOUT_SLOTS = 18
TILE_CONFIG_DIM = 24


# ----------------------------------------------------------------------------- model


@dataclass
class Context:
    """What ``encode`` computes once per graph batch and ``score`` reuses for every chunk of configs."""

    batch: GraphBatch
    pooled: torch.Tensor | None = None  # tile: (B, 2H) mean and max of node states
    config_states: torch.Tensor | None = None  # layout: (R0, H) free-layer states at configurable nodes
    shared_in: list[torch.Tensor] | None = None  # layout: shared input of each config layer (N, H)
    shared_pre: list[torch.Tensor] | None = None  # layout: shared pre-activation of each config layer
    outside_sum: torch.Tensor | None = None  # layout: (B, H) sum of final shared states outside D_L
    outside_max: torch.Tensor | None = None  # layout: (B, H) their max (-inf if none)


class GNNModel(nn.Module):
    """``encode(batch)`` once per graph batch, then ``score(context, configs)`` -> (B, K) costs."""

    def __init__(self, cfg: GNNConfig, node_feat_dim: int, kind: str):
        super().__init__()
        if kind not in ("layout", "tile"):
            raise ValueError(f"kind must be 'layout' or 'tile', got {kind!r}")
        hidden = cfg.hidden
        self.kind = kind
        self.opcode_embed = nn.Embedding(NUM_OPCODES + 1, cfg.opcode_dim)
        self.input_proj = nn.Linear(cfg.opcode_dim + node_feat_dim, hidden)
        num_free = cfg.free_layers + (cfg.config_layers if kind == "tile" else 0)
        self.free_layers = nn.ModuleList(make_layer(cfg) for _ in range(num_free))
        if kind == "layout":
            self.config_layers = nn.ModuleList(make_layer(cfg) for _ in range(cfg.config_layers))
            self.value_embed = nn.Embedding(LAYOUT_NUM_VALUES, cfg.config_value_dim)
            self.slot_embed = nn.Parameter(0.1 * torch.randn(LAYOUT_SLOTS, cfg.config_value_dim))
            self.no_config = nn.Parameter(0.1 * torch.randn(hidden))
            self.physics_proj = nn.Linear(PHYSICS_DIM, hidden) if cfg.layout_physics else None
            config_in = LAYOUT_SLOTS * cfg.config_value_dim
        else:
            self.config_layers = nn.ModuleList()
            config_in = TILE_CONFIG_DIM + (TILE_PHYSICS_DIM if cfg.tile_physics else 0)
        self.config_proj = nn.Sequential(nn.Linear(config_in, hidden), nn.GELU(), nn.Linear(hidden, hidden))
        self.chains = kind == "layout" and cfg.config_pairs
        if self.chains:
            self.chain_slot_embed = nn.Parameter(0.1 * torch.randn(2 * 6, cfg.config_value_dim))
            self.chain_mlp = nn.Sequential(nn.Linear(12 * cfg.config_value_dim + CHAIN_DIM, hidden), nn.GELU(),
                                           nn.Linear(hidden, hidden))
            self.chain_to_node = nn.Linear(hidden, 2 * hidden, bias=False)  # producer's and consumer's share
        self.combine = nn.Sequential(nn.Linear((4 if self.chains else 3) * hidden, hidden), nn.LayerNorm(hidden))
        self.attention = (
            nn.TransformerEncoderLayer(hidden, cfg.attention_heads, 2 * hidden, cfg.dropout,
                                       batch_first=True, norm_first=True)
            if cfg.cross_config_attention else None
        )
        self.head = nn.Sequential(nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, 1))
        # built last so that the other modules draw the same initial weights with the option off
        self.node_cost = (NodeCostHead(hidden, weighting=READOUT_WEIGHTING[cfg.readout])
                          if kind == "layout" and cfg.readout != "pooled" else None)
        self.roles_proj = nn.Linear(ROLES_DIM, hidden) if kind == "layout" and cfg.layout_roles else None
        self.reshape_proj = nn.Linear(RESHAPE_DIM, hidden) if kind == "layout" and cfg.reshape_physics else None

    @property
    def fused_config_layers(self) -> bool:
        """Whether the config layers run fused (every one is linear up to its norm; also with none)."""
        return all(layer.fusable for layer in self.config_layers)

    # --- config-free part

    def encode_nodes(self, batch: GraphBatch, opcode: torch.Tensor | None = None) -> torch.Tensor:
        """Node states after the config-free layers (N, H); ``opcode`` overrides (pre-training masks)."""
        ops = batch.node_opcode if opcode is None else opcode
        h = self.input_proj(torch.cat([self.opcode_embed(ops), batch.node_feat], dim=-1))
        for layer in self.free_layers:
            h = layer(h, batch)
        return h

    def encode(self, batch: GraphBatch) -> Context:
        h = self.encode_nodes(batch)
        b = batch.num_graphs
        if self.kind == "tile":
            mean = segment_sum(h, batch.node_graph, b) / batch.num_nodes[:, None]
            return Context(batch, pooled=torch.cat([mean, segment_max_sorted(h, batch.node_graph, b, batch.node_counts)], -1))
        x = h + self.no_config
        shared_in, shared_pre = [], []
        if self.config_layers and self.fused_config_layers:
            for layer in self.config_layers:
                pre = layer.pre(x, batch)
                shared_in.append(x)
                shared_pre.append(pre)
                x = x + layer.post(pre)
        else:
            shared_in.append(x)
        # index_select with host-known row ids: a boolean mask would make a GPU report its count
        outside = batch.outside_rows
        x_out, graph_out = x.index_select(0, outside), batch.node_graph.index_select(0, outside)
        return Context(
            batch, config_states=h[batch.config_rows], shared_in=shared_in, shared_pre=shared_pre,
            outside_sum=segment_sum(x_out, graph_out, b),
            outside_max=segment_max_sorted(x_out, graph_out, b, batch.outside_counts),
        )

    # --- config-dependent part

    def embed_layout_configs(self, configs: ConfigBatch, batch: GraphBatch) -> torch.Tensor:
        """(R0, K, H) embedding of each configurable node's block; each distinct block is embedded once."""
        e = self.value_embed(configs.values.long()) + self.slot_embed
        projected = self.config_proj(e.flatten(-2))  # (T, H), one row per distinct block
        # index_select, not [index]: [index]'s backward (index_put with accumulation) adds with atomics
        # when torch runs 2+ threads, so CPU fits would not repeat to the bit; index_add adds in order
        embedded = projected.index_select(0, configs.inverse.flatten()).view(*configs.inverse.shape, -1)
        if self.physics_proj is not None:
            physics = layout_physics(configs.values, configs.inverse, batch.config_shapes, batch.config_layouts)
            embedded = embedded + self.physics_proj(physics)
        if self.roles_proj is not None:
            roles = layout_roles(configs.values, configs.inverse, batch.config_shapes, batch.config_layouts,
                                 batch.config_roles)
            embedded = embedded + self.roles_proj(roles)
        if self.reshape_proj is not None:
            embedded = embedded + self.reshape_proj(reshape_physics(configs.values, configs.inverse, batch))
        return embedded

    def inject(self, ctx: Context, configs: ConfigBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """States (R0, K, H) of the configurable nodes with their configs injected, and (with
        ``config_pairs``) the per-config sum of the chain-end messages (B, K, H), else None."""
        x = ctx.config_states.unsqueeze(1) + self.embed_layout_configs(configs, ctx.batch)
        if not self.chains:
            return x, None
        batch = ctx.batch
        seen = chain_layouts(configs.values, configs.inverse, batch.chain_src, batch.chain_dst, batch.chain_kernel,
                             batch.chain_src_layout, batch.chain_dims, batch.chain_bytes)
        hidden = self.chain_hidden(seen)  # (E, K, H)
        # The message of an end is chain_mlp[2](hidden); what reaches a node is chain_to_node's share of
        # the messages of its ends, and the pooled term their sum: all linear in hidden. So hidden is
        # summed per node first and projected once per (node, config) by the product of the two weights
        # (a fixed-layout side adds to a spare row R0, dropped), and summed over ends before the last
        # layer: no (E, K, H) message nor (E, K, 2H) projection is built.
        rows, k, h = x.shape
        last, to_node = self.chain_mlp[2], self.chain_to_node.weight
        for ends, share in ((batch.chain_src, to_node[:h]), (batch.chain_dst, to_node[h:])):  # producer's, consumer's
            slot = torch.where(ends < 0, rows, ends).long()
            summed = hidden.new_zeros((rows + 1, k, h)).index_add_(0, slot, hidden)[:rows]
            count = hidden.new_zeros(rows + 1).index_add_(0, slot, torch.ones_like(slot, dtype=hidden.dtype))[:rows]
            x = x + (F.linear(summed, share @ last.weight) + count[:, None, None] * (share @ last.bias)).to(x.dtype)
        # one graph (every layout training step): a plain sum, much cheaper than index_add's scatter
        summed = (hidden.sum(0, keepdim=True) if batch.num_graphs == 1
                  else segment_sum(hidden, batch.chain_graph, batch.num_graphs))
        pooled = F.linear(summed, last.weight) + batch.num_chain_ends[:, None, None] * last.bias
        return x, pooled / batch.num_config_nodes.clamp(min=1)[:, None, None]

    def chain_hidden(self, seen: ChainLayouts) -> torch.Tensor:
        """(E, K, H): the hidden layer of ``chain_mlp`` over [producer's layout embedded (6 values,
        value + slot embedding), the consumer's, the copy features]. The first linear layer is split
        by its inputs: each distinct layout of ``seen.table`` is embedded and projected once per side,
        then gathered per end and config, instead of embedding 12 values per end and config."""
        first, dv = self.chain_mlp[0], self.value_embed.embedding_dim
        values = self.value_embed(seen.table)  # (T, 6, dv)
        as_producer = F.linear((values + self.chain_slot_embed[:6]).flatten(-2), first.weight[:, :6 * dv])
        as_consumer = F.linear((values + self.chain_slot_embed[6:]).flatten(-2), first.weight[:, 6 * dv:12 * dv])
        shape = (*seen.produced.shape, first.out_features)  # (E, K, H)
        # index_select, not [index]: its backward is an index_add, several times faster on CPU than index_put
        pre = (as_producer.index_select(0, seen.produced.flatten()).view(shape)
               + as_consumer.index_select(0, seen.wanted.flatten()).view(shape)
               + F.linear(seen.feat.to(as_producer.dtype), first.weight[:, 12 * dv:], first.bias))
        return self.chain_mlp[1](pre)

    def score(self, ctx: Context, configs: ConfigBatch, fused: bool = True) -> torch.Tensor:
        """Costs (B, K) of the configs of each graph; padded slots hold meaningless values."""
        node_cost = None
        if self.kind == "tile":
            c = self.config_proj(configs.values)
            feats = torch.cat([ctx.pooled.unsqueeze(1).expand(-1, c.shape[1], -1), c], dim=-1)
        elif fused and self.fused_config_layers:
            feats, node_cost = self._layout_fused(ctx, configs)
        else:
            feats, node_cost = self._layout_unfused(ctx, configs)
        z = self.combine(feats)
        if self.attention is not None:
            z = self.attention(z, src_key_padding_mask=~configs.mask)
        # the head in float32 also under bf16 autocast (see full_precision: bf16 costs tied 68% of
        # the OOF configs of the small world's xla:default graphs)
        with full_precision(z):
            cost = self.head(z.float()).squeeze(-1)
        return cost if node_cost is None else cost + node_cost

    def _pool_layout(self, batch: GraphBatch, total: torch.Tensor, maximum: torch.Tensor,
                     at_config: torch.Tensor, chain_sum: torch.Tensor | None) -> torch.Tensor:
        mean = total / batch.num_nodes[:, None, None]
        config_mean = segment_sum(at_config, batch.config_graph, batch.num_graphs)
        config_mean = config_mean / batch.num_config_nodes.clamp(min=1)[:, None, None]
        parts = [mean, maximum, config_mean] + ([chain_sum.to(mean.dtype)] if chain_sum is not None else [])
        return torch.cat(parts, dim=-1)

    def _layout_fused(self, ctx: Context, configs: ConfigBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Pooled features (B, K, F) and, with the node-cost readout, its (B, K) sum, else None."""
        batch = ctx.batch
        b = batch.num_graphs
        x, chain_sum = self.inject(ctx, configs)  # (R0, K, H)
        k = x.shape[1]
        prev_rows = batch.config_rows
        for layer, level, x_shared, pre_shared in zip(self.config_layers, batch.levels, ctx.shared_in,
                                                      ctx.shared_pre):
            # index_select, not [rows]: see embed_layout_configs
            delta = x - x_shared.index_select(0, prev_rows).unsqueeze(1)
            shared_pre = pre_shared.index_select(0, level.rows).unsqueeze(1).repeat(1, k, 1)
            pre = layer.add_delta_pre(shared_pre, delta, level)
            x, shared = layer.post(pre), x_shared.index_select(0, level.rows).unsqueeze(1)
            # the residual added in place, one full-size buffer fewer (post's output is new and its backward
            # does not read it); not under bf16 autocast, where post is bfloat16 and the sum float32
            x = (x.add_(shared) if x.dtype == shared.dtype else x + shared).index_add_(0, level.root, delta)
            prev_rows = level.rows
        if b == 1 and self.node_cost is None and x.device.type == "cpu" and x.requires_grad:
            # a training step on the CPU (one graph): the three pooling inputs with one backward pass
            # (the node-cost head would be a fourth input, added in another order: not taken there)
            total, maximum, at_config = PoolOneGraph.apply(x, batch.final_graph, batch.config_in_final)
        else:
            total = segment_sum(x, batch.final_graph, b)
            maximum = segment_max_sorted(x, batch.final_graph, b, batch.final_counts)
            at_config = x[batch.config_in_final]
        total = total + ctx.outside_sum.unsqueeze(1)
        maximum = torch.maximum(maximum, ctx.outside_max.unsqueeze(1))
        pooled = self._pool_layout(batch, total, maximum, at_config, chain_sum)
        return pooled, None if self.node_cost is None else self.node_cost(x, batch.final_graph, batch)

    def _layout_unfused(self, ctx: Context, configs: ConfigBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Reference path: K full copies of the graph (GAT, and the check of the fused path)."""
        batch = ctx.batch
        injected, chain_sum = self.inject(ctx, configs)
        k = injected.shape[1]
        x = ctx.shared_in[0].unsqueeze(1).expand(-1, k, -1).index_copy(0, batch.config_rows, injected)
        for layer in self.config_layers:
            x = layer(x, batch)
        total = segment_sum(x, batch.node_graph, batch.num_graphs)
        maximum = segment_max_sorted(x, batch.node_graph, batch.num_graphs, batch.node_counts)
        pooled = self._pool_layout(batch, total, maximum, x[batch.config_rows], chain_sum)
        if self.node_cost is None:
            return pooled, None
        # the nodes of D_L (the only ones whose state differs between configs), as the fused path sums them
        return pooled, self.node_cost(x.index_select(0, batch.final_rows), batch.final_graph, batch)
