"""Tile cost model: noise-free runtime (ns) of a fused kernel per tile config.

The kernel is run as a grid of steps over the output; each step DMAs its
operand tiles HBM->VMEM, computes, and writes its output tile back.  With
double buffering a step costs max(compute, DMA) plus a fixed per-step cost;
the first step's DMA is not hidden.  Tiles are padded to (sublane,128) in
their two minor-most physical dims; partial edge tiles waste work; a working
set above VMEM loses double buffering and spills.  See README.md.
"""
import math

import numpy as np

from . import hw
from .layout_model import ELEMENTWISE, TRANSCENDENTAL, REDUCE_LIKE, FREE_OPS

STEP_NS = 350.0          # per grid step: pipeline bookkeeping, semaphores
DMA_ISSUE_NS = 40.0      # per DMA descriptor per step
SMALL_RESIDENT = 1 << 20  # operands up to 1 MiB are loaded once and kept


class Kernel(object):
    def __init__(self, node_feat, opcode, edge_index):
        n = len(opcode)
        ops = [int(v) for v in opcode]
        roots = [i for i in range(n) if node_feat[i, 0] > 0.5]
        r = roots[-1] if roots else n - 1
        dims = hw.dims_of(node_feat[r])
        if not dims:        # tuple root: take the largest non-tuple node
            best = max(range(n), key=lambda i: hw.true_elems(hw.dims_of(node_feat[i]))
                       if hw.dims_of(node_feat[i]) else 0)
            r = best
            dims = hw.dims_of(node_feat[r])
        self.out_dims = dims if dims else (1,)
        self.out_e = hw.dtype_bytes(node_feat[r, 2:21]) or 4
        self.out_lay = hw.natural_layout(node_feat[r], len(self.out_dims))
        self.out_elems = hw.true_elems(self.out_dims)
        # vector work per output element
        w = 0.0
        for i in range(n):
            if ops[i] in ELEMENTWISE:
                w += 8.0 if ops[i] in TRANSCENDENTAL else 1.0
            elif ops[i] not in FREE_OPS and ops[i] not in (26, 34):
                w += 0.5
        self.vpu_per_elem = max(w, 0.5)
        self.kind = "conv" if 26 in ops else ("dot" if 34 in ops else (
            "reduce" if any(o in REDUCE_LIKE for o in ops) else "elementwise"))
        # MXU work for conv / dot kernels
        self.mxu_flops = 0.0
        self.k_depth = 1.0
        if self.kind in ("conv", "dot"):
            op_id = 26 if self.kind == "conv" else 34
            m = [i for i in range(n) if ops[i] == op_id][0]
            prods = [int(v) for u, v in edge_index if int(u) == m]
            od = hw.dims_of(node_feat[m]) or self.out_dims
            if self.kind == "conv":
                win = max(float(node_feat[m, 44]), 1.0)
                groups = max(int(node_feat[m, 107]), 1)
                if_ = int(node_feat[m, 94])
                cin = 1
                for p in prods:
                    pdims = hw.dims_of(node_feat[p])
                    if 0 <= if_ < len(pdims) and pdims[if_] > cin:
                        cin = pdims[if_]
                        break
                self.k_depth = win * max(cin // groups, 1)
            else:
                sizes = [hw.true_elems(hw.dims_of(node_feat[p])) for p in prods]
                po = max(hw.true_elems(od), 1.0)
                if len(sizes) >= 2:
                    self.k_depth = max(math.sqrt(sizes[0] * sizes[1] / po), 1.0)
            self.mxu_flops = 2.0 * hw.true_elems(od) * self.k_depth
        # operands (parameters) of the kernel
        self.params = []
        for i in range(n):
            if ops[i] == 63:
                d = hw.dims_of(node_feat[i])
                e = hw.dtype_bytes(node_feat[i, 2:21]) or 4
                self.params.append((d, e, hw.natural_layout(node_feat[i], len(d))))
        self.in_elems = max([hw.true_elems(p[0]) for p in self.params] + [0.0])

    def tile_elems_padded(self, tile, e):
        ph = [i for i in reversed(self.out_lay) if self.out_dims[i] != 1]
        if not ph:
            return float(hw.LANES)
        sizes = [tile[i] for i in ph]
        sizes[-1] = hw.ceil_to(sizes[-1], hw.LANES)
        if len(sizes) >= 2:
            sizes[-2] = hw.ceil_to(sizes[-2], hw.sublanes(e))
        return float(math.prod(sizes))

    def cost(self, out_bounds, in_bounds, kernel_bounds):
        """Noise-free runtime of one tile config."""
        od = self.out_dims
        r = len(od)
        tile = []
        for i in range(r):
            b = int(out_bounds[i]) if i < len(out_bounds) else 0
            tile.append(od[i] if b <= 0 else min(b, od[i]))
        steps = 1
        for i in range(r):
            steps *= int(math.ceil(od[i] / tile[i]))
        t_true = float(math.prod(tile))
        t_pad = self.tile_elems_padded(tile, self.out_e)
        lane_eff = t_true / t_pad
        # bytes per step
        out_b = t_pad * self.out_e
        in_b, resident, n_dma = 0.0, 0.0, 1
        frac = t_true / max(self.out_elems, 1.0)
        in_tile = [int(v) for v in in_bounds if v > 0]
        for d, e, lay in self.params:
            pb = hw.padded_elems(d, lay, e) * e if d else e
            if d == od:
                in_b += t_pad * e
                n_dma += 1
            elif pb <= SMALL_RESIDENT:
                resident += pb
            else:
                if in_tile and len(in_tile) == len(d):
                    tl = [min(a, b) for a, b in zip(in_tile, d)]
                    ip = hw.padded_elems(tuple(tl), lay, e) * e
                else:
                    ip = pb * frac * 1.15
                if self.kind == "conv" and len(self.params) >= 2 and d != od and ip > pb:
                    ip = pb
                in_b += ip
                n_dma += 1
        # compute per step
        vpu = self.vpu_per_elem * t_pad / hw.VPU_OPS_PER_NS
        if self.kind == "reduce":
            vpu += (self.in_elems / max(self.out_elems, 1.0)) * t_pad / hw.VPU_OPS_PER_NS
        mxu = 0.0
        if self.mxu_flops > 0:
            # the output tile's minor dim feeds the 128-wide MXU columns, the
            # rest its rows (multiples of 8)
            ph = [i for i in reversed(self.out_lay) if od[i] != 1]
            ncol = tile[ph[-1]] if ph else 1
            mrow = t_true / max(ncol, 1)
            kp = hw.ceil_to(self.k_depth, 128) if self.k_depth >= 64 else self.k_depth * 2
            fl = 2.0 * hw.ceil_to(mrow, 8) * hw.ceil_to(ncol, 128) * kp
            mxu = fl / hw.MXU_FLOP_PER_NS * (hw.MXU_F32_SLOWDOWN if self.out_e >= 4 else 1.0)
        compute = max(vpu, mxu)
        # DMA efficiency: narrow rows make short bursts
        minor_bytes = (tile[self.out_lay[0]] if r else 1) * self.out_e
        burst = min(1.0, (minor_bytes / 512.0) ** 0.5) if minor_bytes > 0 else 1.0
        burst = max(burst, 0.25)
        dma = (in_b + out_b) / (hw.HBM_B_PER_NS * burst) + n_dma * DMA_ISSUE_NS
        footprint = 2.0 * (in_b + out_b) + resident
        t = hw.KERNEL_LAUNCH_NS + resident / hw.HBM_B_PER_NS
        if footprint <= hw.VMEM_BYTES:
            t += steps * (max(compute, dma) + STEP_NS) + dma  # prologue not hidden
        else:
            over = footprint / hw.VMEM_BYTES
            t += steps * (compute + dma + STEP_NS) * (1.0 + 0.5 * (over - 1.0))
        # tiny tiles cannot keep the vector unit busy
        if lane_eff < 0.5 and steps > 1:
            t *= 1.0 + 0.1 * (0.5 - lane_eff)
        return t

    def default_tile(self):
        """The outside author's 'compiler default': the whole output, halved
        along the most major physical dim (keeping (8,128) granules in the
        minor two) until one step's working set is under a quarter of VMEM."""
        od = list(self.out_dims)
        tile = list(od)
        ph = [i for i in reversed(self.out_lay)]          # major -> minor
        budget = hw.VMEM_BYTES / 4.0
        for _ in range(64):
            t_pad = self.tile_elems_padded(tile, self.out_e)
            per_step = t_pad * (self.out_e + sum(p[1] for p in self.params if tuple(p[0]) == tuple(od)))
            if per_step <= budget:
                break
            moved = False
            for pos, i in enumerate(ph):
                floor = 1
                if pos == len(ph) - 1:
                    floor = 128
                elif pos == len(ph) - 2:
                    floor = 8
                if tile[i] > floor:
                    tile[i] = max(floor, int(math.ceil(tile[i] / 2)))
                    moved = True
                    break
            if not moved:
                break
        return tile


def tile_runtimes(node_feat, opcode, edge_index, config_feat):
    """(noise-free runtimes per config, noise-free runtime of the default)."""
    k = Kernel(node_feat, opcode, edge_index)
    cf = np.asarray(config_feat, dtype=np.float64)
    out = np.empty(len(cf))
    cache = {}
    for i in range(len(cf)):
        key = tuple(cf[i].tolist())
        v = cache.get(key)
        if v is None:
            v = k.cost(cf[i, 8:14], cf[i, 16:22], cf[i, 0:6])
            cache[key] = v
        out[i] = v
    d = k.default_tile()
    default = k.cost(d + [0] * (6 - len(d)), [0] * 6, [0] * 6)
    return out, default
