"""Tile world: fused kernels cut from the programs (under the compiler-default layouts), their tile
size configurations, and a per-kernel cost model (padding, VMEM, pipelining, grid steps)."""
import numpy as np

from . import tpu
from .hlo import Graph, Instr, ELEMENTWISE
from .layout import OPCOST, Analysis
from .tpu import PERMS

STEP_OVH = 165.0 / tpu.CLK          # per grid step: DMA issue, semaphore waits, loop bookkeeping
DMA_RUN = 512.0                     # bytes of contiguous run for full DMA efficiency


# ---------------------------------------------------------------------------------------
# kernel extraction
# ---------------------------------------------------------------------------------------
def _kernel_sets(an):
    """Node sets of fused kernels: conv/dot output (+input-convert) fusions and loop/reduce fusions."""
    g = an.g
    sets = []
    used = set()
    for v in an.cfg_nodes:
        ins = g[v]
        if ins.op not in ("convolution", "dot"):
            continue
        S = {v}
        # input fusion: single-use converts / elementwise producers
        for o in ins.operands:
            oi = g[o]
            if oi.op == "convert" and len(an.cons[o]) == 1:
                S.add(o)
        # output fusion: single-consumer elementwise chain
        cur = v
        for _ in range(8):
            cs = an.cons[cur]
            if len(cs) != 1:
                break
            c = cs[0][0]
            if g[c].op not in ELEMENTWISE or g[c].shape != ins.shape:
                break
            S.add(c)
            for o in g[c].operands:
                if g[o].op in ("broadcast", "constant") and len(an.cons[o]) == 1:
                    S.add(o)
                    for oo in g[o].operands:
                        if g[oo].op == "constant":
                            S.add(oo)
            cur = c
        sets.append(("conv" if ins.op == "convolution" else "dot", sorted(S)))
        used |= S
    for mem in an.groups:
        S = [v for v in mem if v not in used]
        if not S:
            continue
        for v in list(S):
            for o in g[v].operands:
                if g[o].op == "constant" and len(an.cons[o]) == 1:
                    S.append(o)
        S = sorted(set(S))
        kind = "reduce" if any(g[v].op == "reduce" for v in S) else "loop"
        if all(g[v].op in ("broadcast", "constant", "iota") for v in S):
            continue
        sets.append((kind, S))
    return sets


def extract_kernels(g, an=None):
    an = an or Analysis(g)
    out = []
    for kind, S in _kernel_sets(an):
        k = _make_kernel(g, an, kind, S)
        if k is not None:
            out.append(k)
    return out


def _make_kernel(g, an, kind, S):
    Sset = set(S)
    kg = Graph()
    remap = {}
    layouts = []
    ext = []
    for v in S:
        for o in g[v].operands:
            if o not in Sset and o not in ext:
                ext.append(o)
    for o in ext:
        oi = g[o]
        if oi.dtype == "tuple":
            return None
        remap[o] = kg.param(oi.shape, oi.dtype)
        layouts.append(_lay(an, o))
    for v in S:
        ins = g[v]
        nid = kg.add(ins.op, ins.shape, ins.dtype, [remap[o] for o in ins.operands], **dict(ins.attrs))
        remap[v] = nid
        layouts.append(_lay(an, v))
    outs = [v for v in S if any(c not in Sset for c, _ in an.cons[v]) or v in an.root_set or not an.cons[v]]
    outs = [v for v in outs if g[v].op not in ("constant", "broadcast") or len(outs) == 1]
    if not outs:
        return None
    if len(outs) == 1:
        kg.set_root(remap[outs[0]], "entry")
    else:
        kg.set_root(kg.tuple([remap[v] for v in outs]), "entry")
        layouts.append(None)
    n = len(kg.ins)
    if n < 5 or n > 60:
        return None
    main = None
    if kind in ("conv", "dot"):
        main = [v for v in S if g[v].op in ("convolution", "dot")][0]
    elif kind == "reduce":
        main = max((v for v in S if g[v].op == "reduce"), key=lambda v: g[g[v].operands[0]].elems)
    else:
        main = max(outs, key=lambda v: g[v].elems)
    info = _kernel_info(g, an, kind, S, main, outs, ext)
    if info is None:
        return None
    return dict(graph=kg, layouts=layouts, kind=kind, info=info,
                sig=(kind, tuple((g[v].op, g[v].shape) for v in S)))


def _lay(an, v):
    p = an.default_perm_of(v)
    ins = an.g[v]
    if ins.dtype == "tuple":
        return None
    if p is None:
        return list(range(ins.rank - 1, -1, -1))
    return [int(x) for x in PERMS[ins.rank][p]]


def _kernel_info(g, an, kind, S, main, outs, ext):
    mi = g[main]
    ops_per_elem = 0.0
    for v in S:
        op = g[v].op
        if op in ELEMENTWISE:
            ops_per_elem += OPCOST.get(op, 1.0)
        elif op in ("broadcast", "slice", "pad", "concatenate", "dynamic-slice", "dynamic-update-slice"):
            ops_per_elem += 0.5
        elif op in ("reduce-window", "select-and-scatter"):
            ops_per_elem += float(np.prod([w["size"] for w in g[v].attrs["window"]]))
    info = dict(kind=kind, dtype=mi.dtype, ops=ops_per_elem)
    big_ins = [o for o in ext if g[o].rank >= 1]
    if kind == "conv":
        x, k = mi.operands
        dn = mi.attrs["conv_dims"]
        info.update(out_shape=mi.shape, out_perm=_lay(an, main), in_shape=g[x].shape, in_perm=_lay(an, x),
                    in_dtype=g[x].dtype, k_shape=g[k].shape, dn=dn, window=mi.attrs["window"],
                    fgc=mi.attrs["fgc"], bgc=mi.attrs["bgc"])
        K = g[x].shape[dn["if_"]] // mi.attrs["fgc"]
        Wp = int(np.prod([w["size"] for w in mi.attrs["window"]]))
        info["dw"] = Wp > 64
        info["iter"] = list(mi.shape) + [K * Wp if info["dw"] else K]
    elif kind == "dot":
        a, b = mi.operands
        lb, rb, lc, rc = mi.attrs["dot_dims"]
        K = int(np.prod([g[a].shape[d] for d in lc])) if lc else 1
        info.update(out_shape=mi.shape, out_perm=_lay(an, main), a_shape=g[a].shape, a_perm=_lay(an, a),
                    b_shape=g[b].shape, dot_dims=mi.attrs["dot_dims"], in_dtype=g[a].dtype)
        info["iter"] = list(mi.shape) + [K]
    elif kind == "reduce":
        o = mi.operands[0]
        info.update(in_shape=g[o].shape, in_perm=_lay(an, o), red=list(mi.attrs["dimensions"]),
                    out_shape=mi.shape)
        info["iter"] = list(g[o].shape)
        info["out_perm"] = _lay(an, o)
    else:
        info.update(out_shape=mi.shape, out_perm=_lay(an, main))
        info["iter"] = list(mi.shape)
    if len(info["iter"]) > 6 or len(info["iter"]) == 0 or min(info["iter"]) <= 0:
        return None
    out_bytes = sum(g[v].nbytes for v in outs)
    info["n_inputs"] = max(1, len([o for o in big_ins if g[o].elems * 4 >= g[main].elems]))
    info["extra_in_bytes"] = float(sum(g[o].nbytes for o in big_ins))
    info["n_outputs"] = len(outs)
    info["out_bytes_total"] = float(out_bytes)
    return info


# ---------------------------------------------------------------------------------------
# tile cost model
# ---------------------------------------------------------------------------------------
def _pad_tile(t, perm, dtype):
    """Elements of a VMEM tile after (sublane, lane) padding; t logical tile dims, perm minor_to_major."""
    t = list(t)
    if not t:
        return 1.0
    lane = perm[0]
    tot = float(np.prod(t))
    tot = tot / t[lane] * (np.ceil(t[lane] / 128.0) * 128.0)
    if len(t) >= 2:
        sub = perm[1]
        st = tpu.sublane_tile(dtype)
        tot = tot / t[sub] * (np.ceil(t[sub] / st) * st)
    return tot


def _dma_eff(t, full, perm, nbytes, est=False):
    if est:
        return 1.0
    lane = perm[0]
    run = t[lane] * nbytes
    if t[lane] >= full[lane] and len(t) >= 2:
        run *= t[perm[1]]
    return min(1.0, (run / DMA_RUN)) ** 0.5


def tile_cost(info, tile, est=False):
    """Seconds (noise-free) for one tile configuration; None if it does not fit VMEM.
    est=True is the compiler's own cruder estimate (no DMA efficiency, no halo, no VMEM pressure)."""
    kind = info["kind"]
    it = info["iter"]
    t = [min(a, b) for a, b in zip(tile, it)]
    steps = float(np.prod([np.ceil(e / x) for e, x in zip(it, t)]))
    dt = info["dtype"]
    nb = tpu.elem_bytes(dt)
    out_perm = info["out_perm"]
    if kind in ("conv", "dot"):
        r = len(info["out_shape"])
        to = t[:r]
        tK = t[r]
        K = it[r]
        out_tile = _pad_tile(to, out_perm, dt)
        out_b = out_tile * nb
        ksteps = np.ceil(K / tK)
        osteps = steps / ksteps
        if kind == "conv" and info["dw"]:
            # weight-gradient conv: contraction over batch x output-spatial, tiled like a matmul
            dn = info["dn"]
            ib_ = tpu.elem_bytes(info["in_dtype"])
            N_t = to[dn["of"]]
            M_t = float(np.prod([to[d] for d in range(r) if d != dn["of"]]))
            ci_t = to[dn["ob"]]
            sp_t = M_t / ci_t
            in_b = (np.ceil(ci_t / 128.0) * 128.0) * (np.ceil(tK / 16.0) * 16.0) * ib_ * (1.0 + 0.08 * (sp_t - 1))
            w_b = (np.ceil(tK / 16.0) * 16.0) * (np.ceil(N_t / 128.0) * 128.0) * ib_
            Wp = 1.0
            in_eff = 1.0 if est else min(1.0, (ci_t * ib_) / DMA_RUN) ** 0.5
            depthwise = info["bgc"] > 1
            if depthwise:
                K = K / info["bgc"]
        elif kind == "conv":
            dn = info["dn"]
            wnd = info["window"]
            ish = info["in_shape"]
            ti = [1] * len(ish)
            ti[dn["ib"]] = to[dn["ob"]] * info["bgc"] if info["bgc"] > 1 else to[dn["ob"]]
            ti[dn["if_"]] = tK * info["fgc"] if info["fgc"] > 1 and K == 1 else tK
            Wp = 1.0
            for i, d in enumerate(dn["is_"]):
                w = wnd[i]
                eff = (w["size"] - 1) * w["wdil"] + 1
                span = ((to[dn["os"][i]] - 1) * w["stride"] + eff + w["bdil"] - 1) // w["bdil"]
                if est:
                    span = min(span, to[dn["os"][i]] * w["stride"])
                ti[d] = min(ish[d], span)
                Wp *= w["size"]
            ti = [min(a, b) for a, b in zip(ti, ish)]
            in_b = _pad_tile(ti, info["in_perm"], info["in_dtype"]) * tpu.elem_bytes(info["in_dtype"])
            N_t = to[dn["of"]]
            M_t = float(np.prod([to[d] for d in range(r) if d != dn["of"]]))
            w_b = Wp * np.ceil(tK / 8.0) * 8 * np.ceil(N_t / 128.0) * 128 * tpu.elem_bytes(info["in_dtype"])
            in_eff = _dma_eff(ti, ish, info["in_perm"], tpu.elem_bytes(info["in_dtype"]), est)
            depthwise = info["fgc"] > 1 and K == 1 or info["bgc"] > 1
        else:
            lb, rb, lc, rc = info["dot_dims"]
            ash = info["a_shape"]
            nbt = len(lb)
            la_free = [d for d in range(len(ash)) if d not in lc and d not in lb]
            ta = [1] * len(ash)
            for i, d in enumerate(lb):
                ta[d] = to[i]
            for i, d in enumerate(la_free):
                ta[d] = to[nbt + i]
            rem = tK
            for d in reversed(lc):
                ta[d] = int(min(ash[d], max(1, rem)))
                rem = max(1, rem // ash[d])
            in_b = _pad_tile(ta, info["a_perm"], info["in_dtype"]) * tpu.elem_bytes(info["in_dtype"])
            N_t = float(np.prod(to[nbt + len(la_free):])) if r > nbt + len(la_free) else 1.0
            M_t = float(np.prod(to[:nbt + len(la_free)]))
            w_b = np.ceil(tK / 8.0) * 8 * np.ceil(N_t / 128.0) * 128 * tpu.elem_bytes(info["in_dtype"]) \
                * float(np.prod(to[:nbt]))
            Wp = 1.0
            in_eff = _dma_eff(ta, ash, info["a_perm"], tpu.elem_bytes(info["in_dtype"]), est)
            depthwise = False
        f32 = info["in_dtype"] == "f32"
        if depthwise:
            comp = out_tile * Wp * max(tK, 1) * 2.0 / 1024.0
        else:
            comp = (np.ceil(M_t / 8.0) * 8.0 * Wp * np.ceil(tK / 128.0) * np.ceil(N_t / 128.0)
                    / tpu.N_MXU * (3.0 if f32 else 1.0))
            comp += Wp * np.ceil(tK / 128.0) * np.ceil(N_t / 128.0) * 128.0
        comp += out_tile * info["ops"] / 1024.0 / ksteps
        acc_b = out_tile * 4 if ksteps > 1 else 0.0
        if ksteps > 1:
            comp += out_tile / 1024.0
        out_eff = _dma_eff(to, info["out_shape"], out_perm, nb, est)
        dma_b = in_b / in_eff + w_b + out_b / out_eff / ksteps
        vmem = 2 * (in_b + out_b) + 2 * w_b + acc_b
        first = (in_b + w_b) / tpu.HBM_BW
        last = out_b / tpu.HBM_BW
    else:
        perm = out_perm
        tt = t
        tile_el = _pad_tile(tt, perm, dt)
        eff = _dma_eff(tt, it, perm, nb, est)
        n_in = info["n_inputs"]
        if kind == "reduce":
            red = info["red"]
            kept = [d for d in range(len(it)) if d not in red]
            ro = [tt[d] for d in kept]
            rperm = [p for p in perm if p not in red]
            rperm = [sum(1 for q in kept if q < p) for p in rperm]
            out_el = _pad_tile(ro, rperm, dt) if ro else 8.0 * 128.0
            rsteps = float(np.prod([np.ceil(it[d] / tt[d]) for d in red]))
            comp = tile_el * (1.0 + info["ops"]) / 1024.0
            if perm[0] in red:
                comp += tile_el / 8.0 / 1024.0 * 9.0
            out_b = out_el * nb
            dma_b = tile_el * nb * n_in / eff + out_b * (2.0 if rsteps > 1 else 1.0) / max(1.0, rsteps) * (rsteps > 1 or 1)
            vmem = 2 * (tile_el * nb * n_in + out_b) + out_el * 4
        else:
            comp = tile_el * max(info["ops"], 0.5) / 1024.0
            out_b = tile_el * nb * info["n_outputs"]
            in_b = tile_el * nb * n_in
            dma_b = (in_b + out_b) / eff
            vmem = 2 * (in_b + out_b)
        first = dma_b / 2 / tpu.HBM_BW
        last = out_b / tpu.HBM_BW
    if vmem > tpu.VMEM_BYTES:
        return None
    step = max(comp / tpu.CLK, dma_b / tpu.HBM_BW) + STEP_OVH * (0.6 if est else 1.0)
    if vmem > 0.75 * tpu.VMEM_BYTES and not est:
        step *= 1.08
    return tpu.LAUNCH + first + steps * step + last


def _cands(e, is_lane, is_sub):
    """Tile sizes the tuner explores for one dim of extent e (at most 32 tiles along it)."""
    c = set()
    x = 1
    while x < e:
        c.add(x)
        x *= 2
    c.add(e)
    lo = e / 32.0
    if is_lane:
        c |= set(range(128, min(e, 2048) + 1, 128))
        lo = max(lo, min(e, 64))
    if is_sub:
        lo = max(lo, min(e, 4))
    c = sorted(v for v in c if v >= lo or v == e)
    if len(c) > 9:
        idx = np.unique(np.round(np.linspace(0, len(c) - 1, 9)).astype(int))
        c = [c[i] for i in idx]
    return c


def _iter_perm(info):
    """Physical order of the iteration dims: output layout, the contraction dim outermost-minor."""
    it = info["iter"]
    p = list(info["out_perm"])
    if info["kind"] in ("conv", "dot"):
        p = p + [len(it) - 1]
    return p


def _greedy(info, lane_w, budget, kt):
    it = info["iter"]
    perm = _iter_perm(info)
    t = [1] * len(it)
    kind = info["kind"]
    if kind in ("conv", "dot"):
        k = len(it) - 1
        t[k] = min(it[k], kt)
    lane = perm[0]
    t[lane] = min(it[lane], lane_w)
    if len(perm) > 1 and (perm[1] != len(it) - 1 or kind not in ("conv", "dot")):
        t[perm[1]] = min(it[perm[1]], 8)
    for d in perm:
        if kind in ("conv", "dot") and d == len(it) - 1:
            continue
        while t[d] < it[d]:
            nt = list(t)
            nt[d] = min(it[d], t[d] * 2)
            if _vmem_est(info, nt) > budget:
                break
            t = nt
    return tuple(t)


def default_tile(info):
    """The compiler's choice: greedy tiles for a few lane widths / VMEM budgets / contraction
    tiles, the feasible ones ranked by the compiler's own (cruder) estimate."""
    it = info["iter"]
    kts = [1 << 30]
    if info["kind"] in ("conv", "dot"):
        kts = sorted({min(it[-1], x) for x in (it[-1], 2048, 512, 128)}, reverse=True)
    best, bc = None, None
    seen = set()
    for lane_w in (128, 256, 512):
        for frac in (16, 8, 4, 2):
            for kt in kts:
                t = _greedy(info, lane_w, tpu.VMEM_BYTES / frac, kt)
                if t in seen:
                    continue
                seen.add(t)
                if tile_cost(info, list(t)) is None:
                    continue
                c = tile_cost(info, list(t), est=True)
                if c is not None and (bc is None or c < bc * 0.999):
                    best, bc = t, c
    if best is None:
        perm = _iter_perm(info)
        cands = [_cands(e, d == perm[0], len(perm) > 1 and d == perm[1]) for d, e in enumerate(it)]
        frng = np.random.default_rng(12345)
        for _ in range(400):
            t = tuple(int(c[frng.integers(len(c))]) for c in cands)
            if tile_cost(info, list(t)) is None:
                continue
            c = tile_cost(info, list(t), est=True)
            if bc is None or c < bc:
                best, bc = t, c
    return best


def _vmem_est(info, t):
    it = info["iter"]
    nb = tpu.elem_bytes(info["dtype"])
    perm = _iter_perm(info)
    if info["kind"] in ("conv", "dot"):
        r = len(info["out_shape"])
        o = _pad_tile(t[:r], info["out_perm"], info["dtype"]) * nb
        return 3 * o + 2 * t[r] * 128 * nb * 4
    return _pad_tile(t, info["out_perm"], info["dtype"]) * nb * 2 * (info["n_inputs"] + 1)


def tile_configs(info, rng, n):
    """Sample up to n distinct feasible tile configs; the default tile is always included first."""
    it = info["iter"]
    perm = _iter_perm(info)
    lane = perm[0]
    sub = perm[1] if len(perm) > 1 else -1
    cands = [_cands(e, d == lane, d == sub) for d, e in enumerate(it)]
    space = float(np.prod([len(c) for c in cands]))
    dflt = default_tile(info)
    if dflt is None:
        return []
    seen = {dflt: tile_cost(info, list(dflt))}
    order = [dflt]
    tries = 0
    while len(order) < n and tries < n * 30 and tries < space * 6:
        tries += 1
        t = tuple(int(c[min(len(c) - 1, int(len(c) * rng.random() ** 0.6))]) for c in cands)
        if t in seen:
            continue
        if np.prod([np.ceil(e / x) for e, x in zip(it, t)]) > 8192:
            seen[t] = None
            continue
        cst = tile_cost(info, list(t))
        seen[t] = cst
        if cst is not None:
            order.append(t)
    out = [(t, seen[t]) for t in order if seen[t] is not None]
    # the compiler's default tile is always offered, as config 0 (world.py tracks it through the shuffle)
    assert out and out[0][0] == dflt, "default tile missing from the sampled configs"
    return out


def _seq(vals):
    vals = [int(v) for v in vals]
    out = (vals + [0] * 6)[:6]
    return out + [sum(vals), int(np.prod(vals)) if vals else 0]


def config_features(info, t):
    kind = info["kind"]
    it = info["iter"]
    t = [min(a, b) for a, b in zip(t, it)]
    if kind in ("conv", "dot"):
        r = len(info["out_shape"])
        ob = t[:r]
        tK = t[r]
        if kind == "conv" and info["dw"]:
            dn = info["dn"]
            ish = info["in_shape"]
            ib = [1] * len(ish)
            ib[dn["ib"]] = ob[dn["ob"]]
            B = ish[dn["if_"]]
            ib[dn["if_"]] = min(B, tK)
            rest = max(1, tK // B)
            for d in reversed(dn["is_"]):
                ib[d] = int(min(ish[d], rest))
                rest = max(1, rest // ish[d])
        elif kind == "conv":
            dn = info["dn"]
            ish = info["in_shape"]
            ib = [1] * len(ish)
            ib[dn["ib"]] = ob[dn["ob"]]
            ib[dn["if_"]] = tK
            for i, d in enumerate(dn["is_"]):
                w = info["window"][i]
                span = (ob[dn["os"][i]] - 1) * w["stride"] + (w["size"] - 1) * w["wdil"] + 1
                ib[d] = min(ish[d], span)
        else:
            lb, rb, lc, rc = info["dot_dims"]
            ash = info["a_shape"]
            la_free = [d for d in range(len(ash)) if d not in lc and d not in lb]
            ib = [1] * len(ash)
            for i, d in enumerate(lb):
                ib[d] = ob[i]
            for i, d in enumerate(la_free):
                ib[d] = ob[len(lb) + i]
            for d in lc:
                ib[d] = min(ash[d], tK)
    elif kind == "reduce":
        red = info["red"]
        ob = [t[d] for d in range(len(it)) if d not in red]
        ib = list(t)
    else:
        ob = list(t)
        ib = list(t)
    return _seq(t) + _seq(ob) + _seq(ib)
