"""Constants of the imagined TPU core and layout helpers (tiles, permutations)."""
import itertools
from functools import lru_cache

import numpy as np

CLK = 0.94e9                 # core clock, Hz
N_MXU = 2                    # 128x128 systolic arrays per core
MXU_DIM = 128
HBM_BW = 640e9               # effective bytes/s
VPU_RATE = 1024 * CLK        # element-ops/s (8 sublanes x 128 lanes)
EUP_COST = 5.0               # transcendental cost in VPU element-op units
XLU_RATE = 112 * CLK         # elements/s through the cross-lane unit (transposes, rotates, lane reductions)
LAUNCH = 1.05e-6             # fused-kernel launch + pipeline fill, s
LAUNCH_COPY = 0.7e-6
LAUNCH_CONV = 1.6e-6
VMEM_BYTES = 16 * 2 ** 20
LANE = 128

PERMS = {r: np.array(list(itertools.permutations(range(r))), dtype=np.int16).reshape(-1, r) for r in range(1, 7)}
PERMS[0] = np.zeros((1, 0), dtype=np.int16)
PERM_ID = {r: {tuple(int(x) for x in p): i for i, p in enumerate(PERMS[r])} for r in range(0, 7)}


def sublane_tile(dtype):
    return {"bf16": 16, "f16": 16, "pred": 32, "s8": 32}.get(dtype, 8)


def desc(r):
    return tuple(range(r - 1, -1, -1))


def pid(perm):
    return PERM_ID[len(perm)][tuple(int(x) for x in perm)]


def elem_bytes(dtype):
    return {"bf16": 2, "f16": 2, "pred": 1, "s8": 1, "f32": 4, "s32": 4}.get(dtype, 4)


@lru_cache(maxsize=None)
def lane_sub(shape):
    """Effective (lane, sublane) dim per permutation: size-1 dims are transparent (squeezed)."""
    r = len(shape)
    P = PERMS[r]
    lane = np.full(len(P), -1, dtype=np.int16)
    sub = np.full(len(P), -1, dtype=np.int16)
    for i, p in enumerate(P):
        big = [int(d) for d in p if shape[d] > 1]
        if len(big) >= 1:
            lane[i] = big[0]
        if len(big) >= 2:
            sub[i] = big[1]
    return lane, sub


@lru_cache(maxsize=None)
def padded_elems(shape, dtype):
    """Per permutation (minor_to_major) of the tensor: elements after padding the minor dim to 128
    lanes and the second-minor dim to the sublane tile (8 for 32-bit, 16 for bf16); size-1 dims do
    not take the lanes/sublanes."""
    r = len(shape)
    total = float(np.prod(shape)) if r else 1.0
    if r == 0:
        return np.array([1.0])
    sh = np.array(list(shape) + [1], dtype=np.float64)
    lane, sub = lane_sub(tuple(shape))
    ln = sh[lane]            # index -1 -> the appended 1
    sb = sh[sub]
    out = total / ln * (np.ceil(ln / LANE) * LANE)
    st = sublane_tile(dtype)
    out = out / sb * (np.ceil(sb / st) * st)
    return out


@lru_cache(maxsize=None)
def major_penalty(r):
    """DMA inefficiency when the major dims are not in row-major order (strided descriptors)."""
    P = PERMS[r]
    out = np.ones(len(P))
    if r <= 2:
        return out
    for i, p in enumerate(P):
        maj = list(p[2:])
        inv = sum(1 for a in range(len(maj)) for b in range(a + 1, len(maj)) if maj[a] < maj[b])
        out[i] = 1.0 + 0.022 * inv + (0.015 if p[1] < p[0] else 0.0)
    return out


def complete(partial, default):
    """Fill a partial minor_to_major prefix with the remaining dims in the default's order."""
    rest = [d for d in default if d not in partial]
    return tuple(partial) + tuple(rest)


# ---------------- permutation transforms (tables over perm ids) -----------------
@lru_cache(maxsize=None)
def tbl_transpose(perm):
    """Transpose out[i] = in[perm[i]]: layout of output when it is a bitcast of the input."""
    r = len(perm)
    inv = {d: i for i, d in enumerate(perm)}
    return np.array([PERM_ID[r][tuple(inv[d] for d in p)] for p in PERMS[r]], dtype=np.int32)


@lru_cache(maxsize=None)
def tbl_transpose_inv(perm):
    """Layout of the input that makes transpose(perm) a bitcast of a given output layout."""
    r = len(perm)
    return np.array([PERM_ID[r][tuple(perm[d] for d in p)] for p in PERMS[r]], dtype=np.int32)


@lru_cache(maxsize=None)
def tbl_reduce(r, dims):
    ds = set(dims)
    ro = r - len(dims)
    res = []
    for p in PERMS[r]:
        q = tuple(d - sum(1 for x in dims if x < d) for d in p if d not in ds)
        res.append(PERM_ID[ro][q])
    return np.array(res, dtype=np.int32)


@lru_cache(maxsize=None)
def tbl_restrict(r_out, dims):
    """Broadcast: output layout -> induced layout of the operand (operand dim i = output dim dims[i])."""
    ro = len(dims)
    pos = {d: i for i, d in enumerate(dims)}
    res = []
    for p in PERMS[r_out]:
        q = tuple(pos[d] for d in p if d in pos)
        res.append(PERM_ID[ro][q])
    return np.array(res, dtype=np.int32)


# ---------------- reshape bitcast analysis -----------------
def _groups(a, b):
    """Common factorisation of two shapes (ignoring size-1 dims): list of (a_dims, b_dims)."""
    ai = [i for i, s in enumerate(a) if s != 1]
    bi = [i for i, s in enumerate(b) if s != 1]
    groups = []
    i = j = 0
    while i < len(ai) and j < len(bi):
        ga, gb = [ai[i]], [bi[j]]
        pa, pb = a[ai[i]], b[bi[j]]
        i += 1; j += 1
        while pa != pb:
            if pa < pb:
                ga.append(ai[i]); pa *= a[ai[i]]; i += 1
            else:
                gb.append(bi[j]); pb *= b[bi[j]]; j += 1
        groups.append((ga, gb))
    return groups


def _group_order(shape, perm, gmap):
    """Physical major->minor order of groups, or None if some group is not contiguous & row-major."""
    phys = [d for d in reversed(perm) if shape[d] != 1]
    order, last = [], None
    seq = []
    for d in phys:
        gi = gmap[d]
        if gi != last:
            if gi in order:
                return None
            order.append(gi)
            last = gi
        seq.append(d)
    # within a group dims must be increasing (row-major)
    pos = {d: k for k, d in enumerate(seq)}
    for gi in order:
        pass
    return order, pos


@lru_cache(maxsize=200000)
def reshape_is_bitcast(a, b, pa, pb, dtype):
    groups = _groups(a, b)
    ga = {d: k for k, (x, _) in enumerate(groups) for d in x}
    gb = {d: k for k, (_, y) in enumerate(groups) for d in y}
    ra = _group_order(a, PERMS[len(a)][pa], ga)
    rb = _group_order(b, PERMS[len(b)][pb], gb)
    if ra is None or rb is None:
        return False
    if ra[0] != rb[0]:
        return False
    for k, (x, y) in enumerate(groups):
        px = [ra[1][d] for d in x]
        py = [rb[1][d] for d in y]
        if px != sorted(px) or py != sorted(py):
            return False
    return _tile_compatible(a, b, PERMS[len(a)][pa], PERMS[len(b)][pb], dtype)


def _minor_sizes(shape, perm):
    s = [shape[d] for d in perm if shape[d] != 1]
    return (s + [1, 1])[:2]


def _tile_compatible(a, b, pa, pb, dtype):
    la, sa = _minor_sizes(a, pa)
    lb, sb = _minor_sizes(b, pb)
    st = sublane_tile(dtype)
    if not (la == lb or (la % LANE == 0 and lb % LANE == 0)):
        return False
    if not (sa == sb or (sa % st == 0 and sb % st == 0) or (la == lb and sa == sb)):
        return False
    return True


@lru_cache(maxsize=None)
def reshape_bitcast_table(a, b, dtype):
    """For each input layout: an output layout making the reshape a bitcast (or descending)."""
    ra, rb = len(a), len(b)
    groups = _groups(a, b)
    ga = {d: k for k, (x, _) in enumerate(groups) for d in x}
    res = []
    dflt = PERM_ID[rb][desc(rb)]
    for pa in range(len(PERMS[ra])):
        o = _group_order(a, PERMS[ra][pa], ga)
        if o is None:
            res.append(dflt); continue
        major_to_minor = [d for d in range(rb) if b[d] == 1]
        for gi in o[0]:
            major_to_minor += sorted(groups[gi][1])
        if len(major_to_minor) != rb:
            res.append(dflt); continue
        cand = PERM_ID[rb][tuple(reversed(major_to_minor))]
        res.append(cand if reshape_is_bitcast(a, b, pa, cand, dtype) else dflt)
    return np.array(res, dtype=np.int32)
