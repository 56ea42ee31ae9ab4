"""Pure functions: parsed HLO instructions -> the TpuGraphs arrays (node_feat, node_opcode, edges, splits).

Column meanings, opcode ids and the graph rules follow the dataset's own featurizer
(``tpu_graphs/process_data/xla/featurizers.h``, ``hlo_opcode.h`` and ``hlo_encoder.cc`` in
google-research-datasets/tpu_graphs), as summarised in shared/TPUGRAPHS_FORMAT.md:

* a module graph holds every instruction of every computation, node ``i`` the ``i``-th instruction of
  the serialized module (computations in the proto's order, then their instructions in its order, as
  ``HloEncoder`` numbers them; XLA writes callees and operands first); ``is_root`` marks each
  computation's root;
* edges: row ``[u, v]`` for each distinct operand ``v`` of ``u``, plus ``[u, root of c]`` for each
  computation ``c`` that ``u`` calls (so a while, call or fusion sees its body);
* ``node_splits``: a split after each computation whose name contains ``cluster``, ``while`` or
  ``cond``, and at the end;
* a tile graph is one fused computation alone (no edges to other computations).

Attribute groups hold six leading values (0 padded) then their sum and product (product of an empty
list 1); a group absent from an instruction is all zero except that product.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from pipelines.core.errors import FormatError
from pipelines.hlo.parse import Computation, Instruction, Module, Shape
from pipelines.data.tpugraphs import NODE_FEAT_DIM, NodeFeat

# The dataset's opcode ids (hlo_opcode.h: LEARNED list plus the two tombstones); 0 = unknown.
_OPCODES = """
abs add add-dependency after-all all-reduce all-to-all atan2 batch-norm-grad batch-norm-inference
batch-norm-training bitcast bitcast-convert broadcast call ceil cholesky clamp collective-permute
count-leading-zeros compare complex concatenate conditional constant convert convolution copy copy-done
copy-start cosine custom-call divide domain dot dynamic-slice dynamic-update-slice exponential
exponential-minus-one fft floor fusion gather get-dimension-size set-dimension-size get-tuple-element
imag infeed iota is-finite log log-plus-one and not or xor map maximum minimum multiply negate outfeed
pad parameter partition-id popcnt power real recv recv-done reduce reduce-precision reduce-window
remainder replica-id reshape reverse rng rng-get-and-update-state rng-bit-generator round-nearest-afz
rsqrt scatter select select-and-scatter send send-done shift-left shift-right-arithmetic
shift-right-logical sign sine slice sort sqrt subtract tanh trace transpose triangular-solve tuple
tuple-select while cbrt all-gather collective-permute-start collective-permute-done logistic
dynamic-reshape all-reduce-start all-reduce-done reduce-scatter all-gather-start all-gather-done
opt-barrier async-start async-update async-done round-nearest-even stochastic-convert tan
""".split()
OPCODE_IDS: dict[str, int] = {name: i for i, name in enumerate(_OPCODES, start=1)}  # trace 97, tuple-select 101
CONFIGURABLE = ("convolution", "dot", "reshape")
CONFIGURABLE_IDS = tuple(OPCODE_IDS[o] for o in CONFIGURABLE)
# featurizers.h PRIMITIVE_TYPE_FEATURES order; a type outside it (f8e4m3fn, s4, ...) sets no column.
ELEMENT_TYPES = ("invalid", "pred", "s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64", "f16", "f32", "f64",
                 "bf16", "c64", "c128", "tuple", "opaque", "token")
SPLIT_NAME_PARTS = ("cluster", "while", "cond")
# Ops whose proto carries feature/batch group counts (others hold 0 there).
_GROUPED_OPS = ("convolution", "custom-call")


def opcode_id(opcode: str) -> int:
    return OPCODE_IDS.get(opcode, 0)


# ----------------------------------------------------------------------------- attribute text


def int_list(text: str) -> list[int]:
    """``{1,0}`` or ``1,0`` -> [1, 0]; ``{}`` -> []."""
    return [int(x) for x in re.findall(r"-?\d+", text or "")]


@dataclass(frozen=True)
class Window:
    size: tuple[int, ...]
    stride: tuple[int, ...]
    pad_low: tuple[int, ...]
    pad_high: tuple[int, ...]
    window_dilation: tuple[int, ...]  # rhs_dilate
    base_dilation: tuple[int, ...]  # lhs_dilate
    reversal: tuple[bool, ...]


def parse_window(text: str) -> Window:
    """``{size=3x3 stride=2x2 pad=0_1x0_1 lhs_dilate=2x2 rhs_dilate=1x1 rhs_reversal=0x1}``; fields XLA
    leaves out are its defaults (stride and dilations 1, padding 0, no reversal)."""
    fields = dict(part.split("=", 1) for part in (text or "").strip("{} ").split() if "=" in part)
    size = tuple(int(x) for x in fields["size"].split("x")) if fields.get("size") else ()
    rank = len(size)

    def dims(key: str, default: int) -> tuple[int, ...]:
        return tuple(int(x) for x in fields[key].split("x")) if key in fields else (default,) * rank

    pads = [tuple(int(v) for v in p.split("_")) for p in fields["pad"].split("x")] if "pad" in fields \
        else [(0, 0)] * rank
    return Window(size, dims("stride", 1), tuple(p[0] for p in pads), tuple(p[1] for p in pads),
                  dims("rhs_dilate", 1), dims("lhs_dilate", 1), tuple(bool(v) for v in dims("rhs_reversal", 0)))


def parse_dim_labels(text: str) -> list[int]:
    """``b01f_01io->b01f`` -> the 14 convolution dimension numbers of the dataset's featurizer: input
    batch, input feature, input spatial x4, kernel input feature, kernel output feature, kernel
    spatial x4, output batch, output feature (spatial dims in their numeric order, 0 padded)."""
    lhs, _, rest = text.partition("_")
    rhs, _, out = rest.partition("->")

    def spatial(labels: str) -> list[int]:
        found = sorted((int(ch), i) for i, ch in enumerate(labels) if ch.isdigit())
        positions = [i for _, i in found][:4]
        return positions + [0] * (4 - len(positions))

    return [lhs.find("b"), lhs.find("f"), *spatial(lhs), rhs.find("i"), rhs.find("o"), *spatial(rhs),
            out.find("b"), out.find("f")]


def parse_slice(text: str) -> tuple[list[int], list[int], list[int]]:
    """``{[0:4], [1:3:2]}`` -> starts, strides, limits."""
    starts, strides, limits = [], [], []
    for start, limit, stride in re.findall(r"\[\s*(-?\d+)\s*:\s*(-?\d+)\s*(?::\s*(-?\d+))?\s*\]", text or ""):
        starts.append(int(start))
        limits.append(int(limit))
        strides.append(int(stride) if stride else 1)
    return starts, strides, limits


def parse_padding(text: str) -> tuple[list[int], list[int]]:
    """``0_0x1_2_1`` (low_high[_interior] per dim) -> edge lows, edge highs."""
    lows, highs = [], []
    for dim in (text or "").split("x"):
        values = [int(v) for v in dim.split("_") if v.strip().lstrip("-").isdigit()]
        if len(values) >= 2:
            lows.append(values[0])
            highs.append(values[1])
    return lows, highs


def group(values, width: int) -> list[float]:
    """``width`` leading values (0 padded), their sum, their product (1 for an empty list)."""
    values = [int(v) for v in values]
    return [float(v) for v in values[:width]] + [0.0] * (width - min(len(values), width)) + \
        [float(sum(values)), float(math.prod(values))]


# ----------------------------------------------------------------------------- one node


def node_features(instruction: Instruction, is_root: bool) -> np.ndarray:
    """The 140 node_feat columns of one instruction (float64; cast on writing)."""
    row = np.zeros(NODE_FEAT_DIM, dtype=np.float64)
    shape, attrs, op = instruction.shape, instruction.attrs, instruction.opcode
    row[NodeFeat.IS_ROOT] = 1.0 if is_root else 0.0
    if shape.etype in ELEMENT_TYPES:
        row[NodeFeat.ELEMENT_TYPE.start + ELEMENT_TYPES.index(shape.etype)] = 1.0
    row[21:29] = group(shape.dims, 6)
    row[NodeFeat.TUPLE_SIZE] = len(shape.elements) if shape.is_tuple else 0
    row[NodeFeat.PARAMETER_NUMBER] = instruction.parameter_number
    dims = int_list(attrs["dimensions"]) if "dimensions" in attrs else \
        int_list(attrs["iota_dimension"]) if "iota_dimension" in attrs else []
    row[31:31 + min(len(dims), 6)] = dims[:6]
    window = parse_window(attrs["window"]) if "window" in attrs else parse_window("")
    for start, values in ((37, window.size), (45, window.stride), (53, window.pad_low), (61, window.pad_high),
                          (69, window.window_dilation), (77, window.base_dilation)):
        row[start:start + 8] = group(values, 6)
    rev = window.reversal
    row[85:85 + min(len(rev), 6)] = [1.0 if r else 0.0 for r in rev[:6]]
    row[91], row[92] = sum(rev), len(rev) - sum(rev)
    if "dim_labels" in attrs:
        row[93:107] = parse_dim_labels(attrs["dim_labels"])
    if op in _GROUPED_OPS:
        row[107] = int(attrs.get("feature_group_count", 1))
        row[108] = int(attrs.get("batch_group_count", 1))
    starts, strides, limits = parse_slice(attrs["slice"]) if op == "slice" and "slice" in attrs else ([], [], [])
    row[109:113], row[113:117], row[117:121] = group(starts, 2), group(strides, 2), group(limits, 2)
    row[121:125] = group(int_list(attrs.get("dynamic_slice_sizes", "")), 2)
    lows, highs = parse_padding(attrs["padding"]) if op == "pad" and "padding" in attrs else ([], [])
    row[125:129], row[129:133] = group(lows, 2), group(highs, 2)
    row[NodeFeat.IS_STABLE] = 1.0 if attrs.get("is_stable") == "true" else 0.0
    layout = shape.minor_to_major if not shape.is_tuple else ()
    row[134:134 + min(len(layout), 6)] = layout[:6]
    return row


# ----------------------------------------------------------------------------- graphs


@dataclass
class GraphArrays:
    """What a featurized graph holds, with the names that map its nodes back to the HLO."""

    node_feat: np.ndarray  # float32 (n, 140)
    node_opcode: np.ndarray  # uint8 (n,)
    edge_index: np.ndarray  # int64 (m, 2)
    node_splits: np.ndarray  # int64 (1, s)
    names: list[str]  # HLO instruction name per node
    instructions: list[Instruction]
    unknown_ops: dict[str, int]  # opcode -> count of nodes given id 0

    @property
    def config_ids(self) -> np.ndarray:
        return np.flatnonzero(np.isin(self.node_opcode, CONFIGURABLE_IDS)).astype(np.int64)


def module_graph(module: Module) -> GraphArrays:
    """The whole module as one layout graph (see the module docstring for the rules)."""
    return _graph(module.computations, cross_computation=True, source=module.source)


def computation_graph(computation: Computation, source: str = "<module>") -> GraphArrays:
    """One computation alone (a fused computation as a tile graph)."""
    return _graph([computation], cross_computation=False, source=source)


def _graph(computations: list[Computation], cross_computation: bool, source: str) -> GraphArrays:
    index: dict[str, int] = {}
    roots: dict[str, int] = {}
    for computation in computations:
        for instruction in computation.instructions:
            index[instruction.name] = len(index)
        roots[computation.name] = index[computation.root]
    feats, opcodes, names, instructions = [], [], [], []
    edges: set[tuple[int, int]] = set()
    splits = [0]
    unknown: dict[str, int] = {}
    for computation in computations:
        for instruction in computation.instructions:
            u = len(names)
            feats.append(node_features(instruction, instruction.name == computation.root))
            code = opcode_id(instruction.opcode)
            if code == 0:
                unknown[instruction.opcode] = unknown.get(instruction.opcode, 0) + 1
            opcodes.append(code)
            names.append(instruction.name)
            instructions.append(instruction)
            targets = [index[o] for o in instruction.operands if o in index]
            if cross_computation:
                targets += [roots[c] for c in instruction.called if c in roots]
            for v in targets:
                if v >= u:  # XLA writes producers and callees first; the format relies on it
                    raise FormatError(source, f"instruction {instruction.name} is listed before what it uses "
                                              f"(node {v}) in the module's proto: not a module XLA serialized")
                edges.add((u, v))
        if any(part in computation.name for part in SPLIT_NAME_PARTS):
            splits.append(len(names))
    if splits[-1] < len(names):
        splits.append(len(names))
    edge_index = np.array(sorted(edges), dtype=np.int64).reshape(-1, 2)
    node_feat = np.array(feats, dtype=np.float32).reshape(-1, NODE_FEAT_DIM)
    return GraphArrays(node_feat, np.array(opcodes, dtype=np.uint8), edge_index,
                       np.array([splits], dtype=np.int64), names, instructions, unknown)


def shape_text(shape: Shape) -> str:
    return str(shape)
