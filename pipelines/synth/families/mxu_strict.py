"""mxu_strict: the matrix unit decides; layouts matter through what the MXU is fed.

A reading of the public TPU descriptions (the MXU is a 128 x 128 systolic array fed from vector
registers of (8 sublanes x 128 lanes); transposes go through the cross-lane unit, XLU):

* conv / dot compute = flops / peak / (u_k * u_n), where u_k = C / ceil128(C) for the contracted
  size C and u_n = N / ceil128(N) for the output-feature size N (the array multiplies whole
  128 x 128 weight blocks); the other dims stream through and cost nothing extra. Padding of the
  non-contracted dims does not enter compute (unlike reference's sqrt of all padding ratios);
* the MXU wants the contracted dim minor-most in its input (lanes) and writes the output feature
  dim minor-most: otherwise the input (resp. the output) is transposed in-core through the XLU at
  ``XLU_BYTES_NS`` over its padded bytes, added to compute (reference: a fixed 1.2x / 1.1x factor,
  and "among the two minor dims" is enough there; here only minor-most counts);
* memory = padded bytes ((8 x 128) tiles of the two minor dims) / HBM bandwidth, no per-run DMA
  cost; a node costs max(compute, memory) + launch;
* reshape: a bitcast only when the tiles are the same physical bytes, i.e. the minor-most sizes
  agree and the second-minor sizes agree (or are both multiples of 8); else a copy of the padded
  tensors. Reference asks for both layouts to be row-major instead;
* producer/consumer mismatch (configurable links, rigid producers and consumers alike): when the
  two minor-most dims differ, a full copy (read + write the padded tensor, plus a launch); when only
  the major dims differ, the consumer's DMA walks the tiles in another order: a quarter of a
  copy's traffic and no launch (reference: any difference is a full copy);
* non-configurable ops: as reference (default layouts, 10% of their roofline survives fusion);
* tiles: MXU occupancy on the tile's own dims (the output tile's minor dim and the contraction tile
  padded to 128), a hard VMEM budget of 16 MiB whose overflow multiplies memory time by
  1 + 6 x overflow ratio, 600 ns per grid step, the fill of one step exposed, output tiles over 2 cores;
* noise: tile 0.4-1%, layout default search 1-3% (the compiler's candidates run back to back on a
  busy host), random search 0.5-1.5%.
"""

from __future__ import annotations

import math

import numpy as np

from pipelines.synth.families import _common as c
from pipelines.synth.programs import Program, TileKernel

NAME = "mxu_strict"
PEAK_FLOPS_NS = 9.0e4
F32_SLOWDOWN = 4.0
HBM_BYTES_NS = 700.0
XLU_BYTES_NS = 250.0
VPU_OPS_NS = 4.0e3
LAUNCH_NS = 1500.0
COPY_LAUNCH_NS = 2500.0
BITCAST_NS = 100.0
MAJOR_ONLY_SHARE = 0.25
VMEM_BYTES = 16 * 2**20
SPILL_SLOPE = 6.0
STEP_NS = 600.0
TILE_LAUNCH_NS = 2000.0
CORES = 2
NOISE = {"tile": (0.004, 0.01), "default": (0.01, 0.03), "random": (0.005, 0.015)}


def _mismatch_cost(p_a: np.ndarray, p_b: np.ndarray, nbytes: np.ndarray, passes: float) -> np.ndarray:
    minor = np.any(p_a[..., :2] != p_b[..., :2], axis=-1)
    major = np.any(p_a != p_b, axis=-1) & ~minor
    copy = passes * nbytes / HBM_BYTES_NS
    return minor * (copy + COPY_LAUNCH_NS) + major * MAJOR_ONLY_SHARE * copy


def _costs(s: c.Structure, blocks: np.ndarray) -> np.ndarray:
    m = s.model
    p_out, p_in, p_ker = c.resolve(s, blocks)
    out_b = c.padded(m.out_shape, m.out_rank, p_out) * m.out_bytes
    in_b = c.padded(m.in_shape, m.in_rank, p_in) * m.in_bytes
    has_ker = m.ker_rank > 0
    ker_b = np.where(has_ker, c.padded(m.ker_shape, np.maximum(m.ker_rank, 1), p_ker), 0.0) * m.ker_bytes
    rows = np.arange(m.num_configurable)
    contracted = m.in_shape[rows, m.contract_dim]
    features = m.out_shape[rows, m.out_feat_dim]
    util = (contracted / c.ceil_to(contracted, 128)) * (features / c.ceil_to(features, 128))
    compute = m.flops / m.peak * (PEAK_FLOPS_NS / 9.0e4) / util
    compute = compute + np.where(p_in[..., 0] != m.contract_dim, in_b / XLU_BYTES_NS, 0.0) \
        + np.where(p_out[..., 0] != m.out_feat_dim, out_b / XLU_BYTES_NS, 0.0)
    memory = (out_b + in_b + ker_b) / HBM_BYTES_NS
    mxu = np.maximum(compute, memory) + LAUNCH_NS
    in_minor, out_minor = c.dim_size(m.in_shape, p_in, 0), c.dim_size(m.out_shape, p_out, 0)
    in_second, out_second = c.dim_size(m.in_shape, p_in, 1), c.dim_size(m.out_shape, p_out, 1)
    same_tiles = (in_minor == out_minor) & ((in_second == out_second)
                                            | ((in_second % 8 == 0) & (out_second % 8 == 0)))
    reshape = np.where(same_tiles, BITCAST_NS, (in_b + out_b) / HBM_BYTES_NS + LAUNCH_NS)
    total = np.where(c.is_reshape(s), reshape, mxu).sum(axis=1)
    consumer = (p_in, p_ker)
    consumer_b = (in_b, ker_b)
    for block in (0, 1):
        sel = m.c2c_block == block
        if np.any(sel):
            src, dst = m.c2c_src[sel], m.c2c_dst[sel]
            total += _mismatch_cost(p_out[:, src], consumer[block][:, dst],
                                    out_b[:, src] + consumer_b[block][:, dst], 1.0).sum(axis=1)
        sel = m.fixed_block == block
        if np.any(sel):
            dst = m.fixed_dst[sel]
            total += _mismatch_cost(consumer[block][:, dst], m.fixed_perm[sel][None],
                                    consumer_b[block][:, dst], 2.0).sum(axis=1)
    total += (m.out_fanout * _mismatch_cost(p_out, m.defaults[None, :, 0:6], out_b, 2.0)).sum(axis=1)
    return total + m.base_ns


def layout_runtimes(program: Program, blocks: np.ndarray) -> np.ndarray:
    s = c.structure(program)
    return c.chunked(_costs, s, blocks)


def tile_runtimes(kernel: TileKernel, config_feat: np.ndarray) -> np.ndarray:
    ker_t, out_t, in_t = c.tile_bounds(kernel, config_feat)
    out_shape = np.array(kernel.out_shape, dtype=np.float64)
    n_tiles = np.ceil(np.prod(np.ceil(out_shape / out_t), axis=1) / CORES)
    eb = float(kernel.elem_bytes)
    peak = PEAK_FLOPS_NS / (F32_SLOWDOWN if eb >= 4 else 1.0)
    out_pad, in_pad = c.tile_padded(out_t), c.tile_padded(in_t)
    if kernel.contract:
        k_tile = ker_t[:, -2]
        k_steps = np.ceil(kernel.contract / k_tile)
        ker_pad = c.tile_padded(ker_t)
        window = float(math.prod(kernel.window)) if kernel.window else 1.0
        rows = np.prod(out_t[:, :-1], axis=1)
        compute = 2.0 * rows * c.ceil_to(out_t[:, -1], 128) * c.ceil_to(k_tile, 128) * window / peak \
            + kernel.epilogue * out_pad / VPU_OPS_NS / k_steps
    else:
        k_steps = np.ones(len(config_feat))
        ker_pad = np.zeros(len(config_feat))
        compute = (kernel.epilogue + 1) * np.maximum(in_pad, out_pad) / VPU_OPS_NS
    memory = ((in_pad + ker_pad) * eb + out_pad * eb / k_steps) / HBM_BYTES_NS
    working_set = 2.0 * (in_pad + ker_pad) * eb + out_pad * 4.0
    memory = memory * (1.0 + SPILL_SLOPE * np.maximum(0.0, working_set / VMEM_BYTES - 1.0))
    step = np.maximum(compute, memory) + STEP_NS
    return n_tiles * k_steps * step + memory + TILE_LAUNCH_NS


def noise_range(search: str) -> tuple[float, float]:
    return NOISE[search]


def noise_sigma(search: str) -> float:
    low, high = NOISE[search]
    return (low + high) / 2
