"""A small HLO-like IR: instructions, shapes, a builder with XLA shape inference."""
import numpy as np

# Opcode ids as the TpuGraphs featurizer numbers them (hlo_opcode.h of the dataset).
_OPS = """abs 1|add 2|add-dependency 3|after-all 4|all-reduce 5|all-to-all 6|atan2 7|batch-norm-grad 8|
batch-norm-inference 9|batch-norm-training 10|bitcast 11|bitcast-convert 12|broadcast 13|call 14|ceil 15|
cholesky 16|clamp 17|collective-permute 18|count-leading-zeros 19|compare 20|complex 21|concatenate 22|
conditional 23|constant 24|convert 25|convolution 26|copy 27|copy-done 28|copy-start 29|cosine 30|
custom-call 31|divide 32|domain 33|dot 34|dynamic-slice 35|dynamic-update-slice 36|exponential 37|
exponential-minus-one 38|fft 39|floor 40|fusion 41|gather 42|get-dimension-size 43|set-dimension-size 44|
get-tuple-element 45|imag 46|infeed 47|iota 48|is-finite 49|log 50|log-plus-one 51|and 52|not 53|or 54|
xor 55|map 56|maximum 57|minimum 58|multiply 59|negate 60|outfeed 61|pad 62|parameter 63|partition-id 64|
popcnt 65|power 66|real 67|recv 68|recv-done 69|reduce 70|reduce-precision 71|reduce-window 72|
remainder 73|replica-id 74|reshape 75|reverse 76|rng 77|rng-get-and-update-state 78|rng-bit-generator 79|
round-nearest-afz 80|rsqrt 81|scatter 82|select 83|select-and-scatter 84|send 85|send-done 86|
shift-left 87|shift-right-arithmetic 88|shift-right-logical 89|sign 90|sine 91|slice 92|sort 93|sqrt 94|
subtract 95|tanh 96|trace 97|transpose 98|triangular-solve 99|tuple 100|tuple-select 101|while 102|
cbrt 103|all-gather 104|collective-permute-start 105|collective-permute-done 106|logistic 107|
dynamic-reshape 108|all-reduce-start 109|all-reduce-done 110|reduce-scatter 111|all-gather-start 112|
all-gather-done 113|opt-barrier 114|async-start 115|async-update 116|async-done 117|
round-nearest-even 118|stochastic-convert 119|tan 120"""
OPCODE = {}
for _tok in _OPS.replace("\n", "").split("|"):
    _n, _i = _tok.rsplit(" ", 1)
    OPCODE[_n.strip()] = int(_i)

DTYPES = ["invalid", "pred", "s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64", "f16", "f32",
          "f64", "bf16", "c64", "c128", "tuple", "opaque", "token"]
DTYPE_INDEX = {d: i for i, d in enumerate(DTYPES)}
NBYTES = {"pred": 1, "s8": 1, "s16": 2, "s32": 4, "s64": 8, "u32": 4, "f16": 2, "f32": 4, "bf16": 2,
          "f64": 8, "tuple": 0, "token": 0}

UNARY = {"abs", "exponential", "log", "negate", "rsqrt", "sqrt", "tanh", "logistic", "convert", "copy",
         "sign", "floor", "ceil", "not", "log-plus-one", "exponential-minus-one", "cosine", "sine"}
BINARY = {"add", "subtract", "multiply", "divide", "maximum", "minimum", "compare", "power", "and", "or",
          "atan2", "remainder"}
ELEMENTWISE = UNARY | BINARY | {"select", "clamp"}


class Instr:
    __slots__ = ("id", "op", "shape", "dtype", "operands", "attrs", "comp", "name")

    def __init__(self, iid, op, shape, dtype, operands, attrs, comp, name=""):
        self.id = iid
        self.op = op
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.operands = list(operands)
        self.attrs = attrs
        self.comp = comp
        self.name = name

    @property
    def rank(self):
        return len(self.shape)

    @property
    def elems(self):
        return int(np.prod(self.shape)) if self.shape else 1

    @property
    def nbytes(self):
        return self.elems * NBYTES.get(self.dtype, 4)


class Graph:
    """Flattened module: entry computation plus nested (while body/cond) computations."""

    def __init__(self):
        self.ins = []
        self.comp = "entry"
        self.roots = {}          # computation name -> root instr id
        self.comp_mult = {"entry": 1}   # execution multiplicity of each computation
        self.comp_order = ["entry"]
        self._nparam = {}

    # ---- core ----
    def add(self, op, shape, dtype, operands=(), **attrs):
        for o in operands:
            assert 0 <= o < len(self.ins), (op, o)
        i = Instr(len(self.ins), op, shape, dtype, operands, attrs, self.comp)
        self.ins.append(i)
        return i.id

    def __getitem__(self, i):
        return self.ins[i]

    def shape(self, i):
        return self.ins[i].shape

    def dtype(self, i):
        return self.ins[i].dtype

    def set_root(self, i, comp=None):
        self.roots[comp or self.comp] = i

    def begin_comp(self, name, mult):
        self.comp = name
        self.comp_mult[name] = mult
        self.comp_order.append(name)

    def end_comp(self):
        self.comp = "entry"

    # ---- leaves ----
    def param(self, shape, dtype):
        n = self._nparam.get(self.comp, 0)
        self._nparam[self.comp] = n + 1
        return self.add("parameter", shape, dtype, (), param_num=n)

    def const(self, dtype="f32", shape=()):
        return self.add("constant", shape, dtype, ())

    def iota(self, shape, dim, dtype="s32"):
        return self.add("iota", shape, dtype, (), dimensions=[dim])

    # ---- elementwise ----
    def un(self, op, x):
        return self.add(op, self.shape(x), self.dtype(x), (x,))

    def bin(self, op, a, b):
        assert self.shape(a) == self.shape(b), (op, self.shape(a), self.shape(b))
        return self.add(op, self.shape(a), self.dtype(a), (a, b))

    def compare(self, a, b, direction="GT"):
        assert self.shape(a) == self.shape(b)
        return self.add("compare", self.shape(a), "pred", (a, b), direction=direction)

    def select(self, p, a, b):
        return self.add("select", self.shape(a), self.dtype(a), (p, a, b))

    def convert(self, x, dtype):
        if self.dtype(x) == dtype:
            return x
        return self.add("convert", self.shape(x), dtype, (x,))

    def scalar_bcast(self, shape, dtype, value=None):
        c = self.const(dtype)
        if not shape:
            return c
        return self.add("broadcast", shape, dtype, (c,), dimensions=[])

    def broadcast(self, x, shape, dims):
        xs = self.shape(x)
        assert len(dims) == len(xs)
        for d, s in zip(dims, xs):
            assert shape[d] == s, (shape, xs, dims)
        return self.add("broadcast", shape, self.dtype(x), (x,), dimensions=list(dims))

    # ---- data movement ----
    def transpose(self, x, perm):
        xs = self.shape(x)
        if list(perm) == list(range(len(xs))):
            return x
        return self.add("transpose", [xs[p] for p in perm], self.dtype(x), (x,), dimensions=list(perm))

    def reshape(self, x, shape):
        assert int(np.prod(shape)) == int(np.prod(self.shape(x))), (shape, self.shape(x))
        if tuple(shape) == self.shape(x):
            return x
        return self.add("reshape", shape, self.dtype(x), (x,))

    def slice(self, x, start, limit, stride=None):
        xs = self.shape(x)
        stride = stride or [1] * len(xs)
        shape = [(l - s + st - 1) // st for s, l, st in zip(start, limit, stride)]
        return self.add("slice", shape, self.dtype(x), (x,), slice=(list(start), list(stride), list(limit)))

    def concat(self, xs, dim):
        s0 = list(self.shape(xs[0]))
        s0[dim] = sum(self.shape(x)[dim] for x in xs)
        return self.add("concatenate", s0, self.dtype(xs[0]), tuple(xs), dimensions=[dim])

    def pad(self, x, lo, hi):
        pv = self.const(self.dtype(x))
        shape = [s + a + b for s, a, b in zip(self.shape(x), lo, hi)]
        return self.add("pad", shape, self.dtype(x), (x, pv), pad=(list(lo), list(hi)))

    def reduce(self, x, dims, kind="add", out_dtype=None):
        xs = self.shape(x)
        init = self.const(out_dtype or self.dtype(x))
        shape = [s for d, s in enumerate(xs) if d not in dims]
        return self.add("reduce", shape, out_dtype or self.dtype(x), (x, init),
                        dimensions=sorted(dims), reduce_op=kind)

    def reduce_window(self, x, window, kind="max"):
        init = self.const(self.dtype(x))
        shape = window_out_shape(self.shape(x), window, list(range(len(self.shape(x)))))
        return self.add("reduce-window", shape, self.dtype(x), (x, init), window=window, reduce_op=kind)

    def select_and_scatter(self, x, src, window):
        init = self.const(self.dtype(x))
        return self.add("select-and-scatter", self.shape(x), self.dtype(x), (x, src, init), window=window)

    def gather_rows(self, table, idx):
        ts, ishape = self.shape(table), self.shape(idx)
        shape = list(ishape) + [ts[-1]]
        return self.add("gather", shape, self.dtype(table), (table, idx), slice_sizes=[1, ts[-1]])

    def scatter_add(self, operand, idx, upd):
        return self.add("scatter", self.shape(operand), self.dtype(operand), (operand, idx, upd))

    def dynamic_slice(self, x, idx_scalars, sizes):
        return self.add("dynamic-slice", sizes, self.dtype(x), (x,) + tuple(idx_scalars),
                        dyn_sizes=list(sizes))

    def dynamic_update_slice(self, x, upd, idx_scalars):
        return self.add("dynamic-update-slice", self.shape(x), self.dtype(x), (x, upd) + tuple(idx_scalars))

    def tuple(self, xs):
        return self.add("tuple", (), "tuple", tuple(xs))

    def gte(self, t, index, shape, dtype):
        return self.add("get-tuple-element", shape, dtype, (t,), index=index)

    # ---- compute ----
    def dot(self, a, b, lc, rc, lb=(), rb=(), out_dtype=None):
        sa, sb = self.shape(a), self.shape(b)
        for x, y in zip(lc, rc):
            assert sa[x] == sb[y], ("dot contracting", sa, sb, lc, rc)
        for x, y in zip(lb, rb):
            assert sa[x] == sb[y], ("dot batch", sa, sb)
        shape = [sa[d] for d in lb]
        shape += [sa[d] for d in range(len(sa)) if d not in lc and d not in lb]
        shape += [sb[d] for d in range(len(sb)) if d not in rc and d not in rb]
        return self.add("dot", shape, out_dtype or self.dtype(a), (a, b),
                        dot_dims=(list(lb), list(rb), list(lc), list(rc)))

    def conv(self, x, k, window, dn, fgc=1, bgc=1, out_dtype=None):
        """dn = dict(ib, if_, is_, ki, ko, ks, ob, of, os) (XLA ConvolutionDimensionNumbers)."""
        sx, sk = self.shape(x), self.shape(k)
        rank = len(sx)
        assert len(sk) == rank
        assert sx[dn["if_"]] == sk[dn["ki"]] * fgc, ("conv feature", sx, sk, dn, fgc)
        out = [0] * rank
        out[dn["ob"]] = sx[dn["ib"]] // bgc
        out[dn["of"]] = sk[dn["ko"]]
        sp = window_out_shape(sx, window, dn["is_"])
        for i, d in enumerate(dn["os"]):
            out[d] = sp[i]
        for i, d in enumerate(dn["ks"]):
            assert sk[d] == window[i]["size"], ("kernel window", sk, window)
        assert all(o > 0 for o in out), ("conv out", out, sx, sk, window)
        return self.add("convolution", out, out_dtype or self.dtype(x), (x, k), window=window,
                        conv_dims=dn, fgc=fgc, bgc=bgc)

    def while_loop(self, init, body_root, cond_root, trip, shapes):
        w = self.add("while", (), "tuple", (init, body_root, cond_root), trip=trip, tuple_shapes=shapes)
        return w


def win(sizes, strides=None, pad_lo=None, pad_hi=None, wdil=None, bdil=None, rev=None):
    n = len(sizes)
    strides = strides or [1] * n
    pad_lo = pad_lo or [0] * n
    pad_hi = pad_hi or [0] * n
    wdil = wdil or [1] * n
    bdil = bdil or [1] * n
    rev = rev or [False] * n
    return [dict(size=int(sizes[i]), stride=int(strides[i]), lo=int(pad_lo[i]), hi=int(pad_hi[i]),
                 wdil=int(wdil[i]), bdil=int(bdil[i]), rev=bool(rev[i])) for i in range(n)]


def window_out_shape(in_shape, window, spatial_dims):
    out = []
    for w, d in zip(window, spatial_dims):
        n = in_shape[d]
        dil_in = (n - 1) * w["bdil"] + 1
        padded = dil_in + w["lo"] + w["hi"]
        eff = (w["size"] - 1) * w["wdil"] + 1
        out.append((padded - eff) // w["stride"] + 1)
    if len(spatial_dims) == len(in_shape):
        return out
    return out
