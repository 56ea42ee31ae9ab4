"""copy_fusion: memory traffic decides, and fusion absorbs layout changes that reach it.

A reading of XLA's TPU fusion behaviour (elementwise consumers are fused into the producing
kernel and run in its output layout; a layout change inside a fusion is an indexing change of its
loop, while a change between two unfused kernels needs a materialised copy):

* conv / dot compute = flops / peak x (padded / real elements of the output) x (padded / real of
  the input): padded tiles are fully computed (exponent 1, no square root as in reference); no
  penalty for which dim is minor (the compiler re-tiles freely inside VMEM);
* memory = padded bytes / HBM bandwidth + ``DMA_RUN_NS`` (3 ns, 3x reference) per contiguous run
  of the minor-most dim: short minor dims are expensive, "largest dim minor-most" pays most here;
* the elementwise chain fused after a conv / dot runs in that node's output layout: each op of the
  chain re-reads the padded output, of which a share ``HIDDEN`` (70%) hides under the kernel's
  own compute (reference: elementwise work is a fixed 10% of its default-layout cost, blind to the
  chosen layout);
* producer / consumer mismatch between configurable nodes: a direct edge costs a copy (read +
  write + launch); a path through elementwise ops is absorbed by the fusion: only the strided
  re-read of the minor-most dim costs (half a pass, no launch), and a mismatch in the major dims
  only is free;
* rigid producers and consumers: a copy (two passes + launch) on any mismatch, as reference;
* reshape: a bitcast when the padded element counts and the minor-most sizes agree (the bytes do
  not move), else a copy;
* non-configurable ops: 30% of their roofline survives fusion (reference 10%);
* tiles: 150 ns per step, 32 MiB VMEM with a gentle spill (x(1 + 2 overflow)), but two steps of
  fill and drain exposed (deep pipelines), output tiles over 2 cores, compute on padded tiles;
* noise: tile 0.3-0.8%, layout 0.5-1% for both searches.
"""

from __future__ import annotations

import math

import numpy as np

from pipelines.synth.families import _common as c
from pipelines.synth.programs import Program, TileKernel

NAME = "copy_fusion"
PEAK_FLOPS_NS = 9.0e4
F32_SLOWDOWN = 4.0
HBM_BYTES_NS = 700.0
VPU_OPS_NS = 4.0e3
DMA_RUN_NS = 3.0
LAUNCH_NS = 1500.0
COPY_LAUNCH_NS = 2500.0
BITCAST_NS = 100.0
HIDDEN = 0.7
ABSORBED_PASSES = 0.5
UNFUSED_SHARE = 0.3  # reference keeps 0.1 of the non-configurable roofline
VMEM_BYTES = 32 * 2**20
SPILL_SLOPE = 2.0
STEP_NS = 150.0
FILL_STEPS = 2.0
TILE_LAUNCH_NS = 2000.0
CORES = 2
NOISE = {"tile": (0.003, 0.008), "default": (0.005, 0.01), "random": (0.005, 0.01)}


def _costs(s: c.Structure, blocks: np.ndarray) -> np.ndarray:
    m = s.model
    p_out, p_in, p_ker = c.resolve(s, blocks)
    out_e = c.padded(m.out_shape, m.out_rank, p_out)
    in_e = c.padded(m.in_shape, m.in_rank, p_in)
    has_ker = m.ker_rank > 0
    ker_e = np.where(has_ker, c.padded(m.ker_shape, np.maximum(m.ker_rank, 1), p_ker), 0.0)
    out_b, in_b, ker_b = out_e * m.out_bytes, in_e * m.in_bytes, ker_e * m.ker_bytes
    runs = lambda shape, perm, elems: elems / c.dim_size(shape, perm, 0)  # noqa: E731
    out_runs = runs(m.out_shape, p_out, s.out_elems)
    in_runs = runs(m.in_shape, p_in, s.in_elems)
    ker_runs = np.where(has_ker, runs(m.ker_shape, p_ker, np.maximum(s.ker_elems, 1)), 0.0)
    compute = m.flops / m.peak * (out_e / s.out_elems) * (in_e / s.in_elems)
    memory = (out_b + in_b + ker_b) / HBM_BYTES_NS + DMA_RUN_NS * (out_runs + in_runs + ker_runs)
    chain = s.chain_ops * (1.0 - HIDDEN) * (out_b / HBM_BYTES_NS + DMA_RUN_NS * out_runs)
    mxu = np.maximum(compute, memory) + LAUNCH_NS + chain
    bitcast = (in_e == out_e) & (c.dim_size(m.in_shape, p_in, 0) == c.dim_size(m.out_shape, p_out, 0))
    reshape = np.where(bitcast, BITCAST_NS, (in_b + out_b) / HBM_BYTES_NS
                       + DMA_RUN_NS * (in_runs + out_runs) + LAUNCH_NS)
    total = np.where(c.is_reshape(s), reshape, mxu).sum(axis=1)
    consumer, consumer_b = (p_in, p_ker), (in_b, ker_b)
    for block in (0, 1):
        sel = m.c2c_block == block
        if np.any(sel):
            src, dst, direct = m.c2c_src[sel], m.c2c_dst[sel], s.c2c_direct[sel]
            a, b = p_out[:, src], consumer[block][:, dst]
            nbytes = out_b[:, src] + consumer_b[block][:, dst]
            differ = np.any(a != b, axis=-1)
            minor = a[..., 0] != b[..., 0]
            copy = differ * (nbytes / HBM_BYTES_NS + COPY_LAUNCH_NS)
            absorbed = minor * ABSORBED_PASSES * consumer_b[block][:, dst] / HBM_BYTES_NS
            total += np.where(direct[None], copy, absorbed).sum(axis=1)
        total += c.fixed_producer_copies(m, block, consumer[block], consumer_b[block], HBM_BYTES_NS, COPY_LAUNCH_NS)
    total += c.off_default_copies(m, p_out, out_b, HBM_BYTES_NS, COPY_LAUNCH_NS)
    return total + m.base_ns * (UNFUSED_SHARE / 0.1)


def layout_runtimes(program: Program, blocks: np.ndarray) -> np.ndarray:
    return c.chunked(_costs, c.structure(program), blocks)


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
        compute = 2.0 * out_pad * c.ceil_to(k_tile, 8) * window / peak
        epilogue = kernel.epilogue * out_pad / VPU_OPS_NS / k_steps * (1.0 - HIDDEN)
    else:
        k_steps = np.ones(len(config_feat))
        ker_pad = np.zeros(len(config_feat))
        compute = np.maximum(in_pad, out_pad) / VPU_OPS_NS
        epilogue = kernel.epilogue * out_pad / VPU_OPS_NS * (1.0 - HIDDEN)
    memory = ((in_pad + ker_pad) * eb + out_pad * eb / k_steps) / HBM_BYTES_NS
    working_set = 2.0 * (in_pad + ker_pad) * eb + out_pad * 4.0
    memory = memory * (1.0 + SPILL_SLOPE * np.maximum(0.0, working_set / VMEM_BYTES - 1.0))
    step = np.maximum(compute, memory) + epilogue + STEP_NS
    return n_tiles * k_steps * step + FILL_STEPS * memory + TILE_LAUNCH_NS


def noise_range(search: str) -> tuple[float, float]:
    return NOISE[search]


def noise_sigma(search: str) -> float:
    low, high = NOISE[search]
    return (low + high) / 2
