"""Outside author's TPU cost model (layout and tile), written from public facts.

All times are in nanoseconds.  Machine figures (see README for sources):
TPU v4-class chip, bf16 MXU peak 275 TFLOP/s, HBM 1.2 TB/s, (8,128) tiles,
16 MiB scoped VMEM, ~0.35 us per pipelined grid step.
"""
import functools

import numpy as np

PEAK_MXU = 275e12 / 1e9        # flop per ns (bf16, DEFAULT precision: one pass)
PEAK_VPU = 2 * 4 * 8 * 128 * 1.05  # elementwise ops per ns (2 cores x 4 ALUs x 8x128 lanes x 1.05 GHz)
HBM_BW = 1200.0                # bytes per ns (1.2 TB/s)
VMEM = 16 * 2**20              # scoped VMEM budget, bytes
STEP_NS = 350.0                # per grid step overhead
LAUNCH_NS = 1500.0             # kernel launch / fusion boundary overhead
LANE, SUB = 128, 8

OP_CONV, OP_DOT, OP_RESHAPE, OP_PARAM, OP_CONST = 26, 34, 75, 63, 24
FREE_OPS = {0, OP_PARAM, OP_CONST, 45, 100, 13}   # unknown, param, const, gte, tuple, broadcast
HEAVY_OPS = {OP_CONV, OP_DOT, 70, 27, 98}            # dot/conv/reduce/copy/transpose: own kernels
# bytes per element by one-hot slot 2..20 of node_feat
_ELEM_BYTES = [4, 1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 2, 8, 16, 0, 0, 0]


class Graph:
    """Decoded node features of one graph (the official 140-column encoding)."""

    def __init__(self, nf, op, edges):
        self.n = len(op)
        self.op = op.astype(np.int64)
        dims = np.rint(nf[:, 21:27]).astype(np.int64)
        self.shape, self.rank, self.deflt = [], np.zeros(self.n, np.int64), []
        for i in range(self.n):
            nz = np.nonzero(dims[i])[0]
            r = int(nz[-1]) + 1 if len(nz) else 0
            self.rank[i] = r
            self.shape.append(tuple(int(max(d, 1)) for d in dims[i, :r]))
            lay = [int(x) for x in np.rint(nf[i, 134:134 + r])]
            if sorted(lay) != list(range(r)):
                lay = list(range(r - 1, -1, -1))
            self.deflt.append(tuple(lay))
        oh = nf[:, 2:21]
        self.bytes = np.array([_ELEM_BYTES[int(np.argmax(oh[i]))] if oh[i].max() > 0 else 4
                               for i in range(self.n)], np.int64)
        self.bytes[self.bytes == 0] = 4
        self.nf = nf
        self.operands = [[] for _ in range(self.n)]
        self.users = [[] for _ in range(self.n)]
        for u, v in edges:
            self.operands[int(u)].append(int(v))
            self.users[int(v)].append(int(u))
        self.is_root = nf[:, 0] > 0.5


def ceil_to(x, m):
    return -(-x // m) * m


def sublane(nbytes):
    return SUB * max(1, 4 // max(1, int(nbytes)))


def eff_perm(shape, perm):
    """minor_to_major order with size-1 dims dropped (they do not move data)."""
    return tuple(d for d in perm if shape[d] > 1)


@functools.lru_cache(maxsize=None)
def padded_bytes(shape, perm, nbytes):
    """Bytes of a tensor stored in (sublane,128) tiles under layout perm (minor_to_major)."""
    if not shape:
        return float(nbytes)
    sizes = [shape[d] for d in perm]
    if len(sizes) == 1:
        return float(ceil_to(sizes[0], LANE) * nbytes)
    tot = ceil_to(sizes[0], LANE) * ceil_to(sizes[1], sublane(nbytes))
    for s in sizes[2:]:
        tot *= s
    return float(tot * nbytes)


def resolve(block, default):
    """Config block (minor-most dims first, -1 = compiler) -> full minor_to_major perm."""
    r = len(default)
    spec = []
    for x in block[:r]:
        x = int(x)
        if 0 <= x < r and x not in spec:
            spec.append(x)
    return tuple(spec + [d for d in default if d not in spec])


# ----------------------------------------------------------------------------- dot / conv roles

def dot_roles(lhs, rhs, out):
    """Infer (batch, lhs_contract, rhs_contract, rhs_free) dim indices from shapes alone."""
    rl, rr, ro = len(lhs), len(rhs), len(out)
    b = 0
    while b < min(rl, rr, ro) and lhs[b] == rhs[b] == out[b] and (rl + rr - 2 * (b + 1) - ro) >= 2:
        b += 1
    k = max(1, (rl + rr - 2 * b - ro) // 2)
    nfl = rl - b - k

    def pick(shape, target, start):
        from itertools import combinations
        cand = list(range(b, len(shape)))
        for comb in combinations(cand, k):
            rest = [shape[d] for d in cand if d not in comb]
            if tuple(rest) == tuple(target):
                return list(comb)
        return cand[-k:] if start == "lhs" else cand[:k]

    lc = pick(lhs, out[b:b + nfl], "lhs")
    rc = pick(rhs, out[b + nfl:], "rhs")
    rfree_out = list(range(b + nfl, ro))
    return list(range(b)), lc, rc, rfree_out


def conv_dims(nf):
    c = [int(round(x)) for x in nf[93:107]]
    return dict(in_b=c[0], in_f=c[1], k_in=c[6], k_out=c[7], out_b=c[12], out_f=c[13])


# ----------------------------------------------------------------------------- copies

@functools.lru_cache(maxsize=None)
def copy_ns(shape, src, dst, nbytes, fused):
    """Cost of changing a tensor's layout from src to dst (both minor_to_major)."""
    if not shape:
        return 0.0
    es, ed = eff_perm(shape, src), eff_perm(shape, dst)
    if es == ed:
        return 0.0
    mv = padded_bytes(shape, src, nbytes) + padded_bytes(shape, dst, nbytes)
    if es[:2] == ed[:2]:
        t = 0.5 * mv / HBM_BW          # only major dims reorder: strided DMA
    elif es[:1] == ed[:1]:
        t = 1.0 * mv / HBM_BW          # sublane shuffle inside tiles
    else:
        t = 1.6 * mv / HBM_BW          # minor dim changes: XLU transpose
    return 0.5 * t if fused else t + LAUNCH_NS


# ----------------------------------------------------------------------------- per-node costs

def node_ns(g, i, out_l, in_l, k_l):
    """Time of configurable node i under resolved layouts (out, operand0, operand1)."""
    op, out, nb = g.op[i], g.shape[i], g.bytes[i]
    ops = g.operands[i]
    out_pad = padded_bytes(out, out_l, nb)
    if op == OP_RESHAPE:
        if not ops:
            return 0.0
        src = ops[0]
        ins, inb = g.shape[src], g.bytes[src]
        e_in, e_out = eff_perm(ins, in_l), eff_perm(out, out_l)
        rm_in = e_in == tuple(sorted(e_in, reverse=True))
        rm_out = e_out == tuple(sorted(e_out, reverse=True))
        minor_in = ins[e_in[0]] if e_in else 1
        minor_out = out[e_out[0]] if e_out else 1
        if rm_in and rm_out and (minor_in == minor_out or (minor_in % LANE == 0 and minor_out % LANE == 0)):
            return 0.0                                   # bitcast
        mv = padded_bytes(ins, in_l, inb) + out_pad
        f = 1.0 if (rm_in and rm_out) else 1.6
        return f * mv / HBM_BW + LAUNCH_NS
    lhs = g.shape[ops[0]] if ops else out
    rhs = g.shape[ops[1]] if len(ops) > 1 else ()
    lb = g.bytes[ops[0]] if ops else nb
    rb = g.bytes[ops[1]] if len(ops) > 1 else nb
    mem = out_pad + padded_bytes(lhs, in_l, lb) + (padded_bytes(rhs, k_l, rb) if rhs else 0.0)
    xpose = 0.0
    if op == OP_DOT and rhs:
        bat, lc, rc, rfree = dot_roles(lhs, rhs, out)
        kk = int(np.prod([lhs[d] for d in lc])) if lc else 1
        flops = 2.0 * np.prod(out) * kk
        n = int(np.prod([out[d] for d in rfree])) if rfree else 1
        eff = (kk / ceil_to(kk, LANE)) * (n / ceil_to(n, LANE))
        el, er, eo = eff_perm(lhs, in_l), eff_perm(rhs, k_l), eff_perm(out, out_l)
        if el and el[0] not in lc:
            xpose += (2.0 if el[0] in bat else 1.0) * padded_bytes(lhs, in_l, lb) / HBM_BW
        if er and er[0] in bat:
            xpose += 2.0 * padded_bytes(rhs, k_l, rb) / HBM_BW
        if eo and eo[0] not in rfree:
            xpose += (1.5 if eo[0] in bat else 0.6) * out_pad / HBM_BW
    elif op == OP_CONV:
        cd = conv_dims(g.nf[i])
        r = len(out)
        win = float(np.prod(np.maximum(g.nf[i, 37:37 + max(r - 2, 0)], 1))) if r > 2 else 1.0
        fg = max(1.0, float(g.nf[i, 107]))
        cin = lhs[cd["in_f"]] if cd["in_f"] < len(lhs) else 1
        cout = out[cd["out_f"]] if cd["out_f"] < len(out) else 1
        flops = 2.0 * np.prod(out) * win * cin / fg
        eff = (cin / ceil_to(cin, LANE)) * (cout / ceil_to(cout, LANE)) if fg == 1 else 0.25
        eff = max(eff, 0.02)
        el, eo = eff_perm(lhs, in_l), eff_perm(out, out_l)
        if el and el[0] != cd["in_f"]:
            xpose += (1.2 if el[0] == cd["in_b"] else 2.0) * padded_bytes(lhs, in_l, lb) / HBM_BW
        if eo and eo[0] != cd["out_f"]:
            xpose += (0.8 if eo[0] == cd["out_b"] else 1.5) * out_pad / HBM_BW
    else:
        flops, eff = float(np.prod(out)) if out else 1.0, 1.0
        return mem / HBM_BW + flops / PEAK_VPU + LAUNCH_NS
    f32 = 2.0 if nb >= 4 else 1.0
    compute = flops / (PEAK_MXU * max(eff, 0.02)) * (f32 ** 0.5)
    return max(compute, mem / HBM_BW) + xpose + LAUNCH_NS


def base_ns(g, skip):
    """Config-independent time of all other nodes under their default layouts."""
    t = 5000.0
    for i in range(g.n):
        if i in skip or g.op[i] in FREE_OPS:
            continue
        b = padded_bytes(g.shape[i], g.deflt[i], g.bytes[i])
        if g.op[i] in (OP_DOT, OP_CONV) and g.operands[i]:
            t += node_ns(g, i, g.deflt[i], g.deflt[g.operands[i][0]],
                         g.deflt[g.operands[i][1]] if len(g.operands[i]) > 1 else ())
        elif g.op[i] in HEAVY_OPS:
            ins = sum(padded_bytes(g.shape[v], g.deflt[v], g.bytes[v]) for v in g.operands[i])
            t += (b + ins) / HBM_BW + LAUNCH_NS
        else:                                   # elementwise: mostly fused, half the traffic
            t += 0.5 * b / HBM_BW + 0.25 * LAUNCH_NS
    return t


# ----------------------------------------------------------------------------- layout

def layout_noise_free(nf, op, edges, cfg_ids, ncf):
    """Noise-free runtime (ns) of each layout config: float64 (C,)."""
    g = Graph(nf, op, edges)
    C, M = ncf.shape[0], len(cfg_ids)
    ids = [int(x) for x in cfg_ids]
    pos = {n: m for m, n in enumerate(ids)}
    total = np.full(C, base_ns(g, set(ids)))
    outs, ins, kerns = [], [], []     # per node: (perm list, per-config perm index)
    for m, i in enumerate(ids):
        blocks = (np.asarray(ncf[:, m, :]).astype(np.int64) + 1).clip(0, 7)   # values -1..6 -> 0..7
        keys = blocks @ (8 ** np.arange(18, dtype=np.int64))
        _, first, iv = np.unique(keys, return_index=True, return_inverse=True)
        uniq, iv = blocks[first] - 1, iv.reshape(-1)
        ops = g.operands[i]
        d0 = g.deflt[ops[0]] if ops else ()
        d1 = g.deflt[ops[1]] if len(ops) > 1 else ()
        o_l = [resolve(u[0:6], g.deflt[i]) for u in uniq]
        i_l = [resolve(u[6:12], d0) for u in uniq]
        k_l = [resolve(u[12:18] if len(d1) <= 2 else [-1] * 6, d1) for u in uniq]
        memo = {}
        for u in range(len(uniq)):
            key = (o_l[u], i_l[u], k_l[u])
            if key not in memo:
                memo[key] = node_ns(g, i, *key)
        cost = np.array([memo[(o_l[u], i_l[u], k_l[u])] for u in range(len(uniq))])
        # consumers that are not configurable expect the default layout: copy (fused if elementwise)
        cons = [u for u in g.users[i] if u not in pos]
        if cons:
            fused = all(g.op[u] not in HEAVY_OPS for u in cons)
            cost += np.array([copy_ns(g.shape[i], o_l[u], g.deflt[i], int(g.bytes[i]), fused)
                              for u in range(len(uniq))])
        # producers that are not configurable deliver their default layout
        for slot, lay in ((0, i_l), (1, k_l)):
            if len(ops) > slot and ops[slot] not in pos:
                p = ops[slot]
                fused = g.op[p] not in HEAVY_OPS and g.op[p] not in (OP_PARAM, OP_CONST)
                cost += np.array([copy_ns(g.shape[p], g.deflt[p], lay[u], int(g.bytes[p]), fused)
                                  for u in range(len(uniq))])
        total += cost[iv]
        for store, lay in ((outs, o_l), (ins, i_l), (kerns, k_l)):
            perms = sorted(set(lay))
            idx = np.array([perms.index(x) for x in lay], np.int64)
            store.append((perms, idx[iv]))
    # edges between two configurable nodes: producer's chosen output vs consumer's chosen input
    for m, i in enumerate(ids):
        for slot, v in enumerate(g.operands[i][:2]):
            if v not in pos:
                continue
            (pa, ia), (pb, ib) = outs[pos[v]], (ins[m] if slot == 0 else kerns[m])
            mat = np.array([[copy_ns(g.shape[v], a, b, int(g.bytes[v]), False) for b in pb]
                            for a in pa])
            total += mat[ia, ib]
    return total


# ----------------------------------------------------------------------------- tile

def _bounds(vals, shape, perm, nb):
    """Tile extents for a tensor from a config's 6 bounds (0 / missing = whole dim).

    The two minor-most dims cannot be split below the hardware (sublane,128) tile."""
    ext = [min(int(vals[j]), d) if j < len(vals) and vals[j] >= 1 else d for j, d in enumerate(shape)]
    for k, gran in zip(perm[:2], (LANE, sublane(nb))):
        ext[k] = min(shape[k], ceil_to(ext[k], gran))
    return ext


def _tile_pad(ext, perm, nb):
    return padded_bytes(tuple(ext), perm, nb)


def tile_setup(nf, op, edges):
    g = Graph(nf, op, edges)
    roots = np.nonzero(g.is_root)[0]
    root = int(roots[-1]) if len(roots) else g.n - 1
    params = sorted([i for i in range(g.n) if g.op[i] == OP_PARAM and g.shape[i]],
                    key=lambda i: -np.prod(g.shape[i]))
    heavy = [i for i in range(g.n) if g.op[i] in (OP_DOT, OP_CONV) and len(g.operands[i]) > 1]
    mxu_flops, vpu_ops = 0.0, 0.0
    for i in range(g.n):
        if g.op[i] in FREE_OPS or not g.shape[i]:
            continue
        if i in heavy:
            lhs, rhs, out = g.shape[g.operands[i][0]], g.shape[g.operands[i][1]], g.shape[i]
            if g.op[i] == OP_DOT and lhs and rhs:
                _, lc, _, _ = dot_roles(lhs, rhs, out)
                kk = float(np.prod([lhs[d] for d in lc]))
            else:
                cd, r = conv_dims(g.nf[i]), len(out)
                kk = float(np.prod(np.maximum(g.nf[i, 37:37 + max(r - 2, 0)], 1)))
                kk *= lhs[cd["in_f"]] if cd["in_f"] < len(lhs) else 1
                kk /= max(1.0, float(g.nf[i, 107]))
            mxu_flops += 2.0 * float(np.prod(out)) * kk
        else:
            vpu_ops += float(np.prod(g.shape[i]))
    return dict(g=g, root=root, inp=params[0] if params else None,
                ker=params[1] if len(params) > 1 else None, mxu=mxu_flops, vpu=vpu_ops)


def tile_ns(s, cfg):
    """Noise-free time of one fused kernel under one tile config (24 floats)."""
    g, root = s["g"], s["root"]
    out, nb = g.shape[root], g.bytes[root]
    to = _bounds(cfg[8:14], out, g.deflt[root], nb)
    n_out = int(np.prod([-(-d // t) for d, t in zip(out, to)])) if out else 1
    out_tile = _tile_pad(to, g.deflt[root], nb) if out else float(nb)
    steps, ws = n_out, 2 * out_tile
    traffic = n_out * out_tile
    for key, lo in (("inp", 16), ("ker", 0)):
        p = s[key]
        if p is None:
            continue
        sh = g.shape[p]
        ext = _bounds(cfg[lo:lo + 6], sh, g.deflt[p], g.bytes[p])
        full = padded_bytes(sh, g.deflt[p], g.bytes[p])
        t = _tile_pad(ext, g.deflt[p], g.bytes[p])
        need = int(np.prod([-(-d // e) for d, e in zip(sh, ext)]))
        steps = max(steps, need)
        traffic += full if need == 1 else steps * t     # resident if whole, else streamed per step
        ws += 2 * t
    # MXU fill: small output tiles under-use the 128x128 array
    eo = eff_perm(out, g.deflt[root]) if out else ()
    tn = to[eo[0]] if eo else 1
    tm = to[eo[1]] if len(eo) > 1 else 1
    fill = (tn / ceil_to(tn, LANE)) * (tm / ceil_to(tm, SUB)) * min(1.0, tm * tn / (LANE * LANE)) ** 0.25
    # requested extents that are not whole hardware tiles need masked loads/stores
    masked = sum(1 for v, d in zip(cfg[8:14], out) if 1 <= v < d and v % SUB) if out else 0
    compute = (s["mxu"] / (PEAK_MXU * max(fill, 0.01)) + s["vpu"] / PEAK_VPU) * (1.0 + 0.15 * masked)
    mem = traffic / HBM_BW
    step = max(compute, mem) / steps + STEP_NS
    t = steps * step + LAUNCH_NS + min(traffic / steps, ws / 2) / HBM_BW   # prologue DMA
    if ws > VMEM:                                # spill: tile does not fit the scoped VMEM
        t *= 1.0 + 0.6 * (ws / VMEM - 1.0) ** 0.7
    return t


def tile_default_cfg(s):
    """The compiler's own tile choice: lane-dense minor tile, modest second-minor tile."""
    g, root = s["g"], s["root"]
    out = g.shape[root]
    cfg = np.zeros(24)
    if not out:
        return cfg
    to = [1] * len(out)
    budget = 512 * 1024 // int(g.bytes[root])      # elements per output tile
    for k in g.deflt[root]:                         # fill from the minor-most dim outwards
        to[k] = max(1, min(out[k], budget))
        budget //= to[k]
    for j, t in enumerate(to[:6]):
        cfg[8 + j] = t
    # operands: dims whose size matches a tiled output dim follow that tile, others whole
    for key, lo in (("inp", 16), ("ker", 0)):
        p = s[key]
        if p is None:
            continue
        for j, d in enumerate(g.shape[p][:6]):
            m = [to[k] for k in range(len(out)) if out[k] == d and to[k] < d]
            cfg[lo + j] = m[0] if m else d
    return cfg


# ----------------------------------------------------------------------------- noise

def measure(rng, nf_ns, sigma):
    """Measured runtimes: lognormal jitter, rare slow outliers, a 1 us floor; int64 ns."""
    nf_ns = np.asarray(nf_ns, np.float64)
    z = rng.standard_normal(nf_ns.shape)
    slow = rng.random(nf_ns.shape) < 0.01
    bump = 1.0 + slow * rng.uniform(0.05, 0.3, nf_ns.shape)
    return np.maximum(np.rint(nf_ns * np.exp(sigma * z) * bump), 1000).astype(np.int64)


def tile_sigma(nf_ns):
    return 0.012 + 0.03 * np.exp(-np.asarray(nf_ns) / 20000.0)


LAYOUT_SIGMA = 0.005
