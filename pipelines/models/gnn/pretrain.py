"""Unsupervised pre-training of the node encoder as a graph autoencoder (no runtimes needed).

Two self-supervised tasks on the config-free encoder (opcode embedding, feature projection and
the free message-passing layers), summed:

* masked opcodes: a share of nodes gets the mask token instead of its opcode and a linear head
  predicts the opcode from the encoded state (cross-entropy);
* edge reconstruction (GAE-style): an inner-product decoder scores every edge against as many
  random node pairs of the same graph (binary cross-entropy). Random pairs may hit a true edge;
  graphs are sparse, so this rare label noise is accepted rather than paid for with a lookup.

Runs on every graph handed to it (train, valid and test alike); the decoders are thrown away.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipelines.models.gnn.batch import PreparedGraph, collate
from pipelines.models.gnn.model import MASK_OPCODE, NUM_OPCODES, GNNModel
from pipelines.models.gnn.trainer import make_optimizer
from pipelines.config.gnn import GNNConfig

logger = logging.getLogger(__name__)


def encoder_parameters(model: GNNModel) -> list[nn.Parameter]:
    """The parameters pre-training trains (and the test checks it changes)."""
    modules = [model.opcode_embed, model.input_proj, model.free_layers]
    return [p for m in modules for p in m.parameters()]


def random_pairs(rng: np.random.Generator, node_offset: np.ndarray, graph_sizes: np.ndarray,
                 count_per_graph: np.ndarray) -> np.ndarray:
    """(2, sum(count)) random node pairs, each inside one graph of the batch."""
    graph = np.repeat(np.arange(graph_sizes.shape[0]), count_per_graph)
    pick = (rng.random((2, graph.shape[0])) * graph_sizes[graph]).astype(np.int64)
    return pick + node_offset[graph]


def pretrain_encoder(model: GNNModel, graphs: list[PreparedGraph], cfg: GNNConfig,
                     rng: np.random.Generator) -> list[float]:
    """Train the encoder of ``model`` in place on ``graphs``; returns the mean loss of each epoch."""
    device = next(model.parameters()).device
    decoder = nn.Linear(cfg.hidden, NUM_OPCODES).to(device)
    params = encoder_parameters(model) + list(decoder.parameters())
    optimizer = make_optimizer(params, cfg.pretrain_lr, cfg.weight_decay)
    model.train()
    scale = 1.0 / math.sqrt(cfg.hidden)
    history = []
    for epoch in range(cfg.pretrain_epochs):
        order = rng.permutation(len(graphs))
        losses = []
        for start in range(0, len(graphs), cfg.graphs_per_step):
            chosen = [graphs[i] for i in order[start:start + cfg.graphs_per_step]]
            batch = collate(chosen).to(device)
            n = batch.node_opcode.shape[0]
            mask = rng.random(n) < cfg.pretrain_mask_rate
            mask[int(rng.integers(n))] = True  # at least one masked node per step
            masked = torch.from_numpy(mask).to(device)
            opcode = batch.node_opcode.masked_fill(masked, MASK_OPCODE)
            z = model.encode_nodes(batch, opcode)
            loss = F.cross_entropy(decoder(z[masked]), batch.node_opcode[masked])
            if batch.message_edges.shape[1]:
                sizes = np.array([g.num_nodes for g in chosen])
                edges_per_graph = np.array([g.message_edges.shape[1] for g in chosen])
                offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
                negative = torch.from_numpy(random_pairs(rng, offsets, sizes, edges_per_graph)).to(device)
                pos = (z[batch.message_edges[0]] * z[batch.message_edges[1]]).sum(-1) * scale
                neg = (z[negative[0]] * z[negative[1]]).sum(-1) * scale
                loss = loss + F.binary_cross_entropy_with_logits(pos, torch.ones_like(pos)) \
                    + F.binary_cross_entropy_with_logits(neg, torch.zeros_like(neg))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            optimizer.step()
            losses.append(loss.detach())
        history.append(float(np.mean(torch.stack(losses).tolist())))
        logger.debug(f"pretrain epoch {epoch + 1}/{cfg.pretrain_epochs} loss {history[-1]:.4f}")
    return history
