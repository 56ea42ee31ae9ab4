"""Configurations of the synthetic world: tile sizes for kernels, layouts for programs.

Layout configs are int8 arrays (c, nc, 18): three six-slot minor_to_major blocks (output, input,
kernel) per configurable node, -1 past the tensor's rank and -1 throughout for "compiler default".
The kernel block is used only for rank 1-2 kernels, so columns 14-17 are always -1.

* ``random`` search: every block an independent random permutation (10% compiler default).
* ``default`` search: the compiler's own explorer, clustered around good configs: rows start from
  the default config, an autotuned config (see ``tuned_config``) or an earlier row, and
  mutate a few nodes; a file-specific share of rows repeats an earlier row exactly.

Tile configs are distinct tile-size choices (powers of two and the full extent per output dim,
plus the contracted-dim tile for convs and dots) written as the 24 config_feat columns.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from pipelines.synth.costmodel import LayoutCostModel, chunked_costs, node_costs
from pipelines.synth.programs import MAX_RANK, TileKernel

DEFAULT_SHARE_RANDOM = 0.10
CHUNK_CELLS = 4_000_000  # int8 entries per working chunk (bounded memory for large nc)


def _chunk_rows(num_configurable: int) -> int:
    return max(16, min(2048, CHUNK_CELLS // max(18 * num_configurable, 1)))


def permutation_table() -> tuple[np.ndarray, np.ndarray]:
    """All permutations of ranks 0..6 stacked (int8, -1 padded) and each rank's first row."""
    rows: list[list[int]] = []
    offsets = np.zeros(MAX_RANK + 2, dtype=np.int64)
    for rank in range(MAX_RANK + 1):
        offsets[rank] = len(rows)
        rows.extend(list(p) + [-1] * (MAX_RANK - rank) for p in itertools.permutations(range(rank)))
    offsets[MAX_RANK + 1] = len(rows)
    return np.array(rows, dtype=np.int8), offsets


def _random_perms(ranks: np.ndarray, rng: np.random.Generator, table: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """One uniformly random permutation block (-1 padded) per entry of ``ranks``."""
    counts = np.array([math.factorial(int(r)) for r in range(MAX_RANK + 1)])[ranks]
    return table[offsets[ranks] + np.floor(rng.random(ranks.shape) * counts).astype(np.int64)]


def block_ranks(model: LayoutCostModel) -> np.ndarray:
    """(nc, 3) rank of each configurable block; 0 marks a block that stays -1."""
    return np.stack([model.out_rank, model.in_rank, np.where(model.ker_configurable, model.ker_rank, 0)], axis=1)


def default_config(model: LayoutCostModel) -> np.ndarray:
    """The compiler's default layouts written out explicitly (nc, 18)."""
    return model.defaults.copy()


def tuned_config(model: LayoutCostModel, top: int = 64) -> np.ndarray:
    """A good config as an autotuner would find it, starting from the default: (nc, 18).

    One greedy sweep over the ``top`` most expensive configurable nodes: try every output layout,
    with the inputs of the node's configurable consumers following it (so no copy is implied
    between them), and keep it when the whole program gets faster.
    """
    table, offsets = permutation_table()
    config = default_config(model)
    best = float(chunked_costs(model, config[None])[0])
    followers: dict[int, list[tuple[int, int]]] = {}
    for src, dst, block in zip(model.c2c_src, model.c2c_dst, model.c2c_block):
        followers.setdefault(int(src), []).append((int(dst), int(block)))
    order = np.argsort(-node_costs(model, config[None])[0], kind="stable")[:top]
    for i in order:
        rank = int(model.out_rank[i])
        perms = table[offsets[rank]:offsets[rank + 1]]
        candidates = np.repeat(config[None], len(perms), axis=0)
        candidates[:, i, 0:6] = perms
        for dst, block in followers.get(int(i), []):
            candidates[:, dst, 6 + 6 * block:12 + 6 * block] = perms
        costs = chunked_costs(model, candidates)
        j = int(np.argmin(costs))
        if costs[j] < best:
            best, config = float(costs[j]), candidates[j].copy()
    return config


def random_search(model: LayoutCostModel, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` configs with independent random layouts per block (int8 (count, nc, 18))."""
    table, offsets = permutation_table()
    ranks = block_ranks(model)
    out = np.full((count, model.num_configurable, 18), -1, dtype=np.int8)
    step = _chunk_rows(model.num_configurable)
    for start in range(0, count, step):
        rows = min(step, count - start)
        for block in range(3):
            r = np.broadcast_to(ranks[:, block], (rows, model.num_configurable))
            perms = _random_perms(r, rng, table, offsets)
            keep = (rng.random(r.shape) >= DEFAULT_SHARE_RANDOM) & (r > 0)
            out[start:start + rows, :, block * 6:block * 6 + 6] = np.where(keep[..., None], perms, -1)
    return out


def default_search(model: LayoutCostModel, count: int, rng: np.random.Generator,
                   duplicate_share: float, mutations: float) -> np.ndarray:
    """``count`` configs clustered near the default and padding-minimal configs (see module doc).

    The mix (anchor shares, mutation choices) comes from the world's constants, ``model.params``.
    """
    mix = model.params
    table, offsets = permutation_table()
    nc = model.num_configurable
    ranks = block_ranks(model)
    anchors = np.stack([default_config(model), tuned_config(model), np.full((nc, 18), -1, np.int8)])
    out = np.empty((count, nc, 18), dtype=np.int8)
    out[0] = anchors[0]
    step = _chunk_rows(nc)
    for start in range(1, count, step):
        rows = min(step, count - start)
        # parents: an anchor, or a row generated before this chunk (recent rows preferred)
        from_anchor = rng.random(rows) < mix.from_anchor
        back = np.minimum(rng.geometric(1.0 / max(2.0, start / 4), size=rows), start)
        parent_rows = out[start - back]
        anchor_pick = anchors[rng.choice(3, size=rows, p=list(mix.anchor_mix))]
        chunk = np.where(from_anchor[:, None, None], anchor_pick, parent_rows)
        duplicate = (~from_anchor) & (rng.random(rows) < duplicate_share)
        num_mut = np.where(duplicate, 0, 1 + rng.poisson(mutations, size=rows))
        for round_ in range(int(num_mut.max(initial=0))):  # not `step`: that is the chunk size above
            live = np.flatnonzero(num_mut > round_)
            node = rng.integers(nc, size=live.size)
            block = rng.integers(3, size=live.size)
            block = np.where(ranks[node, block] > 0, block, 0)
            choice = rng.random(live.size)
            perms = _random_perms(ranks[node, block], rng, table, offsets)
            good = anchors[1][node, :].reshape(-1, 3, 6)[np.arange(live.size), block]
            value = np.where((choice < mix.mutation_unset)[:, None], np.int8(-1),
                             np.where((choice < mix.mutation_tuned)[:, None], good, perms))
            cols = block[:, None] * 6 + np.arange(6)[None, :]
            chunk[live[:, None], node[:, None], cols] = value
        out[start:start + rows] = chunk
    return out


def row_hashes(configs: np.ndarray) -> np.ndarray:
    """A 64-bit hash per config row (random linear form, wrap-around), for finding duplicates."""
    flat = configs.reshape(configs.shape[0], -1)
    weights = np.random.default_rng(12345).integers(1, 2**62, size=flat.shape[1], dtype=np.int64) | 1
    hashes = np.zeros(flat.shape[0], dtype=np.int64)
    step = max(1, 4_000_000 // max(flat.shape[1], 1))
    with np.errstate(over="ignore"):
        for start in range(0, flat.shape[0], step):
            hashes[start:start + step] = (flat[start:start + step].astype(np.int64) + 2) @ weights
    return hashes


# ----------------------------------------------------------------------------- tile configs


def _tile_options(extent: int) -> np.ndarray:
    """Powers of two from extent/32 up, plus the full extent (the tuner never tries slivers)."""
    options = [1 << k for k in range(int(math.log2(extent)) + 1) if extent / 32 <= (1 << k) < extent]
    return np.array(options + [extent], dtype=np.int64)


def tile_space_size(kernel: TileKernel) -> int:
    sizes = [len(_tile_options(d)) for d in kernel.out_shape]
    if kernel.contract:
        sizes.append(len(_tile_options(kernel.contract)))
    return math.prod(sizes)


def _bounds_block(values: np.ndarray) -> np.ndarray:
    """Six slots (0 padded), sum, product (product of an empty list is 0 in config_feat)."""
    c, r = values.shape
    block = np.zeros((c, 8), dtype=np.float64)
    block[:, :r] = values
    block[:, 6] = values.sum(axis=1)
    block[:, 7] = np.prod(values, axis=1) if r else 0.0
    return block


def tile_configs(kernel: TileKernel, count: int, rng: np.random.Generator) -> np.ndarray:
    """``min(count, space)`` distinct tile configs as float32 config_feat (c, 24)."""
    options = [_tile_options(d) for d in kernel.out_shape]
    if kernel.contract:
        options.append(_tile_options(kernel.contract))
    radix = [len(o) for o in options]
    space = math.prod(radix)
    picks = rng.choice(space, size=min(count, space), replace=False)
    digits = []
    for r in radix:
        digits.append(picks % r)
        picks = picks // r
    chosen = np.stack([o[d] for o, d in zip(options, digits)], axis=1).astype(np.float64)
    out_rank = len(kernel.out_shape)
    out_t = chosen[:, :out_rank]
    if kernel.kind == "conv":
        k_t = chosen[:, out_rank]
        window = np.array(kernel.window, dtype=np.float64)
        spatial = np.minimum(np.array(kernel.in_shape[1:-1], dtype=np.float64),
                             out_t[:, 1:-1] * kernel.stride + window - 1)
        ker = np.column_stack([np.broadcast_to(window, (len(k_t), len(window))), k_t, out_t[:, -1]])
        inp = np.column_stack([out_t[:, 0], spatial, k_t])
    elif kernel.kind == "dot":
        k_t = chosen[:, out_rank]
        ker = np.column_stack([k_t, out_t[:, -1]])
        inp = np.column_stack([out_t[:, 0], k_t])
    elif kernel.kind == "reduce":
        ker = np.zeros((len(out_t), 0))
        inp = np.column_stack([out_t, np.full(len(out_t), float(kernel.in_shape[-1]))])
    else:
        ker = np.zeros((len(out_t), 0))
        inp = out_t
    return np.hstack([_bounds_block(ker), _bounds_block(out_t), _bounds_block(inp)]).astype(np.float32)
