"""A non-learned baseline: one hand-made cost heuristic per collection kind (no runtime is ever read).

Costs follow the project convention (LOWER = predicted FASTER); ties are broken by config index.

* tile: the output tile should cover the kernel's output with few tiles and little padding. Per
  output dim of size ``d`` tiled by ``t``: ``log(ceil(d/t))`` (more tiles, more steps) plus
  ``log(ceil(d/t) * t / d)`` (padded share). Where the output size of a dim is unknown, a larger
  tile is preferred (``-log t``).
* layout: prefer leaving blocks to the compiler (all -1) and, where a layout is chosen, putting the
  largest output dim minor-most (the TPU tiles the two minor dims by 8x128, so a small minor dim
  pads). Cost = number of configurable nodes whose chosen output layout puts a smaller dim
  minor-most, plus ``DEFAULT_BLOCK_WEIGHT`` per non-default block.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipelines.data.root import DataRoot
from pipelines.core.collection import ALL_COLLECTIONS
from pipelines.data.features import output_node
from pipelines.data.submission import submission_row
from pipelines.data.tpugraphs import Graph, LayoutGraph, NodeFeat, TileGraph, iter_graphs

SHAPE_COLS = NodeFeat.SHAPE_DIMS
TILE_OUTPUT_BOUNDS = slice(8, 14)  # config_feat: output tile bounds per dim
BLOCK_WIDTH = 6  # node_config_feat: output, input, kernel blocks of 6 minor_to_major slots
DEFAULT_BLOCK_WEIGHT = 0.1
CONFIG_CHUNK = 8192  # layout configs scored per step, bounding temporary arrays


def _output_dims(graph: TileGraph) -> np.ndarray:
    """Output shape of the kernel (see :func:`pipelines.data.features.output_node`)."""
    return graph.node_feat[output_node(graph.node_feat), SHAPE_COLS].astype(np.float64)


def tile_costs(graph: TileGraph) -> np.ndarray:
    """Predicted cost of each tile config (lower = faster): tile count plus padding waste, in logs."""
    bounds = graph.config_feat[:, TILE_OUTPUT_BOUNDS].astype(np.float64)
    dims = np.broadcast_to(_output_dims(graph), bounds.shape)
    tiled = bounds > 0
    known = tiled & (dims > 0)
    safe_bounds = np.where(tiled, bounds, 1.0)
    safe_dims = np.where(known, dims, 1.0)
    tiles = np.ceil(safe_dims / safe_bounds)
    covered = np.log(tiles) + np.log(tiles * safe_bounds / safe_dims)
    return np.where(known, covered, np.where(tiled, -np.log(safe_bounds), 0.0)).sum(axis=1)


def layout_costs(graph: LayoutGraph) -> np.ndarray:
    """Predicted cost of each layout config (lower = faster): misplaced minor dims plus non-default blocks."""
    dims = graph.node_feat[graph.node_config_ids, SHAPE_COLS].astype(np.float64)  # (nc, 6)
    largest = dims.max(axis=1)
    node = np.arange(dims.shape[0])[None, :]
    costs = np.empty(graph.num_configs, dtype=np.float64)
    for start in range(0, graph.num_configs, CONFIG_CHUNK):
        chunk = graph.node_config_feat[start : start + CONFIG_CHUNK]  # int8 (k, nc, 18)
        minor = chunk[:, :, 0].astype(np.int64)  # output layout's minor-most dim; -1 = compiler's choice
        minor_size = dims[node, np.clip(minor, 0, BLOCK_WIDTH - 1)]
        misplaced = ((minor >= 0) & (minor_size < largest[None, :])).sum(axis=1)
        blocks = chunk.reshape(chunk.shape[0], chunk.shape[1], -1, BLOCK_WIDTH)
        non_default = (blocks != -1).any(axis=-1).sum(axis=(1, 2))
        costs[start : start + chunk.shape[0]] = misplaced + DEFAULT_BLOCK_WEIGHT * non_default
    return costs


def baseline_costs(graph: Graph) -> np.ndarray:
    return tile_costs(graph) if isinstance(graph, TileGraph) else layout_costs(graph)


def baseline_rows(data_root: Path | str, split: str) -> dict[str, list[int]]:
    """Submission rows for every graph of ``split`` in all five collections, one graph in memory at a time."""
    rows: dict[str, list[int]] = {}
    for collection in ALL_COLLECTIONS:
        for ref, graph in iter_graphs(DataRoot(data_root).graphs(collection, split)):
            rows[ref.submission_id] = submission_row(collection, baseline_costs(graph))
    return rows
