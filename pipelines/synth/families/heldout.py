"""The ``heldout`` cost family: a TPU cost model written from public facts, apart from the project's models.

All times are noise-free nanoseconds. The machine is a TPU v4-like chip (two TensorCores run as
one "megacore"); every rule below is a rule of this family, chosen from public descriptions of
TPUs and XLA (tiled layouts, MXU, VMEM, layout assignment, fusion), not fitted to anything.

Machine constants
-----------------
* HBM 1200 B/ns; MXU peak 275,000 flop/ns (275 Tflop/s) in bf16 (8 MXUs of 128x128 at 1.05 GHz); VPU 8600
  element-ops/ns (on padded elements); XLU (transpose / cross-lane unit) 300 B/ns; ICI 100 B/ns.
* VMEM: 16 MiB scoped per core. A materialised kernel (anything not fused, inserted copies
  included) costs a launch of 600 ns; bitcasts and fused ops cost none.
* f32 dots and convolutions run as 3 bf16 passes (1/3 of the bf16 rate); f16 is converted on the
  VPU as it is loaded (one VPU op per padded operand element); bf16 runs at the full rate.

Rule 1 - tiled layouts pad. In HBM the two minor-most physical dims (minor_to_major[0] and [1])
  are tiled (sublanes x 128 lanes), where sublanes = 8 * (4 / element bytes) for types narrower
  than 32 bits (bf16/f16 16, s8/pred 32) and 8 otherwise: the minor-most dim is padded to a
  multiple of 128 and the second-minor to a multiple of the sublane count; major dims are not
  padded. Rank-1 arrays are padded to a multiple of sublanes*128; scalars are one element. Every
  byte count below is a padded byte count under the tensor's layout at that point.

Rule 2 - layouts propagate. A configurable node's output layout is its output block (its
  default ``node.layout`` when the block is unset). Transparent elementwise ops (programs.py's
  TRANSPARENT_OPCODES) with an operand 0 of the same shape take operand 0's layout, so a
  producer's choice flows down an elementwise chain to wherever the chain meets a node with a
  layout of its own. Every other node keeps its own default layout (parameters, compare,
  reduce, reduce-window, slice, all-reduce, broadcast, gather, concatenate, transpose, ...).

Rule 3 - mismatches cost copies, or are absorbed. Where a consumer wants an operand in a layout W
  other than the layout L the producer has, XLA inserts a copy. A consumer wants: an elementwise
  op (compare included), for every non-generated operand of its shape, its own layout;
  reduce-window, slice and all-reduce, for operand 0, their own layout; a conv/dot/reshape, its
  input block for operand 0 and (dot with a rank 1-2 operand 1) its kernel block for operand 1
  (unset blocks want L: no copy); the root tuple, each result in its default layout;
  concatenate, its own layout; a transpose wants the operand layout that makes it a bitcast of
  its fixed output layout (so a transpose is free when the producer's layout already matches).
  Broadcasts, constants and iotas are generated inside the consumer's fusion and never mismatch.
  If L and W have the same two minor (tiled) dims in the same order, only the order of whole
  tiles changes: the consumer's DMA absorbs it for 15% of the tensor's bytes. Otherwise a copy
  kernel runs: read under L + write under W at HBM speed, plus an XLU pass over the bytes when
  the minor-most (lane) dim changes, plus a launch. A copy is not shared between consumers.

Rule 4 - convolution and dot on the MXU. Flops are counted on padded MXU tiles:
  2 * rows * pad128(K) * pad128(N) * taps, with K the contracted dim (input feature; dot lhs's
  last dim), N the output feature (kernel's last dim), taps the window size (1 for dot) and rows
  the streamed lhs rows (conv: batch x output positions; dot: all non-contracted lhs dims). The
  lhs's second-minor dim of size s pads the rows: rows * pad_sublane(s) / s. Time is
  max(MXU time, HBM time) + per-operand relayout extras + launch; HBM time reads lhs once per
  half-VMEM block of the (natural-layout) kernel bytes (weights stationary, lhs re-streamed).
  Operand classes (the input block, kernel block or the producer's layout):
  * lhs / conv input: K minor-most is natural. K second-minor: an XLU transpose of the lhs in
    VMEM (bytes / XLU), rows then padded by the minor-most dim. K not among the two minor dims:
    a relayout copy (as in rule 3) into the compiler's best natural layout (K minor, second
    chosen to minimise padded rows, shift penalty included). For a batched dot, a batch dim in the
    second-minor slot interleaves different matmuls in one tile: it costs the XLU transpose too.
  * conv sublane shifts: when the conv input's second-minor dim is spatial with window w > 1,
    each extra tap needs a sublane rotate: 0.5 * (w - 1) * input bytes / XLU.
  * kernel (dot rhs, conv kernel): N minor-most with K second-minor is natural; K minor with N
    second-minor costs an XLU transpose of the kernel; anything else a relayout copy.
  * output: feature N minor-most is natural (a batched dot's batch dim second-minor costs an XLU
    transpose); N second-minor costs an XLU transpose of the output; N major a copy from the
    natural layout. Elementwise consumers are fused into the output (rule 6).

Rule 5 - reshape is a bitcast or a copy. A reshape is free iff, under its input and output
  layouts, (a) the dims of each merge/split group appear contiguous and in logical order in both
  physical orders and the groups come in the same order (size-1 dims ignored), (b) the
  minor-most physical dim has the same size on both sides and (c) the second-minor sizes are
  equal or both multiples of the sublane count (the (8,128) tiles line up). Otherwise it is a
  copy: read + write at HBM speed, an XLU pass when the minor-most size changes, and a launch.

Rule 6 - fusion hides most elementwise traffic. An elementwise op costs its padded element count
  on the VPU plus 20% of its padded output bytes at HBM speed (the share of outputs XLA's loop
  and output fusions still materialise: multi-consumer values, fusion boundaries), no launch.

Rule 7 - other ops under layouts. reduce: reads its operand (under the operand's layout) at HBM
  speed, plus a cross-lane XLU pass over the bytes when a reduced dim is the lane dim, or a
  quarter of one when a reduced dim is only the sublane dim; writes its result; launch.
  reduce-window: read + write, plus (w - 1) XLU passes over the input for a window along the
  lane dim and half of that along the sublane dim; launch. slice: reads and writes the slice;
  all-reduce: 2 x bytes over ICI; gather and concatenate: read + write of the output; every such
  op a launch. Parameters, constants, broadcasts, tuples: free.

Tile rules (one fused kernel, a grid of tiles; ``tile_runtimes``)
-----------------------------------------------------------------
T1 grid: ceil(extent / tile) steps per output dim (ragged edge tiles cost full tiles), times
   ceil(contract / k_tile) contraction steps for conv and dot. The two cores split the
   parallel (output) steps: ceil(P / 2) per core, so a one-step grid leaves a core idle; a lone
   core gets the whole HBM bandwidth, two share it.
T2 tiles pad like arrays (rule 1) with the tile's last dim minor-most. VMEM holds two buffers
   (double buffering) of the input, kernel and output tiles plus an f32 accumulator (conv/dot).
   If that overflows 16 MiB but one buffer set fits, transfers stop overlapping compute; if even
   one set overflows, the kernel spills: transfer time scales with 2 x footprint / VMEM.
T3 traffic: every step loads its input and kernel tiles (no reuse across steps: small tiles
   re-read operands many times); output tiles are written once per parallel step.
T4 MXU: each step runs taps * (pad128(k_tile)/128) * (pad128(n_tile)/128) weight tiles over its
   rows (the output tile's non-feature elements, second-minor padded to sublanes), each weight
   tile paying a 128-cycle fill, on 4 MXUs per core (f32 at 1/3 rate). Small row counts waste
   the fill; reduce kernels do a cross-lane reduction (XLU) plus VPU adds; eltwise kernels are
   VPU only. The fused epilogue costs VPU time per padded output element.
T5 per step: max(compute, transfer) when double buffered, else their sum, plus a 350 ns grid-step
   overhead; the first step's loads are not overlapped (pipeline fill); one launch per kernel.

Noise: log-normal widths 0.03 (tile: short kernels, timer jitter), 0.012 (default search),
0.02 (random search: more copies and launches, more variance).
"""

from __future__ import annotations

import math

import numpy as np

from pipelines.synth.programs import ELEMENT_BYTES, OP, TRANSPARENT_OPCODES, Program, TileKernel

NAME = "heldout"

HBM = 1200.0  # B/ns
PEAK = 275_000.0  # flop/ns (275 Tflop/s)
VPU = 8600.0  # padded element-ops / ns
XLU = 300.0  # B/ns
ICI = 100.0  # B/ns
VMEM = 16 * 2**20  # bytes per core
LAUNCH = 600.0  # ns
ABSORB = 0.15
FUSION_LEAK = 0.20
SHIFT = 0.5
F32_RATE = 1.0 / 3.0
STEP_OVERHEAD = 350.0  # ns
MXU_PER_CORE = 4
CLOCK = 1.05  # GHz: cycles per ns
MXU_FILL = 128.0  # cycles per weight tile

_ELEMWISE = frozenset(TRANSPARENT_OPCODES | {OP["compare"]})
_FOLLOW = frozenset({OP["all-reduce"], OP["reduce-window"], OP["slice"]})
_GENERATED = frozenset({OP["broadcast"], OP["constant"], OP["iota"]})
_FREE = frozenset({OP["parameter"], OP["constant"], OP["broadcast"], OP["iota"], OP["tuple"],
                   OP["get-tuple-element"]})
_CONV, _DOT, _RESHAPE = OP["convolution"], OP["dot"], OP["reshape"]
_POW8 = 8 ** np.arange(6, dtype=np.int64)


def noise_sigma(search: str) -> float:
    """Log-normal measurement noise width of a benchmark in ``search`` ('tile', 'default', 'random')."""
    return {"tile": 0.03, "default": 0.012, "random": 0.02}[search]


# ----------------------------------------------------------------------------- padding helpers


def _sublanes(ebytes: int) -> int:
    return 8 * max(1, 4 // ebytes) if ebytes < 4 else 8


def _ebytes(etype: str) -> int:
    return max(1, ELEMENT_BYTES.get(etype, 4))


def _roundup(x, m):
    return -(-x // m) * m


def _pad_elems(shape: tuple[int, ...], m0: int, m1: int, sub: int) -> float:
    r = len(shape)
    if r == 0:
        return 1.0
    if r == 1:
        return float(_roundup(shape[0], sub * 128))
    rest = math.prod(d for i, d in enumerate(shape) if i not in (m0, m1))
    return float(rest * _roundup(shape[m0], 128) * _roundup(shape[m1], sub))


def _pad_table(shape: tuple[int, ...], sub: int) -> np.ndarray:
    """Padded elements for every (minor, second-minor) pair, flattened to 36 (m0 * 6 + m1)."""
    r = len(shape)
    natural = _pad_elems(shape, r - 1, r - 2, sub) if r >= 2 else _pad_elems(shape, 0, 0, sub)
    table = np.full(36, natural)
    if r >= 2:
        for m0 in range(r):
            for m1 in range(r):
                if m0 != m1:
                    table[m0 * 6 + m1] = _pad_elems(shape, m0, m1, sub)
    return table


def _code(layout: tuple[int, ...]) -> int:
    slots = list(layout) + [-1] * (6 - len(layout))
    return int(sum((v + 1) * 8**j for j, v in enumerate(slots)))


def _decode(code: int, rank: int) -> tuple[int, ...]:
    return tuple(((code >> (3 * j)) & 7) - 1 for j in range(rank))


def _pairs(rank: int):
    if rank >= 2:
        return [(a, b) for a in range(rank) for b in range(rank) if a != b]
    return [(0, 0)]


# ----------------------------------------------------------------------------- reshape bitcasts


def _reshape_groups(sin: tuple[int, ...], sout: tuple[int, ...]) -> tuple[list[int], list[int]]:
    gi, go = [-1] * len(sin), [-1] * len(sout)
    a = [d for d in range(len(sin)) if sin[d] != 1]
    b = [d for d in range(len(sout)) if sout[d] != 1]
    i = j = g = 0
    while i < len(a) and j < len(b):
        pa, pb = sin[a[i]], sout[b[j]]
        gi[a[i]], go[b[j]] = g, g
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(a):
                pa *= sin[a[i]]
                gi[a[i]] = g
                i += 1
            elif j < len(b):
                pb *= sout[b[j]]
                go[b[j]] = g
                j += 1
            else:
                break
        g += 1
    return gi, go


def _layout_signature(shape: tuple[int, ...], groups: list[int], layout: tuple[int, ...]) -> tuple[int, int, int]:
    """(group order code or -1 when not a row-major grouping, minor size, second-minor size)."""
    r = len(shape)
    minor = shape[layout[0]] if r >= 1 else 1
    second = shape[layout[1]] if r >= 2 else 1
    phys = [d for d in reversed(layout) if shape[d] != 1]  # major to minor
    order: list[int] = []
    last_dim: dict[int, int] = {}
    for d in phys:
        g = groups[d]
        if order and order[-1] == g:
            if d < last_dim[g]:
                return -1, minor, second
        elif g in last_dim:
            return -1, minor, second
        else:
            order.append(g)
        last_dim[g] = d
    return int(sum((g + 1) * 8**p for p, g in enumerate(order))), minor, second


# ----------------------------------------------------------------------------- the layout plan


class _Plan:
    """Per-program tables (built once per call, plain Python over the nodes)."""

    def __init__(self, program: Program):
        nodes = program.nodes
        cfg = [int(c) for c in program.config_ids]
        nc = len(cfg)
        cfg_of = {v: i for i, v in enumerate(cfg)}
        self.nc = nc
        fixed: dict[int, int] = {}
        fixed_layouts: list[tuple[int, ...]] = []

        def fixed_slot(layout: tuple[int, ...]) -> int:
            code = _code(layout)
            if code not in fixed:
                fixed[code] = len(fixed_layouts)
                fixed_layouts.append(tuple(layout))
            return nc + fixed[code]

        n = len(nodes)
        lslot = np.zeros(n, dtype=np.int64)
        for v, node in enumerate(nodes):
            op0 = nodes[node.inputs[0]] if node.inputs else None
            if v in cfg_of:
                lslot[v] = cfg_of[v]
            elif op0 is not None and node.opcode in TRANSPARENT_OPCODES and op0.shape == node.shape:
                lslot[v] = lslot[node.inputs[0]]
            else:
                lslot[v] = fixed_slot(node.layout)
        self.lslot = lslot

        # configurable nodes: defaults, producers, kernel configurability
        self.default_out = np.full((nc, 6), -1, dtype=np.int8)
        self.in_src = np.zeros(nc, dtype=np.int64)
        self.ker_src = np.zeros(nc, dtype=np.int64)
        self.ker_cfg = np.zeros(nc, dtype=bool)
        for i, v in enumerate(cfg):
            node = nodes[v]
            self.default_out[i, :len(node.layout)] = node.layout
            self.in_src[i] = lslot[node.inputs[0]]
            if len(node.inputs) > 1:
                self.ker_src[i] = lslot[node.inputs[1]]
                self.ker_cfg[i] = node.opcode in (_CONV, _DOT) and 1 <= len(nodes[node.inputs[1]].shape) <= 2
            else:
                self.ker_src[i] = self.in_src[i]

        # own-layout cost terms and mismatch edges (slots refer to the base range for now;
        # input/kernel slots are marked as ("in", i) / ("ker", i))
        terms: list[tuple[object, np.ndarray]] = []
        const = 0.0
        edges: list[tuple[int, object, np.ndarray]] = []  # (producer slot, wanted slot, bytes table)
        conv_rows: list[dict] = []
        reshapes: list[dict] = []
        tables: dict[int, np.ndarray] = {}

        def bytes_table(v: int) -> np.ndarray:
            if v not in tables:
                node = nodes[v]
                eb = _ebytes(node.etype)
                tables[v] = _pad_table(node.shape, _sublanes(eb)) * eb
            return tables[v]

        for v, node in enumerate(nodes):
            op = node.opcode
            eb = _ebytes(node.etype)
            sub = _sublanes(eb)
            # mismatch edges into v
            for j, p in enumerate(node.inputs):
                pn = nodes[p]
                if pn.opcode in _GENERATED:
                    continue
                want: object = None
                if v in cfg_of:
                    i = cfg_of[v]
                    if j == 0:
                        want = ("in", i)
                    elif j == 1 and self.ker_cfg[i]:
                        want = ("ker", i)
                elif op in _ELEMWISE and pn.shape == node.shape and lslot[v] != lslot[p]:
                    want = int(lslot[v])
                elif op in _FOLLOW and j == 0 and len(pn.shape) == len(node.shape) and lslot[v] != lslot[p]:
                    want = int(lslot[v])
                elif op == OP["tuple"]:
                    want = fixed_slot(pn.layout)
                elif op == OP["concatenate"] and len(pn.shape) == len(node.shape):
                    want = int(lslot[v])
                elif op == OP["transpose"] and j == 0:
                    perm = tuple(node.attrs["dimensions"])
                    want = fixed_slot(tuple(perm[d] for d in node.layout))
                if want is not None:
                    edges.append((int(lslot[p]), want, bytes_table(p)))
            # own cost
            if v in cfg_of:
                i = cfg_of[v]
                if op == _RESHAPE:
                    reshapes.append(self._reshape_entry(i, nodes[node.inputs[0]], node))
                else:
                    conv_rows.append(self._mxu_entry(i, node, nodes[node.inputs[0]], nodes[node.inputs[1]]))
                continue
            if op in _FREE or op == OP["transpose"]:
                continue
            shape = node.shape
            if op in _ELEMWISE:
                tab = _pad_table(shape, sub)
                terms.append((int(lslot[v]), tab / VPU + FUSION_LEAK * tab * eb / HBM))
            elif op == OP["reduce"]:
                x = nodes[node.inputs[0]]
                xeb = _ebytes(x.etype)
                xt = _pad_table(x.shape, _sublanes(xeb)) * xeb
                dims = set(node.attrs.get("dimensions", ()))
                tab = xt / HBM
                for m0, m1 in _pairs(len(x.shape)):
                    k = m0 * 6 + m1
                    if m0 in dims:
                        tab[k] += xt[k] / XLU
                    elif m1 in dims and len(x.shape) >= 2:
                        tab[k] += 0.25 * xt[k] / XLU
                out_b = _pad_elems(shape, len(shape) - 1 if shape else 0, len(shape) - 2 if len(shape) > 1 else 0, sub)
                terms.append((int(lslot[node.inputs[0]]), tab + out_b * eb / HBM + LAUNCH))
            elif op == OP["reduce-window"] and len(nodes[node.inputs[0]].shape) == len(shape):
                x = nodes[node.inputs[0]]
                xt = _pad_table(x.shape, sub) * eb
                ot = _pad_table(shape, sub) * eb
                win = tuple(node.attrs.get("window_size", (1,) * len(shape)))
                tab = (xt + ot) / HBM + LAUNCH
                for m0, m1 in _pairs(len(shape)):
                    k = m0 * 6 + m1
                    tab[k] += (win[m0] - 1) * xt[k] / XLU
                    if len(shape) >= 2:
                        tab[k] += SHIFT * (win[m1] - 1) * xt[k] / XLU
                terms.append((int(lslot[v]), tab))
            elif op == OP["all-reduce"]:
                ot = _pad_table(shape, sub) * eb
                terms.append((int(lslot[v]), 2 * ot / ICI + LAUNCH))
            else:  # gather, concatenate, slice of a fixed layout, anything else: read + write
                layout = fixed_layouts[lslot[v] - nc] if lslot[v] >= nc else node.layout
                r = len(shape)
                m0 = layout[0] if r else 0
                m1 = layout[1] if r > 1 else 0
                out_b = _pad_elems(shape, m0, m1, sub) * eb
                const += 2 * out_b / HBM + LAUNCH

        self.F = len(fixed_layouts)
        F = self.F
        fl = np.full((max(F, 1), 6), -1, dtype=np.int8)
        for f, layout in enumerate(fixed_layouts):
            fl[f, :len(layout)] = layout
        self.fixed_layouts = fl[:F]
        self.fixed_codes = (self.fixed_layouts.astype(np.int64) + 1) @ _POW8 if F else np.zeros(0, np.int64)

        def resolve(slot: object) -> int:
            if isinstance(slot, tuple):
                kind, i = slot
                return nc + F + i if kind == "in" else 2 * nc + F + i
            return int(slot)

        # base slots index [O (nc) | fixed (F)]; fixed slots were numbered nc + f already
        self.term_slot = np.array([s for s, _ in terms], dtype=np.int64)
        self.term_table = np.array([t for _, t in terms], dtype=np.float64).reshape(-1, 36)
        self.const = const
        self.edge_a = np.array([a for a, _, _ in edges], dtype=np.int64)
        self.edge_b = np.array([resolve(b) for _, b, _ in edges], dtype=np.int64)
        self.edge_table = np.array([t for _, _, t in edges], dtype=np.float64).reshape(-1, 36)
        self.mxu = {key: np.array([row[key] for row in conv_rows]) for key in
                    ("i", "in_bytes", "in_rows", "in_extra", "ker_bytes", "ker_extra", "out_bytes", "out_extra",
                     "flops_per_row", "reread")} if conv_rows else None
        if self.mxu is not None:
            for key in ("in_bytes", "in_rows", "in_extra", "ker_bytes", "ker_extra", "out_bytes", "out_extra"):
                self.mxu[key] = self.mxu[key].reshape(-1, 36)
        self.reshapes = reshapes

    # -- conv / dot tables over the (minor, second-minor) pair of each operand
    def _mxu_entry(self, i: int, node, x, w) -> dict:
        eb = _ebytes(node.etype)
        xeb, web = _ebytes(x.etype), _ebytes(w.etype)
        rate = F32_RATE if node.etype == "f32" else 1.0
        xs, ws, ys = x.shape, w.shape, node.shape
        rx, rw, ry = len(xs), len(ws), len(ys)
        xsub, wsub, ysub = _sublanes(xeb), _sublanes(web), _sublanes(eb)
        xt, wt, yt = _pad_table(xs, xsub) * xeb, _pad_table(ws, wsub) * web, _pad_table(ys, ysub) * eb
        is_conv = node.opcode == _CONV
        kdim = rx - 1
        batch_dims: set[int] = set() if is_conv else set(range(rx - 2))
        if is_conv:
            window = tuple(node.attrs["window_size"])
            taps = math.prod(window)
            k_size = xs[-1] // max(1, int(node.attrs.get("feature_group_count", 1)))
            total_rows = math.prod(ys[:-1])
            row_size = {d: ys[d] for d in range(rx - 1)}  # output positions along each input dim
            win_of = {d: (window[d - 1] if 1 <= d <= rx - 2 else 1) for d in range(rx)}
        else:
            taps = 1
            k_size = xs[-1]
            total_rows = math.prod(xs[:-1])
            row_size = {d: xs[d] for d in range(rx - 1)}
            win_of = {d: 1 for d in range(rx)}
        n_size = ws[-1] if rw >= 1 else 1
        flops_per_row = 2.0 * _roundup(k_size, 128) * _roundup(n_size, 128) * taps / (PEAK * rate)
        f16_extra = (1.0 / VPU) if node.etype == "f16" else 0.0

        def rows_for(d: int) -> float:
            s = row_size.get(d, 1)
            return total_rows / s * _roundup(s, xsub)

        def shift(d: int, k: int) -> float:
            return SHIFT * (win_of.get(d, 1) - 1) * xt[k] / XLU

        # best natural second-minor for a relayout copy of the input
        candidates = [d for d in range(rx - 1) if d not in batch_dims] or list(range(rx - 1))
        nat_k = {d: kdim * 6 + d for d in candidates}
        best = min(candidates, key=lambda d: rows_for(d) * flops_per_row + shift(d, nat_k[d]))
        nat = nat_k[best] if rx >= 2 else 0
        in_bytes, in_rows, in_extra = np.empty(36), np.empty(36), np.empty(36)
        in_bytes[:], in_rows[:], in_extra[:] = xt[nat], rows_for(best) if rx >= 2 else total_rows, 0.0
        for m0, m1 in _pairs(rx):
            k = m0 * 6 + m1
            if rx < 2:
                break
            if m0 == kdim and m1 not in batch_dims:
                in_bytes[k], in_rows[k], in_extra[k] = xt[k], rows_for(m1), shift(m1, k)
            elif m0 == kdim or m1 == kdim:  # K second-minor, or a batch dim interleaved: XLU relayout
                other = m0 if m1 == kdim else m1
                r_ = rows_for(other) if other not in batch_dims else rows_for(best)
                in_bytes[k], in_rows[k], in_extra[k] = xt[k], r_, xt[k] / XLU + shift(other, k)
            else:
                in_bytes[k], in_rows[k] = xt[nat], rows_for(best)
                in_extra[k] = (xt[k] + xt[nat]) / HBM + xt[k] / XLU + LAUNCH + shift(best, nat)
        in_extra += f16_extra * in_bytes / xeb

        ker_bytes, ker_extra = np.empty(36), np.zeros(36)
        kn = (rw - 1) * 6 + (rw - 2) if rw >= 2 else 0
        ker_bytes[:] = wt[kn]
        if rw >= 2:
            for m0, m1 in _pairs(rw):
                k = m0 * 6 + m1
                if (m0, m1) == (rw - 1, rw - 2):
                    ker_bytes[k] = wt[k]
                elif (m0, m1) == (rw - 2, rw - 1):
                    ker_bytes[k], ker_extra[k] = wt[k], wt[k] / XLU
                else:
                    ker_extra[k] = (wt[k] + wt[kn]) / HBM + wt[k] / XLU + LAUNCH
        ker_extra += f16_extra * ker_bytes / web

        fdim = ry - 1
        out_cands = [d for d in range(ry - 1)]
        y_batch = set() if is_conv else set(range(ry - 2))
        good = [d for d in out_cands if d not in y_batch] or out_cands
        onat = fdim * 6 + min(good, key=lambda d: yt[fdim * 6 + d]) if ry >= 2 else 0
        out_bytes, out_extra = np.empty(36), np.zeros(36)
        out_bytes[:] = yt[onat]
        if ry >= 2:
            for m0, m1 in _pairs(ry):
                k = m0 * 6 + m1
                if m0 == fdim:
                    out_bytes[k] = yt[k]
                    out_extra[k] = yt[k] / XLU if m1 in y_batch else 0.0
                elif m1 == fdim:
                    out_bytes[k], out_extra[k] = yt[k], yt[k] / XLU
                else:
                    out_extra[k] = (yt[k] + yt[onat]) / HBM + yt[onat] / XLU + LAUNCH
        reread = max(1.0, math.ceil(wt[kn] / (VMEM / 2)))
        return {"i": i, "in_bytes": in_bytes, "in_rows": in_rows, "in_extra": in_extra, "ker_bytes": ker_bytes,
                "ker_extra": ker_extra, "out_bytes": out_bytes, "out_extra": out_extra,
                "flops_per_row": flops_per_row, "reread": reread}

    def _reshape_entry(self, i: int, x, node) -> dict:
        eb = _ebytes(node.etype)
        sub = _sublanes(eb)
        gi, go = _reshape_groups(x.shape, node.shape)
        return {"i": i, "in_shape": x.shape, "out_shape": node.shape, "gi": gi, "go": go, "sub": sub,
                "in_table": _pad_table(x.shape, sub) * eb, "out_table": _pad_table(node.shape, sub) * eb}


# ----------------------------------------------------------------------------- layout costs


def _chunk_costs(plan: _Plan, blocks: np.ndarray) -> np.ndarray:
    kc = blocks.shape[0]
    nc, F = plan.nc, plan.F
    b = blocks.astype(np.int64)
    out_b, in_b, ker_b = b[:, :, 0:6], b[:, :, 6:12], b[:, :, 12:18]
    out_set = (out_b >= 0).any(axis=2)
    O = np.where(out_set[:, :, None], out_b, plan.default_out[None].astype(np.int64))
    code_o = (O + 1) @ _POW8
    code_base = np.concatenate([code_o, np.broadcast_to(plan.fixed_codes, (kc, F))], axis=1)
    fixed = plan.fixed_layouts.astype(np.int64)
    m0_base = np.concatenate([O[:, :, 0], np.broadcast_to(fixed[:, 0], (kc, F))], axis=1).clip(0)
    m1_base = np.concatenate([O[:, :, 1], np.broadcast_to(fixed[:, 1], (kc, F))], axis=1).clip(0)

    def side(block: np.ndarray, src: np.ndarray, allowed: np.ndarray | None):
        is_set = (block >= 0).any(axis=2)
        if allowed is not None:
            is_set &= allowed[None]
        code = np.where(is_set, (block + 1) @ _POW8, code_base[:, src])
        m0 = np.where(is_set, block[:, :, 0].clip(0), m0_base[:, src])
        m1 = np.where(is_set, block[:, :, 1].clip(0), m1_base[:, src])
        return code, m0, m1

    ci, i0, i1 = side(in_b, plan.in_src, None)
    ck, k0, k1 = side(ker_b, plan.ker_src, plan.ker_cfg)
    CODE = np.concatenate([code_base, ci, ck], axis=1)
    M0 = np.concatenate([m0_base, i0, k0], axis=1)
    M1 = np.concatenate([m1_base, i1, k1], axis=1)
    IDX = M0 * 6 + M1

    total = np.full(kc, plan.const)
    if plan.term_slot.size:
        idx = IDX[:, plan.term_slot]
        total += plan.term_table[np.arange(plan.term_slot.size)[None, :], idx].sum(axis=1)
    if plan.edge_a.size:
        ea, eb_ = plan.edge_a, plan.edge_b
        rows = np.arange(ea.size)[None, :]
        ia, ib = IDX[:, ea], IDX[:, eb_]
        pa = plan.edge_table[rows, ia]
        pb = plan.edge_table[rows, ib]
        same = CODE[:, ea] == CODE[:, eb_]
        tiles_same = ia == ib
        lane_change = M0[:, ea] != M0[:, eb_]
        copy = (pa + pb) / HBM + lane_change * pa / XLU + LAUNCH
        cost = np.where(same, 0.0, np.where(tiles_same, ABSORB * pa / HBM, copy))
        total += cost.sum(axis=1)
    if plan.mxu is not None:
        m = plan.mxu
        i = m["i"]
        rows = np.arange(i.size)[None, :]
        ii = IDX[:, nc + F + i]
        ik = IDX[:, 2 * nc + F + i]
        io = IDX[:, i]
        t_mxu = m["in_rows"][rows, ii] * m["flops_per_row"][None]
        t_mem = (m["in_bytes"][rows, ii] * m["reread"][None] + m["ker_bytes"][rows, ik]
                 + m["out_bytes"][rows, io]) / HBM
        extra = m["in_extra"][rows, ii] + m["ker_extra"][rows, ik] + m["out_extra"][rows, io]
        total += (np.maximum(t_mxu, t_mem) + extra + LAUNCH).sum(axis=1)
    for r in plan.reshapes:
        i = r["i"]
        cin, cout = CODE[:, nc + F + i], CODE[:, i]
        sig_in = _signatures(cin, r["in_shape"], r["gi"])
        sig_out = _signatures(cout, r["out_shape"], r["go"])
        sub = r["sub"]
        bitcast = ((sig_in[0] >= 0) & (sig_in[0] == sig_out[0]) & (sig_in[1] == sig_out[1])
                   & ((sig_in[2] == sig_out[2]) | ((sig_in[2] % sub == 0) & (sig_out[2] % sub == 0))))
        pin = r["in_table"][IDX[:, nc + F + i]]
        pout = r["out_table"][IDX[:, i]]
        copy = (pin + pout) / HBM + (sig_in[1] != sig_out[1]) * pin / XLU + LAUNCH
        total += np.where(bitcast, 0.0, copy)
    return total


def _signatures(codes: np.ndarray, shape: tuple[int, ...], groups: list[int]) -> tuple[np.ndarray, ...]:
    uniq, inverse = np.unique(codes, return_inverse=True)
    sig = np.array([_layout_signature(shape, groups, _decode(int(c), len(shape))) for c in uniq],
                   dtype=np.int64).reshape(-1, 3)
    return sig[inverse, 0], sig[inverse, 1], sig[inverse, 2]


def layout_runtimes(program: Program, blocks: np.ndarray) -> np.ndarray:
    """Noise-free runtime in ns of the whole program under each of k layout configs.

    ``blocks``: int8 (k, nc, 18), per configurable node (``program.config_ids`` order) the output,
    input (operand 0) and kernel (operand 1, rank 1-2 dot kernels only) minor_to_major blocks, -1
    past the rank; an all -1 block is the compiler default (the node's own layout for the output,
    the producer's layout for an operand). Returns float64 (k,), all > 0.
    """
    blocks = np.asarray(blocks)
    nc = len(program.config_ids)
    if blocks.ndim != 3 or blocks.shape[1:] != (nc, 18):
        raise ValueError(f"blocks must be (k, {nc}, 18), got {blocks.shape}")
    plan = _Plan(program)
    k = blocks.shape[0]
    out = np.empty(k, dtype=np.float64)
    width = 3 * nc + plan.F + plan.term_slot.size + 3 * plan.edge_a.size + 18 * nc + 1
    step = int(max(8, min(1024, 4_000_000 // width)))
    for start in range(0, k, step):
        out[start:start + step] = _chunk_costs(plan, blocks[start:start + step])
    return out


# ----------------------------------------------------------------------------- tile costs


def _tile_pad(dims: np.ndarray, sub: int) -> np.ndarray:
    """Padded elements of (c, r) tiles, last dim on lanes and second-last on sublanes."""
    c, r = dims.shape
    if r == 0:
        return np.zeros(c)
    d = np.maximum(dims, 1.0)
    lanes = _roundup(d[:, -1], 128.0)
    if r == 1:
        return _roundup(d[:, 0], 128.0 * sub)
    return np.prod(d[:, :-2], axis=1) * _roundup(d[:, -2], float(sub)) * lanes


def tile_runtimes(kernel: TileKernel, config_feat: np.ndarray) -> np.ndarray:
    """Noise-free runtime in ns of one fused kernel under each of k tile configs (config_feat (k, 24))."""
    cf = np.asarray(config_feat, dtype=np.float64)
    if cf.ndim != 2 or cf.shape[1] != 24:
        raise ValueError(f"config_feat must be (k, 24), got {cf.shape}")
    eb = max(1, int(kernel.elem_bytes))
    sub = _sublanes(eb)
    rate = F32_RATE if eb == 4 else 1.0
    ext = np.array(kernel.out_shape, dtype=np.float64)
    r = ext.size
    out_t = np.clip(cf[:, 8:8 + r], 1.0, ext)
    parallel = np.prod(np.ceil(ext / out_t), axis=1)
    per_core_steps = np.ceil(parallel / 2.0)
    bw = HBM / np.minimum(2.0, parallel)  # per active core
    vpu_core, xlu_core = VPU / 2.0, XLU / 2.0
    out_pad = _tile_pad(out_t, sub)
    out_b = out_pad * eb
    kind = kernel.kind
    if kind in ("conv", "dot"):
        nw = len(kernel.window) if kind == "conv" else 0
        ker_t = np.maximum(cf[:, 0:nw + 2], 1.0)
        k_t = np.clip(ker_t[:, nw], 1.0, max(1, kernel.contract))
        ksteps = np.ceil(max(1, kernel.contract) / k_t)
        rin = len(kernel.in_shape)
        in_t = np.maximum(cf[:, 16:16 + rin], 1.0)
        in_b = _tile_pad(in_t, sub) * eb
        ker_b = _tile_pad(ker_t, sub) * eb
        acc_b = out_pad * 4.0
        taps = float(math.prod(kernel.window)) if kind == "conv" else 1.0
        if r >= 2:
            rows = np.prod(out_t[:, :-2], axis=1) * _roundup(out_t[:, -2], float(sub))
        else:
            rows = np.full(len(cf), float(sub))
        wtiles = taps * (_roundup(k_t, 128.0) / 128.0) * (_roundup(out_t[:, -1], 128.0) / 128.0)
        t_cmp = wtiles * (rows + MXU_FILL) / (MXU_PER_CORE * CLOCK * rate)
        t_cmp = t_cmp + kernel.epilogue * out_pad / vpu_core / ksteps
        t_mem = (in_b + ker_b) / bw + out_b / bw / ksteps
        first = (in_b + ker_b) / bw
    else:
        if kind == "reduce":
            in_t = np.column_stack([out_t, np.full(len(cf), float(kernel.in_shape[-1]))])
        else:
            in_t = out_t
        in_pad = _tile_pad(in_t, sub)
        in_b = in_pad * eb
        ker_b = np.zeros(len(cf))
        acc_b = np.zeros(len(cf))
        ksteps = np.ones(len(cf))
        if kind == "reduce":
            t_cmp = (1 + kernel.epilogue) * in_pad / vpu_core + in_b / xlu_core
        else:
            t_cmp = (1 + kernel.epilogue) * out_pad / vpu_core
        t_mem = (in_b + out_b) / bw
        first = in_b / bw
    single = in_b + ker_b + out_b + acc_b
    double = single + in_b + ker_b + out_b
    overlapped = np.maximum(t_cmp, t_mem)
    serial = t_cmp + t_mem
    spilled = t_cmp + t_mem * 2.0 * single / VMEM
    step_time = np.where(double <= VMEM, overlapped, np.where(single <= VMEM, serial, spilled)) + STEP_OVERHEAD
    total = per_core_steps * ksteps * step_time + first + LAUNCH
    return total.astype(np.float64)
