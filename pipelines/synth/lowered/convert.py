"""A featurized HLO module as the synthetic world's :class:`~pipelines.synth.programs.Program`, which every
cost family prices (pure functions over :mod:`pipelines.hlo` records).

The stored graph is the featurizer's (every computation, callees first); the priced program is the
same computation as XLA would run it after inlining:

* a ``call`` whose callee has that one call site is inlined: the callee's parameter ``i`` is the
  call's operand ``i``, and the call's result is the callee's root;
* a ``while`` stays one node (its operand the initial state); its body and condition follow it, their
  parameter read as the loop node itself (as :func:`pipelines.synth.programs._rnn` builds loops);
* a computation applied per element (the scalar ``to_apply`` of a reduce, a sort comparator, ...) is
  left out: its work is priced with the instruction that applies it; a computation with several call
  sites keeps its own parameters (a fixed layout at its boundary), placed before the entry's nodes.

Every instruction keeps its real opcode id, shape, element type, default layout and attributes under
the names the synthetic programs use (``window_size``, ``conv_dims`` in the order in-batch, in-feature,
in-spatial..., kernel-in, kernel-out, kernel-spatial..., out-batch, out-feature; ``dimensions``;
``lhs_contracting_dims`` ...), so the families read real dimension numbers. The configurable nodes
are the stored graph's, possibly in another order: :attr:`PricedProgram.order` maps them. A dot that
contracts no dim (transformers' head mask, an outer product) is priced as the elementwise product XLA's
algebraic simplifier makes of it, so its layout config changes nothing.

Layout configs of the lowered worlds may be partial, as in the real tuning records: a block that
lists only its two minor-most dims leaves the rest to the compiler. :func:`complete_blocks` fills the
unlisted dims in the order the default layout has them, before a family prices the config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipelines.hlo.featurize import CONFIGURABLE_IDS, GraphArrays, int_list, parse_window
from pipelines.hlo.parse import Computation, Instruction, Module, Shape
from pipelines.synth.programs import ELEMENT_BYTES, MAX_RANK, Node, Program, TileKernel, descending, node_features

INLINED_CALLS = ("call",)
LOOPS = ("while",)
# element types outside the synthetic programs' table, priced as the nearest one of the same width
_ETYPE_FALLBACK = {1: "s8", 2: "bf16", 4: "f32", 8: "f64"}


@dataclass(frozen=True)
class PricedProgram:
    """The priced program of a stored layout graph and the map between their configurable nodes."""

    program: Program
    order: np.ndarray  # int64 (priced nc,): stored config index of each priced configurable node
    stored_nodes: int  # configurable nodes of the stored graph (more when dots were strength-reduced)

    def priced_blocks(self, stored: np.ndarray) -> np.ndarray:
        """Stored-order layout configs (c, nc, 18) in the priced program's node order."""
        return stored[:, self.order]

    def stored_blocks(self, priced: np.ndarray, fill: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`priced_blocks`; a stored node the program does not price takes its row of
        ``fill`` (stored nc, 18) in every config."""
        out = np.broadcast_to(fill[None], (priced.shape[0], *fill.shape)).copy()
        out[:, self.order] = priced
        return out


class _Builder:
    """Appends priced nodes; ``alias`` maps a stored node index to the priced node holding its value."""

    def __init__(self, index: dict[str, int], shapes: dict[str, Shape]):
        self.index = index
        self.shapes = shapes
        self.nodes: list[Node] = []
        self.origin: list[int] = []  # stored node index of each priced node
        self.alias: dict[int, int] = {}

    def value(self, name: str) -> int:
        return self.alias[self.index[name]]

    def add(self, instruction: Instruction, inputs: tuple[int, ...]) -> int:
        u = len(self.nodes)
        self.nodes.append(priced_node(instruction, inputs))
        stored = self.index[instruction.name]
        self.origin.append(stored)
        self.alias[stored] = u
        return u


def priced_program(module: Module, graph: GraphArrays, config_ids: np.ndarray) -> PricedProgram:
    """The priced program of ``module`` as featurized into ``graph`` (see the module docstring)."""
    index = {name: i for i, name in enumerate(graph.names)}
    shapes = {ins.name: ins.shape for ins in graph.instructions}
    by_name = {c.name: c for c in module.computations}
    sites: dict[str, int] = {}
    for _, ins in module.instructions():
        for callee in ins.called:
            sites[callee] = sites.get(callee, 0) + 1
    inlined = {callee for _, ins in module.instructions() if ins.opcode in INLINED_CALLS + LOOPS
               for callee in ins.called if sites[callee] == 1}
    configurable = set(CONFIGURABLE_IDS)
    builder = _Builder(index, shapes)

    def emit(computation: Computation, parameters: dict[int, int] | None) -> None:
        for ins in computation.instructions:
            stored = index[ins.name]
            if ins.opcode == "parameter" and parameters is not None:
                builder.alias[stored] = parameters.get(ins.parameter_number, parameters.get(-1, -1))
                continue
            inputs = tuple(builder.value(o) for o in ins.operands)
            if ins.opcode in INLINED_CALLS and ins.called and ins.called[0] in inlined:
                callee = by_name[ins.called[0]]
                emit(callee, dict(enumerate(inputs)))
                builder.alias[stored] = builder.value(callee.root)
                continue
            u = builder.add(ins, inputs)
            if ins.opcode in LOOPS:
                for name in ins.called:
                    if name in inlined:
                        emit(by_name[name], {-1: u})

    def holds_configurable(name: str) -> bool:  # itself or a computation inlined into it
        return any(graph.node_opcode[index[i.name]] in configurable or
                   any(c in inlined and holds_configurable(c) for c in i.called) for i in by_name[name].instructions)

    for computation in module.computations:  # not inlined anywhere: its own parameters, before the entry
        if not computation.is_entry and computation.name not in inlined and holds_configurable(computation.name):
            emit(computation, None)
    emit(module.entry, None)
    if any(v < 0 for v in builder.alias.values()):
        raise ValueError(f"{module.source}: a loop parameter read before its loop")
    return _program(builder, graph, config_ids, module.source)


def _program(builder: _Builder, graph: GraphArrays, config_ids: np.ndarray, source: str) -> PricedProgram:
    nodes = builder.nodes
    edges = sorted({(u, v) for u, node in enumerate(nodes) for v in node.inputs if v != u})
    opcode = np.array([node.opcode for node in nodes], dtype=np.uint8)
    priced_ids = np.flatnonzero(np.isin(opcode, CONFIGURABLE_IDS)).astype(np.int64)
    stored_position = {int(u): k for k, u in enumerate(config_ids)}
    order = np.array([stored_position[builder.origin[u]] for u in priced_ids], dtype=np.int64)
    emitted = {builder.origin[u] for u in range(len(nodes))}
    if len(set(order.tolist())) != len(order) or not all(int(u) in emitted for u in config_ids):
        raise ValueError(f"{source}: the priced program holds {len(order)} of the {len(config_ids)} configurable nodes")
    root = len(nodes) - 1
    program = Program(nodes, node_features(nodes, root), opcode, np.array(edges, dtype=np.int64).reshape(-1, 2),
                      np.array([[0, len(nodes)]], dtype=np.int64), priced_ids)
    return PricedProgram(program, order, len(config_ids))


# ----------------------------------------------------------------------------- one node


def element_type(shape: Shape) -> str:
    """The shape's element type as the cost models know it (an unknown one by its width)."""
    if shape.is_tuple:
        return "tuple"
    if shape.etype in ELEMENT_BYTES:
        return shape.etype
    bits = [int(b) for b in "".join(ch if ch.isdigit() else " " for ch in shape.etype).split()]
    return _ETYPE_FALLBACK.get(max(1, (bits[0] if bits else 32) // 8), "f32")


def priced_node(instruction: Instruction, inputs: tuple[int, ...]) -> Node:
    """One instruction as a synthetic-program node (see the module docstring for the attribute names)."""
    from pipelines.hlo.featurize import opcode_id

    shape = instruction.shape
    etype = element_type(shape)
    dims = () if shape.is_tuple else tuple(max(1, d) for d in shape.dims)  # dynamic (-1) or empty dims: 1
    if len(dims) > MAX_RANK:
        raise ValueError(f"instruction {instruction.name}: rank {len(dims)} above {MAX_RANK}")
    layout = tuple(shape.minor_to_major) if sorted(shape.minor_to_major) == list(range(len(dims))) \
        else descending(len(dims))
    attrs = node_attributes(instruction)
    opcode = instruction.opcode
    if opcode == "dot" and not attrs.get("lhs_contracting_dims"):
        opcode = "multiply"  # XLA's algebraic simplifier turns a dot that contracts nothing into a product
    return Node(opcode_id(opcode), dims, etype, inputs, () if shape.is_tuple else layout, attrs)


def node_attributes(instruction: Instruction) -> dict[str, tuple[int, ...] | int]:
    a = instruction.attrs
    out: dict[str, tuple[int, ...] | int] = {}
    if instruction.opcode == "parameter":
        out["parameter_number"] = instruction.parameter_number
    if instruction.shape.is_tuple:
        out["tuple_size"] = len(instruction.shape.elements)
    if "dimensions" in a:
        out["dimensions"] = tuple(int_list(a["dimensions"]))
    if "window" in a:
        w = parse_window(a["window"])
        out.update(window_size=w.size, window_stride=w.stride, window_pad_low=w.pad_low, window_pad_high=w.pad_high,
                   window_dilation=w.window_dilation, base_dilation=w.base_dilation,
                   window_reversal=tuple(int(r) for r in w.reversal))
    if "dim_labels" in a:
        out["conv_dims"] = conv_dims(a["dim_labels"])
    if instruction.opcode == "convolution":
        out["feature_group_count"] = int(a.get("feature_group_count", 1))
        out["batch_group_count"] = int(a.get("batch_group_count", 1))
    for key in ("lhs_contracting_dims", "rhs_contracting_dims", "lhs_batch_dims", "rhs_batch_dims"):
        if key in a:
            out[key] = tuple(int_list(a[key]))
    if instruction.opcode == "slice" and "slice" in a:
        from pipelines.hlo.featurize import parse_slice

        starts, strides, limits = parse_slice(a["slice"])
        out.update(slice_start=tuple(starts), slice_stride=tuple(strides), slice_limit=tuple(limits))
    return out


def conv_dims(labels: str) -> tuple[int, ...]:
    """``b01f_01io->b01f`` -> (in-batch, in-feature, in-spatial..., kernel-in, kernel-out, kernel-spatial...,
    out-batch, out-feature), spatial dims in their numeric order (as the synthetic programs store them)."""
    lhs, _, rest = labels.partition("_")
    rhs, _, out = rest.partition("->")

    def spatial(text: str) -> list[int]:
        return [i for _, i in sorted((int(ch), i) for i, ch in enumerate(text) if ch.isdigit())]

    return (lhs.index("b"), lhs.index("f"), *spatial(lhs), rhs.index("i"), rhs.index("o"), *spatial(rhs),
            out.index("b"), out.index("f"))


# ----------------------------------------------------------------------------- partial layout blocks


def complete_blocks(blocks: np.ndarray, defaults: np.ndarray, rows: int = 4096) -> np.ndarray:
    """Layout configs (c, nc, 18) with every partial block (a prefix of its tensor's dims listed, the rest
    -1) completed by the unlisted dims in the order ``defaults`` (nc, 18) lists them; full and all -1
    blocks are kept."""
    out = blocks.copy()
    for start in range(0, blocks.shape[0], rows):
        chunk = blocks[start:start + rows]
        for b in range(3):
            cols = slice(6 * b, 6 * b + 6)
            listed = chunk[:, :, cols].astype(np.int16)
            default = np.broadcast_to(defaults[None, :, cols].astype(np.int16), listed.shape)
            count = (listed >= 0).sum(axis=-1)
            rank = (default >= 0).sum(axis=-1)
            partial = (count > 0) & (count < rank)
            if not partial.any():
                continue
            taken = (default[..., :, None] == listed[..., None, :]).any(axis=-1)
            rest_order = np.argsort(~((default >= 0) & ~taken), axis=-1, kind="stable")
            rest = np.take_along_axis(default, rest_order, axis=-1)
            slot = np.arange(6)
            fill = np.take_along_axis(rest, np.clip(slot - count[..., None], 0, 5), axis=-1)
            filled = np.where(slot < count[..., None], listed, np.where(slot < rank[..., None], fill, -1))
            out[start:start + rows, :, cols] = np.where(partial[..., None], filled, listed).astype(np.int8)
    return out


def truncate_blocks(blocks: np.ndarray, partial: np.ndarray, listed: int = 2) -> np.ndarray:
    """Configs with each block marked in ``partial`` (nc, 3) cut to its ``listed`` minor-most dims (the
    rest -1, left to the compiler), as the real tuning records list rank-4 and rank-5 layouts."""
    out = blocks.copy()
    for b in range(3):
        cut = partial[:, b]
        if cut.any():
            out[:, cut, 6 * b + listed:6 * b + 6] = -1
    return out


# ----------------------------------------------------------------------------- tile kernels


def tile_kernel(fused: Computation, shapes: dict[str, Shape], space) -> TileKernel:
    """The :class:`TileKernel` summary of one fused computation, consistent with the tile configs of
    ``space`` (:func:`pipelines.hlo.configs.tile_space`): the conv input in (batch, spatial..., feature)
    order, a dot's input as (output dims but the last, contracted), a reduction's as (output dims,
    reduced)."""
    from pipelines.hlo.featurize import parse_dim_labels

    root = next(i for i in fused.instructions if i.name == fused.root)
    out_shape = tuple(space.out_shape)
    stride, in_shape = 1, out_shape
    main = next((i for i in fused.instructions if i.opcode in ("convolution", "dot", "reduce")), None)
    if space.kind == "conv" and main is not None:
        lhs = shapes[main.operands[0]].first_array()
        labels = main.attrs.get("dim_labels", "")
        numbers = parse_dim_labels(labels) if labels else [0, lhs.rank - 1]
        spatial = [i for _, i in sorted((int(ch), i) for i, ch in enumerate(labels.partition("_")[0]) if ch.isdigit())]
        in_shape = (lhs.dims[numbers[0]], *(lhs.dims[d] for d in spatial), lhs.dims[numbers[1]])
        strides = parse_window(main.attrs.get("window", "")).stride
        stride = int(strides[0]) if strides else 1
    elif space.kind == "dot":
        in_shape = (*out_shape[:-1], space.contract)
    elif space.kind == "reduce":
        in_shape = (*out_shape, space.reduced)
    quiet = {"parameter", "constant", "broadcast", "tuple", "get-tuple-element", "bitcast", "reshape", "copy"}
    work = [i for i in fused.instructions if i.opcode not in quiet]
    epilogue = max(0, len(work) - (1 if main is not None else 0))
    elem = ELEMENT_BYTES.get(element_type(root.shape.first_array()), 4)
    return TileKernel(space.kind, out_shape, tuple(int(d) for d in in_shape), int(space.contract),
                      tuple(int(w) for w in space.window), stride, epilogue, int(elem))


def kernel_ok(kernel: TileKernel) -> bool:
    """Whether a fused kernel can be a tile graph: a non-scalar output of rank <= 6 and positive sizes."""
    shapes = (kernel.out_shape, kernel.in_shape)
    return bool(kernel.out_shape) and all(len(s) <= MAX_RANK and all(d >= 1 for d in s) for s in shapes) \
        and math.prod(kernel.out_shape) > 1
