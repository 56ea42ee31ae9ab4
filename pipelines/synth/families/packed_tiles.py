"""packed_tiles: element types pack into taller tiles, and layouts propagate instead of copying.

A reading of the public TPU memory layout (vregs of 8 sublanes x 128 lanes x 32 bits: 16-bit
types pack two rows per sublane, 8-bit types four, so HBM tiles are (8 x 128) for f32,
(16 x 128) for bf16/f16 and (32 x 128) for s8/u8/pred) and of XLA's layout assignment, which
propagates a producer's layout to its consumers rather than inserting copies:

* padding: the minor-most dim pads to 128, the second-minor to 8 x (4 / element bytes) (16 for
  bf16, 32 for 8-bit), for bytes and compute alike (reference pads every type to 8 x 128);
* conv / dot compute = flops / peak x (padded / real of the input) x (padded / real of the
  kernel): the weight-stationary MXU streams padded input rows against padded weight tiles; f32
  runs as three bf16 passes (x3, reference x4); x1.5 when the contracted dim is not minor-most
  in the input (weights loaded transposed); the output layout does not enter compute;
* memory = padded bytes / HBM bandwidth + 1 ns per contiguous minor-most run;
* propagation: a configurable consumer fed (directly or through elementwise ops) by a
  configurable producer runs on the producer's output layout: its own chosen input (or kernel)
  layout is ignored, and a differing choice costs only an in-core relayout of 0.2 passes
  (reference: a full copy); what changes the consumer's cost is the producer's choice;
* rigid producers, rigid consumers: a copy of two passes plus a launch on any mismatch;
* reshape: a bitcast only when the packed tiles are the same bytes: equal minor-most sizes and
  equal second-minor sizes after packing; else a copy;
* non-configurable ops: as reference;
* tiles: packed tile padding on the kernel's own bounds; a tile whose double-buffered working set
  exceeds 16 MiB is split by the compiler into ceil(working set / VMEM) sub-steps, each paying the
  350 ns step overhead (no spill slope); the output's leading dim is split over 2 cores, so a
  single row of tiles leaves one core idle; bf16 at full MXU rate, f32 at a third;
* noise: tile 0.5-1.5%, layout default search 0.8-2%, random search 1-2.5% (random configs hit
  more relayouts on the host side).
"""

from __future__ import annotations

import math

import numpy as np

from pipelines.synth.families import _common as c
from pipelines.synth.programs import Program, TileKernel

NAME = "packed_tiles"
PEAK_FLOPS_NS = 9.0e4
F32_PASSES = 3.0
HBM_BYTES_NS = 700.0
VPU_OPS_NS = 4.0e3
DMA_RUN_NS = 1.0
LAUNCH_NS = 1500.0
COPY_LAUNCH_NS = 2500.0
BITCAST_NS = 100.0
RELAYOUT_PASSES = 0.2
CONTRACT_NOT_MINOR = 1.5
VMEM_BYTES = 16 * 2**20
STEP_NS = 350.0
TILE_LAUNCH_NS = 2000.0
CORES = 2
NOISE = {"tile": (0.005, 0.015), "default": (0.008, 0.02), "random": (0.01, 0.025)}


def sublanes(elem_bytes: np.ndarray | float) -> np.ndarray:
    return 8.0 * np.maximum(1.0, 4.0 / np.maximum(elem_bytes, 1.0))


def _costs(s: c.Structure, blocks: np.ndarray) -> np.ndarray:
    m = s.model
    p_out, p_in, p_ker = c.resolve(s, blocks)
    extra = np.zeros(blocks.shape[0])
    chosen = {0: p_in, 1: p_ker}
    effective = {0: p_in.copy(), 1: p_ker.copy()}
    for block in (0, 1):
        sel = m.c2c_block == block
        if np.any(sel):
            src, dst = m.c2c_src[sel], m.c2c_dst[sel]
            effective[block][:, dst] = p_out[:, src]
    p_in, p_ker = effective[0], effective[1]
    out_e = c.padded(m.out_shape, m.out_rank, p_out, sublanes(m.out_bytes))
    in_e = c.padded(m.in_shape, m.in_rank, p_in, sublanes(m.in_bytes))
    has_ker = m.ker_rank > 0
    ker_e = np.where(has_ker, c.padded(m.ker_shape, np.maximum(m.ker_rank, 1), p_ker, sublanes(m.ker_bytes)), 0.0)
    out_b, in_b, ker_b = out_e * m.out_bytes, in_e * m.in_bytes, ker_e * m.ker_bytes
    for block, nbytes in ((0, in_b), (1, ker_b)):
        sel = m.c2c_block == block
        if np.any(sel):
            dst = m.c2c_dst[sel]
            differ = np.any(chosen[block][:, dst] != effective[block][:, dst], axis=-1)
            extra += (differ * RELAYOUT_PASSES * nbytes[:, dst] / HBM_BYTES_NS).sum(axis=1)
    peak = np.where(m.peak < 9.0e4 * 0.9, PEAK_FLOPS_NS / F32_PASSES, PEAK_FLOPS_NS)
    ker_ratio = np.where(has_ker, ker_e / np.maximum(s.ker_elems, 1), 1.0)
    compute = m.flops / peak * (in_e / s.in_elems) * ker_ratio \
        * np.where(p_in[..., 0] == m.contract_dim, 1.0, CONTRACT_NOT_MINOR)
    runs = lambda shape, perm, elems: elems / c.dim_size(shape, perm, 0)  # noqa: E731
    dma = DMA_RUN_NS * (runs(m.out_shape, p_out, s.out_elems) + runs(m.in_shape, p_in, s.in_elems))
    memory = (out_b + in_b + ker_b) / HBM_BYTES_NS + dma
    mxu = np.maximum(compute, memory) + LAUNCH_NS
    in_sub, out_sub = sublanes(m.in_bytes), sublanes(m.out_bytes)
    same = (c.dim_size(m.in_shape, p_in, 0) == c.dim_size(m.out_shape, p_out, 0)) & (
        c.ceil_to(c.dim_size(m.in_shape, p_in, 1), in_sub) == c.ceil_to(c.dim_size(m.out_shape, p_out, 1), out_sub))
    reshape = np.where(same, BITCAST_NS, (in_b + out_b) / HBM_BYTES_NS + dma + LAUNCH_NS)
    total = np.where(c.is_reshape(s), reshape, mxu).sum(axis=1) + extra
    consumer, consumer_b = (chosen[0], chosen[1]), (in_b, ker_b)
    for block in (0, 1):
        total += c.fixed_producer_copies(m, block, consumer[block], consumer_b[block], HBM_BYTES_NS, COPY_LAUNCH_NS)
    total += c.off_default_copies(m, p_out, out_b, HBM_BYTES_NS, COPY_LAUNCH_NS)
    return total + m.base_ns


def layout_runtimes(program: Program, blocks: np.ndarray) -> np.ndarray:
    return c.chunked(_costs, c.structure(program), blocks)


def tile_runtimes(kernel: TileKernel, config_feat: np.ndarray) -> np.ndarray:
    ker_t, out_t, in_t = c.tile_bounds(kernel, config_feat)
    out_shape = np.array(kernel.out_shape, dtype=np.float64)
    eb = float(kernel.elem_bytes)
    sub = float(sublanes(eb))
    lead = np.ceil(out_shape[0] / out_t[:, 0])
    rest = np.prod(np.ceil(out_shape[1:] / out_t[:, 1:]), axis=1) if out_t.shape[1] > 1 else 1.0
    n_tiles = np.ceil(lead / CORES) * rest
    peak = PEAK_FLOPS_NS / (F32_PASSES if eb >= 4 else 1.0)
    out_pad, in_pad = c.tile_padded(out_t, sub), c.tile_padded(in_t, sub)
    if kernel.contract:
        k_tile = ker_t[:, -2]
        k_steps = np.ceil(kernel.contract / k_tile)
        ker_pad = c.tile_padded(ker_t, sub)
        window = float(math.prod(kernel.window)) if kernel.window else 1.0
        compute = 2.0 * out_pad * c.ceil_to(k_tile, sub) * window / peak \
            + kernel.epilogue * out_pad / VPU_OPS_NS / k_steps
    else:
        k_steps = np.ones(len(config_feat))
        ker_pad = np.zeros(len(config_feat))
        compute = (kernel.epilogue + 1) * np.maximum(in_pad, out_pad) / VPU_OPS_NS
    memory = ((in_pad + ker_pad) * eb + out_pad * eb / k_steps) / HBM_BYTES_NS
    working_set = 2.0 * (in_pad + ker_pad) * eb + out_pad * 4.0
    pieces = np.maximum(1.0, np.ceil(working_set / VMEM_BYTES))
    step = np.maximum(compute, memory) + pieces * STEP_NS
    return n_tiles * k_steps * step + memory / pieces + TILE_LAUNCH_NS


def noise_range(search: str) -> tuple[float, float]:
    return NOISE[search]


def noise_sigma(search: str) -> float:
    low, high = NOISE[search]
    return (low + high) / 2
