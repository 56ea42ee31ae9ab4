"""Random HLO-like program graphs and their 140 TpuGraphs node features.

A :class:`ProgramBuilder` appends nodes in topological order (every input already exists), so the
edge convention of the real files (row ``[u, v]``: ``u`` consumes ``v``'s output, ``u > v``) holds
by construction. Skeleton functions build whole programs from a :class:`Family` (the program's
architecture: block pattern, widths, filler ops, preferred layouts) and a :class:`Variant` (batch,
precision, train/eval, chips): variants of one family share the skeleton and differ in tensor
sizes and, for training variants, in the backward pass, which is what makes grouping folds by
family matter. Tile kernels are small fusions (conv, dot, reduce or elementwise) with a
:class:`TileKernel` summary that the tile cost model reads.

Everything here is pure: randomness comes in as a ``numpy.random.Generator``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

# HLO opcode ids as numbered in TpuGraphs (alphabetical order of XLA's opcode list, 1-based).
OP: dict[str, int] = {
    "abs": 1, "add": 2, "all-reduce": 6, "broadcast": 13, "compare": 20, "concatenate": 22,
    "constant": 24, "convert": 25, "convolution": 26, "copy": 27, "divide": 32, "dot": 34,
    "exponential": 37, "fusion": 41, "gather": 42, "get-tuple-element": 45, "iota": 48, "log": 50,
    "maximum": 57, "minimum": 58, "multiply": 59, "negate": 60, "pad": 62, "parameter": 63,
    "reduce": 70, "reduce-window": 72, "reshape": 75, "rng-bit-generator": 79, "rsqrt": 81,
    "select": 83, "slice": 92, "sqrt": 94, "subtract": 95, "tanh": 96, "transpose": 98, "tuple": 100,
    "while": 102,
}
CONFIGURABLE_OPCODES = (OP["convolution"], OP["dot"], OP["reshape"])
# Elementwise ops that keep their operand's shape and layout: layouts propagate through them, so a
# layout mismatch across such a chain still costs a copy (see costmodel).
TRANSPARENT_OPCODES = frozenset(OP[k] for k in (
    "abs", "add", "convert", "divide", "exponential", "log", "maximum", "minimum", "multiply",
    "negate", "rsqrt", "select", "sqrt", "subtract", "tanh"))
_FILLER_UNARY = ("convert", "exponential", "tanh", "negate", "rsqrt", "abs", "log", "sqrt")
_FILLER_BINARY = ("add", "multiply", "subtract", "maximum", "minimum", "divide")

ELEMENT_TYPES = ("invalid", "pred", "s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64", "f16", "f32",
                 "f64", "bf16", "c64", "c128", "tuple", "opaque", "token")
ELEMENT_BYTES = {"pred": 1, "s8": 1, "s16": 2, "s32": 4, "s64": 8, "u8": 1, "u16": 2, "u32": 4, "u64": 8,
                 "f16": 2, "f32": 4, "f64": 8, "bf16": 2, "c64": 8, "c128": 16, "tuple": 0, "opaque": 0,
                 "token": 0, "invalid": 0}
MAX_RANK = 6


def descending(rank: int) -> tuple[int, ...]:
    """XLA's default minor_to_major: the last dimension is minor-most."""
    return tuple(range(rank - 1, -1, -1))


def feature_minor(rank: int) -> tuple[int, ...]:
    """TPU-style activation layout: feature (last) dim minor-most, batch second, spatial dims major."""
    if rank < 3:
        return descending(rank)
    return (rank - 1, 0) + tuple(range(rank - 2, 0, -1))


# ----------------------------------------------------------------------------- nodes and builder


@dataclass
class Node:
    opcode: int
    shape: tuple[int, ...]
    etype: str
    inputs: tuple[int, ...]
    layout: tuple[int, ...]  # minor_to_major of the node's output (its compiler default)
    attrs: dict[str, tuple[int, ...] | int] = field(default_factory=dict)


@dataclass
class Program:
    """A built program: its nodes plus the arrays stored in the npz files."""

    nodes: list[Node]
    node_feat: np.ndarray  # float32 (n, 140)
    node_opcode: np.ndarray  # uint8 (n,)
    edge_index: np.ndarray  # int64 (m, 2)
    node_splits: np.ndarray  # int64 (1, s)
    config_ids: np.ndarray  # int64 (nc,) configurable nodes (conv, dot, reshape)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)


class ProgramBuilder:
    """Appends HLO-like nodes in topological order; ``build`` derives the stored arrays."""

    def __init__(self, etype: str = "f32"):
        self.nodes: list[Node] = []
        self.etype = etype
        self.splits: list[int] = [0]
        self._num_params = 0

    def __len__(self) -> int:
        return len(self.nodes)

    def shape(self, node: int) -> tuple[int, ...]:
        return self.nodes[node].shape

    def add(self, op: str, shape: tuple[int, ...], inputs: tuple[int, ...] = (), *, etype: str | None = None,
            layout: tuple[int, ...] | None = None, **attrs: tuple[int, ...] | int) -> int:
        shape = tuple(int(d) for d in shape)
        if len(shape) > MAX_RANK or any(d < 1 for d in shape):
            raise ValueError(f"bad shape {shape} for {op}")
        opcode = OP[op]
        if layout is None:
            first = self.nodes[inputs[0]] if inputs else None
            inherit = opcode in TRANSPARENT_OPCODES and first is not None and first.shape == shape
            layout = first.layout if inherit else descending(len(shape))
        self.nodes.append(Node(opcode, shape, etype or self.etype, tuple(int(i) for i in inputs),
                               tuple(layout), dict(attrs)))
        return len(self.nodes) - 1

    # -- leaves
    def parameter(self, shape: tuple[int, ...], *, etype: str | None = None,
                  layout: tuple[int, ...] | None = None) -> int:
        node = self.add("parameter", shape, etype=etype, layout=layout, parameter_number=self._num_params)
        self._num_params += 1
        return node

    def scalar(self, shape: tuple[int, ...]) -> int:
        """A constant scalar broadcast to ``shape`` (two nodes, as XLA emits it)."""
        const = self.add("constant", ())
        return self.add("broadcast", shape, (const,), dimensions=())

    # -- elementwise
    def unary(self, op: str, x: int) -> int:
        return self.add(op, self.shape(x), (x,))

    def binary(self, op: str, x: int, y: int) -> int:
        return self.add(op, self.shape(x), (x, y))

    def filler(self, x: int, count: int, rng: np.random.Generator) -> int:
        """A chain of ``count`` shape-preserving elementwise ops (dropout, scaling, activations)."""
        for _ in range(count):
            if rng.random() < 0.5:
                x = self.unary(_FILLER_UNARY[rng.integers(len(_FILLER_UNARY))], x)
            else:
                x = self.binary(_FILLER_BINARY[rng.integers(len(_FILLER_BINARY))], x, self.scalar(self.shape(x)))
        return x

    # -- data movement
    def broadcast(self, x: int, shape: tuple[int, ...], dims: tuple[int, ...]) -> int:
        return self.add("broadcast", shape, (x,), dimensions=dims)

    def reshape(self, x: int, shape: tuple[int, ...]) -> int:
        if math.prod(shape) != math.prod(self.shape(x)):
            raise ValueError(f"reshape {self.shape(x)} -> {shape} changes the element count")
        return self.add("reshape", shape, (x,))

    def transpose(self, x: int, perm: tuple[int, ...]) -> int:
        shape = tuple(self.shape(x)[p] for p in perm)
        return self.add("transpose", shape, (x,), dimensions=perm)

    def reduce(self, x: int, dims: tuple[int, ...]) -> int:
        shape = tuple(d for i, d in enumerate(self.shape(x)) if i not in dims)
        init = self.add("constant", ())
        return self.add("reduce", shape, (x, init), dimensions=dims)

    # -- compute
    def conv(self, x: int, kernel: int, *, stride: int = 1, groups: int = 1,
             layout: tuple[int, ...] | None = None) -> int:
        """Channels-last convolution with SAME padding: x (N, *spatial, C), kernel (*window, C/g, O)."""
        in_shape, k_shape = self.shape(x), self.shape(kernel)
        spatial = len(in_shape) - 2
        window = k_shape[:spatial]
        out_spatial = tuple(-(-d // stride) for d in in_shape[1:-1])
        out_shape = (in_shape[0], *out_spatial, k_shape[-1])
        rank = len(in_shape)
        pad_low = tuple((w - 1) // 2 for w in window)
        pad_high = tuple(w - 1 - p for w, p in zip(window, pad_low))
        conv_dims = (0, rank - 1, *range(1, rank - 1), rank - 2, rank - 1, *range(spatial), 0, rank - 1)
        return self.add("convolution", out_shape, (x, kernel), layout=layout,
                        window_size=window, window_stride=(stride,) * spatial, window_pad_low=pad_low,
                        window_pad_high=pad_high, window_dilation=(1,) * spatial,
                        base_dilation=(1,) * spatial, window_reversal=(0,) * spatial,
                        conv_dims=conv_dims, feature_group_count=groups, batch_group_count=1)

    def dot(self, x: int, y: int) -> int:
        """Matmul contracting x's last dim with y's second-to-last; leading dims are batch dims."""
        xs, ys = self.shape(x), self.shape(y)
        if xs[-1] != ys[-2] or xs[:-2] != ys[:-2]:
            raise ValueError(f"dot shapes {xs} x {ys} do not match")
        return self.add("dot", (*xs[:-1], ys[-1]), (x, y))

    def slice(self, x: int, limit: tuple[int, ...]) -> int:
        """The leading ``limit`` corner of ``x`` (start 0, stride 1)."""
        rank = len(limit)
        return self.add("slice", limit, (x,), slice_start=(0,) * rank, slice_stride=(1,) * rank, slice_limit=limit)

    def max_pool(self, x: int, window: int, stride: int) -> int:
        """reduce-window over the spatial dims of a channels-last tensor (VALID padding)."""
        shape = self.shape(x)
        spatial = len(shape) - 2
        out = (shape[0], *(max(1, (d - window) // stride + 1) for d in shape[1:-1]), shape[-1])
        size = (1, *(window,) * spatial, 1)
        strides = (1, *(stride,) * spatial, 1)
        zeros, ones = (0,) * len(shape), (1,) * len(shape)
        init = self.add("constant", ())
        return self.add("reduce-window", out, (x, init), window_size=size, window_stride=strides,
                        window_pad_low=zeros, window_pad_high=zeros, window_dilation=ones, base_dilation=ones,
                        window_reversal=zeros)

    def end_block(self) -> None:
        if len(self.nodes) > self.splits[-1]:
            self.splits.append(len(self.nodes))

    def build(self, root_inputs: tuple[int, ...]) -> Program:
        """Finish with a root tuple of ``root_inputs`` and derive the stored arrays."""
        root = self.add("tuple", (), tuple(root_inputs), etype="tuple", layout=(), tuple_size=len(root_inputs))
        self.end_block()
        nodes = self.nodes
        edges = sorted({(u, v) for u, node in enumerate(nodes) for v in node.inputs if v != u})
        edge_index = np.array(edges, dtype=np.int64).reshape(-1, 2)
        opcode = np.array([node.opcode for node in nodes], dtype=np.uint8)
        config_ids = np.flatnonzero(np.isin(opcode, CONFIGURABLE_OPCODES)).astype(np.int64)
        return Program(nodes, node_features(nodes, root), opcode, edge_index,
                       np.array([self.splits], dtype=np.int64), config_ids)


# ----------------------------------------------------------------------------- node features


def _group(values: tuple[int, ...], width: int) -> list[float]:
    """``width`` slots (0-padded) followed by sum and product (product of an empty list = 1)."""
    slots = list(values[:width]) + [0] * (width - min(len(values), width))
    return slots + [float(sum(values)), float(math.prod(values))]


def node_features(nodes: list[Node], root: int) -> np.ndarray:
    """The 140 node_feat columns exactly as documented in TPUGRAPHS_FORMAT.md."""
    feat = np.zeros((len(nodes), 140), dtype=np.float64)
    for i, node in enumerate(nodes):
        row = feat[i]
        a = node.attrs
        row[0] = 1.0 if i == root else 0.0
        row[2 + ELEMENT_TYPES.index(node.etype)] = 1.0
        row[21:29] = _group(node.shape, 6)
        row[29] = a.get("tuple_size", 0)
        row[30] = a.get("parameter_number", 0)
        dims = tuple(a.get("dimensions", ()))
        row[31:31 + len(dims)] = dims
        if "window_size" in a:
            for start, key in ((37, "window_size"), (45, "window_stride"), (53, "window_pad_low"),
                               (61, "window_pad_high"), (69, "window_dilation"), (77, "base_dilation")):
                row[start:start + 8] = _group(tuple(a[key]), 6)
            reversal = tuple(a["window_reversal"])
            row[85:85 + len(reversal)] = reversal
            row[91], row[92] = sum(reversal), len(reversal) - sum(reversal)
        else:  # no window: empty lists, whose products are 1
            for start in (37, 45, 53, 61, 69, 77):
                row[start + 7] = 1.0
        if "conv_dims" in a:
            row[93:107] = _conv_dim_slots(tuple(a["conv_dims"]))
            row[107], row[108] = a["feature_group_count"], a["batch_group_count"]
        for start, key in ((109, "slice_start"), (113, "slice_stride"), (117, "slice_limit"),
                           (121, "dynamic_slice_sizes"), (125, "pad_low"), (129, "pad_high")):
            values = tuple(a.get(key, ()))
            row[start:start + 4] = _group(values, 2)
        row[134:134 + len(node.layout)] = node.layout
    return feat.astype(np.float32)


def _conv_dim_slots(conv_dims: tuple[int, ...]) -> list[int]:
    """Lay out (in-batch, in-feature, in-spatial.., k-in, k-out, k-spatial.., out-batch, out-feature)."""
    spatial = (len(conv_dims) - 6) // 2
    in_batch, in_feat = conv_dims[0], conv_dims[1]
    in_sp = list(conv_dims[2:2 + spatial])
    k_in, k_out = conv_dims[2 + spatial], conv_dims[3 + spatial]
    k_sp = list(conv_dims[4 + spatial:4 + 2 * spatial])
    out_batch, out_feat = conv_dims[-2], conv_dims[-1]
    return [in_batch, in_feat, *(in_sp + [0] * (4 - spatial)), k_in, k_out, *(k_sp + [0] * (4 - spatial)),
            out_batch, out_feat]


# ----------------------------------------------------------------------------- families and variants


@dataclass(frozen=True)
class Family:
    """A program architecture; every variant of it shares this skeleton."""

    name: str
    kind: str  # "cnn", "rnn", "transformer" or "mlp"
    budget: int  # forward-pass node budget
    width: int  # base channels (cnn), hidden size (transformer) or layer width (mlp)
    spatial_rank: int = 2  # 2 (images) or 3 (unet_3d volumes)
    image: int = 224
    filler: int = 1  # elementwise ops appended after each compute unit
    layout_style: str = "default"  # compiler default for conv/dot outputs: "default" or "feature_minor"
    heads: int = 4
    seq: int = 128
    layers: int = 0  # transformer layers named by the family (0: as many as the budget allows)


@dataclass(frozen=True)
class Variant:
    batch: int
    etype: str = "f32"
    train: bool = False
    chips: int = 1


def build_program(family: Family, variant: Variant, rng: np.random.Generator) -> Program:
    """Build one program of ``family`` in ``variant`` (training variants add a backward pass)."""
    builder = ProgramBuilder(variant.etype)
    skeleton = {"cnn": _cnn, "rnn": _rnn, "transformer": _transformer, "mlp": _mlp}[family.kind]
    outputs, ops = skeleton(builder, family, variant, rng)
    if variant.train:
        outputs = outputs + _backward(builder, ops, variant, family, rng)
    return builder.build(tuple(outputs))


# A forward op the backward pass differentiates: (kind, input, weight, output).
ForwardOp = tuple[str, int, int, int]


def _act_layout(family: Family, rank: int) -> tuple[int, ...]:
    return feature_minor(rank) if family.layout_style == "feature_minor" else descending(rank)


def _cnn(b: ProgramBuilder, f: Family, v: Variant, rng: np.random.Generator) -> tuple[list[int], list[ForwardOp]]:
    batch = max(1, v.batch // v.chips)
    sr = f.spatial_rank
    size = max(4, f.image if sr == 2 else f.image // 4)
    x = b.parameter((batch, *(size,) * sr, 3 if sr == 2 else 4), layout=_act_layout(f, sr + 2))
    ops: list[ForwardOp] = []
    widths = [f.width * 2 ** i for i in range(4)]
    blocks_per_stage = max(1, f.budget // 160)

    def unit(x: int, out_ch: int, window: int, stride: int) -> int:
        in_ch = b.shape(x)[-1]
        w = b.parameter((*(window,) * sr, in_ch, out_ch))
        y = b.conv(x, w, stride=stride, layout=_act_layout(f, sr + 2))
        ops.append(("conv", x, w, y))
        rank = len(b.shape(y))
        spatial_dims = tuple(range(rank - 1))
        mean = b.reduce(y, spatial_dims)
        centred = b.binary("subtract", y, b.broadcast(mean, b.shape(y), (rank - 1,)))
        var = b.reduce(b.binary("multiply", centred, centred), spatial_dims)
        inv = b.unary("rsqrt", var)
        y = b.binary("multiply", centred, b.broadcast(inv, b.shape(y), (rank - 1,)))
        y = b.binary("add", y, b.broadcast(b.parameter((out_ch,)), b.shape(y), (rank - 1,)))
        y = b.filler(y, f.filler, rng)
        return b.binary("maximum", y, b.scalar(b.shape(y)))

    x = unit(x, widths[0], 7 if sr == 2 else 3, 2)
    if b.shape(x)[1] >= 3:
        x = b.max_pool(x, 3, 2)
    stage = 0
    while True:
        for block in range(blocks_per_stage):
            if len(b) > f.budget * 0.85 and ops:
                break
            stride = 2 if block == 0 and stage > 0 and b.shape(x)[1] > 1 else 1
            out_ch = widths[min(stage, 3)]
            y = unit(x, max(8, out_ch // 4), 1, 1)
            y = unit(y, max(8, out_ch // 4), 3, stride)
            y = unit(y, out_ch, 1, 1)
            if b.shape(x) != b.shape(y):
                x = unit(x, out_ch, 1, stride)
            x = b.binary("maximum", b.binary("add", x, y), b.scalar(b.shape(y)))
            b.end_block()
        else:
            stage += 1
            continue
        break
    pooled = b.reduce(x, tuple(range(1, sr + 1)))  # (N, C)
    flat = b.reshape(pooled, (b.shape(pooled)[0], b.shape(pooled)[1]))
    w = b.parameter((b.shape(flat)[1], 1000))
    logits = b.dot(flat, w)
    ops.append(("dot", flat, w, logits))
    logits = b.binary("add", logits, b.broadcast(b.parameter((1000,)), b.shape(logits), (1,)))
    return [logits], ops


def _transformer(b: ProgramBuilder, f: Family, v: Variant,
                 rng: np.random.Generator) -> tuple[list[int], list[ForwardOp]]:
    batch = max(1, v.batch // v.chips)
    seq, hidden, heads = f.seq, f.width, f.heads
    head_dim = max(1, hidden // heads)
    hidden = head_dim * heads
    tokens = batch * seq
    ops: list[ForwardOp] = []
    table = b.parameter((30522 if f.seq > 64 else 8192, hidden))
    ids = b.parameter((batch, seq), etype="s32")
    x = b.add("gather", (batch, seq, hidden), (table, ids))
    x = b.reshape(x, (tokens, hidden))

    def dense(x: int, out: int) -> int:
        w = b.parameter((b.shape(x)[-1], out))
        y = b.dot(x, w)
        ops.append(("dot", x, w, y))
        return b.binary("add", y, b.broadcast(b.parameter((out,)), b.shape(y), (1,)))

    def layer_norm(x: int) -> int:
        mean = b.reduce(x, (1,))
        centred = b.binary("subtract", x, b.broadcast(mean, b.shape(x), (0,)))
        var = b.reduce(b.binary("multiply", centred, centred), (1,))
        return b.binary("multiply", centred, b.broadcast(b.unary("rsqrt", var), b.shape(x), (0,)))

    def split_heads(x: int, perm: tuple[int, ...]) -> int:
        return b.transpose(b.reshape(x, (batch, seq, heads, head_dim)), perm)

    layers = 0
    while layers == 0 or (len(b) < f.budget * 0.85 and (f.layers == 0 or layers < f.layers)):
        q = split_heads(dense(x, hidden), (0, 2, 1, 3))  # (B, A, S, D)
        k = split_heads(dense(x, hidden), (0, 2, 3, 1))  # (B, A, D, S)
        val = split_heads(dense(x, hidden), (0, 2, 1, 3))
        scores = b.dot(q, k)  # (B, A, S, S)
        ops.append(("dot", q, k, scores))
        scores = b.binary("multiply", scores, b.scalar(b.shape(scores)))
        peak = b.broadcast(b.reduce(scores, (3,)), b.shape(scores), (0, 1, 2))
        e = b.unary("exponential", b.binary("subtract", scores, peak))
        probs = b.binary("divide", e, b.broadcast(b.reduce(e, (3,)), b.shape(e), (0, 1, 2)))
        probs = b.filler(probs, f.filler, rng)
        ctx = b.dot(probs, val)  # (B, A, S, D)
        ops.append(("dot", probs, val, ctx))
        ctx = b.reshape(b.transpose(ctx, (0, 2, 1, 3)), (tokens, hidden))
        x = layer_norm(b.binary("add", dense(ctx, hidden), x))
        if len(b) < f.budget:  # tiny budgets keep only the attention half of a layer
            h = dense(x, 4 * hidden)
            h = b.binary("multiply", h, b.unary("tanh", b.binary("multiply", h, b.scalar(b.shape(h)))))
            h = b.filler(h, f.filler, rng)
            x = layer_norm(b.binary("add", dense(h, hidden), x))
        layers += 1
        b.end_block()
    first = b.slice(b.reshape(x, (batch, seq, hidden)), (batch, 1, hidden))  # the [CLS] token
    pooled = b.unary("tanh", dense(b.reshape(first, (batch, hidden)), hidden))
    logits = dense(pooled, 2)
    return [logits], ops


def _mlp(b: ProgramBuilder, f: Family, v: Variant, rng: np.random.Generator) -> tuple[list[int], list[ForwardOp]]:
    batch = max(8, v.batch // v.chips)
    ops: list[ForwardOp] = []
    tables = [b.parameter((100000, f.width)) for _ in range(2)]
    ids = [b.parameter((batch, 4), etype="s32") for _ in range(2)]
    embedded = [b.reshape(b.add("gather", (batch, 4, f.width), (t, i)), (batch, 4 * f.width))
                for t, i in zip(tables, ids)]
    x = b.add("concatenate", (batch, 8 * f.width), tuple(embedded), dimensions=(1,))
    width = f.width * 4
    while len(b) < f.budget * 0.85 or not ops:
        w = b.parameter((b.shape(x)[1], width))
        y = b.dot(x, w)
        ops.append(("dot", x, w, y))
        y = b.binary("add", y, b.broadcast(b.parameter((width,)), b.shape(y), (1,)))
        y = b.filler(y, f.filler, rng)
        x = b.binary("maximum", y, b.scalar(b.shape(y)))
        width = max(16, width // 2) if rng.random() < 0.3 else width
        b.end_block()
    return [x], ops


def _rnn(b: ProgramBuilder, f: Family, v: Variant, rng: np.random.Generator) -> tuple[list[int], list[ForwardOp]]:
    """Stacked LSTM layers, each a ``while`` loop over time steps (an LSTM under ``lax.scan``).

    Per layer: the input projection of every step at once (a dot over seq * batch rows), then the
    loop: its carried state (step, h, c, projected inputs) is a tuple fed to a ``while`` node; the
    body (flattened after it, as the graph holds the body computation's nodes) reads the state
    through get-tuple-element, multiplies h by the recurrent weights (a small dot per step: batch
    rows), adds the step's projected inputs, and applies the gates (sigmoid as tanh, elementwise
    products); the layer's output is the body's new h broadcast over the sequence.
    """
    batch = max(1, v.batch // v.chips)
    steps, hidden = max(4, f.seq), f.width
    ops: list[ForwardOp] = []
    x = b.parameter((steps, batch, hidden))
    layers = 0
    while layers == 0 or len(b) < f.budget * 0.85:
        in_dim = b.shape(x)[-1]
        flat = b.reshape(x, (steps * batch, in_dim))
        wx = b.parameter((in_dim, 4 * hidden))
        proj = b.dot(flat, wx)
        ops.append(("dot", flat, wx, proj))
        proj = b.binary("add", proj, b.broadcast(b.parameter((4 * hidden,)), b.shape(proj), (1,)))
        proj = b.reshape(proj, (steps, batch, 4 * hidden))
        h0, c0 = b.scalar((batch, hidden)), b.scalar((batch, hidden))
        counter = b.add("constant", (), etype="s32")
        state = b.add("tuple", (), (counter, h0, c0, proj), etype="tuple", layout=(), tuple_size=4)
        loop = b.add("while", (), (state,), etype="tuple", layout=(), tuple_size=4)
        h = b.add("get-tuple-element", (batch, hidden), (loop,))
        c = b.add("get-tuple-element", (batch, hidden), (loop,))
        xs = b.add("get-tuple-element", (steps, batch, 4 * hidden), (loop,))
        step_in = b.reshape(b.slice(xs, (1, batch, 4 * hidden)), (batch, 4 * hidden))
        wh = b.parameter((hidden, 4 * hidden))
        gates = b.dot(h, wh)
        ops.append(("dot", h, wh, gates))
        gates = b.filler(b.binary("add", gates, step_in), f.filler, rng)
        part = b.slice(gates, (batch, hidden))  # stand-in for the four gate slices (same shapes)
        i_g, f_g, o_g = (b.unary("tanh", part) for _ in range(3))
        g_g = b.unary("tanh", part)
        c_new = b.binary("add", b.binary("multiply", f_g, c), b.binary("multiply", i_g, g_g))
        h_new = b.binary("multiply", o_g, b.unary("tanh", c_new))
        x = b.broadcast(h_new, (steps, batch, hidden), (1, 2))
        layers += 1
        b.end_block()
    last = b.slice(x, (1, batch, hidden))
    w = b.parameter((hidden, 1000 if hidden >= 256 else 256))
    flat = b.reshape(last, (batch, hidden))
    logits = b.dot(flat, w)
    ops.append(("dot", flat, w, logits))
    return [logits], ops


def _backward(b: ProgramBuilder, ops: list[ForwardOp], v: Variant, f: Family,
              rng: np.random.Generator) -> list[int]:
    """Gradients of every differentiable forward op (in reverse) plus SGD weight updates."""
    outputs: list[int] = []
    grad: int | None = None
    for kind, x, w, y in reversed(ops):
        y_shape = b.shape(y)
        if grad is None:  # the loss gradient
            grad = b.binary("multiply", y, b.scalar(y_shape))
        elif b.shape(grad) != y_shape:  # the ops in between (norms, pooling) summarised by a rescale
            total = b.reduce(grad, tuple(range(len(b.shape(grad)))))
            grad = b.binary("multiply", y, b.broadcast(total, y_shape, ()))
        else:  # relu gradient
            positive = b.add("compare", y_shape, (y, b.scalar(y_shape)), etype="pred")
            grad = b.add("select", y_shape, (positive, grad, b.scalar(y_shape)))
        if kind == "conv":
            sr = len(y_shape) - 2
            # input gradient: convolution with the kernel's feature dims swapped
            dx = b.conv(grad, b.transpose(w, (*range(sr), sr + 1, sr)))
            x_shape = b.shape(x)
            if x_shape[:-1] == y_shape[:-1]:  # weight gradient as one big matmul over N * spatial
                rows = math.prod(y_shape[:-1])
                x_rows = b.transpose(b.reshape(x, (rows, x_shape[-1])), (1, 0))
                dw = b.dot(x_rows, b.reshape(grad, (rows, y_shape[-1])))
                dw = b.broadcast(dw, b.shape(w), (sr, sr + 1))
            else:  # strided: XLA emits a windowed reduction; a cheap stand-in keeps the node count similar
                dw = b.binary("multiply", w, b.scalar(b.shape(w)))
        else:
            rank = len(b.shape(w))
            dx = b.dot(grad, b.transpose(w, (*range(rank - 2), rank - 1, rank - 2)))
            dw = b.dot(b.transpose(x, (*range(rank - 2), rank - 1, rank - 2)), grad)
        if v.chips > 1:
            dw = b.add("all-reduce", b.shape(dw), (dw,))
        if b.nodes[w].opcode == OP["parameter"]:
            outputs.append(b.binary("subtract", w, b.binary("multiply", dw, b.scalar(b.shape(dw)))))
        grad = b.filler(dx, max(0, f.filler - 1), rng)
        b.end_block()
    return outputs if outputs else [grad]


# ----------------------------------------------------------------------------- tile kernels


@dataclass(frozen=True)
class TileKernel:
    """What the tile cost model needs to know about one fused kernel."""

    kind: str  # "conv", "dot", "reduce" or "eltwise"
    out_shape: tuple[int, ...]
    in_shape: tuple[int, ...]  # main input (for reduce: the reduced tensor)
    contract: int  # contracted size per output element tile step (conv: C_in, dot: K); 0 otherwise
    window: tuple[int, ...]  # conv window (spatial); () otherwise
    stride: int
    epilogue: int  # elementwise ops applied per output element
    elem_bytes: int


def build_tile_kernel(model: Family, variant: Variant, kind: str, nodes: int,
                      rng: np.random.Generator) -> tuple[Program, TileKernel]:
    """One fused kernel of ``model`` with about ``nodes`` nodes (at least the kind's minimum)."""
    b = ProgramBuilder(variant.etype)
    batch = max(1, variant.batch)
    ebytes = ELEMENT_BYTES[variant.etype]
    if kind == "conv":
        size = int(rng.choice([7, 14, 28, 56, 112])) if model.kind == "cnn" else int(rng.choice([8, 16, 32]))
        cin = int(model.width * 2 ** rng.integers(0, 4))
        cout = int(model.width * 2 ** rng.integers(0, 4))
        window = int(rng.choice([1, 3, 3, 5]))
        stride = int(rng.choice([1, 1, 2]))
        x = b.parameter((batch, size, size, cin))
        w = b.parameter((window, window, cin, cout))
        y = b.conv(x, w, stride=stride)
        in_shape, contract, win = b.shape(x), cin, (window, window)
    elif kind == "dot":
        m = int(batch * rng.choice([1, 16, 64, 128]))
        k = int(model.width * 2 ** rng.integers(0, 3))
        n = int(model.width * 2 ** rng.integers(0, 3))
        x = b.parameter((m, k))
        y = b.dot(x, b.parameter((k, n)))
        in_shape, contract, win, stride = (m, k), k, (), 1
    elif kind == "reduce":
        shape = (batch, int(rng.choice([16, 64, 128, 512])), int(model.width * 2 ** rng.integers(0, 3)))
        x = b.parameter(shape)
        y = b.reduce(b.filler(x, 1, rng), (2,))
        in_shape, contract, win, stride = shape, 0, (), 1
    else:
        shape = (batch, int(rng.choice([7, 14, 28, 56, 128])), int(model.width * 2 ** rng.integers(0, 4)))
        x = b.parameter(shape)
        y = b.filler(x, 1, rng)
        in_shape, contract, win, stride = shape, 0, (), 1
    start = len(b)
    while len(b) < max(nodes, 5) - 1:  # the root tuple is the last node
        y = b.filler(y, 1, rng)
    epilogue = len(b) - start
    program = b.build((y,))
    return program, TileKernel(kind, b.shape(y), tuple(in_shape), contract, win, stride, epilogue, ebytes)
