"""Reverse-mode differentiation on the HLO-like graph, emitting backward HLO the way XLA/JAX would
(conv input/weight gradients as convolutions with their own dimension numbers, dot_general
transposes, select-and-scatter for max-pooling, scatter for embedding lookups)."""
from .hlo import win


def _zeros_like(g, x):
    return g.scalar_bcast(g.shape(x), g.dtype(x))


def _conv_grads(g, v, dy, need_x, need_k):
    ins = g[v]
    x, k = ins.operands
    sx, sk = g.shape(x), g.shape(k)
    r = len(sx)
    nsp = r - 2
    dn = ins.attrs["conv_dims"]
    assert dn["ib"] == 0 and dn["if_"] == r - 1 and dn["ko"] == r - 1, "canonical convs only"
    wnd = ins.attrs["window"]
    fgc = ins.attrs["fgc"]
    sdy = g.shape(dy)
    out = {}
    sp = list(range(1, r - 1))
    if need_x:
        lo, hi, bd, sizes, rev = [], [], [], [], []
        for i in range(nsp):
            w = wnd[i]
            H, Ho, kk, s = sx[1 + i], sdy[1 + i], w["size"], w["stride"]
            dil_in = (Ho - 1) * s + 1
            l = kk - 1 - w["lo"]
            h = H + kk - 1 - dil_in - l
            lo.append(l); hi.append(h); bd.append(s); sizes.append(kk); rev.append(True)
        wd = win(sizes, pad_lo=lo, pad_hi=hi, bdil=bd, rev=rev)
        if fgc == 1:
            dn2 = dict(ib=0, if_=r - 1, is_=sp, ki=r - 1, ko=r - 2, ks=list(range(nsp)), ob=0, of=r - 1, os=sp)
        else:
            dn2 = dict(ib=0, if_=r - 1, is_=sp, ki=r - 2, ko=r - 1, ks=list(range(nsp)), ob=0, of=r - 1, os=sp)
        out[x] = g.conv(dy, k, wd, dn2, fgc=fgc)
    if need_k:
        lo, hi, wdl, sizes = [], [], [], []
        for i in range(nsp):
            w = wnd[i]
            H, Ho, kk, s = sx[1 + i], sdy[1 + i], w["size"], w["stride"]
            l = w["lo"]
            h = kk - 1 - H - l + (Ho - 1) * s + 1
            lo.append(l); hi.append(h); wdl.append(s); sizes.append(Ho)
        wd = win(sizes, pad_lo=lo, pad_hi=hi, wdil=wdl)
        dn2 = dict(ib=r - 1, if_=0, is_=sp, ki=0, ko=r - 1, ks=sp, ob=r - 2, of=r - 1, os=list(range(nsp)))
        if fgc == 1:
            out[k] = g.conv(x, dy, wd, dn2)
        else:
            out[k] = g.conv(x, dy, wd, dn2, bgc=fgc)
        assert g.shape(out[k]) == sk, (g.shape(out[k]), sk)
    if need_x:
        assert g.shape(out[x]) == sx, (g.shape(out[x]), sx)
    return out


def _dot_grads(g, v, dy, need_a, need_b):
    ins = g[v]
    a, b = ins.operands
    lb, rb, lc, rc = ins.attrs["dot_dims"]
    ra, rbk = len(g.shape(a)), len(g.shape(b))
    la_free = [d for d in range(ra) if d not in lc and d not in lb]
    rb_free = [d for d in range(rbk) if d not in rc and d not in rb]
    nb = len(lb)
    dy_a = list(range(nb, nb + len(la_free)))
    dy_b = list(range(nb + len(la_free), len(g.shape(dy))))
    out = {}
    if need_a:
        da = g.dot(dy, b, lc=dy_b, rc=rb_free, lb=list(range(nb)), rb=list(rb))
        rc_sorted = sorted(rc)
        src = list(lb) + la_free + [lc[rc.index(d)] for d in rc_sorted]
        da = g.transpose(da, [src.index(i) for i in range(ra)])
        out[a] = da
    if need_b:
        db = g.dot(a, dy, lc=la_free, rc=dy_a, lb=list(lb), rb=list(range(nb)))
        lc_sorted = sorted(lc)
        src = list(rb) + [rc[lc.index(d)] for d in lc_sorted] + rb_free
        db = g.transpose(db, [src.index(i) for i in range(rbk)])
        out[b] = db
    return out


def backprop(g, loss, wrt):
    """Returns {w: grad} for each w in wrt (grad has w's shape and dtype)."""
    n = len(g.ins)
    dep = [False] * n
    wrt_set = set(wrt)
    for i in range(n):
        if i in wrt_set:
            dep[i] = True
        elif g[i].op not in ("compare", "iota", "constant") and not (g[i].op == "reduce" and g[i].attrs.get("reduce_op") == "max"):
            dep[i] = any(dep[o] for o in g[i].operands)
    grads = {loss: g.const(g.dtype(loss))}

    def acc(o, d):
        if not dep[o]:
            return
        assert g.shape(d) == g.shape(o), (g[o].op, g.shape(d), g.shape(o))
        if g.dtype(d) != g.dtype(o):
            d = g.convert(d, g.dtype(o))
        if o in grads:
            grads[o] = g.bin("add", grads[o], d)
        else:
            grads[o] = d

    for v in range(loss, -1, -1):
        if v not in grads or not dep[v] or v in wrt_set:
            continue
        ins = g[v]
        op = ins.op
        dy = grads[v]
        ops = ins.operands
        if op == "add":
            acc(ops[0], dy); acc(ops[1], dy)
        elif op == "subtract":
            acc(ops[0], dy)
            if dep[ops[1]]:
                acc(ops[1], g.un("negate", dy))
        elif op == "multiply":
            if dep[ops[0]]:
                acc(ops[0], g.bin("multiply", dy, ops[1]))
            if dep[ops[1]]:
                acc(ops[1], g.bin("multiply", dy, ops[0]))
        elif op == "divide":
            if dep[ops[0]]:
                acc(ops[0], g.bin("divide", dy, ops[1]))
            if dep[ops[1]]:
                acc(ops[1], g.un("negate", g.bin("multiply", dy, g.bin("divide", v, ops[1]))))
        elif op in ("maximum", "minimum"):
            p = g.compare(ops[0], ops[1], "GE" if op == "maximum" else "LE")
            z = _zeros_like(g, dy)
            if dep[ops[0]]:
                acc(ops[0], g.select(p, dy, z))
            if dep[ops[1]]:
                acc(ops[1], g.select(p, z, dy))
        elif op == "select":
            z = _zeros_like(g, dy)
            if dep[ops[1]]:
                acc(ops[1], g.select(ops[0], dy, z))
            if dep[ops[2]]:
                acc(ops[2], g.select(ops[0], z, dy))
        elif op == "exponential":
            acc(ops[0], g.bin("multiply", dy, v))
        elif op == "log":
            acc(ops[0], g.bin("divide", dy, ops[0]))
        elif op == "tanh":
            one = g.scalar_bcast(g.shape(v), g.dtype(v))
            acc(ops[0], g.bin("multiply", dy, g.bin("subtract", one, g.bin("multiply", v, v))))
        elif op == "logistic":
            one = g.scalar_bcast(g.shape(v), g.dtype(v))
            acc(ops[0], g.bin("multiply", g.bin("multiply", dy, v), g.bin("subtract", one, v)))
        elif op == "rsqrt":
            c = g.scalar_bcast(g.shape(v), g.dtype(v))
            cube = g.bin("multiply", v, g.bin("multiply", v, v))
            acc(ops[0], g.bin("multiply", dy, g.bin("multiply", cube, c)))
        elif op == "sqrt":
            c = g.scalar_bcast(g.shape(v), g.dtype(v))
            acc(ops[0], g.bin("divide", dy, g.bin("multiply", v, c)))
        elif op == "negate":
            acc(ops[0], g.un("negate", dy))
        elif op == "convert":
            acc(ops[0], g.convert(dy, g.dtype(ops[0])))
        elif op == "reshape":
            acc(ops[0], g.reshape(dy, g.shape(ops[0])))
        elif op == "transpose":
            perm = ins.attrs["dimensions"]
            inv = [perm.index(i) for i in range(len(perm))]
            acc(ops[0], g.transpose(dy, inv))
        elif op == "broadcast":
            dims = ins.attrs["dimensions"]
            red = [d for d in range(len(ins.shape)) if d not in dims]
            d = g.reduce(dy, red) if red else dy
            kept = [d0 for d0 in range(len(ins.shape)) if d0 not in red]
            order = [kept.index(x) for x in dims]
            if order != sorted(order):
                d = g.transpose(d, order)
            if g.shape(d) != g.shape(ops[0]):
                d = g.reshape(d, g.shape(ops[0]))
            acc(ops[0], d)
        elif op == "reduce":
            dims = ins.attrs["dimensions"]
            kept = [d for d in range(len(g.shape(ops[0]))) if d not in dims]
            acc(ops[0], g.broadcast(dy, g.shape(ops[0]), kept))
        elif op == "dot":
            for o, d in _dot_grads(g, v, dy, dep[ops[0]], dep[ops[1]]).items():
                acc(o, d)
        elif op == "convolution":
            for o, d in _conv_grads(g, v, dy, dep[ops[0]], dep[ops[1]]).items():
                acc(o, d)
        elif op == "reduce-window":
            acc(ops[0], g.select_and_scatter(ops[0], dy, ins.attrs["window"]))
        elif op == "slice":
            start, stride, limit = ins.attrs["slice"]
            xs = g.shape(ops[0])
            acc(ops[0], g.pad(dy, start, [s - l for s, l in zip(xs, limit)]))
        elif op == "concatenate":
            dim = ins.attrs["dimensions"][0]
            off = 0
            for o in ops:
                so = g.shape(o)
                if dep[o]:
                    st = [0] * len(so); st[dim] = off
                    lim = list(g.shape(dy)); lim[dim] = off + so[dim]
                    acc(o, g.slice(dy, st, lim))
                off += so[dim]
        elif op == "pad":
            lo, hi = ins.attrs["pad"]
            xs = g.shape(ops[0])
            acc(ops[0], g.slice(dy, lo, [l + s for l, s in zip(lo, xs)]))
        elif op == "gather":
            z = _zeros_like(g, ops[0])
            acc(ops[0], g.scatter_add(z, ops[1], dy))
        else:
            raise NotImplementedError(op)
    return {w: grads[w] for w in wrt if w in grads}
