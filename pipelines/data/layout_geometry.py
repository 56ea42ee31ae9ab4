"""Where layouts live and meet in a layout graph: shapes, default layouts, (8, 128) tile padding,
layout blocks as integer codes, and the chains of elementwise ops through which one node's layout
reaches another (pure numpy over a pruned graph).

Shared by the GBDT's features (:mod:`pipelines.data.features`) and the GNN's chain ends
(:mod:`pipelines.data.node_arrays`, :mod:`pipelines.models.gnn.batch`). It is its own module so that the
node-arrays stage and the GNN's code key follow this geometry, not every edit of the GBDT's feature
code (see ``tests/test_code_keys.py``).

Layout blocks hold a ``minor_to_major`` permutation of a tensor's dims (slot 0 = minor-most dim).
An all ``-1`` block means "the compiler chooses"; such blocks are resolved to the node's default
layout (``node_feat`` columns 134-139) wherever a concrete layout is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipelines.data.tpugraphs import NodeFeat

if TYPE_CHECKING:  # type hints only
    from pipelines.data.prune import PrunedGraph

CONV, DOT, RESHAPE = 26, 34, 75
LAYOUT_OPS = {"conv": CONV, "dot": DOT, "reshape": RESHAPE}
# Elementwise HLO ops (TpuGraphs opcode ids): same shape in and out, and XLA's layout assignment
# gives them their operand's layout, so a layout flows through them unchanged. Broadcasts change
# the shape and are left out.
ELEMENTWISE_OPCODES = frozenset({
    1, 2, 15, 17, 20, 25, 30, 32, 37, 38, 40, 49, 50, 51, 52, 53, 54, 55, 57, 58, 59, 60, 66, 71, 73,
    80, 81, 83, 87, 88, 89, 90, 91, 94, 95, 96, 103, 107, 118, 120,
})  # abs add ceil clamp compare convert cosine divide exp expm1 floor is-finite log log1p and not or
#     xor max min multiply negate power reduce-precision remainder round rsqrt select shifts sign sine
#     sqrt subtract tanh cbrt logistic round-even tan
# Producers materialised in whatever layout their consumer asks for (no copy ever needed).
FREE_LAYOUT_OPCODES = frozenset({13, 24, 48})  # broadcast, constant, iota
# Opcodes worth a histogram column (the configurable ones and the common structural ones).


ELEMENT_BITS = np.array([0, 8, 8, 16, 32, 64, 8, 16, 32, 64, 16, 32, 64, 16, 64, 128, 0, 0, 0], dtype=np.float64)
DIMS = NodeFeat.SHAPE_DIMS
DIM_PRODUCT = NodeFeat.SHAPE_PRODUCT
DEFAULT_LAYOUT = NodeFeat.LAYOUT
TILE_MINOR, TILE_SECOND = 128, 8  # the TPU's (8, 128) tile over the two minor-most dims
BLOCKS = ("out", "in", "kernel")  # node_config_feat columns 0-5, 6-11, 12-17
# Config rows processed at once ~ this many (config, node) cells, so temporaries stay ~16 MB each.
CELLS_PER_CHUNK = 2_000_000


# ----------------------------------------------------------------------------- node-level helpers


def node_dims(node_feat: np.ndarray) -> np.ndarray:
    """int64 (n, 6) shape dims (unused slots 0)."""
    return np.rint(node_feat[:, DIMS]).astype(np.int64)


def node_rank(dims: np.ndarray) -> np.ndarray:
    """int64 (n,) rank: one past the last non-zero dim slot."""
    nonzero = dims > 0
    return np.where(nonzero.any(axis=1), dims.shape[1] - np.argmax(nonzero[:, ::-1], axis=1), 0)


def element_bytes(node_feat: np.ndarray) -> np.ndarray:
    """float64 (n,) bytes per element from the one-hot element type (0 for tuples and tokens)."""
    return node_feat[:, 2:21].astype(np.float64) @ ELEMENT_BITS / 8.0


def output_bytes(node_feat: np.ndarray, elements: np.ndarray | None = None) -> np.ndarray:
    """float64 (n,) output bytes, at least one byte per element (tuples and tokens count one):
    ``elements`` (default: the shape-product column, at least 1) times the element type's bytes."""
    if elements is None:
        elements = np.maximum(node_feat[:, DIM_PRODUCT].astype(np.float64), 1.0)
    return elements * np.maximum(element_bytes(node_feat), 1.0)


def default_layouts(node_feat: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """int8 (n, 6) default minor_to_major per node with slots past the rank set to -1.

    node_feat pads the layout with 0, which is also a valid dim index; the rank disambiguates.
    """
    layout = np.rint(node_feat[:, DEFAULT_LAYOUT]).astype(np.int8)
    layout[np.arange(6)[None, :] >= rank[:, None]] = -1
    return layout


def chain_ends(num_nodes: int, edge_index: np.ndarray, sources: np.ndarray, passable: np.ndarray,
               downstream: bool = True) -> np.ndarray:
    """int64 (E, 2) unique pairs ``[i, end]``: node ``end`` is reached from ``sources[i]`` by one edge
    or by a chain through ``passable`` nodes only, and is itself not passable (a path stops there).

    ``downstream`` follows producer -> consumer edges, else consumer -> producer. Passable nodes at
    the end of a chain (nothing further in this graph) end nowhere. The ends of every passable node
    are found once, in reverse topological order of the passable nodes (a node's ends are its stopping
    neighbours plus its passable neighbours' ends, shared, not copied), so the work is linear in the
    graph plus the pairs returned; a per-(source, node) search repeated every chain's walk for every
    source, with a union over everything visited at each level (cubic along long chains).
    """
    step_from, step_to = (edge_index[:, 1], edge_index[:, 0]) if downstream else (edge_index[:, 0], edge_index[:, 1])
    order = np.argsort(step_from, kind="stable")
    targets = step_to[order].astype(np.int64).tolist()
    starts = np.searchsorted(step_from[order], np.arange(num_nodes + 1)).tolist()
    passable = np.asarray(passable, dtype=bool)
    through = passable.tolist()

    # Kahn's order over the passable nodes: a node comes after every passable node it steps to
    pending = [0] * num_nodes
    for u in np.flatnonzero(passable).tolist():
        pending[u] = sum(1 for w in targets[starts[u]:starts[u + 1]] if through[w])
    ready = [u for u in np.flatnonzero(passable).tolist() if pending[u] == 0]
    back: list[list[int]] = [[] for _ in range(num_nodes)]  # passable w -> passable nodes stepping to it
    for u in np.flatnonzero(passable).tolist():
        for w in targets[starts[u]:starts[u + 1]]:
            if through[w]:
                back[w].append(u)
    ends: dict[int, frozenset] = {}
    empty: frozenset = frozenset()

    def own_ends(u: int) -> frozenset:
        stops = [w for w in targets[starts[u]:starts[u + 1]] if not through[w]]
        shared = [ends[w] for w in targets[starts[u]:starts[u + 1]] if through[w] and ends[w]]
        if not stops and len(shared) == 1:
            return shared[0]
        return frozenset(stops).union(*shared) if (stops or shared) else empty

    while ready:
        w = ready.pop()
        ends[w] = own_ends(w)
        for u in back[w]:
            pending[u] -= 1
            if pending[u] == 0:
                ready.append(u)
    for u in np.flatnonzero(passable).tolist():  # left over: on or upstream of a cycle (the reader refuses
        if u in ends:                              # them; kept correct here): a search of its own each
            continue
        found, seen, stack = set(), {u}, [u]
        while stack:
            v = stack.pop()
            for w in targets[starts[v]:starts[v + 1]]:
                if not through[w]:
                    found.add(w)
                elif w in ends:
                    found.update(ends[w])
                elif w not in seen:
                    seen.add(w)
                    stack.append(w)
        ends[u] = frozenset(found)

    pairs = [(i, e) for i, u in enumerate(np.asarray(sources, dtype=np.int64).tolist()) for e in own_ends(u)]
    if not pairs:
        return np.zeros((0, 2), dtype=np.int64)
    return np.unique(np.array(pairs, dtype=np.int64), axis=0)


def config_pairs(num_nodes: int, edge_index: np.ndarray, config_nodes: np.ndarray,
                 passable: np.ndarray | None = None) -> np.ndarray:
    """int64 (P, 2) pairs ``[producer, consumer]`` of configurable nodes (as positions in
    ``config_nodes``) where the consumer reads the producer's output directly or through a chain
    of non-configurable nodes of this graph (only ``passable`` ones when given).

    A path stops at the first configurable node it meets (see :func:`chain_ends`).
    """
    position = np.full(num_nodes, -1, dtype=np.int64)
    position[config_nodes] = np.arange(config_nodes.size)
    through = position < 0 if passable is None else (position < 0) & passable
    ends = chain_ends(num_nodes, edge_index, config_nodes, through)
    ends = ends[position[ends[:, 1]] >= 0]
    return np.stack([ends[:, 0], position[ends[:, 1]]], axis=1) if ends.size else np.zeros((0, 2), dtype=np.int64)


# Slot pairs: the two minor-most slots of a block (each -1..5) as one int8 code ``(s0 + 1) + 7 (s1 + 1)``,
# the index into the per-node lookup tables below (everything (8, 128) padding depends on).
SLOT_PAIRS = 49
_LOW_48_BITS = np.uint64(2**48 - 1)


def slot_pairs(configs: np.ndarray, first: int) -> np.ndarray:
    """int8 (...) slot-pair codes of slots ``first`` and ``first + 1`` of ``configs`` (..., 18) or (..., 6).

    Layout values lie in -1..5 (the reader refuses anything else), so codes lie in 0..48 and int8
    arithmetic cannot overflow."""
    return configs[..., first] + configs[..., first + 1] * 7 + 8


def block_codes(configs: np.ndarray) -> np.ndarray:
    """uint64 (c, 3, nc): each block (out, in, kernel) of int8 ``configs`` (c, nc, 18) as one integer,
    its 6 bytes, so that two blocks are equal exactly when their codes are.

    Read through unaligned 8-byte views that stay inside each 18-byte row (block 0: bytes 0-7 masked
    to 0-5; blocks 1 and 2: bytes 4-11 and 10-17 shifted right by 2 bytes), with no copy of the configs.
    """
    configs = np.ascontiguousarray(configs, dtype=np.int8)
    count, nc = configs.shape[:2]
    codes = np.zeros((count, len(BLOCKS), nc), dtype=np.uint64)
    if configs.size == 0:
        return codes
    raw = configs.reshape(-1).view(np.uint8)
    for b in range(len(BLOCKS)):
        start = 6 * b - (2 if b else 0)
        words = np.ndarray((count, nc), dtype="<u8", buffer=raw, offset=start, strides=(nc * 18, 18))
        if b == 0:
            np.bitwise_and(words, _LOW_48_BITS, out=codes[:, b])
        else:
            np.right_shift(words, np.uint64(16), out=codes[:, b])
    return codes


def layout_codes(layouts: np.ndarray) -> np.ndarray:
    """uint64 (m,) :func:`block_codes` of single int8 blocks ``layouts`` (m, 6)."""
    rows = np.zeros((layouts.shape[0], 1, 18), dtype=np.int8)
    rows[:, 0, :6] = layouts
    return block_codes(rows)[:, 0, 0]


def padding_table(dims: np.ndarray) -> np.ndarray:
    """float64 (m, SLOT_PAIRS): :func:`tile_padding` of m tensors (``dims`` (m, 6)) under every slot pair."""
    pair = np.arange(SLOT_PAIRS)
    layouts = np.full((SLOT_PAIRS, dims.shape[0], 6), -1, dtype=np.int8)
    layouts[:, :, 0] = (pair % 7 - 1)[:, None]
    layouts[:, :, 1] = (pair // 7 - 1)[:, None]
    return np.ascontiguousarray(tile_padding(dims, layouts).T)


@dataclass(frozen=True)
class ConfigNodes:
    """What the per-config layout features need to know about a graph's configurable nodes."""

    dims: np.ndarray  # int64 (nc, 6) shape dims
    largest: np.ndarray  # int64 (nc,) largest dim
    nbytes: np.ndarray  # float64 (nc,) output bytes (at least one byte per element)
    default: np.ndarray  # int8 (nc, 6) default layout, -1 past the rank
    pairs: np.ndarray  # int64 (P, 2) connected (producer, consumer) positions, see config_pairs
    op_masks: dict[str, np.ndarray]  # conv/dot/reshape -> bool (nc,)
    # per-node lookups, so that the per-config work gathers instead of recomputing (see _Blocks)
    default_code: np.ndarray  # uint64 (nc,) block code of the default layout
    default_pair: np.ndarray  # int8 (nc,) slot pair of the default layout
    padding: np.ndarray  # float64 (nc, SLOT_PAIRS) tile_padding of the output under each slot pair
    violates: np.ndarray  # bool (nc, SLOT_PAIRS) the minor-most slot's dim is smaller than the largest dim
    default_padding: np.ndarray  # float64 (1, nc) tile_padding of the default layouts

    @classmethod
    def of(cls, graph: PrunedGraph) -> ConfigNodes:
        feat = graph.node_feat[graph.config_nodes]
        opcode = graph.node_opcode[graph.config_nodes].astype(np.int64)
        dims = node_dims(feat)
        default = default_layouts(feat, node_rank(dims))
        largest = dims.max(axis=1)
        minor_slot = np.arange(SLOT_PAIRS) % 7 - 1
        minor = np.where(minor_slot >= 0, dims[:, np.maximum(minor_slot, 0)], 0)  # (nc, SLOT_PAIRS)
        return cls(
            dims=dims,
            largest=largest,
            nbytes=output_bytes(feat),
            default=default,
            pairs=config_pairs(graph.num_nodes, graph.edge_index, graph.config_nodes),
            op_masks={name: opcode == code for name, code in LAYOUT_OPS.items()},
            default_code=layout_codes(default),
            default_pair=slot_pairs(default, 0),
            padding=padding_table(dims),
            violates=(minor_slot >= 0) & (minor < largest[:, None]),
            default_padding=tile_padding(dims, default[None]),
        )


def block_columns(nc: int, block: np.ndarray | int, node: np.ndarray) -> np.ndarray:
    """intp columns of (node, block) in the (k, 3 nc) arrays of :class:`_Blocks`."""
    return (np.asarray(block, dtype=np.intp) * nc + node).astype(np.intp)


@dataclass(frozen=True)
class Chains:
    """Where a configurable node's layout meets another layout through elementwise chains.

    Elementwise ops take their operand's layout (:data:`ELEMENTWISE_OPCODES`), so a layout decided at
    one node reaches, unchanged, every node at the end of an elementwise chain. At each end the
    layouts must agree, or XLA inserts a copy (a transpose when the tiled minor dims differ):

    * ``pair_*``: configurable producer -> configurable consumer: the producer's output layout vs.
      the consumer's input block;
    * ``fixed_in_*``: a non-configurable, non-elementwise producer (its layout is the file's, fixed
      for every config; broadcasts, constants and iotas are laid out as asked and never count) ->
      a configurable consumer's input block;
    * ``fixed_out``: configurable nodes whose output reaches a non-configurable, non-elementwise
      consumer, which keeps the layout it has under the default config (the producer's default).

    Which input block a producer feeds is not in the file (edges are sorted, operand order is lost):
    the kernel block when the consumer is a convolution or dot whose kernel block is explicit in
    some config and has the producer's rank while the input block has not, else the input block.
    """

    pair_producer: np.ndarray  # int64 (P,) positions in config_nodes
    pair_consumer: np.ndarray  # int64 (P,)
    pair_kernel: np.ndarray  # bool (P,) the consumer's kernel block (else input block)
    fixed_in_consumer: np.ndarray  # int64 (F,) positions in config_nodes
    fixed_in_kernel: np.ndarray  # bool (F,)
    fixed_in_layout: np.ndarray  # int8 (F, 6) the producer's layout (-1 past its rank)
    fixed_in_dims: np.ndarray  # int64 (F, 6) the producer's shape
    fixed_in_bytes: np.ndarray  # float64 (F,)
    fixed_out: np.ndarray  # bool (nc,)
    fixed_in_code: np.ndarray  # uint64 (F,) block code of fixed_in_layout
    fixed_in_padding: np.ndarray  # float64 (F, SLOT_PAIRS) padding_table of fixed_in_dims
    fixed_in_own_padding: np.ndarray  # float64 (1, F) tile_padding of the producers in their own layout
    pair_columns: np.ndarray  # intp (P,) the consumer's input or kernel block, see block_columns
    fixed_in_columns: np.ndarray  # intp (F,)

    @classmethod
    def of(cls, graph: PrunedGraph, nodes: ConfigNodes) -> Chains:
        n, config_nodes = graph.num_nodes, graph.config_nodes
        opcode = graph.node_opcode.astype(np.int64)
        is_config = np.zeros(n, dtype=bool)
        is_config[config_nodes] = True
        elementwise = np.isin(opcode, list(ELEMENTWISE_OPCODES)) & ~is_config
        free = np.isin(opcode, list(FREE_LAYOUT_OPCODES))
        position = np.full(n, -1, dtype=np.int64)
        position[config_nodes] = np.arange(config_nodes.size)
        dims = node_dims(graph.node_feat)
        rank = node_rank(dims)
        kernel_capable = nodes.op_masks["conv"] | nodes.op_masks["dot"]
        in_rank, kernel_rank = _block_ranks(graph.config_feat, np.flatnonzero(kernel_capable))

        def kernel_block(consumer: np.ndarray, producer_rank: np.ndarray) -> np.ndarray:
            k_rank, i_rank = kernel_rank[consumer], in_rank[consumer]
            return kernel_capable[consumer] & (k_rank > 0) & (producer_rank == k_rank) & (producer_rank != i_rank)

        down = chain_ends(n, graph.edge_index, config_nodes, elementwise, downstream=True)
        to_config = is_config[down[:, 1]]
        pair_producer, pair_consumer = down[to_config, 0], position[down[to_config, 1]]
        fixed_out = np.zeros(config_nodes.size, dtype=bool)
        fixed_out[down[~to_config & ~free[down[:, 1]], 0]] = True

        up = chain_ends(n, graph.edge_index, config_nodes, elementwise, downstream=False)
        up = up[~is_config[up[:, 1]] & ~free[up[:, 1]] & (rank[up[:, 1]] > 0)]
        producer = up[:, 1]
        feat = graph.node_feat[producer]
        fixed_layout, fixed_dims = default_layouts(feat, rank[producer]), dims[producer]
        pair_kernel = kernel_block(pair_consumer, node_rank(nodes.dims)[pair_producer])
        fixed_in_kernel = kernel_block(up[:, 0], rank[producer])
        return cls(
            pair_producer=pair_producer, pair_consumer=pair_consumer, pair_kernel=pair_kernel,
            pair_columns=block_columns(config_nodes.size, 1 + pair_kernel, pair_consumer),
            fixed_in_columns=block_columns(config_nodes.size, 1 + fixed_in_kernel, up[:, 0]),
            fixed_in_consumer=up[:, 0], fixed_in_kernel=fixed_in_kernel,
            fixed_in_layout=fixed_layout, fixed_in_dims=fixed_dims,
            fixed_in_bytes=output_bytes(feat), fixed_out=fixed_out,
            fixed_in_code=layout_codes(fixed_layout), fixed_in_padding=padding_table(fixed_dims),
            fixed_in_own_padding=tile_padding(fixed_dims, fixed_layout[None]),
        )


def _block_ranks(configs: np.ndarray, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int64 (nc,) each: the most slots any config sets in a node's input and kernel blocks, for
    the configurable nodes at ``columns`` (0 elsewhere: only convolutions and dots use them)."""
    nc = configs.shape[1]
    ranks = [np.zeros(nc, dtype=np.int64), np.zeros(nc, dtype=np.int64)]
    if columns.size == 0:
        return ranks[0], ranks[1]
    step = max(1, CELLS_PER_CHUNK // columns.size)
    for start in range(0, configs.shape[0], step):
        cfg = np.take(configs[start : start + step], columns, axis=1)
        for rank, first in zip(ranks, (6, 12)):
            slots_set = np.zeros(cfg.shape[:2], dtype=np.int8)  # at most 6: int8 counts
            for slot in range(first, first + 6):
                slots_set += cfg[:, :, slot] >= 0
            rank[columns] = np.maximum(rank[columns], slots_set.max(axis=0, initial=0))
    return ranks[0], ranks[1]


def reshape_stride_constraints(in_dims: np.ndarray, out_dims: np.ndarray) -> np.ndarray | None:
    """int64 (C, 6) rows ``[block_a, dim_a, mult_a, block_b, dim_b, mult_b]`` (block 0: the reshape's
    output, 1: its operand): the reshape from ``in_dims`` to ``out_dims`` (each (6,), 0 past the rank) is a
    bitcast - every element keeps its place in memory, so XLA needs no copy - exactly when, under the two
    layouts, ``stride(block_a, dim_a) * mult_a == stride(block_b, dim_b) * mult_b`` on every row, a dim's
    stride being the product of the dims its layout puts more minor. None when the element counts differ
    (no reshape of these shapes).

    Reshapes keep the row-major order of the logical index. Size-1 dims never move an element and are
    left out. Where the two shapes' row-major boundaries nest (``[6] -> [2, 3]``, ``[2, 3, 4] -> [6, 4]``),
    each finest digit of the logical index must have one stride on both sides (layouts that permute
    dims alike stay bitcasts); where they do not (``[2, 3] -> [3, 2]``), the dims between two common
    boundaries must be contiguous and row-major on both sides, with one stride at their minor end.
    """
    def spans(dims: np.ndarray) -> tuple[list[tuple[int, int, int]], int]:
        """(dim, low, high) of each dim of size > 1, minor-most logical dim first; and the element count
        (0 for an empty tensor)."""
        sizes = np.asarray(dims, dtype=np.int64)
        found, low = [], 1
        for d in reversed(range(int(node_rank(sizes[None])[0]))):
            size = int(sizes[d])
            if size > 1:
                found.append((d, low, low * size))
            low *= size
        return found, low

    (ins, count_in), (outs, count_out) = spans(in_dims), spans(out_dims)
    if count_in != count_out or count_in == 0:
        return None
    bounds_in, bounds_out = {s[1] for s in ins} | {count_in}, {s[1] for s in outs} | {count_out}
    common = sorted(bounds_in & bounds_out)
    rows: list[tuple[int, int, int, int, int, int]] = []
    for low, high in zip(common, common[1:]):
        group_in = [s for s in ins if low <= s[1] and s[2] <= high]
        group_out = [s for s in outs if low <= s[1] and s[2] <= high]
        digits = sorted({s[1] for s in group_in + group_out} | {high})
        if all(b % a == 0 for a, b in zip(digits, digits[1:])):
            for start in digits[:-1]:
                d_in = next(s for s in group_in if s[1] <= start < s[2])
                d_out = next(s for s in group_out if s[1] <= start < s[2])
                rows.append((1, d_in[0], start // d_in[1], 0, d_out[0], start // d_out[1]))
        else:
            for block, group in ((1, group_in), (0, group_out)):
                for minor, major in zip(group, group[1:]):
                    rows.append((block, major[0], 1, block, minor[0], minor[2] // minor[1]))
            rows.append((1, group_in[0][0], 1, 0, group_out[0][0], 1))
    return np.array(rows, dtype=np.int64).reshape(-1, 6)


def tile_padding(dims: np.ndarray, layouts: np.ndarray) -> np.ndarray:
    """float64 (k, m): padded / actual elements of m tensors (``dims`` (m, 6)) laid out as ``layouts``
    (k, m, 6) in (8, 128) tiles over the two minor-most dims; rank-1 tensors pad the minor dim only,
    and a scalar (slot 0 = -1) counts as one element in a 128-lane row."""
    row = np.arange(dims.shape[0])[None, :]
    minor_slot, second_slot = layouts[..., 0].astype(np.int64), layouts[..., 1].astype(np.int64)
    minor = np.maximum(np.where(minor_slot >= 0, dims[row, np.maximum(minor_slot, 0)], 1), 1).astype(np.float64)
    second = np.maximum(np.where(second_slot >= 0, dims[row, np.maximum(second_slot, 0)], 1), 1).astype(np.float64)
    padded = np.ceil(minor / TILE_MINOR) * TILE_MINOR / minor
    return padded * np.where(second_slot >= 0, np.ceil(second / TILE_SECOND) * TILE_SECOND / second, 1.0)
