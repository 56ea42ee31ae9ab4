"""Shared precomputation for the families: one pass over a program, then vectorised per config.

The structure of a program (shapes, element types, which configurable node feeds which, which
rigid producers and consumers are attached) is a fact of the program, not of a cost model; the
families read it from the reference's :class:`costmodel.LayoutCostModel` and add what their own
rules need: whether a configurable consumer reads its configurable producer directly or through a
chain of elementwise ops (a fusion), and how many elementwise ops follow each configurable node.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipelines.synth import costmodel
from pipelines.synth.costmodel import RESHAPE, LayoutCostModel, _trace_producer
from pipelines.synth.programs import MAX_RANK, OP, TRANSPARENT_OPCODES, Program, TileKernel

CHUNK_CELLS = 1_000_000  # config-node entries per working chunk


@dataclass
class Structure:
    model: LayoutCostModel  # the reference precomputation (default constants)
    c2c_direct: np.ndarray  # (L,) bool: the consumer reads the producer with no elementwise op between
    chain_ops: np.ndarray  # (nc,) elementwise ops of the same shape fed by the node's output
    out_elems: np.ndarray  # (nc,)
    in_elems: np.ndarray
    ker_elems: np.ndarray


def structure(program: Program) -> Structure:
    model = costmodel.layout_cost_model(program, costmodel.DEFAULT_PARAMS)
    nodes = program.nodes
    n = len(nodes)
    is_config = np.zeros(n, dtype=bool)
    is_config[program.config_ids] = True
    consumers: list[list[int]] = [[] for _ in range(n)]
    for u, v in program.edge_index:
        consumers[v].append(int(u))
    direct: list[bool] = []
    chain: list[int] = []
    for i, u in enumerate(program.config_ids):
        node = nodes[u]
        ker_conf = node.opcode != OP["reshape"] and 1 <= len(nodes[node.inputs[1]].shape) <= 2
        for operand in node.inputs[: 2 if ker_conf else 1]:
            producer = _trace_producer(program, operand, is_config)
            if is_config[producer]:
                direct.append(producer == operand)
        count, stack, seen = 0, [int(u)], {int(u)}
        while stack:
            for c in consumers[stack.pop()]:
                if c in seen or is_config[c]:
                    continue
                seen.add(c)
                if nodes[c].opcode in TRANSPARENT_OPCODES and nodes[c].shape == node.shape:
                    count += 1
                    stack.append(c)
        chain.append(count)
    return Structure(model, np.array(direct, dtype=bool).reshape(-1), np.array(chain, dtype=np.float64),
                     np.prod(model.out_shape, axis=1), np.prod(model.in_shape, axis=1),
                     np.where(model.ker_rank > 0, np.prod(model.ker_shape, axis=1), 0.0))


def chunked(fn, s: Structure, blocks: np.ndarray) -> np.ndarray:
    """``fn(s, blocks_chunk) -> (rows,)`` over row chunks (bounded memory)."""
    rows = max(1, CHUNK_CELLS // max(s.model.num_configurable, 1))
    out = np.empty(blocks.shape[0], dtype=np.float64)
    for start in range(0, blocks.shape[0], rows):
        out[start:start + rows] = fn(s, blocks[start:start + rows])
    return out


def resolve(s: Structure, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Resolved output, input and kernel layouts (c, nc, 6) (compiler defaults filled in)."""
    m = s.model
    res = costmodel.resolve_defaults(blocks, m.defaults)
    p_ker = np.where(m.ker_configurable[None, :, None], res[:, :, 12:18], m.ker_fixed_perm[None])
    return res[:, :, 0:6], res[:, :, 6:12], p_ker


def dim_size(shape: np.ndarray, perm: np.ndarray, slot: int) -> np.ndarray:
    """Size of the dim at ``perm[..., slot]`` (1 where the slot is past the rank)."""
    idx = perm[..., slot]
    size = shape[np.arange(shape.shape[0]), np.clip(idx, 0, MAX_RANK - 1)]
    return np.where(idx >= 0, size, 1.0)


def padded(shape: np.ndarray, rank: np.ndarray, perm: np.ndarray, sublanes: np.ndarray | float = 8.0,
           lanes: float = 128.0) -> np.ndarray:
    """Elements after tiling the two minor-most dims into (sublanes x lanes) tiles under ``perm``."""
    minor = dim_size(shape, perm, 0)
    second = np.where(rank >= 2, dim_size(shape, perm, 1), 1.0)
    elems = np.prod(shape, axis=1)
    tiled_second = np.where(rank >= 2, np.ceil(second / sublanes) * sublanes, 1.0)
    return elems / (minor * second) * np.ceil(minor / lanes) * lanes * tiled_second


def ceil_to(x: np.ndarray, multiple: float) -> np.ndarray:
    return np.ceil(x / multiple) * multiple


def is_reshape(s: Structure) -> np.ndarray:
    return s.model.kind == RESHAPE


def fixed_producer_copies(m: LayoutCostModel, block: int, consumer: np.ndarray, consumer_bytes: np.ndarray,
                          hbm_bytes_ns: float, launch_ns: float) -> np.ndarray | float:
    """Per config, the copies where input (``block`` 0) or kernel (1) layouts ``consumer`` (k, nc, 6) of
    configurable nodes differ from the layout of the fixed-layout producer they read: a read and a write
    of the operand (``consumer_bytes`` (k, nc)) plus a launch each; 0 where no such producer feeds that block."""
    sel = m.fixed_block == block
    if not np.any(sel):
        return 0.0
    dst = m.fixed_dst[sel]
    differ = np.any(consumer[:, dst] != m.fixed_perm[sel][None], axis=-1)
    return (differ * (2.0 * consumer_bytes[:, dst] / hbm_bytes_ns + launch_ns)).sum(axis=1)


def off_default_copies(m: LayoutCostModel, p_out: np.ndarray, out_bytes: np.ndarray, hbm_bytes_ns: float,
                       launch_ns: float) -> np.ndarray:
    """Per config, the copies of outputs off their default layout, one per fixed-layout consumer reading them
    (``m.out_fanout``): a read and a write of the output plus a launch each."""
    off = np.any(p_out != m.defaults[None, :, 0:6], axis=-1)
    return (off * m.out_fanout * (2.0 * out_bytes / hbm_bytes_ns + launch_ns)).sum(axis=1)


def tile_bounds(kernel: TileKernel, config_feat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(kernel, output, input) tile sizes of each config, float64, from the 24 config_feat columns."""
    out_rank, in_rank = len(kernel.out_shape), len(kernel.in_shape)
    ker_rank = (len(kernel.window) + 2 if kernel.kind == "conv" else 2) if kernel.contract else 0
    return (config_feat[:, 0:ker_rank].astype(np.float64), config_feat[:, 8:8 + out_rank].astype(np.float64),
            config_feat[:, 16:16 + in_rank].astype(np.float64))


def tile_padded(bounds: np.ndarray, sublanes: float = 8.0) -> np.ndarray:
    """Padded elements of tiles with the last dim on the 128 lanes and the one before on ``sublanes``."""
    rank = bounds.shape[1]
    if rank == 0:
        return np.zeros(bounds.shape[0])
    minor = ceil_to(bounds[:, -1], 128)
    if rank == 1:
        return minor
    return np.prod(bounds[:, :-2], axis=1) * ceil_to(bounds[:, -2], sublanes) * minor
