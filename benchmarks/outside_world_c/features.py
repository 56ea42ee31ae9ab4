"""node_feat (140 columns), opcodes and edges in the TpuGraphs layout."""
import numpy as np

from .hlo import OPCODE, DTYPE_INDEX


def _seq(vals, k, empty_prod=1.0):
    vals = [int(v) for v in vals]
    out = [0.0] * k
    for i, v in enumerate(vals[:k]):
        out[i] = float(v)
    s = float(sum(vals))
    p = float(np.prod(vals, dtype=np.float64)) if vals else empty_prod
    return out + [s, p]


def node_features(g, layouts=None):
    """layouts: optional list (per node) of minor_to_major lists; default descending."""
    n = len(g.ins)
    F = np.zeros((n, 140), dtype=np.float32)
    roots = set(g.roots.values())
    for i, ins in enumerate(g.ins):
        row = []
        row.append(1.0 if i in roots else 0.0)              # 0 is_root
        row.append(0.0)                                     # 1 element_size_in_bits
        oh = [0.0] * 19
        oh[DTYPE_INDEX[ins.dtype]] = 1.0
        row += oh                                           # 2-20
        row += _seq(ins.shape, 6)                           # 21-28
        ts = ins.attrs.get("tuple_shapes")
        if ins.op == "tuple":
            row.append(float(len(ins.operands)))
        elif ts is not None:
            row.append(float(len(ts)))
        elif ins.op == "parameter" and ins.dtype == "tuple":
            row.append(8.0)
        else:
            row.append(0.0)                                 # 29
        row.append(float(ins.attrs.get("param_num", 0)))    # 30
        dims = ins.attrs.get("dimensions", [])
        row += [float(d) for d in dims[:6]] + [0.0] * (6 - min(6, len(dims)))   # 31-36
        wnd = ins.attrs.get("window")
        if wnd:
            for key in ("size", "stride", "lo", "hi", "wdil", "bdil"):
                row += _seq([w[key] for w in wnd], 6)       # 37-84
            rev = [1.0 if w["rev"] else 0.0 for w in wnd]
            row += rev[:6] + [0.0] * (6 - min(6, len(rev)))
            row += [float(sum(rev)), float(len(rev) - sum(rev))]   # 85-92
        else:
            for _ in range(6):
                row += [0.0] * 6 + [0.0, 1.0]
            row += [0.0] * 8
        dn = ins.attrs.get("conv_dims")
        if dn:
            isp = list(dn["is_"]) + [0] * (4 - len(dn["is_"]))
            ksp = list(dn["ks"]) + [0] * (4 - len(dn["ks"]))
            row += [dn["ib"], dn["if_"]] + isp + [dn["ki"], dn["ko"]] + ksp + [dn["ob"], dn["of"]]
            row += [ins.attrs["fgc"], ins.attrs["bgc"]]
        else:
            row += [0.0] * 16                               # 93-108
        sl = ins.attrs.get("slice")
        if sl:
            st, sd, lm = sl
            row += _seq(st, 2) + _seq(sd, 2) + _seq(lm, 2)
        else:
            row += [0.0, 0.0, 0.0, 1.0] * 3                 # 109-120
        ds = ins.attrs.get("dyn_sizes")
        row += _seq(ds, 2) if ds else [0.0, 0.0, 0.0, 1.0]  # 121-124
        pc = ins.attrs.get("pad")
        if pc:
            row += _seq(pc[0], 2) + _seq(pc[1], 2)
        else:
            row += [0.0, 0.0, 0.0, 1.0] * 2                 # 125-132
        row.append(1.0 if ins.attrs.get("is_stable") else 0.0)  # 133
        if layouts is not None and layouts[i] is not None:
            lay = list(layouts[i])
        else:
            lay = list(range(ins.rank - 1, -1, -1)) if ins.dtype != "tuple" else []
        row += [float(x) for x in lay[:6]] + [0.0] * (6 - min(6, len(lay)))   # 134-139
        assert len(row) == 140, (len(row), ins.op)
        F[i] = row
    return F


def opcodes(g):
    return np.array([OPCODE[i.op] for i in g.ins], dtype=np.uint8)


def edges(g):
    e = set()
    for ins in g.ins:
        for o in ins.operands:
            if o != ins.id:
                e.add((ins.id, o))
    arr = np.array(sorted(e), dtype=np.int64).reshape(-1, 2)
    return arr


def node_splits(g):
    """Segment boundaries: one segment per computation run of nodes (0 ... n)."""
    n = len(g.ins)
    cuts = [0]
    for i in range(1, n):
        if g.ins[i].comp != g.ins[i - 1].comp:
            cuts.append(i)
    cuts.append(n)
    return np.array([cuts], dtype=np.int64)
