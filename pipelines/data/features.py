"""Hand-made features for the GBDT ranker (pure functions over graphs; the features stage writes them).

Two kinds of table:

* graph aggregates (``g_*``), one row per graph, from the full (unpruned) graph structure: sizes,
  an opcode histogram, shape statistics and rough flops/bytes of the heavy ops;
* per-config features (``f_*``), one row per config, vectorised over configs: for layout graphs
  the costs a layout choice implies (minor-most violations, 8x128 tile padding, copies between
  disagreeing neighbours, copies where layouts meet at the ends of elementwise chains with their
  padded bytes, counts of layout choices, how common each choice is); for tile graphs the 24 config
  values plus padding waste and tile count against the output shape, and the tiles' fit to the
  (8, 128) vector registers, bytes moved and per-step working set.

Layout blocks hold a ``minor_to_major`` permutation of a tensor's dims (slot 0 = minor-most dim).
An all ``-1`` block means "the compiler chooses"; such blocks are resolved to the node's default
layout (``node_feat`` columns 134-139) wherever a concrete layout is needed.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from pipelines.core.collection import LABELLED, Collection
from pipelines.core.engine import Code, StageOutput
from pipelines.core.errors import PipelineError
from pipelines.data.layout_geometry import (
    BLOCKS,
    CELLS_PER_CHUNK,
    CONV,
    DIM_PRODUCT,
    DIMS,
    DOT,
    LAYOUT_OPS,
    SLOT_PAIRS,
    TILE_MINOR,
    TILE_SECOND,
    Chains,
    ConfigNodes,
    block_codes,
    block_columns,
    default_layouts,
    element_bytes,
    node_dims,
    node_rank,
    slot_pairs,
)
from pipelines.core.parallel import file_cost, map_in_order
from pipelines.core.progress import Progress
from pipelines.core.stages import Stage, StageCall, run_declared, section_fields
from pipelines.core.stage_files import read_parquet
from pipelines.data.prune import PrunedGraph, load_pruned, pruned_path, sample_configs
from pipelines.data.tpugraphs import GraphRef, NodeFeat, load_ref

if TYPE_CHECKING:  # type hints only: the config reaches the key as resolved values
    from pipelines.config.settings import PipelineConfig

HISTOGRAM_OPCODES = {
    "add": 2, "broadcast": 13, "constant": 24, "convert": 25, "conv": 26, "copy": 27, "dot": 34,
    "fusion": 41, "gte": 45, "parameter": 63, "reduce": 70, "reshape": 75, "slice": 92,
    "transpose": 98, "tuple": 100, "while": 102,
}
WINDOW_PRODUCT = NodeFeat.WINDOW_SIZE_PRODUCT
LAYOUT_VALUES = range(6)
# pack_blocks: a block's six values as base-7 digits (value + 1), the offset adds the ones.
_BASE7_DIGITS = (7 ** np.arange(6)).astype(np.float32)
_BASE7_OFFSET = int(_BASE7_DIGITS.sum())
_PACK_CHUNK_VALUES = 2**18
# Bits per element of node_feat's one-hot element types (columns 2-20, in order).
# ----------------------------------------------------------------------------- graph aggregates


def graph_aggregates(node_feat: np.ndarray, node_opcode: np.ndarray, edge_index: np.ndarray,
                     config_nodes: np.ndarray) -> dict[str, float]:
    """Graph-level features (``g_*``) of one graph; ``config_nodes`` is empty for tile graphs.

    Flops of a convolution or dot are estimated from sizes alone as
    ``2 * sqrt(|operands product| * |out| * window)``: exact for a plain matmul (m,k)x(k,n)
    and for stride-1 "same" convolutions, and a consistent size proxy otherwise.
    """
    n, m = node_feat.shape[0], edge_index.shape[0]
    opcode = node_opcode.astype(np.int64)
    dims = node_dims(node_feat)
    rank = node_rank(dims)
    elems = np.maximum(node_feat[:, DIM_PRODUCT].astype(np.float64), 0.0)
    nbytes = elems * element_bytes(node_feat)
    log_elems = np.log1p(elems)

    out: dict[str, float] = {
        "g_num_nodes": float(n),
        "g_num_edges": float(m),
        "g_num_config_nodes": float(config_nodes.size),
        "g_config_share": config_nodes.size / n,
    }
    known = np.zeros(n, dtype=bool)
    for name, code in HISTOGRAM_OPCODES.items():
        hit = opcode == code
        known |= hit
        out[f"g_op_{name}"] = float(hit.sum())
    out["g_op_other"] = float((~known).sum())
    out["g_num_opcodes"] = float(np.unique(opcode).size)
    out.update({
        "g_log_elems_mean": float(log_elems.mean()),
        "g_log_elems_max": float(log_elems.max()),
        "g_log_elems_std": float(log_elems.std()),
        "g_log_bytes_total": float(np.log1p(nbytes.sum())),
        "g_log_max_dim": float(np.log1p(dims.max())),
        "g_rank_mean": float(rank.mean()),
        "g_rank_max": float(rank.max()),
    })

    # log of each node's operand-size product (sum of log sizes over its producers)
    log_operands = np.zeros(n)
    np.add.at(log_operands, edge_index[:, 0], np.log(np.maximum(elems[edge_index[:, 1]], 1.0)))
    log_window = np.log(np.maximum(node_feat[:, WINDOW_PRODUCT].astype(np.float64), 1.0))
    log_flops = np.log(2.0) + 0.5 * (log_operands + np.log(np.maximum(elems, 1.0)) + log_window)
    operand_bytes = np.zeros(n)
    np.add.at(operand_bytes, edge_index[:, 0], nbytes[edge_index[:, 1]])
    for name, code in (("conv", CONV), ("dot", DOT)):
        hit = opcode == code
        out[f"g_log_flops_{name}"] = float(np.log1p(np.exp(log_flops[hit]).sum())) if hit.any() else 0.0
        out[f"g_log_bytes_{name}"] = float(np.log1p((nbytes[hit] + operand_bytes[hit]).sum()))
    cfg = config_nodes
    out["g_log_config_bytes"] = float(np.log1p(nbytes[cfg].sum())) if cfg.size else 0.0
    out["g_config_log_elems_mean"] = float(log_elems[cfg].mean()) if cfg.size else 0.0
    out["g_config_rank_mean"] = float(rank[cfg].mean()) if cfg.size else 0.0
    return out


# ----------------------------------------------------------------------------- layout per-config


def feature_columns(collection: Collection) -> list[str]:
    """The ``f_*`` columns the features stage writes for ``collection`` (value frequencies: default
    search only), in order: what a model may name (``feature:<column>``, ``gbdt.exclude_features``)."""
    return tile_feature_names() if collection.is_tile else layout_feature_names(collection.search == "default")


def layout_feature_names(value_frequency: bool) -> list[str]:
    """The ``f_*`` columns :func:`layout_config_features` returns, in order."""
    names = ["f_violation_ratio", "f_pad_ratio_sum", "f_pad_ratio_mean", "f_pad_log_bytes", "f_pad_waste",
             "f_implied_copies", "f_implied_copies_explicit", "f_out_off_default", "f_out_off_default_log_bytes"]
    names += [f"f_default_{block}" for block in BLOCKS]
    names += CHAIN_FEATURES
    names += [f"f_{op}_{block}_s{slot}_v{value}" for op in LAYOUT_OPS for block in BLOCKS
              for slot in (0, 1) for value in LAYOUT_VALUES]
    if value_frequency:
        names += ["f_freq_mean", "f_freq_min", "f_freq_logmean"]
    return names


# Copies along chains of elementwise ops (see :class:`Chains` and :func:`_chain_copies`).
CHAIN_FEATURES = ["f_chain_copies", "f_chain_copies_tiled", "f_chain_in_fixed", "f_chain_out_fixed",
                  "f_chain_copy_log_bytes", "f_chain_copy_share"]


def _lookup(table: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """``table[j, pairs[:, j]]`` for a per-tensor table (m, SLOT_PAIRS) and slot pairs (k, m)."""
    offsets = np.arange(table.shape[0], dtype=np.intp) * SLOT_PAIRS
    return np.take(table.reshape(-1), pairs + offsets)


@dataclass(frozen=True)
class _Blocks:
    """One chunk of configs (k rows) as the layout features read it: every block as one code (equal
    blocks, equal codes) and as the slot pair of its two minor-most slots, and the output blocks
    resolved (an output block left to the compiler is the node's default layout).

    Per-block arrays are (k, 3 nc): block b of configurable node j in column ``b * nc + j``, so that
    one gather picks each consumer's input or kernel block.
    """

    default: np.ndarray  # bool (k, 3 nc): slot 0 is -1 (the compiler chooses)
    code: np.ndarray  # uint64 (k, 3 nc), see block_codes
    pair: np.ndarray  # int8 (k, 3 nc), see slot_pairs
    resolved: np.ndarray  # uint64 (k, nc) code of the resolved output block
    resolved_pair: np.ndarray  # int8 (k, nc)
    padded: np.ndarray  # float64 (k, nc) tile_padding of the outputs in their resolved layouts
    off_default: np.ndarray  # bool (k, nc) resolved output layout != default layout

    @classmethod
    def of(cls, cfg: np.ndarray, nodes: ConfigNodes) -> _Blocks:
        k, nc = cfg.shape[:2]
        default = np.empty((k, len(BLOCKS), nc), dtype=bool)
        pair = np.empty((k, len(BLOCKS), nc), dtype=np.int8)
        for b in range(len(BLOCKS)):
            np.equal(cfg[:, :, 6 * b], -1, out=default[:, b])
            pair[:, b] = slot_pairs(cfg, 6 * b)
        code = block_codes(cfg)
        resolved = np.where(default[:, 0], nodes.default_code[None], code[:, 0])
        resolved_pair = np.where(default[:, 0], nodes.default_pair[None], pair[:, 0])
        return cls(default=default.reshape(k, -1), code=code.reshape(k, -1), pair=pair.reshape(k, -1),
                   resolved=resolved, resolved_pair=resolved_pair, padded=_lookup(nodes.padding, resolved_pair),
                   off_default=resolved != nodes.default_code[None])

    def wanted(self, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Code, slot pair and explicitness (slot 0 set) of the blocks in ``columns``, (k, len(columns)) each."""
        return (np.take(self.code, columns, axis=1), np.take(self.pair, columns, axis=1),
                ~np.take(self.default, columns, axis=1))


def layout_config_features(graph: PrunedGraph, value_frequency: bool) -> dict[str, np.ndarray]:
    """Per-config features of a layout graph: name -> float32 (c,), see :func:`layout_feature_names`.

    * violation ratio: share of configurable nodes whose minor-most output dim is smaller than
      their largest dim (ties are no violation; scalars never violate);
    * padding: each configurable node's output padded to the (8, 128) tile over its two minor-most
      dims (rank-1 tensors pad the minor dim only): sum and mean over nodes of padded/actual
      elements, log of total padded bytes, and total padded bytes / total actual bytes;
    * implied copies: connected (producer, consumer) pairs of configurable nodes (see
      :func:`config_pairs`) whose producer output block differs from the consumer input block;
      default blocks resolve to the producer's default layout; ``_explicit`` counts only pairs
      where neither block is a default;
    * off-default outputs: configurable nodes whose chosen output layout differs from their default
      (non-configurable consumers expect the default, so this implies copies too), count and log of
      their total bytes;
    * chains (``f_chain_*``): copies where layouts meet at the ends of elementwise chains, between
      configurable nodes and against fixed producers and consumers, counted and weighted by the
      (8, 128)-padded bytes they move (see :class:`Chains` and :func:`_chain_copies`);
    * counts of each value 0..5 in slots 0 and 1 of each block, per opcode (conv/dot/reshape),
      and of default (-1) blocks;
    * with ``value_frequency``: share of this graph's configs that choose the same block at the
      same node, averaged (mean, min, mean log) over the (node, block) cells that vary at all.

    Configs are processed in chunks of about ``CELLS_PER_CHUNK`` (config, node) cells.
    """
    configs = graph.config_feat
    count, nc = configs.shape[0], configs.shape[1]
    nodes = ConfigNodes.of(graph)
    chains = Chains.of(graph, nodes)
    columns = {name: np.zeros(count, dtype=np.float32) for name in layout_feature_names(value_frequency)}
    step = max(1, CELLS_PER_CHUNK // max(nc, 1))
    for start in range(0, count, step):
        cfg = np.ascontiguousarray(configs[start : start + step])
        blocks = _Blocks.of(cfg, nodes)
        chunk = {
            **_output_costs(blocks, nodes),
            **_implied_copies(blocks, nodes),
            **_choice_counts(blocks, nodes),
            **_chain_copies(blocks, nodes, chains),
        }
        for name, values in chunk.items():
            columns[name][start : start + cfg.shape[0]] = values
    if value_frequency:
        columns["f_freq_mean"][:], columns["f_freq_min"][:], columns["f_freq_logmean"][:] = value_frequencies(configs)
    return columns


def _output_costs(blocks: _Blocks, nodes: ConfigNodes) -> dict[str, np.ndarray]:
    """Violation ratio, (8, 128) padding and off-default outputs of the resolved output blocks."""
    padded = blocks.padded
    nc = padded.shape[1]
    padded_bytes = padded @ nodes.nbytes
    off_default = blocks.off_default
    return {
        "f_violation_ratio": _lookup(nodes.violates, blocks.resolved_pair).sum(axis=1) / nc,
        "f_pad_ratio_sum": padded.sum(axis=1),
        "f_pad_ratio_mean": padded.mean(axis=1),
        "f_pad_log_bytes": np.log1p(padded_bytes),
        "f_pad_waste": padded_bytes / nodes.nbytes.sum(),
        "f_out_off_default": off_default.sum(axis=1),
        "f_out_off_default_log_bytes": np.log1p(off_default @ nodes.nbytes),
    }


def _implied_copies(blocks: _Blocks, nodes: ConfigNodes) -> dict[str, np.ndarray]:
    """Connected pairs whose producer output and consumer input layouts disagree (see above)."""
    if nodes.pairs.size == 0:
        return {}  # the columns stay 0
    producer, consumer = nodes.pairs[:, 0], nodes.pairs[:, 1]
    columns = block_columns(blocks.resolved.shape[1], 1, consumer)
    in_default = np.take(blocks.default, columns, axis=1)
    wanted = np.where(in_default, nodes.default_code[producer][None], np.take(blocks.code, columns, axis=1))
    differ = np.take(blocks.resolved, producer, axis=1) != wanted
    explicit = ~np.take(blocks.default, producer, axis=1) & ~in_default
    return {"f_implied_copies": differ.sum(axis=1), "f_implied_copies_explicit": (differ & explicit).sum(axis=1)}


def _chain_copies(blocks: _Blocks, nodes: ConfigNodes, chains: Chains) -> dict[str, np.ndarray]:
    """Copies where layouts meet at the ends of elementwise chains (see :class:`Chains`).

    A default (all -1) input block lets the compiler pick the operand's layout: no copy. A copy
    reads the tensor in its source layout and writes it in its destination layout, both padded to
    (8, 128) tiles; ``copy_log_bytes`` sums those bytes over every copy, ``copy_share`` divides the
    sum by the configurable nodes' unpadded output bytes. ``copies_tiled`` counts the pairs whose
    minor-most or second-minor dim differs (the tiled dims: a real transpose, not a strided copy).
    """
    moved = np.zeros(blocks.padded.shape[0])

    producer = chains.pair_producer
    dst, dst_pair, explicit = blocks.wanted(chains.pair_columns)
    differ = explicit & (np.take(blocks.resolved, producer, axis=1) != dst)
    tiled = explicit & (np.take(blocks.resolved_pair, producer, axis=1) != dst_pair)
    moved += (differ * (np.take(blocks.padded, producer, axis=1) + _lookup(nodes.padding[producer], dst_pair))
              ) @ nodes.nbytes[producer]

    dst, dst_pair, explicit = blocks.wanted(chains.fixed_in_columns)
    differ_in = explicit & (dst != chains.fixed_in_code[None])
    moved += (differ_in * (_lookup(chains.fixed_in_padding, dst_pair) + chains.fixed_in_own_padding)
              ) @ chains.fixed_in_bytes

    off = blocks.off_default & chains.fixed_out[None]
    moved += (off * (blocks.padded + nodes.default_padding)) @ nodes.nbytes
    return {
        "f_chain_copies": differ.sum(axis=1), "f_chain_copies_tiled": tiled.sum(axis=1),
        "f_chain_in_fixed": differ_in.sum(axis=1), "f_chain_out_fixed": off.sum(axis=1),
        "f_chain_copy_log_bytes": np.log1p(moved), "f_chain_copy_share": moved / nodes.nbytes.sum(),
    }


def _choice_counts(blocks: _Blocks, nodes: ConfigNodes) -> dict[str, np.ndarray]:
    """Default blocks per block type; values 0..5 in slots 0-1 per opcode and block type."""
    rows, nc = blocks.resolved.shape
    out = {f"f_default_{block}": blocks.default[:, b * nc : (b + 1) * nc].sum(axis=1) for b, block in enumerate(BLOCKS)}
    # one bincount of slot pairs per op: the pair p of block b of config r lands in bin 49 (3 r + b) + p
    offsets = SLOT_PAIRS * (len(BLOCKS) * np.arange(rows, dtype=np.intp)[:, None, None]
                            + np.arange(len(BLOCKS), dtype=np.intp)[None, :, None])
    for op, mask in nodes.op_masks.items():
        op_nodes = np.flatnonzero(mask)
        pairs = np.take(blocks.pair, block_columns(nc, np.arange(len(BLOCKS))[:, None], op_nodes[None, :]), axis=1)
        joint = np.bincount((pairs + offsets).reshape(-1), minlength=rows * len(BLOCKS) * SLOT_PAIRS)
        joint = joint.reshape(rows, len(BLOCKS), 7, 7)  # [config, block, slot 1 + 1, slot 0 + 1]
        for b, block in enumerate(BLOCKS):
            for value in LAYOUT_VALUES:
                out[f"f_{op}_{block}_s0_v{value}"] = joint[:, b, :, value + 1].sum(axis=1)
                out[f"f_{op}_{block}_s1_v{value}"] = joint[:, b, value + 1, :].sum(axis=1)
    return out


def pack_blocks(configs: np.ndarray) -> np.ndarray:
    """int32 (c, nc, 3): each 6-value block (values -1..5) packed base 7 into one integer
    (slot pairs, see :func:`slot_pairs`, are its base-49 digits).

    One float32 matrix-vector product per chunk of configs (BLAS, a few times faster than nine
    strided integer passes): every product and partial sum is an integer of magnitude below 2**24,
    which float32 holds exactly, so the result does not depend on the summation order."""
    count, nc = configs.shape[:2]
    packed = np.empty((count, nc, len(BLOCKS)), dtype=np.int32)
    blocks = configs.reshape(count, nc * len(BLOCKS), 6)
    step = max(1, _PACK_CHUNK_VALUES // max(nc * 18, 1))  # a chunk's float32 copy stays in cache
    for start in range(0, count, step):
        values = blocks[start : start + step].astype(np.float32).reshape(-1, 6)
        packed[start : start + step] = (values @ _BASE7_DIGITS).reshape(-1, nc, len(BLOCKS))
    packed += _BASE7_OFFSET
    return packed


def value_frequencies(configs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per config: mean, min and mean-log of the share of configs choosing the same block value at
    each (node, block) cell, over the cells whose value varies across configs (float64 (c,) each).

    Vectorised over cells, in groups of cells so that temporaries stay small: the packed values
    that occur anywhere get dense ids, and one bincount of ``cell * ids + id`` counts every
    (cell, value) pair of a group at once (a sort where the distinct values outnumber the configs
    several times over, which real layouts never do).
    """
    count = configs.shape[0]
    packed = pack_blocks(configs).reshape(count, -1)
    varying = np.flatnonzero((packed != packed[:1]).any(axis=0))
    total = np.zeros(count)
    total_log = np.zeros(count)
    lowest = np.ones(count)
    if varying.size == 0 or count == 0:
        return np.ones(count), lowest, total_log
    seen = np.zeros(7**6, dtype=bool)
    seen[packed.reshape(-1)] = True  # a scatter: twice as fast as a bincount here
    distinct = int(seen.sum())
    dense = (np.cumsum(seen) - 1).astype(np.int32)  # packed value -> id among the values that occur
    group = max(1, CELLS_PER_CHUNK // count)
    for start in range(0, varying.size, group):
        cells = varying[start : start + group]
        if distinct <= 4 * count:
            share = np.empty((count, cells.size))
            step = max(1, CELLS_PER_CHUNK // distinct)  # cells per bincount: at most ~CELLS_PER_CHUNK bins
            for first in range(0, cells.size, step):
                part = cells[first : first + step]
                keys = dense[np.take(packed, part, axis=1)] + np.arange(part.size, dtype=np.intp)[None, :] * distinct
                share[:, first : first + part.size] = np.bincount(keys.reshape(-1), minlength=part.size * distinct)[keys]
            share /= count
        else:
            keys = packed[:, cells].astype(np.int64) + np.arange(cells.size, dtype=np.int64)[None, :] * np.int64(7**6)
            ordered = np.sort(keys, axis=None)
            share = (np.searchsorted(ordered, keys, "right") - np.searchsorted(ordered, keys, "left")) / count
        total += share.sum(axis=1)
        total_log += np.log(share).sum(axis=1)
        lowest = np.minimum(lowest, share.min(axis=1))
    return total / varying.size, lowest, total_log / varying.size


# ----------------------------------------------------------------------------- tile per-config


def tile_feature_names() -> list[str]:
    return [f"f_cfg_{i}" for i in range(24)] + [
        "f_log_kernel_prod", "f_log_output_prod", "f_log_input_prod", "f_tile_count_log", "f_tile_waste"
    ] + TILE_VREG_FEATURES


# Tile features against the (8, 128) vector-register tile (see tile_vreg_features).
TILE_VREG_FEATURES = ["f_tile_out_lane_pad", "f_tile_out_sublane_pad", "f_tile_out_vreg_pad", "f_tile_in_vreg_pad",
                      "f_tile_kernel_vreg_pad", "f_tile_minor_waste", "f_tile_log_traffic", "f_tile_log_working_set"]


def output_node(node_feat: np.ndarray) -> int:
    """Position of the kernel's output tensor: the last is_root node that has a shape.

    A root is often a tuple (no dims) of the real outputs, which come just before it in
    topological order; then the last node with a shape stands in. Last node if none has a shape.
    """
    shaped = (node_feat[:, DIMS] > 0).any(axis=1)
    for candidates in (np.flatnonzero((node_feat[:, NodeFeat.IS_ROOT] > 0.5) & shaped), np.flatnonzero(shaped)):
        if candidates.size:
            return int(candidates[-1])
    return node_feat.shape[0] - 1


def tile_config_features(config_feat: np.ndarray, node_feat: np.ndarray) -> dict[str, np.ndarray]:
    """Per-config features of a tile graph: name -> float32 (c,), see :func:`tile_feature_names`.

    The output tile (config columns 8-13) is laid over the output node's shape dim by dim:
    ``tile_count = prod ceil(d_i / t_i)`` and ``tile_waste = prod(count_i * t_i) / prod(d_i)``
    (>= 1; 1 means no padding). Dims whose tile bound is 0 (unused slot) count as one whole tile.
    """
    config = config_feat.astype(np.float64)
    dims = node_dims(node_feat[output_node(node_feat)][None, :])[0].astype(np.float64)
    used = dims > 0
    tile = config[:, 8:14]
    whole = (tile <= 0) | ~used[None, :]
    safe_tile = np.where(whole, 1.0, tile)
    counts = np.where(whole, 1.0, np.ceil(dims[None, :] / safe_tile))
    padded = np.where(whole, np.maximum(dims, 1.0)[None, :], counts * safe_tile)
    actual = np.prod(np.maximum(dims[used], 1.0))
    columns = {f"f_cfg_{i}": config_feat[:, i].astype(np.float32) for i in range(24)}
    columns["f_log_kernel_prod"] = np.log1p(np.maximum(config[:, 7], 0)).astype(np.float32)
    columns["f_log_output_prod"] = np.log1p(np.maximum(config[:, 15], 0)).astype(np.float32)
    columns["f_log_input_prod"] = np.log1p(np.maximum(config[:, 23], 0)).astype(np.float32)
    columns["f_tile_count_log"] = np.log(counts.prod(axis=1)).astype(np.float32)
    columns["f_tile_waste"] = (np.where(used[None, :], padded, 1.0).prod(axis=1) / actual).astype(np.float32)
    columns.update(tile_vreg_features(config, node_feat[output_node(node_feat)], counts.prod(axis=1)))
    return columns


def _vreg_pad(minor: np.ndarray, second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Padded / used share of the 128 lanes (minor) and 8 sublanes (second-minor) of tiles with these
    extents (float64, >= 1 each); an extent below 1 counts as 1."""
    minor, second = np.maximum(minor, 1.0), np.maximum(second, 1.0)
    return np.ceil(minor / TILE_MINOR) * TILE_MINOR / minor, np.ceil(second / TILE_SECOND) * TILE_SECOND / second


def _row_major_minor(bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Minor-most and second-minor extents of tile ``bounds`` (c, 6) read row-major: the last and
    next-to-last used (> 0) slots; 1 where there is none."""
    used = bounds > 0
    count = used.sum(axis=1)
    rows = np.arange(bounds.shape[0])
    # slots of the used bounds in order: the last used slot is the (count-1)-th used one
    order = np.argsort(~used, axis=1, kind="stable")
    last = order[rows, np.maximum(count - 1, 0)]
    previous = order[rows, np.maximum(count - 2, 0)]
    return (np.where(count >= 1, bounds[rows, last], 1.0), np.where(count >= 2, bounds[rows, previous], 1.0))


def tile_vreg_features(config: np.ndarray, output: np.ndarray, tile_count: np.ndarray) -> dict[str, np.ndarray]:
    """What a tile size costs against the TPU's (8, 128) vector registers (float32 (c,) each).

    * ``out_lane_pad`` / ``out_sublane_pad`` / ``out_vreg_pad``: padded / used lanes, sublanes and
      both, of one output tile over the output node's minor-most and second-minor dims (from its
      layout; an unused bound means the whole dim);
    * ``in_vreg_pad`` / ``kernel_vreg_pad``: the same for the input and kernel tiles, whose layouts
      the file does not give: read row-major (last used slot minor-most); 1 when the tile is unused;
      a tile without a second-minor extent fills one of the 8 sublanes (as a rank-1 output tile does);
    * ``minor_waste``: padded / actual extent of the output's minor-most dim when cut into tiles;
    * ``log_traffic``: log bytes read and written, every output tile reading one input and one
      kernel tile: ``tile_count * (input + kernel) + output``, elements times the output's bytes;
    * ``log_working_set``: log bytes of one step's input, kernel and output tiles, register-padded.
    """
    dims = node_dims(output[None, :])[0].astype(np.float64)
    rank = int(node_rank(dims[None, :].astype(np.int64))[0])
    layout = default_layouts(output[None, :], np.array([rank]))[0]
    bounds = config[:, 8:14]
    whole = np.where(bounds > 0, bounds, np.maximum(dims, 1.0)[None, :])

    def extent(slot: int) -> np.ndarray:
        return whole[:, layout[slot]] if slot < rank and layout[slot] >= 0 else np.ones(config.shape[0])

    lane, sublane = _vreg_pad(extent(0), extent(1))
    in_lane, in_sublane = _vreg_pad(*_row_major_minor(config[:, 16:22]))
    kernel_lane, kernel_sublane = _vreg_pad(*_row_major_minor(config[:, 0:6]))
    minor_dim = dims[layout[0]] if rank and layout[0] >= 0 else 1.0
    minor_tile = extent(0)
    minor_waste = np.ceil(max(minor_dim, 1.0) / minor_tile) * minor_tile / max(minor_dim, 1.0)
    nbytes = max(float(element_bytes(output[None, :])[0]), 1.0)
    in_prod, kernel_prod, out_prod = (np.maximum(config[:, k], 0.0) for k in (23, 7, 15))
    out_elems = float(np.prod(np.maximum(dims[:rank], 1.0)))
    traffic = (tile_count * (in_prod + kernel_prod) + out_elems) * nbytes
    working = (in_prod * in_lane * in_sublane + kernel_prod * kernel_lane * kernel_sublane
               + out_prod * lane * sublane) * nbytes
    has_input, has_kernel = (config[:, 16:22] > 0).any(axis=1), (config[:, 0:6] > 0).any(axis=1)
    return {name: values.astype(np.float32) for name, values in {
        "f_tile_out_lane_pad": lane, "f_tile_out_sublane_pad": sublane, "f_tile_out_vreg_pad": lane * sublane,
        "f_tile_in_vreg_pad": np.where(has_input, in_lane * in_sublane, 1.0),
        "f_tile_kernel_vreg_pad": np.where(has_kernel, kernel_lane * kernel_sublane, 1.0),
        "f_tile_minor_waste": minor_waste, "f_tile_log_traffic": np.log1p(traffic),
        "f_tile_log_working_set": np.log1p(working),
    }.items()}


# ----------------------------------------------------------------------------- tables


def config_feature_table(graph: PrunedGraph, *, value_frequency: bool = False) -> pl.DataFrame:
    """One row per config of ``graph``: ``graph``, ``config_index`` (int32), ``target`` (float64)
    and the ``f_*`` features (float32). Tile graphs ignore ``value_frequency``."""
    return feature_table([graph.stem], [config_feature_columns(graph, value_frequency=value_frequency)])


def config_feature_columns(graph: PrunedGraph, *, value_frequency: bool = False) -> dict[str, np.ndarray]:
    """The columns of :func:`config_feature_table` but ``graph``, as arrays."""
    if graph.kind == "tile":
        columns = tile_config_features(graph.config_feat, graph.node_feat)
    else:
        columns = layout_config_features(graph, value_frequency)
    return {"config_index": graph.config_index, "target": graph.target, **columns}


def feature_table(stems: Sequence[str], columns: Sequence[dict[str, np.ndarray]]) -> pl.DataFrame:
    """The config tables of several graphs (``stems``, their :func:`config_feature_columns`) as one
    table, graph after graph: one DataFrame built instead of one per graph and a concatenation."""
    merged = columns[0] if len(columns) == 1 else {name: np.concatenate([c[name] for c in columns])
                                                   for name in columns[0]}
    stem_column = [stem for stem, c in zip(stems, columns) for _ in range(c["config_index"].shape[0])]
    return pl.DataFrame({
        "graph": pl.Series(stem_column, dtype=pl.String),
        "config_index": pl.Series(merged["config_index"], dtype=pl.Int32),
        "target": pl.Series(merged["target"], dtype=pl.Float64),
        **{name: pl.Series(values, dtype=pl.Float32) for name, values in merged.items() if name.startswith("f_")},
    })


def graph_feature_table(rows: list[dict[str, float]], stems: list[str]) -> pl.DataFrame:
    """``graph`` + ``g_*`` (float32) from one aggregate dict per graph (all with the same keys)."""
    names = list(rows[0]) if rows else []
    return pl.DataFrame({
        "graph": pl.Series(stems, dtype=pl.String),
        **{name: pl.Series([row[name] for row in rows], dtype=pl.Float32) for name in names},
    })


# ----------------------------------------------------------------------------- stage: features (I/O shell)

# The code the stage runs (part of its key): this module and what it imports (prune, the reader).
FEATURES_CODE = Code(("pipelines.data.features",))
GRAPH_FEATURES = "graph_features.parquet"
# Tile graphs are many (7,229) and small (tens of configs after de-duplication): a parquet file each
# would cost more than their features (polars spends ~2.4 ms per file written, whatever the
# compression or statistics). Their config tables go TILE_GRAPHS_PER_PART graphs to a file,
# <split>/configs/part-<k>.parquet, in file order; <split>/configs/parts.parquet says where each
# graph's rows are. Layout graphs (thousands of configs each) keep a file per graph.
TILE_GRAPHS_PER_PART = 64
PARTS_TABLE = "parts.parquet"
_PARTS_SCHEMA = {"graph": pl.String, "part": pl.String, "offset": pl.Int64, "rows": pl.Int64}


def _config_table_name(split: str, stem: str) -> str:
    return f"{split}/configs/{stem}.parquet"


def _part_name(split: str, part: str) -> str:
    return f"{split}/configs/{part}"


def seeded_rng(seed: int, stem: str) -> np.random.Generator:
    """A generator per (seed, graph), so a graph's sample does not depend on which graphs ran before."""
    return np.random.default_rng([seed, zlib.crc32(stem.encode("utf-8"))])


def _features_facts(call: StageCall) -> dict[str, Any]:
    # how often each chosen value occurs is only informative where configs come from a search
    return {"collection": call.collection.name, "value_frequency": call.collection.search == "default"}


def _features_settings(config: PipelineConfig, collection: Collection) -> dict[str, str]:
    return section_fields(config, "features")


def graph_features(ref: GraphRef, prune_path: Path, config: PipelineConfig,
                   value_frequency: bool) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The config feature columns (:func:`config_feature_columns`; labelled splits: a seeded sample of at
    most ``max_configs_per_graph``) and the graph aggregates of one pruned graph."""
    pruned = load_pruned(pruned_path(prune_path, ref.split, ref.stem))
    if ref.split in LABELLED:
        pruned = sample_configs(pruned, config.features.max_configs_per_graph,
                                seeded_rng(config.features.seed, ref.stem))
    columns = config_feature_columns(pruned, value_frequency=value_frequency)
    if pruned.kind == "tile":  # unpruned: the graph is the whole program
        aggregate = graph_aggregates(pruned.node_feat, pruned.node_opcode, pruned.edge_index, pruned.config_nodes)
    else:  # aggregates describe the whole program, not the pruned part: re-read the raw structure
        del pruned
        raw = load_ref(ref, with_configs=False)
        aggregate = graph_aggregates(raw.node_feat, raw.node_opcode, raw.edge_index, raw.node_config_ids)
    return columns, aggregate


def _features_part_to(folder: Path, refs: list[GraphRef], name: str, prune_path: Path, config: PipelineConfig,
                      value_frequency: bool) -> list[tuple[int, list[str], dict[str, float]]]:
    """One features job for ``refs``: writes their tables, in order, into one file ``name``; returns per
    graph its row count, feature columns and graph aggregates (collected by the stage into one table
    per split)."""
    columns, results = [], []
    for ref in refs:
        graph_columns, aggregate = graph_features(ref, prune_path, config, value_frequency)
        columns.append(graph_columns)
        results.append((graph_columns["config_index"].shape[0], [c for c in graph_columns if c.startswith("f_")],
                        aggregate))
    feature_table([ref.stem for ref in refs], columns).write_parquet(folder / name)
    return results


def run_features(call: StageCall) -> StageOutput:
    """The features stage: prune output (``call.upstream["prune"]``) + raw structure of the graphs it kept
    (``call.raw``) -> config feature tables (a file per layout graph, parts of TILE_GRAPHS_PER_PART tile
    graphs) and one graph-aggregate table per split (read them back with :func:`read_feature_rows`)."""
    config, collection, prune, refs = call.config, call.collection, call.upstream["prune"], call.raw.refs
    stage_config = FEATURES.key_config(call)

    def compute(folder: Path) -> dict[str, Any]:
        rows = 0
        columns: list[str] = []
        progress = Progress("[features]", sum(len(items) for items in refs.values()))
        vf = stage_config["value_frequency"]
        # One job per output file (a layout graph, or a part of tile graphs), every split in one fan-out:
        # the costliest jobs start first and no split waits for the previous one's last file.
        jobs: list[tuple[str, list[GraphRef], str | None, str]] = []  # (split, refs, tile part, file)
        for split, items in refs.items():
            (folder / split / "configs").mkdir(parents=True)
            if collection.is_tile:
                for k, start in enumerate(range(0, len(items), TILE_GRAPHS_PER_PART)):
                    part = f"part-{k:05d}.parquet"
                    jobs.append((split, items[start:start + TILE_GRAPHS_PER_PART], part, _part_name(split, part)))
            else:  # a table per graph
                jobs += [(split, [ref], None, _config_table_name(split, ref.stem)) for ref in items]
        results = map_in_order(_features_part_to, [(folder, chunk, name, prune.path, config, vf)
                                                   for _, chunk, _, name in jobs], config.run.n_jobs,
                               costs=[sum(file_cost(ref.path) for ref in chunk) for _, chunk, _, _ in jobs])
        aggregates: dict[str, list[dict[str, float]]] = {split: [] for split in refs}
        listings: dict[str, list[tuple[str, str | None, int, int]]] = {split: [] for split in refs}  # tile parts
        for (split, chunk, part, _), batch in zip(jobs, results):
            offset = 0
            for ref, (height, names, aggregate) in zip(chunk, batch):
                progress.step()
                rows += height
                columns = columns or names
                aggregates[split].append(aggregate)
                listings[split].append((ref.stem, part, offset, height))
                offset += height
        for split, items in refs.items():
            if collection.is_tile:
                pl.DataFrame(listings[split], schema=_PARTS_SCHEMA, orient="row").write_parquet(
                    folder / _part_name(split, PARTS_TABLE))
            graph_feature_table(aggregates[split], [ref.stem for ref in items]).write_parquet(
                folder / split / GRAPH_FEATURES)
        return {"rows": rows, "config_features": len(columns)}

    return run_declared(FEATURES, call, compute, seeds={"features": config.features.seed})


def _features_inputs(call: StageCall) -> dict[str, str]:
    return {"prune": call.upstream["prune"].key, "data": call.raw.data_key}


# The features stage as data (pipelines.core.stages): its key is built from this declaration alone.
FEATURES = Stage("features", inputs=("prune",), code=FEATURES_CODE, settings=_features_settings, run=run_features,
                 input_keys=_features_inputs, facts=_features_facts)


class _ConfigTables:
    """The config table of each graph of a features stage output: its own file, or its rows of a part
    file (parts read once per reader)."""

    def __init__(self, features: StageOutput) -> None:
        self.features = features
        self.index: dict[str, dict[str, tuple[str, int, int]] | None] = {}
        self.parts: dict[str, pl.DataFrame] = {}

    def table(self, stem: str, split: str) -> pl.DataFrame:
        if split not in self.index:
            listing = self.features.path / _part_name(split, PARTS_TABLE)
            self.index[split] = ({graph: (part, offset, rows) for graph, part, offset, rows in
                                  read_parquet(listing).iter_rows()} if listing.is_file() else None)
        index = self.index[split]
        if index is None:
            return read_parquet(self.features.file(_config_table_name(split, stem)))
        if stem not in index:
            raise PipelineError(f"{self.features.path}: output of stage 'features' has no graph {stem!r} in "
                                f"{split} (see {_part_name(split, PARTS_TABLE)})")
        part, offset, rows = index[stem]
        name = _part_name(split, part)
        if name not in self.parts:
            self.parts[name] = read_parquet(self.features.file(name))
        return self.parts[name].slice(offset, rows)


def read_feature_rows(features: StageOutput, graphs: Sequence[tuple[str, str]], max_configs: int | None = None,
                      seed: int = 0) -> pl.DataFrame:
    """Config feature rows of ``graphs`` ((stem, split) pairs; at most ``max_configs`` per graph, a
    seeded sample kept in file order), joined with their ``g_*`` graph aggregates."""
    tables = []
    source = _ConfigTables(features)
    for stem, split in graphs:
        table = source.table(stem, split)
        if max_configs is not None and table.height > max_configs:
            table = table[np.sort(seeded_rng(seed, stem).choice(table.height, size=max_configs, replace=False))]
        tables.append(table)
    if not tables:
        raise ValueError("read_feature_rows needs at least one graph")
    splits = sorted({split for _, split in graphs})
    aggregates = pl.concat([read_parquet(features.file(f"{split}/{GRAPH_FEATURES}")) for split in splits])
    return pl.concat(tables).join(aggregates, on="graph", how="left")
