"""Candidate configurations of a featurized program: layouts of its configurable nodes, tiles of its fusions.

Layout configs are int8 (c, nc, 18): per configurable node three six-slot minor_to_major blocks
(output, input = operand 0, kernel = operand 1), -1 past the tensor's rank, and an all -1 block for
"let the compiler choose" (the format of layout ``node_config_feat``). As in the dataset (and our
synthetic world), only kernels of rank 1-2 get a kernel block, so columns 14-17 stay -1.

* ``random`` search: every block an independent uniformly random permutation, 10% left to the
  compiler (the random collections' procedure).
* ``default`` search: the compiler's explorer as the default collections show it: row 0 is the
  module's own layouts written out; later rows start from that default, from "all compiler
  default" or from an earlier row, and change one or a few blocks (to a random permutation, or
  back to -1); a share of rows repeats an earlier row exactly.

Tile configs (c, 24) are distinct tile sizes of a fusion's output (powers of two from extent/32 up,
plus the whole extent, per dim), with the contracted dim's tile for dot and convolution fusions,
written as kernel / output / input bounds (six slots, sum, product; product of an empty list 0).
Runtimes are unknown: featurized programs are test graphs, ``config_runtime`` all 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipelines.hlo.featurize import int_list, parse_dim_labels, parse_window
from pipelines.hlo.parse import Computation, Instruction, Shape
from pipelines.synth.searches import permutation_table

MAX_RANK = 6
COMPILER_DEFAULT_SHARE = 0.10
SEARCHES = ("random", "default")
CHUNK_CELLS = 1_000_000  # (config, node) cells drawn per step of the random search


@dataclass(frozen=True)
class LayoutSpace:
    """Per configurable node: the rank of each block (0 = block stays -1) and the module's own layouts."""

    ranks: np.ndarray  # int64 (nc, 3)
    defaults: np.ndarray  # int8 (nc, 18)

    @property
    def num_nodes(self) -> int:
        return int(self.ranks.shape[0])


def _block(layout: tuple[int, ...], rank: int) -> list[int]:
    perm = list(layout) if len(layout) == rank and sorted(layout) == list(range(rank)) \
        else list(range(rank - 1, -1, -1))  # no (valid) layout printed: XLA's default, last dim minor
    return perm[:MAX_RANK] + [-1] * (MAX_RANK - min(rank, MAX_RANK))


def layout_space(nodes: list[Instruction], shapes_by_name: dict[str, Shape]) -> LayoutSpace:
    """The block ranks and default layouts of configurable ``nodes`` (conv, dot, reshape)."""
    ranks, defaults = [], []
    for node in nodes:
        out = node.shape.first_array()
        src = shapes_by_name[node.operands[0]].first_array() if node.operands else Shape("invalid")
        ker = shapes_by_name[node.operands[1]].first_array() if node.opcode != "reshape" and len(node.operands) > 1 \
            else None
        ker_rank = ker.rank if ker is not None and 1 <= ker.rank <= 2 else 0
        rank = (min(out.rank, MAX_RANK), min(src.rank, MAX_RANK), ker_rank)
        ranks.append(rank)
        defaults.append(_block(out.minor_to_major, rank[0]) + _block(src.minor_to_major, rank[1])
                        + (_block(ker.minor_to_major, ker_rank) if ker_rank else [-1] * MAX_RANK))
    nc = len(nodes)
    return LayoutSpace(np.array(ranks, dtype=np.int64).reshape(nc, 3),
                       np.array(defaults, dtype=np.int8).reshape(nc, 18))


def _random_blocks(ranks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One uniformly random permutation (-1 padded) per entry of ``ranks`` (any shape)."""
    table, offsets = permutation_table()
    counts = np.array([math.factorial(r) for r in range(MAX_RANK + 1)])[ranks]
    return table[offsets[ranks] + np.floor(rng.random(ranks.shape) * counts).astype(np.int64)]


def random_search(space: LayoutSpace, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` configs, each block an independent random permutation (10% compiler default)."""
    nc = space.num_nodes
    out = np.full((count, nc, 18), -1, dtype=np.int8)
    step = max(1, CHUNK_CELLS // max(nc, 1))  # bounded temporaries whatever count x nc
    for start in range(0, count, step):
        rows = min(step, count - start)
        for block in range(3):
            ranks = np.broadcast_to(space.ranks[:, block], (rows, nc))
            perms = _random_blocks(ranks, rng)
            keep = (rng.random(ranks.shape) >= COMPILER_DEFAULT_SHARE) & (ranks > 0)
            out[start:start + rows, :, 6 * block:6 * block + 6] = np.where(keep[..., None], perms, -1)
    return out


def default_search(space: LayoutSpace, count: int, rng: np.random.Generator, *, duplicate_share: float = 0.2,
                   mutations: float = 1.0, from_anchor: float = 0.3) -> np.ndarray:
    """``count`` configs clustered around the module's default layouts (see the module docstring)."""
    nc = space.num_nodes
    anchors = np.stack([space.defaults, np.full((nc, 18), -1, np.int8)])
    out = np.empty((count, nc, 18), dtype=np.int8)
    out[0] = anchors[0]
    for row in range(1, count):
        if rng.random() < from_anchor:
            config = anchors[int(rng.random() < 0.2)].copy()
        else:
            config = out[row - min(int(rng.geometric(1.0 / max(2.0, row / 4))), row)].copy()
            if rng.random() < duplicate_share:
                out[row] = config
                continue
        for _ in range(1 + int(rng.poisson(mutations))):
            node = int(rng.integers(nc))
            choices = [b for b in range(3) if space.ranks[node, b] > 0]
            if not choices:
                continue
            block = int(rng.choice(choices))
            cols = slice(6 * block, 6 * block + 6)
            if rng.random() < 0.15:
                config[node, cols] = -1
            else:
                config[node, cols] = _random_blocks(np.array([space.ranks[node, block]]), rng)[0]
        out[row] = config
    return out


def layout_configs(space: LayoutSpace, count: int, search: str, seed: int) -> np.ndarray:
    if search not in SEARCHES:
        raise ValueError(f"unknown search {search!r}; expected one of {SEARCHES}")
    rng = np.random.default_rng([seed, SEARCHES.index(search)])
    return (random_search if search == "random" else default_search)(space, count, rng)


def describe_block(block: np.ndarray, default: np.ndarray) -> str:
    """A block in words: ``{1,0}``, or ``default {1,0}`` when it is left to the compiler (all -1)."""
    def text(values: np.ndarray) -> str:
        return "{" + ",".join(str(int(v)) for v in values if v >= 0) + "}"

    return f"default {text(default)}" if np.all(block < 0) else text(block)


# ----------------------------------------------------------------------------- tiles


@dataclass(frozen=True)
class TileSpace:
    """What a fusion's tile configs are made of."""

    kind: str  # "conv", "dot", "reduce" or "eltwise"
    out_shape: tuple[int, ...]
    contract: int  # contracted extent (conv: input features, dot: K); 0 otherwise
    window: tuple[int, ...]  # conv window sizes
    reduced: int  # reduce: extent of the reduced dims
    # conv: output dims in (batch, spatial..., feature) order, so NCHW and NHWC fusions derive their
    # kernel and input tiles alike; () = as they come
    conv_order: tuple[int, ...] = ()


def tile_space(fused: Computation, shapes_by_name: dict[str, Shape]) -> TileSpace:
    by_name = {i.name: i for i in fused.instructions}
    root = by_name[fused.root]
    out = tuple(d for d in root.shape.first_array().dims if d > 0)
    for kind, opcode in (("conv", "convolution"), ("dot", "dot")):
        node = next((i for i in fused.instructions if i.opcode == opcode), None)
        if node is None:
            continue
        lhs = shapes_by_name[node.operands[0]].first_array()
        if kind == "conv":
            labels = node.attrs.get("dim_labels", "")
            feature = parse_dim_labels(labels)[1] if labels else lhs.rank - 1
            contract = lhs.dims[feature] if 0 <= feature < lhs.rank else 1
            window = parse_window(node.attrs.get("window", "")).size
            order: tuple[int, ...] = ()
            if labels and node.name == fused.root and len(out) == node.shape.rank:
                numbers = parse_dim_labels(labels)
                spatial = sorted((int(ch), i) for i, ch in enumerate(labels.split("->")[-1]) if ch.isdigit())
                order = (numbers[12], *(i for _, i in spatial), numbers[13])
            return TileSpace(kind, out, int(contract), window, 0, order if sorted(order) == list(range(len(out)))
                             else ())
        dims = int_list(node.attrs.get("lhs_contracting_dims", ""))
        contract = math.prod(lhs.dims[d] for d in dims if d < lhs.rank) if dims else 1
        return TileSpace(kind, out, int(contract), (), 0)
    reduce = next((i for i in fused.instructions if i.opcode == "reduce"), None)
    if reduce is not None:
        src = shapes_by_name[reduce.operands[0]].first_array()
        reduced = math.prod(src.dims) // max(1, math.prod(reduce.shape.first_array().dims) or 1)
        return TileSpace("reduce", out, 0, (), int(max(reduced, 1)))
    return TileSpace("eltwise", out, 0, (), 0)


def _tile_options(extent: int) -> list[int]:
    extent = max(int(extent), 1)
    return [1 << k for k in range(int(math.log2(extent)) + 1) if extent / 32 <= (1 << k) < extent] + [extent]


def _bounds(values: list[int]) -> list[float]:
    values = list(values)[:MAX_RANK]
    return [float(v) for v in values] + [0.0] * (MAX_RANK - len(values)) + \
        [float(sum(values)), float(math.prod(values)) if values else 0.0]


def tile_configs(space: TileSpace, count: int, seed: int) -> np.ndarray:
    """Up to ``count`` distinct tile configs as float32 (c, 24) (at least one: the whole output)."""
    options = [_tile_options(d) for d in space.out_shape[:MAX_RANK]]
    if space.contract:
        options.append(_tile_options(space.contract))
    radix = [len(o) for o in options]
    size = math.prod(radix)
    rng = np.random.default_rng(seed)
    picks = sorted(rng.choice(size, size=min(count, size), replace=False).tolist()) if size > 1 else [0]
    rows = []
    for pick in picks:
        chosen = []
        for o, r in zip(options, radix):
            chosen.append(o[pick % r])
            pick //= r
        out_t = chosen[:len(space.out_shape[:MAX_RANK])]
        if space.kind == "conv":
            k_t = chosen[-1]
            bsf = [out_t[d] for d in space.conv_order] if space.conv_order else out_t  # batch, spatial, feature
            kernel = [*space.window, k_t, bsf[-1] if bsf else 1]
            inp = [bsf[0] if bsf else 1, *bsf[1:-1], k_t]
        elif space.kind == "dot":
            k_t = chosen[-1]
            kernel = [k_t, out_t[-1] if out_t else 1]
            inp = [*out_t[:-1], k_t]
        elif space.kind == "reduce":
            kernel, inp = [], [*out_t, space.reduced]
        else:
            kernel, inp = [], list(out_t)
        rows.append(_bounds(kernel) + _bounds(out_t) + _bounds(inp))
    return np.array(rows, dtype=np.float32).reshape(-1, 24)
