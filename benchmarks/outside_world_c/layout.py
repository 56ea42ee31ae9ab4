"""Layout world: static analysis of a program, layout-config generation, and the cost model that
prices a whole program under a layout configuration (vectorised over configurations)."""
import numpy as np

from . import tpu
from .tpu import PERMS, PERM_ID, pid, desc, padded_elems, major_penalty, elem_bytes
from .hlo import ELEMENTWISE

CONFIG_OPS = ("convolution", "dot", "reshape")
SAME_RANK_SRC0 = ("reduce-window", "select-and-scatter", "slice", "pad", "dynamic-slice",
                  "dynamic-update-slice", "reverse")
OPCOST = {"divide": 4.0, "exponential": tpu.EUP_COST, "log": tpu.EUP_COST, "tanh": tpu.EUP_COST,
          "logistic": tpu.EUP_COST + 1, "rsqrt": tpu.EUP_COST, "sqrt": tpu.EUP_COST, "power": 8.0}


def _act_default(shape, fdim, bdim, spatial):
    """Activation layout preference: feature dim in lanes, batch in sublanes -- unless the feature
    dim is narrow and a wide spatial dim exists, then that spatial dim takes the lanes."""
    sp = sorted(spatial, reverse=True)
    F = shape[fdim]
    if sp:
        w = sp[0]
        if F < 48 and shape[w] >= 2 * F and shape[w] >= 32:
            return tuple([w, fdim, bdim] + sp[1:])
    return tuple([fdim, bdim] + sp)


class Analysis:
    """Everything about one program that does not depend on the layout configuration."""

    def __init__(self, g):
        self.g = g
        n = len(g.ins)
        self.n = n
        self.cons = [[] for _ in range(n)]
        for ins in g.ins:
            for k, o in enumerate(ins.operands):
                self.cons[o].append((ins.id, k))
        self.mult = np.array([g.comp_mult.get(i.comp, 1) for i in g.ins], dtype=np.float64)
        self.root_set = set(g.roots.values())
        self._categorise()
        self._vars()
        self._sources()
        self._groups()
        self._edges()

    # ------------------------------------------------------------------
    def _categorise(self):
        g = self.g
        cat = [None] * self.n
        for ins in g.ins:
            op, r = ins.op, ins.rank
            if op in CONFIG_OPS:
                c = "config"
            elif ins.dtype in ("tuple", "token") or op in ("tuple", "while"):
                c = "none"
            elif r <= 1:
                c = "none"
            elif op in ("parameter", "gather", "scatter", "get-tuple-element"):
                c = "fixed"
            elif op in ("broadcast", "iota", "constant"):
                c = "adapt"
            elif op in ELEMENTWISE or op == "concatenate":
                srcs = [o for o in ins.operands if g[o].rank == r and cat[o] in ("config", "flex", "fixed")]
                c = "flex" if srcs else "adapt"
            elif op in SAME_RANK_SRC0:
                c = "flex" if cat[ins.operands[0]] in ("config", "flex", "fixed") else "adapt"
            elif op in ("transpose", "reduce"):
                c = "flex" if cat[ins.operands[0]] in ("config", "flex", "fixed") else "fixed"
            else:
                c = "fixed"
            cat[ins.id] = c
        self.cat = cat

    def _vars(self):
        """var 0 is the constant var (domain size 1). Each configurable node has out/in0/in1 vars."""
        g = self.g
        self.var_rank = [0]
        self.var_shape = [()]
        self.var_default = [0]
        self.var_owner = [(-1, "const")]
        self.cfg_nodes = [i.id for i in g.ins if self.cat[i.id] == "config"]
        self.cfg_vars = {}
        for v in self.cfg_nodes:
            ins = g[v]
            vs = {}
            for role in ("out", "in0", "in1"):
                if role == "in1" and ins.op == "reshape":
                    continue
                r = ins.rank if role == "out" else g[ins.operands[0 if role == "in0" else 1]].rank
                vs[role] = len(self.var_rank)
                self.var_rank.append(r)
                self.var_shape.append(ins.shape if role == "out" else g[ins.operands[0 if role == "in0" else 1]].shape)
                self.var_default.append(None)
                self.var_owner.append((v, role))
            self.cfg_vars[v] = vs
        self.nvars = len(self.var_rank)

    def _default_perm(self, v, role):
        """The compiler's own preference for a configurable node's layouts (a role heuristic)."""
        g = self.g
        ins = g[v]
        if ins.op == "convolution":
            dn = ins.attrs["conv_dims"]
            if role == "out":
                return _act_default(ins.shape, dn["of"], dn["ob"], dn["os"])
            elif role == "in0":
                return _act_default(g[ins.operands[0]].shape, dn["if_"], dn["ib"], dn["is_"])
            else:
                m = [dn["ko"], dn["ki"]] + sorted(dn["ks"], reverse=True)
            return tuple(m)
        if ins.op == "dot":
            lb, rb, lc, rc = ins.attrs["dot_dims"]
            if role == "out":
                return desc(ins.rank)
            if role == "in0":
                r = g[ins.operands[0]].rank
                free = [d for d in range(r) if d not in lc and d not in lb]
                return tuple(sorted(lc, reverse=True) + sorted(free, reverse=True) + sorted(lb, reverse=True))
            r = g[ins.operands[1]].rank
            if list(rc) == [r - 1]:
                return desc(r)
            free = [d for d in range(r) if d not in rc and d not in rb]
            return tuple(sorted(free, reverse=True) + sorted(rc, reverse=True) + sorted(rb, reverse=True))
        return None

    def _sources(self):
        """src[v] = (var, table): layout perm id of v = table[perm id of var]."""
        g = self.g
        src = [None] * self.n
        const = lambda r, p=None: (0, np.array([PERM_ID[r][p if p is not None else desc(r)]], dtype=np.int32))
        for ins in g.ins:
            v, c, r = ins.id, self.cat[ins.id], ins.rank
            if c == "config":
                vs = self.cfg_vars[v]
                for role, var in vs.items():
                    if ins.op == "reshape":
                        continue
                    self.var_default[var] = PERM_ID[self.var_rank[var]][self._default_perm(v, role)]
                if ins.op == "reshape":
                    o = ins.operands[0]
                    if self.cat[o] in ("config", "flex", "fixed"):
                        k, t = src[o]
                        dp = int(t[self.var_default[k]]) if k else int(t[0])
                    else:
                        dp = PERM_ID[g[o].rank][desc(g[o].rank)]
                    self.var_default[vs["in0"]] = dp
                    tb = tpu.reshape_bitcast_table(g[o].shape, ins.shape, ins.dtype)
                    self.var_default[vs["out"]] = int(tb[dp])
                src[v] = (vs["out"], np.arange(len(PERMS[r]), dtype=np.int32))
            elif c == "fixed":
                src[v] = const(r)
            elif c == "none":
                src[v] = None
            elif c == "flex":
                if ins.op in ELEMENTWISE or ins.op == "concatenate":
                    cands = [o for o in ins.operands if g[o].rank == r and self.cat[o] in ("config", "flex", "fixed")]
                    best = max(cands, key=lambda o: (g[o].elems, -cands.index(o)))
                    src[v] = src[best]
                    self.src_operand = getattr(self, "src_operand", {})
                    self.src_operand[v] = best
                elif ins.op in SAME_RANK_SRC0:
                    src[v] = src[ins.operands[0]]
                elif ins.op == "transpose":
                    k, t = src[ins.operands[0]]
                    src[v] = (k, tpu.tbl_transpose(tuple(ins.attrs["dimensions"]))[t])
                elif ins.op == "reduce":
                    k, t = src[ins.operands[0]]
                    if r == 0:
                        src[v] = None
                    else:
                        src[v] = (k, tpu.tbl_reduce(g[ins.operands[0]].rank, tuple(ins.attrs["dimensions"]))[t])
        # adaptable nodes: take the layout their first consumer wants (reverse pass)
        for v in range(self.n - 1, -1, -1):
            if self.cat[v] != "adapt":
                continue
            r = g[v].rank
            got = None
            for (c, k) in sorted(self.cons[v]):
                ci = g[c]
                if self.cat[c] == "config":
                    role = "in0" if k == 0 else ("in1" if k == 1 else None)
                    if role in self.cfg_vars[c]:
                        got = (self.cfg_vars[c][role], np.arange(len(PERMS[r]), dtype=np.int32))
                        break
                elif self.cat[c] in ("flex", "adapt") and src[c] is not None:
                    if ci.op == "transpose":
                        kk, t = src[c]
                        got = (kk, tpu.tbl_transpose_inv(tuple(ci.attrs["dimensions"]))[t])
                        break
                    if ci.rank == r and ci.op not in ("broadcast", "reduce"):
                        got = src[c]
                        break
            src[v] = got if got is not None else const(r)
        self.src = src
        if not hasattr(self, "src_operand"):
            self.src_operand = {}

    def default_perm_of(self, v):
        s = self.src[v]
        if s is None:
            return None
        k, t = s
        return int(t[self.var_default[k] if k else 0])

    # ------------------------------------------------------------------
    def _groups(self):
        """Static fusion groups of flexible/adaptable nodes (same layout source, joined by edges)."""
        g = self.g
        members = [v for v in range(self.n) if self.cat[v] in ("flex", "adapt")]
        parent = {v: v for v in members}

        def find(x):
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for v in members:
            for o in g[v].operands:
                if o in parent and self.src[o][0] == self.src[v][0] and g[o].op != "reduce" \
                        and g[o].comp == g[v].comp:
                    ra, rb = find(o), find(v)
                    if ra != rb:
                        parent[rb] = ra
        groups = {}
        for v in members:
            groups.setdefault(find(v), []).append(v)
        self.group_of = {v: find(v) for v in members}
        self.groups = [sorted(m) for _, m in sorted(groups.items())]

    def _is_materialised(self, v):
        if v in self.root_set:
            return True
        gv = self.group_of.get(v)
        for (c, k) in self.cons[v]:
            if self.g[c].op in ("tuple", "while"):
                return True
            if self.group_of.get(c) != gv:
                return True
            if self.g[v].op == "reduce":
                return True
        return False

    def _edges(self):
        """Layout requirements on edges: (producer, required (var, table)) pairs that may need a copy."""
        g = self.g
        req = {}
        for ins in g.ins:
            c = ins.id
            cc = self.cat[c]
            for k, o in enumerate(ins.operands):
                if self.cat[o] in ("none",) or self.src[o] is None or g[o].rank < 2:
                    continue
                need = None
                if cc == "config":
                    role = "in0" if k == 0 else ("in1" if k == 1 else None)
                    if role in self.cfg_vars[c]:
                        need = (self.cfg_vars[c][role], np.arange(len(PERMS[g[o].rank]), dtype=np.int32))
                elif cc in ("flex", "adapt") and self.src[c] is not None:
                    if ins.op == "broadcast":
                        kk, t = self.src[c]
                        need = (kk, tpu.tbl_restrict(ins.rank, tuple(ins.attrs["dimensions"]))[t])
                    elif ins.op in ("transpose", "reduce"):
                        need = None
                    elif ins.op in SAME_RANK_SRC0 and k == 0:
                        need = None
                    elif g[o].rank == ins.rank and self.src_operand.get(c) != o:
                        need = self.src[c]
                if need is None:
                    continue
                ko, to = self.src[o]
                if ko == need[0] and np.array_equal(to, need[1]):
                    continue
                if ko == 0 and need[0] == 0 and to[0] == need[1][0]:
                    continue
                key = (o, need[0], need[1].tobytes())
                if key not in req:
                    req[key] = (o, need[0], need[1], self.mult[c])
        self.req_edges = list(req.values())


# ======================================================================================
# cost model
# ======================================================================================

def _bytes_vec(shape, dtype):
    return padded_elems(tuple(shape), dtype) * elem_bytes(dtype) * major_penalty(len(shape))


class CostModel:
    def __init__(self, an):
        self.an = an
        g = an.g
        self.g = g
        self.const = 0.0
        self._group_tables()
        self._copy_terms()
        self._cfg_terms()

    # ---------------- fused loop/reduce kernels ----------------
    def _node_vectors(self, v, k_dom):
        """vpu, xlu element-op arrays (over the group var domain) for one member node."""
        an, g = self.an, self.g
        ins = g[v]
        kv, tv = an.src[v]
        pv = tv if kv else np.zeros(k_dom, dtype=np.int32) + tv[0]
        ls, ss = tpu.lane_sub(ins.shape)
        pe = padded_elems(ins.shape, ins.dtype)[pv]
        lane = ls[pv]
        sub = ss[pv]
        op = ins.op
        vpu = np.zeros(k_dom); xlu = np.zeros(k_dom)
        if op in ELEMENTWISE:
            vpu += pe * OPCOST.get(op, 1.0)
        elif op in ("broadcast", "iota", "constant"):
            vpu += pe * 0.5
            if op == "broadcast":
                dims = ins.attrs["dimensions"]
                if len(dims) >= 1:
                    inlane = np.isin(lane, dims)
                    xlu += np.where(inlane, 0.0, pe * 0.12)
                    insub = np.isin(sub, dims)
                    xlu += np.where(~inlane & insub, pe * 0.2, 0.0)
        elif op == "reduce":
            o = ins.operands[0]
            ko, to = an.src[o]
            po = to if ko else np.zeros(k_dom, dtype=np.int32) + to[0]
            pin = padded_elems(g[o].shape, g[o].dtype)[po]
            lo_, so_ = tpu.lane_sub(g[o].shape)
            dims = ins.attrs["dimensions"]
            vpu += pin
            xlu += np.where(np.isin(lo_[po], dims), pin / 6.0, 0.0)
            vpu += np.where(np.isin(so_[po], dims), pin * 0.3, 0.0)
        elif op in ("reduce-window", "select-and-scatter"):
            wnd = ins.attrs["window"]
            sizes = np.array([w["size"] for w in wnd] + [1], dtype=np.float64)
            strides = np.array([w["stride"] for w in wnd] + [1], dtype=np.float64)
            f = 2.0 if op == "select-and-scatter" else 1.0
            vpu += pe * sizes.prod() * f
            xlu += pe * f * np.where(sizes[lane] > 1, sizes[lane] * 0.6, 0.0)
            xlu += pe * f * np.where(strides[lane] > 1, 0.8, 0.0)
            vpu += pe * f * np.where(sizes[sub] > 1, sizes[sub] * 0.3, 0.0)
        elif op in ("slice", "pad", "dynamic-slice", "dynamic-update-slice", "concatenate", "reverse"):
            vpu += pe * 0.5
            moved = np.zeros(ins.rank + 1, dtype=bool)
            if op == "slice":
                st, sd, lm = ins.attrs["slice"]
                moved = np.array([(a % 128 != 0) or (s != 1) for a, s in zip(st, sd)] + [False])
            elif op == "pad":
                lo, hi = ins.attrs["pad"]
                moved = np.array([a % 128 != 0 for a in lo] + [False])
            elif op == "concatenate":
                d = ins.attrs["dimensions"][0]
                moved[d] = any(g[o].shape[d] % 128 for o in ins.operands)
            elif op in ("dynamic-slice", "dynamic-update-slice"):
                big = g[ins.operands[0]].shape
                small = ins.shape if op == "dynamic-slice" else g[ins.operands[1]].shape
                moved = np.array([a != b for a, b in zip(big, small)] + [False])
            xlu += np.where(moved[lane], pe, 0.0)
            vpu += np.where(moved[sub], pe * 0.25, 0.0)
        elif op == "transpose":
            pass   # bitcast under propagated layouts
        else:
            vpu += pe
        return pv, vpu, xlu

    def _group_tables(self):
        an, g = self.an, self.g
        self.group_terms = []
        for mem in an.groups:
            k = an.src[mem[0]][0]
            dom = len(PERMS[an.var_rank[k]]) if k else 1
            mset = set(mem)
            vpu = np.zeros(dom); xlu = np.zeros(dom); hbm = np.zeros(dom)
            for v in mem:
                pv, a, b = self._node_vectors(v, dom)
                vpu += a; xlu += b
                ins = g[v]
                if an._is_materialised(v):
                    hbm += _bytes_vec(ins.shape, ins.dtype)[pv]
                for o in set(ins.operands):
                    if o in mset:
                        continue
                    oi = g[o]
                    if oi.rank < 2 or an.src[o] is None:
                        hbm += oi.nbytes
                        continue
                    if o == an.src_operand.get(v) or ins.op in ("transpose", "reduce") or \
                            (ins.op in SAME_RANK_SRC0 and o == ins.operands[0]):
                        ko, to = an.src[o]
                        po = to if ko else np.zeros(dom, dtype=np.int32) + to[0]
                        if ko and ko != k:
                            po = np.zeros(dom, dtype=np.int32) + to[an.var_default[ko]]
                        hbm += _bytes_vec(oi.shape, oi.dtype)[po]
                    elif oi.rank == ins.rank:
                        hbm += _bytes_vec(oi.shape, oi.dtype)[pv]
                    else:
                        hbm += oi.nbytes
            t = np.maximum.reduce([hbm / tpu.HBM_BW, vpu / tpu.VPU_RATE + 0.5 * xlu / tpu.XLU_RATE,
                                   xlu / tpu.XLU_RATE]) + tpu.LAUNCH
            t = t * an.mult[mem[0]] * 1e9
            if k == 0:
                self.const += float(t[0])
            else:
                self.group_terms.append((k, t))
        # cheap rank<=1 work (fused everywhere, no launch of its own)
        for ins in g.ins:
            if an.cat[ins.id] == "none" and ins.op not in ("tuple", "while", "parameter", "get-tuple-element", "constant"):
                self.const += an.mult[ins.id] * 1e9 * (ins.elems * OPCOST.get(ins.op, 1.0) / tpu.VPU_RATE + 2e-8)
            if ins.op == "gather":
                self.const += 1e9 * (tpu.LAUNCH + 2.0 * ins.nbytes / tpu.HBM_BW + ins.elems / ins.shape[-1] * 3e-9)
            if ins.op == "scatter":
                upd = g[ins.operands[2]]
                self.const += 1e9 * (tpu.LAUNCH + (ins.nbytes + 3 * upd.nbytes) / tpu.HBM_BW
                                     + upd.elems / upd.shape[-1] * 6e-9)

    # ---------------- layout copies inserted by the compiler ----------------
    def _copy_table(self, shape, dtype):
        r = len(shape)
        P = PERMS[r]
        bv = _bytes_vec(shape, dtype)
        pe = padded_elems(tuple(shape), dtype)
        lane, sub = tpu.lane_sub(tuple(shape))
        hbm = (bv[:, None] + bv[None, :]) / tpu.HBM_BW
        lane_change = lane[:, None] != lane[None, :]
        sub_change = sub[:, None] != sub[None, :]
        work = np.maximum(pe[:, None], pe[None, :])
        xlu = np.where(lane_change, work, np.where(sub_change, work * 0.3, work * 0.05)) / tpu.XLU_RATE
        t = np.maximum(hbm * np.where(lane_change, 1.15, 1.0), xlu) + tpu.LAUNCH_COPY
        np.fill_diagonal(t, 0.0)
        return t * 1e9

    def _copy_terms(self):
        an, g = self.an, self.g
        self.copy_terms = []
        cache = {}
        for (o, kr, tr, mult) in an.req_edges:
            oi = g[o]
            key = (oi.shape, oi.dtype)
            if key not in cache:
                cache[key] = self._copy_table(oi.shape, oi.dtype)
            ko, to = an.src[o]
            self.copy_terms.append((ko, to, kr, tr, cache[key], mult))

    # ---------------- configurable nodes ----------------
    def _cfg_terms(self):
        an, g = self.an, self.g
        self.cfg_terms = []
        for v in an.cfg_nodes:
            ins = g[v]
            vs = an.cfg_vars[v]
            single = [c for (c, k) in an.cons[v]]
            fusable = (len(single) == 1 and an.cat[single[0]] == "flex" and g[single[0]].op in ELEMENTWISE
                       and an.src[single[0]][0] == vs["out"])
            self.cfg_terms.append((v, ins.op, vs, fusable, an.mult[v]))

    def _conv_cost(self, v, P_out, P_in, P_k, fusable):
        g = self.g
        ins = g[v]
        x, k = ins.operands
        sx, sk, so = g[x].shape, g[k].shape, ins.shape
        dn = ins.attrs["conv_dims"]
        fgc, bgc = ins.attrs["fgc"], ins.attrs["bgc"]
        wnd = ins.attrs["window"]
        r = len(sx)
        lane_x, sub_x = (a[P_in] for a in tpu.lane_sub(sx))
        lane_k = tpu.lane_sub(sk)[0][P_k]
        lane_o = tpu.lane_sub(so)[0][P_out]
        pin = padded_elems(sx, g[x].dtype)[P_in]
        pk = padded_elems(sk, g[k].dtype)[P_k]
        pout = padded_elems(so, ins.dtype)[P_out]
        bx = _bytes_vec(sx, g[x].dtype)[P_in]
        bk = _bytes_vec(sk, g[k].dtype)[P_k]
        bo = _bytes_vec(so, ins.dtype)[P_out]
        wsz = np.array([w["size"] for w in wnd], dtype=np.float64)
        wstr = np.array([w["stride"] for w in wnd], dtype=np.float64)
        Wp = float(wsz.prod())
        K = sx[dn["if_"]] / fgc
        N = so[dn["of"]] / fgc
        M = float(so[dn["ob"]]) * float(np.prod([so[d] for d in dn["os"]]))
        f32 = g[x].dtype == "f32"
        xlu = np.zeros(len(P_out))
        spatial_x = list(dn["is_"])
        if (fgc > 1 and K == 1) or bgc > 1:
            work = float(np.prod(so)) * Wp * (sx[dn["if_"]] / fgc) * 2.0
            util = pin / float(np.prod(sx))
            vpu = work * util
            for i, d in enumerate(spatial_x):
                xlu += np.where(lane_x == d, pin * min(wsz[i], 8.0) * 0.5, 0.0)
            xlu += np.where(lane_x == dn["ib"], pin, 0.0)
            xlu += np.where(lane_o != dn["of"], pout, 0.0)
            comp = vpu / tpu.VPU_RATE
        else:
            ktiles = np.full(len(P_out), Wp * np.ceil(K / 128.0))
            for i, d in enumerate(spatial_x):
                if wsz[i] > 1:
                    packed = Wp / wsz[i] * np.ceil(K * wsz[i] / 128.0)
                    on = lane_x == d
                    ktiles = np.where(on, packed, ktiles)
                    xlu += np.where(on, pin * min(wsz[i], 4.0) * 0.5, 0.0)
                else:
                    xlu += np.where(lane_x == d, pin, 0.0)
            xlu += np.where(lane_x == dn["ib"], pin * 1.2, 0.0)
            for i, d in enumerate(spatial_x):
                if wstr[i] > 1:
                    xlu += np.where((sub_x == d) & (lane_x == dn["if_"]), pin * 0.25, 0.0)
            xlu += np.where(lane_o != dn["of"], pout, 0.0)
            xlu += np.where(lane_k == dn["ko"], 0.0, np.where(lane_k == dn["ki"], pk * 0.5, pk * 1.5))
            ntiles = np.ceil(N / 128.0)
            mrows = np.ceil(M / 8.0) * 8.0
            cyc = fgc * mrows * ktiles * ntiles / tpu.N_MXU * (3.0 if f32 else 1.0)
            cyc += fgc * ktiles * ntiles * 128.0 * np.ceil(mrows / 4096.0)
            comp = cyc / tpu.CLK
        hbm = bx + bk + bo
        if fusable:
            hbm = np.where(lane_o == dn["of"], hbm - bo, hbm)
        t = np.maximum.reduce([comp + 0.35 * xlu / tpu.XLU_RATE, hbm / tpu.HBM_BW, xlu / tpu.XLU_RATE])
        t = t + tpu.LAUNCH_CONV
        if fusable:
            t = t - np.where(lane_o == dn["of"], 0.6 * bo / tpu.HBM_BW, 0.0)
        return t * 1e9

    def _dot_cost(self, v, P_out, P_a, P_b, fusable):
        g = self.g
        ins = g[v]
        a, b = ins.operands
        sa, sb, so = g[a].shape, g[b].shape, ins.shape
        lb, rb, lc, rc = ins.attrs["dot_dims"]
        ra, rbk, ro = len(sa), len(sb), len(so)
        la_free = [d for d in range(ra) if d not in lc and d not in lb]
        rb_free = [d for d in range(rbk) if d not in rc and d not in rb]
        Bt = float(np.prod([sa[d] for d in lb])) if lb else 1.0
        M = float(np.prod([sa[d] for d in la_free])) if la_free else 1.0
        K = float(np.prod([sa[d] for d in lc])) if lc else 1.0
        N = float(np.prod([sb[d] for d in rb_free])) if rb_free else 1.0
        nb, nl = len(lb), len(la_free)

        def lane_of(shape, P, r):
            return tpu.lane_sub(tuple(shape))[0][P]
        lane_a = lane_of(sa, P_a, ra)
        lane_b = lane_of(sb, P_b, rbk)
        lane_o = lane_of(so, P_out, ro)
        pa = padded_elems(sa, g[a].dtype)[P_a]
        pb = padded_elems(sb, g[b].dtype)[P_b]
        po = padded_elems(so, ins.dtype)[P_out]
        cat_a = np.where(np.isin(lane_a, lc), 0, np.where(np.isin(lane_a, la_free), 1, 2))   # c, f, b
        cat_b = np.where(np.isin(lane_b, rc), 0, np.where(np.isin(lane_b, rb_free), 1, 2))
        o_rf = lane_o >= nb + nl
        o_lf = (lane_o >= nb) & ~o_rf
        f32 = g[a].dtype == "f32"
        mult = 3.0 if f32 else 1.0
        cyc_n = Bt * np.ceil(M / 8.0) * 8.0 * np.ceil(K / 128.0) * np.ceil(N / 128.0)
        cyc_t = Bt * np.ceil(N / 8.0) * 8.0 * np.ceil(K / 128.0) * np.ceil(M / 128.0)
        cyc = np.where(o_lf, cyc_t, cyc_n) * mult / tpu.N_MXU
        wl = Bt * np.ceil(K / 128.0) * np.where(o_lf, np.ceil(M / 128.0), np.ceil(N / 128.0)) * 128.0
        cyc = cyc + wl
        xlu = np.zeros(len(P_out))
        # normal: lhs streamed (wants contracting in lanes), rhs stationary (wants free in lanes)
        xa_n = np.where(cat_a == 0, 0.0, np.where(cat_a == 1, pa, pa * 1.5))
        xb_n = np.where(cat_b == 1, 0.0, np.where(cat_b == 0, pb * 0.4, pb * 1.5))
        # transposed: rhs streamed (contracting in lanes), lhs stationary (free in lanes)
        xa_t = np.where(cat_a == 1, 0.0, np.where(cat_a == 0, pa * 0.4, pa * 1.5))
        xb_t = np.where(cat_b == 0, 0.0, np.where(cat_b == 1, pb, pb * 1.5))
        xlu += np.where(o_lf, xa_t + xb_t, xa_n + xb_n)
        xlu += np.where(o_rf | o_lf, 0.0, po * 1.5)
        if ra == 1 or rbk == 1:
            xlu *= 0.0
        ba = _bytes_vec(sa, g[a].dtype)[P_a]
        bb = _bytes_vec(sb, g[b].dtype)[P_b]
        bo = _bytes_vec(so, ins.dtype)[P_out]
        hbm = ba + bb + bo
        if fusable:
            hbm = np.where(o_rf, hbm - bo, hbm)
        t = np.maximum.reduce([cyc / tpu.CLK + 0.35 * xlu / tpu.XLU_RATE, hbm / tpu.HBM_BW, xlu / tpu.XLU_RATE])
        t = t + tpu.LAUNCH_CONV
        if fusable:
            t = t - np.where(o_rf, 0.6 * bo / tpu.HBM_BW, 0.0)
        return t * 1e9

    def _reshape_cost(self, v, P_out, P_in):
        g = self.g
        ins = g[v]
        o = ins.operands[0]
        sa, sb = g[o].shape, ins.shape
        dt = ins.dtype
        pairs = np.stack([P_in, P_out], 1)
        uniq, inv = np.unique(pairs, axis=0, return_inverse=True)
        bi = _bytes_vec(sa, dt)
        bo = _bytes_vec(sb, dt)
        pi = padded_elems(sa, dt)
        po = padded_elems(sb, dt)
        res = np.zeros(len(uniq))
        for u, (a, b) in enumerate(uniq):
            if tpu.reshape_is_bitcast(sa, sb, int(a), int(b), dt):
                res[u] = 0.04e-6
                continue
            la = tpu._minor_sizes(sa, PERMS[len(sa)][a])[0]
            lb_ = tpu._minor_sizes(sb, PERMS[len(sb)][b])[0]
            work = max(pi[a], po[b])
            xl = work / tpu.XLU_RATE * (1.0 if la != lb_ else 0.3)
            res[u] = tpu.LAUNCH_COPY + max((bi[a] + bo[b]) / tpu.HBM_BW, xl)
        return res[inv.reshape(-1)] * 1e9

    # ---------------- evaluation ----------------
    def evaluate(self, V):
        """V: int array (c, nvars) of permutation ids per var. Returns noise-free runtimes (ns)."""
        c = V.shape[0]
        tot = np.full(c, self.const)
        for k, t in self.group_terms:
            tot += t[V[:, k]]
        for (ko, to, kr, tr, tab, mult) in self.copy_terms:
            a = to[V[:, ko]] if ko else np.full(c, to[0])
            b = tr[V[:, kr]] if kr else np.full(c, tr[0])
            tot += tab[a, b] * mult
        for (v, op, vs, fusable, mult) in self.cfg_terms:
            Po = V[:, vs["out"]]
            if op == "convolution":
                tot += mult * self._conv_cost(v, Po, V[:, vs["in0"]], V[:, vs["in1"]], fusable)
            elif op == "dot":
                tot += mult * self._dot_cost(v, Po, V[:, vs["in0"]], V[:, vs["in1"]], fusable)
            else:
                tot += mult * self._reshape_cost(v, Po, V[:, vs["in0"]])
        return tot


# ======================================================================================
# configurations
# ======================================================================================

def resolve(an, feat):
    """feat: int8 (c, nc, 18) config blocks -> V (c, nvars) permutation ids."""
    g = an.g
    c = feat.shape[0]
    V = np.zeros((c, an.nvars), dtype=np.int32)
    for j, v in enumerate(an.cfg_nodes):
        vs = an.cfg_vars[v]
        ins = g[v]
        order = ["in0", "in1", "out"]
        for role in order:
            if role not in vs:
                continue
            var = vs[role]
            r = an.var_rank[var]
            lo = {"out": 0, "in0": 6, "in1": 12}[role]
            width = 2 if role == "in1" else 6
            blk = feat[:, j, lo:lo + width]
            if r == 0:
                V[:, var] = 0
                continue
            if ins.op == "reshape" and role == "out":
                tb = tpu.reshape_bitcast_table(g[ins.operands[0]].shape, ins.shape, ins.dtype)
                keyarr = np.concatenate([blk.astype(np.int32), V[:, vs["in0"]][:, None]], 1)
                uniq, inv = np.unique(keyarr, axis=0, return_inverse=True)
                res = np.zeros(len(uniq), dtype=np.int32)
                for u, row in enumerate(uniq):
                    dflt = tuple(int(x) for x in PERMS[r][tb[row[-1]]])
                    part = [int(x) for x in row[:-1] if x >= 0]
                    res[u] = PERM_ID[r][tpu.complete(part, dflt)]
                V[:, var] = res[inv.reshape(-1)]
                continue
            dflt = tuple(int(x) for x in PERMS[r][an.var_default[var]])
            uniq, inv = np.unique(blk, axis=0, return_inverse=True)
            res = np.zeros(len(uniq), dtype=np.int32)
            for u, row in enumerate(uniq):
                part = [int(x) for x in row if x >= 0]
                res[u] = PERM_ID[r][tpu.complete(part, dflt)]
            V[:, var] = res[inv.reshape(-1)]
    return V


def _rand_block(rng, r, width, p_full):
    blk = [-1] * width
    if r == 0:
        return blk
    perm = list(rng.permutation(r))
    if width == 2 or rng.random() > p_full:
        k = min(2, r, width)
    else:
        k = r
    blk[:k] = perm[:k]
    return blk


def random_configs(an, rng, n):
    """Broad random search: each config perturbs a random fraction of the nodes; a perturbed
    block is either a partial (two minor-most dims) or a full minor_to_major permutation."""
    nc = len(an.cfg_nodes)
    feat = np.full((n, nc, 18), -1, dtype=np.int8)
    q = rng.beta(1.1, 1.6, size=n)
    p_keep = rng.uniform(0.1, 0.5, size=n)
    p_full = rng.uniform(0.15, 0.6, size=n)
    for j, v in enumerate(an.cfg_nodes):
        touched = rng.random(n) < q
        vs = an.cfg_vars[v]
        for role, lo, w in (("out", 0, 6), ("in0", 6, 6), ("in1", 12, 2)):
            if role not in vs:
                continue
            r = an.var_rank[vs[role]]
            on = touched & (rng.random(n) >= p_keep)
            if r == 0 or not on.any():
                continue
            perms = np.argsort(rng.random((n, r)), axis=1).astype(np.int8)
            full = (rng.random(n) < p_full) & (w == 6)
            k2 = min(2, r, w)
            blk = np.full((n, w), -1, dtype=np.int8)
            blk[:, :k2] = perms[:, :k2]
            if w == 6:
                blk[full, :r] = perms[full, :r]
            feat[on, j, lo:lo + w] = blk[on]
    return feat


def _near_default_block(rng, an, var, width):
    r = an.var_rank[var]
    d = list(PERMS[r][an.var_default[var]]) if r else []
    blk = [-1] * width
    if r == 0:
        return blk
    u = rng.random()
    if r == 1:
        blk[0] = 0
        return blk
    shape = an.var_shape[var]
    big = [x for x in d if shape[x] >= 16]
    if u >= 0.85 and len(big) < 2:
        u = 0.0
    if u < 0.35:                       # restate the default's two minor-most dims
        blk[:2] = d[:2]
    elif u < 0.85 and (u >= 0.65 or width == 2 or r <= 2):
        others = [x for x in d[1:] if shape[x] >= 8] or [d[1]]
        blk[:2] = [d[0], others[rng.integers(len(others))]]     # keep the lanes, change the sublanes
    elif u >= 0.85:                    # bring another wide dim to the lanes
        lanes = [x for x in big if x != d[0]]
        blk[:2] = [lanes[rng.integers(len(lanes))], d[0]]
    else:                              # full permutation: default minor pair, major dims shuffled
        if width == 2:
            blk[:2] = d[:2]
        else:
            maj = list(d[2:])
            rng.shuffle(maj)
            full = d[:2] + maj
            blk[:r] = full
    return blk


def default_configs(an, rng, n):
    """Search that stays near the compiler default: few nodes, small perturbations."""
    nc = len(an.cfg_nodes)
    feat = np.full((n, nc, 18), -1, dtype=np.int8)
    for i in range(n):
        k = rng.choice([0, 1, 1, 1, 2, 2, 3, 4])
        if nc == 0 or k == 0:
            continue
        for j in rng.choice(nc, size=min(k, nc), replace=False):
            v = an.cfg_nodes[j]
            vs = an.cfg_vars[v]
            roles = [r for r in ("out", "in0", "in1") if r in vs]
            role = roles[rng.integers(len(roles))]
            lo, w = {"out": (0, 6), "in0": (6, 6), "in1": (12, 2)}[role]
            feat[i, j, lo:lo + w] = _near_default_block(rng, an, vs[role], w)
    return feat
