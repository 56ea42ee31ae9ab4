"""Pure runtime functions of the synthetic world: a small, physically motivated TPU cost model.

Units: nanoseconds, bytes, flops. The machine is TPU-like: a matrix unit (MXU) of ``PEAK_FLOPS_NS``
flops/ns for 16-bit types (a quarter of that for f32, which takes several passes), a vector unit of
``VPU_OPS_NS`` element-ops/ns, HBM bandwidth ``HBM_BYTES_NS`` bytes/ns, ``VMEM_BYTES`` of on-chip
memory, and a fixed cost per launched op.

Memory tiling. Arrays live in HBM in (8 x 128) tiles over their two minor-most dimensions under
the array's layout (``minor_to_major[0]`` is padded up to a multiple of 128, ``minor_to_major[1]``
to a multiple of 8). A layout that puts a small dimension minor-most (a 3-channel image, a batch of
1) wastes most of every tile: bytes moved and MXU passes grow by the padding ratio.

Layout programs (``layout_costs``). A program's runtime is a fixed part (every non-configurable
op at its default layout, roofline-costed) plus, per configurable node (convolution, dot,
reshape) under its chosen output/input/kernel layouts:

* convolution and dot: roofline ``max(flops_eff / peak, memory) + launch``, where ``memory`` is
  padded bytes / bandwidth plus ``DMA_RUN_NS`` per contiguous run of the minor-most dim moved
  (a short minor dim means many short transfers: "largest dim minor-most" pays off), and
  ``flops_eff = flops * sqrt(pad_in * pad_out * pad_kernel)`` (the MXU multiplies padded tiles)
  times 1.2 when the contracted feature dim is not among the input's two minor dims and 1.1
  when the output feature dim is not minor-most (in-core transposes feed the MXU);
* reshape: a free bitcast when both layouts are row-major (descending), else a copy;
* implied copies: where a producer's output layout and its consumer's expected input layout
  disagree (following the producer through layout-preserving elementwise ops), a copy of the
  padded tensor is inserted. Producers with a fixed layout (parameters, transposes, reductions,
  ...: ``RIGID_PRODUCERS``) impose theirs on configurable consumers, and layout-rigid consumers
  (program outputs, transposes, ...: ``RIGID_CONSUMERS``) expect configurable outputs in their
  default layout; broadcasts, constants and elementwise ops adapt for free.

Non-configurable ops are costed once per program at their default layouts and scaled by
``FUSED_SHARE`` (XLA fuses most elementwise work into neighbouring kernels).

A compiler-default block (all -1) resolves to the node's own default layout from node_feat
(columns 134-139) for outputs and to the producing node's default layout for inputs and kernels,
so "let the compiler choose" avoids copies but keeps whatever padding the defaults imply: it is
neither always best nor always worst. Big ops dominate (a 3x3 conv over 56x56x256 matters more
than a tiny reshape), and the effects interact (a layout that pads less may force copies), so no
single hand-made feature ranks configs perfectly.

Tile kernels (``tile_costs``). A fused kernel runs tile by tile over its output; the reduction
(contracted) dim of a conv/dot is tiled too. Per step it moves the padded input, kernel and output
tiles and computes on padded tiles; a step costs ``max(compute, memory) + step overhead`` (double
buffering overlaps the two), plus the exposed fill and drain (one step's memory traffic), so
few big tiles pipeline badly. The working set (double-buffered in/kernel tiles plus an f32
accumulator) beyond ``VMEM_BYTES`` spills: memory time grows with the overflow.
Output tiles are shared out over ``TILE_CORES`` cores, so a single huge tile leaves cores idle.
Tiny tiles pay overhead and padding, huge tiles spill or idle cores: the optimum is in between and
depends on the kernel.

Measurement. Runtimes are reported as the total of a benchmark loop (``LAYOUT_REPEATS`` program
runs, ``TILE_REPEATS`` kernel runs), so they are large integers (mostly above 2**24 ns, where
float32 would create false ties), and carry multiplicative log-normal noise (see ``noisy``; the
world draws its width per file, 0.5-2%, and lets duplicate layout configs share one measurement
except for a few re-measured ones).

Variants. The module constants above are variant 0, the model every world used before variants
existed (its files are byte-for-byte unchanged). ``synth --variant N`` (N >= 1) draws a
:class:`CostParams` from ``VARIANT_RANGES`` with an RNG keyed by N alone, so one variant number is
one "machine" whatever the seed, and the same seed under two variants gives the same programs and
configs with other runtimes. What varies: the hardware balance (MXU peak vs. HBM bandwidth, vector
unit), launch/copy/DMA overheads, how layouts change compute efficiency (padding exponent, the
contracted/feature-dim penalties), how much non-configurable work stays unfused, the tile VMEM
budget and spill slope, the measurement noise per search strategy, and the mix of the ``default``
search (anchor shares, mutation counts, duplicate shares). What stays fixed: the physical facts a
model may rely on: (8 x 128) tiling of the two minor-most dims, element sizes (bf16 packing), the
f32 MXU slowdown, two cores per chip, the benchmark-loop repeat counts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from pipelines.synth.programs import (ELEMENT_BYTES, MAX_RANK, OP, TRANSPARENT_OPCODES, Node,
                                      Program, TileKernel, descending)

PEAK_FLOPS_NS = 9.0e4  # 16-bit MXU flops per ns (~90 TFLOP/s)
F32_SLOWDOWN = 4.0
VPU_OPS_NS = 4.0e3  # vector-unit element ops per ns
HBM_BYTES_NS = 700.0  # ~700 GB/s
VMEM_BYTES = 16 * 2**20
OP_LAUNCH_NS = 1500.0
BITCAST_NS = 100.0
DMA_RUN_NS = 1.0  # per contiguous run (row of the minor-most dim) a DMA moves
COPY_LAUNCH_NS = 2500.0
TILE_STEP_NS = 350.0
TILE_LAUNCH_NS = 2000.0
TILE_CORES = 2
SPILL_SLOPE = 3.0
CONTRACT_NOT_MINOR = 1.2
FEATURE_NOT_MINOR = 1.1
LAYOUT_REPEATS = 100
TILE_REPEATS = 1000

CONV, DOT, RESHAPE = 0, 1, 2
_KIND = {OP["convolution"]: CONV, OP["dot"]: DOT, OP["reshape"]: RESHAPE}
_NO_COST_OPS = frozenset(OP[k] for k in ("parameter", "constant", "tuple", "get-tuple-element"))
# Producers whose output layout is fixed (host-fed parameters, data movement, reductions): a
# configurable consumer that wants another layout needs a copy. Broadcasts and constants are
# materialised in whatever layout their consumer wants, so they never force copies.
RIGID_PRODUCERS = frozenset(OP[k] for k in ("parameter", "gather", "concatenate", "transpose", "reduce",
                                             "all-reduce", "slice", "reduce-window"))
# Consumers that need their operand in its default layout (data movement, program outputs);
# elementwise ops and reductions adapt to any layout.
RIGID_CONSUMERS = frozenset(OP[k] for k in ("tuple", "transpose", "concatenate", "gather", "slice",
                                             "all-reduce", "reduce-window"))
# Non-configurable elementwise work is mostly fused into neighbouring kernels by XLA; it keeps
# only this share of its standalone roofline cost.
FUSED_SHARE = 0.1


# ----------------------------------------------------------------------------- per-world constants


@dataclass(frozen=True)
class CostParams:
    """The constants of one world's cost model and searches; the defaults are variant 0."""

    peak_flops_ns: float = PEAK_FLOPS_NS
    vpu_ops_ns: float = VPU_OPS_NS
    hbm_bytes_ns: float = HBM_BYTES_NS
    op_launch_ns: float = OP_LAUNCH_NS
    bitcast_ns: float = BITCAST_NS
    dma_run_ns: float = DMA_RUN_NS
    copy_launch_ns: float = COPY_LAUNCH_NS
    fixed_copy_passes: float = 2.0  # HBM passes (read + write) of a copy forced by a rigid neighbour
    contract_not_minor: float = CONTRACT_NOT_MINOR
    feature_not_minor: float = FEATURE_NOT_MINOR
    pad_compute_power: float = 1.0  # MXU work grows as sqrt(padding ratios) ** this
    fused_share: float = FUSED_SHARE
    vmem_bytes: float = VMEM_BYTES
    spill_slope: float = SPILL_SLOPE
    tile_step_ns: float = TILE_STEP_NS
    tile_launch_ns: float = TILE_LAUNCH_NS
    # measurement noise: per-file log-normal width drawn uniformly from these ranges
    tile_noise: tuple[float, float] = (0.005, 0.02)
    default_noise: tuple[float, float] = (0.006, 0.015)  # layout, compiler's default search
    random_noise: tuple[float, float] = (0.006, 0.015)  # layout, random search
    remeasured_duplicates: float = 0.05  # share of duplicate layout configs measured again
    # the ``default`` search (see pipelines.synth.searches.default_search)
    from_anchor: float = 0.35  # share of rows restarting from an anchor
    anchor_mix: tuple[float, float, float] = (0.45, 0.45, 0.10)  # default / autotuned / all-compiler
    mutation_unset: float = 0.15  # a mutated block becomes "compiler default" ...
    mutation_tuned: float = 0.45  # ... or (up to this share) the autotuned block, else random
    duplicate_shares: tuple[float, ...] = (0.05, 0.3, 0.6, 0.9, 0.99)  # per-file share of exact repeats
    mutations: tuple[float, float] = (0.5, 3.0)  # per-file mean extra mutations per row


# (low, high, log-uniform?) per drawn field; tuple fields are described in ``variant_params``.
VARIANT_RANGES: dict[str, tuple[float, float, bool]] = {
    "peak_flops_ns": (3.0e4, 2.7e5, True),  # MXU 1/3x .. 3x: compute-bound vs. memory-bound worlds
    "vpu_ops_ns": (1.5e3, 1.0e4, True),
    "hbm_bytes_ns": (300.0, 1600.0, True),
    "op_launch_ns": (500.0, 4000.0, True),
    "dma_run_ns": (0.25, 4.0, True),
    "copy_launch_ns": (800.0, 8000.0, True),
    "fixed_copy_passes": (1.0, 3.0, False),
    "contract_not_minor": (1.0, 1.6, False),
    "feature_not_minor": (1.0, 1.4, False),
    "pad_compute_power": (0.5, 1.6, False),
    "fused_share": (0.03, 0.4, True),
    "vmem_bytes": (4 * 2**20, 64 * 2**20, True),
    "spill_slope": (1.0, 8.0, True),
    "tile_step_ns": (100.0, 1000.0, True),
    "tile_launch_ns": (800.0, 5000.0, True),
    "noise_low": (0.002, 0.015, True),  # per strategy: low end of the noise range ...
    "noise_span": (1.2, 4.0, False),  # ... and high / low
    "remeasured_duplicates": (0.0, 0.2, False),
    "from_anchor": (0.15, 0.6, False),
    "mutation_unset": (0.05, 0.3, False),
    "mutation_tuned_span": (0.1, 0.5, False),  # mutation_tuned = mutation_unset + this
    "mutations_high": (1.5, 5.0, False),  # mutations range = (0.5, this)
}


def variant_params(variant: int) -> CostParams:
    """The constants of ``variant``: 0 is today's model; N >= 1 is drawn from ``VARIANT_RANGES``.

    Tuple fields: each strategy's noise range is ``(low, low * span)`` with its own draws; the
    anchor mix is a Dirichlet(2, 2, 1) draw; duplicate shares are five sorted draws in [0, 0.99].
    """
    if variant < 0:
        raise ValueError(f"variant must be 0 or more, got {variant}")
    if variant == 0:
        return CostParams()
    rng = np.random.default_rng([0x5EED_C057, variant])

    def draw(name: str) -> float:
        low, high, log = VARIANT_RANGES[name]
        return float(math.exp(rng.uniform(math.log(low), math.log(high))) if log else rng.uniform(low, high))

    scalars = {name: draw(name) for name in (
        "peak_flops_ns", "vpu_ops_ns", "hbm_bytes_ns", "op_launch_ns", "dma_run_ns", "copy_launch_ns",
        "fixed_copy_passes", "contract_not_minor", "feature_not_minor", "pad_compute_power", "fused_share",
        "vmem_bytes", "spill_slope", "tile_step_ns", "tile_launch_ns", "remeasured_duplicates", "from_anchor",
        "mutation_unset")}
    noise = {}
    for strategy in ("tile", "default", "random"):
        low = draw("noise_low")
        noise[f"{strategy}_noise"] = (low, low * draw("noise_span"))
    unset = scalars["mutation_unset"]
    return CostParams(
        **scalars, **noise,
        bitcast_ns=BITCAST_NS,
        mutation_tuned=unset + draw("mutation_tuned_span"),
        anchor_mix=tuple(float(x) for x in rng.dirichlet([2.0, 2.0, 1.0])),
        duplicate_shares=tuple(float(x) for x in np.sort(rng.uniform(0.0, 0.99, size=5))),
        mutations=(0.5, draw("mutations_high")))


def params_dict(params: CostParams) -> dict:
    """JSON-ready constants (for the label sidecar's record of the world)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(params).items()}


DEFAULT_PARAMS = CostParams()


def _ceil_to(x: np.ndarray, multiple: int) -> np.ndarray:
    return np.ceil(x / multiple) * multiple


def padded_elements(shape: np.ndarray, rank: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """Elements of each tensor after (8 x 128) tiling of its two minor-most dims under ``perm``.

    ``shape`` (k, 6) float (1 past the rank), ``rank`` (k,), ``perm`` (..., k, 6) minor_to_major
    (-1 past the rank); the result has ``perm``'s leading shape.
    """
    k = shape.shape[0]
    rows = np.arange(k)
    minor = shape[rows, np.clip(perm[..., 0], 0, None)]
    second = np.where(rank >= 2, shape[rows, np.clip(perm[..., 1], 0, None)], 1.0)
    elems = np.prod(shape, axis=1)
    return elems / (minor * second) * _ceil_to(minor, 128) * np.where(rank >= 2, _ceil_to(second, 8), 1.0)


def dma_runs(shape: np.ndarray, rank: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """Contiguous runs a DMA moves for each tensor: elements / minor-most dim (same shapes as above)."""
    minor = shape[np.arange(shape.shape[0]), np.clip(perm[..., 0], 0, None)]
    return np.prod(shape, axis=1) / minor


def _pad6(values: tuple[int, ...], fill: int) -> list[int]:
    return list(values) + [fill] * (MAX_RANK - len(values))


def _shape6(shape: tuple[int, ...]) -> list[float]:
    return [float(d) for d in shape] + [1.0] * (MAX_RANK - len(shape))


# ----------------------------------------------------------------------------- layout programs


@dataclass
class LayoutCostModel:
    """Per-configurable-node constants of one program, precomputed once for all its configs."""

    kind: np.ndarray  # (nc,) CONV, DOT or RESHAPE
    out_shape: np.ndarray  # (nc, 6) float64, 1 past the rank
    out_rank: np.ndarray
    in_shape: np.ndarray
    in_rank: np.ndarray
    ker_shape: np.ndarray
    ker_rank: np.ndarray  # 0: no kernel operand
    ker_configurable: np.ndarray  # (nc,) bool: kernel rank 1..2 (block columns 12-13)
    ker_fixed_perm: np.ndarray  # (nc, 6) kernel layout used when it is not configurable
    out_bytes: np.ndarray  # (nc,) bytes per element
    in_bytes: np.ndarray
    ker_bytes: np.ndarray
    peak: np.ndarray  # (nc,) flops per ns for the node's element type
    flops: np.ndarray  # (nc,)
    contract_dim: np.ndarray  # (nc,) input dim contracted by the MXU (feature dim)
    out_feat_dim: np.ndarray  # (nc,)
    defaults: np.ndarray  # (nc, 18) int8: what an all -1 block resolves to
    row_major_out: np.ndarray  # (nc, 6) int8 descending perms (-1 padded)
    row_major_in: np.ndarray
    c2c_src: np.ndarray  # (L,) configurable producer (index into nc) ...
    c2c_dst: np.ndarray  # ... whose output feeds this configurable consumer ...
    c2c_block: np.ndarray  # ... as its input (0) or kernel (1) operand
    fixed_dst: np.ndarray  # (F,) configurable consumer fed by a non-configurable producer
    fixed_block: np.ndarray
    fixed_perm: np.ndarray  # (F, 6) producer's (fixed) layout
    out_fanout: np.ndarray  # (nc,) non-configurable consumers expecting the default output layout
    base_ns: float  # all non-configurable ops
    params: CostParams = field(default=DEFAULT_PARAMS)

    @property
    def num_configurable(self) -> int:
        return int(self.kind.shape[0])


def _trace_producer(program: Program, node: int, is_config: np.ndarray) -> int:
    """Follow ``node`` back through shape-preserving elementwise ops to where its layout is decided."""
    nodes = program.nodes
    while not is_config[node] and nodes[node].opcode in TRANSPARENT_OPCODES:
        same = [v for v in nodes[node].inputs if nodes[v].shape == nodes[node].shape]
        if not same:
            break
        node = same[0]
    return node


def layout_cost_model(program: Program, params: CostParams = DEFAULT_PARAMS) -> LayoutCostModel:
    """Precompute everything the per-config cost needs (one pass over the program)."""
    nodes = program.nodes
    n = len(nodes)
    config_ids = program.config_ids
    is_config = np.zeros(n, dtype=bool)
    is_config[config_ids] = True
    index_of = {int(u): i for i, u in enumerate(config_ids)}
    consumers: list[list[int]] = [[] for _ in range(n)]
    for u, v in program.edge_index:
        consumers[v].append(int(u))

    nc = len(config_ids)
    arrays: dict[str, list] = {k: [] for k in (
        "kind", "out_shape", "out_rank", "in_shape", "in_rank", "ker_shape", "ker_rank", "ker_configurable",
        "ker_fixed_perm", "out_bytes", "in_bytes", "ker_bytes", "peak", "flops", "contract_dim", "out_feat_dim",
        "defaults", "row_major_out", "row_major_in", "out_fanout")}
    c2c: list[tuple[int, int, int]] = []
    fixed: list[tuple[int, int, list[int]]] = []
    for i, u in enumerate(config_ids):
        node = nodes[u]
        kind = _KIND[node.opcode]
        src = nodes[node.inputs[0]]
        ker = nodes[node.inputs[1]] if kind != RESHAPE else None
        ker_rank = len(ker.shape) if ker is not None else 0
        ker_conf = 1 <= ker_rank <= 2
        a = arrays
        a["kind"].append(kind)
        a["out_shape"].append(_shape6(node.shape))
        a["out_rank"].append(len(node.shape))
        a["in_shape"].append(_shape6(src.shape))
        a["in_rank"].append(len(src.shape))
        a["ker_shape"].append(_shape6(ker.shape) if ker is not None else [1.0] * MAX_RANK)
        a["ker_rank"].append(ker_rank)
        a["ker_configurable"].append(ker_conf)
        a["ker_fixed_perm"].append(_pad6(ker.layout if ker is not None else (), -1))
        a["out_bytes"].append(ELEMENT_BYTES[node.etype])
        a["in_bytes"].append(ELEMENT_BYTES[src.etype])
        a["ker_bytes"].append(ELEMENT_BYTES[ker.etype] if ker is not None else 0)
        a["peak"].append(params.peak_flops_ns / (F32_SLOWDOWN if node.etype in ("f32", "f64") else 1.0))
        contract, window, contract_dim, out_feat_dim = mxu_dims(node, src, ker)
        if kind == CONV:
            flops = 2.0 * math.prod(node.shape) * contract * window / max(1, node.attrs["feature_group_count"])
        elif kind == DOT:
            flops = 2.0 * math.prod(node.shape) * contract
        else:
            flops = 0.0
        a["flops"].append(flops)
        a["contract_dim"].append(contract_dim)
        a["out_feat_dim"].append(out_feat_dim)
        a["defaults"].append(_pad6(node.layout, -1) + _pad6(src.layout, -1)
                             + (_pad6(ker.layout, -1) if ker_conf else [-1] * MAX_RANK))
        a["row_major_out"].append(_pad6(descending(len(node.shape)), -1))
        a["row_major_in"].append(_pad6(descending(len(src.shape)), -1))
        for block, operand in enumerate(node.inputs[: 2 if ker_conf else 1]):
            producer = _trace_producer(program, operand, is_config)
            if is_config[producer]:
                c2c.append((index_of[producer], i, block))
            elif nodes[producer].opcode in RIGID_PRODUCERS:
                fixed.append((i, block, _pad6(nodes[producer].layout, -1)))
        a["out_fanout"].append(_count_default_consumers(program, int(u), consumers, is_config))
    f64 = lambda key: np.array(arrays[key], dtype=np.float64)  # noqa: E731
    i64 = lambda key: np.array(arrays[key], dtype=np.int64)  # noqa: E731
    i8 = lambda key: np.array(arrays[key], dtype=np.int8).reshape(nc, -1)  # noqa: E731
    c2c_arr = np.array(c2c, dtype=np.int64).reshape(-1, 3)
    return LayoutCostModel(
        kind=i64("kind"), out_shape=f64("out_shape").reshape(nc, MAX_RANK), out_rank=i64("out_rank"),
        in_shape=f64("in_shape").reshape(nc, MAX_RANK), in_rank=i64("in_rank"),
        ker_shape=f64("ker_shape").reshape(nc, MAX_RANK), ker_rank=i64("ker_rank"),
        ker_configurable=np.array(arrays["ker_configurable"], dtype=bool), ker_fixed_perm=i8("ker_fixed_perm"),
        out_bytes=f64("out_bytes"), in_bytes=f64("in_bytes"), ker_bytes=f64("ker_bytes"), peak=f64("peak"),
        flops=f64("flops"), contract_dim=i64("contract_dim"), out_feat_dim=i64("out_feat_dim"),
        defaults=i8("defaults"), row_major_out=i8("row_major_out"), row_major_in=i8("row_major_in"),
        c2c_src=c2c_arr[:, 0], c2c_dst=c2c_arr[:, 1], c2c_block=c2c_arr[:, 2],
        fixed_dst=np.array([f[0] for f in fixed], dtype=np.int64),
        fixed_block=np.array([f[1] for f in fixed], dtype=np.int64),
        fixed_perm=np.array([f[2] for f in fixed], dtype=np.int8).reshape(-1, MAX_RANK),
        out_fanout=f64("out_fanout"), base_ns=_base_ns(program, is_config, params), params=params)


def mxu_dims(node: Node, src: Node, ker: Node | None) -> tuple[int, int, int, int]:
    """(contracted size, window taps, contracted input dim, output feature dim) of a convolution or dot.

    Read from its dimension numbers where it has them (``conv_dims``; a dot's ``lhs_contracting_dims``):
    lowered HLO contracts whichever dims its dimension numbers say (a weight gradient contracts the
    batch). Without them, the synthetic programs' convention: channels last, the input's last dim
    contracted, the output's last dim its feature, the kernel's leading dims its window (which is
    also what a synthetic convolution's own ``conv_dims`` say)."""
    contract_dim, out_feat_dim = len(src.shape) - 1, len(node.shape) - 1
    if ker is None:  # a reshape
        return (src.shape[-1] if src.shape else 1), 1, contract_dim, out_feat_dim
    if node.opcode == OP["convolution"]:
        dims = node.attrs.get("conv_dims")
        if dims is None:
            return src.shape[-1], math.prod(ker.shape[:-2]), contract_dim, out_feat_dim
        spatial = (len(dims) - 6) // 2
        window = math.prod(ker.shape[d] for d in dims[4 + spatial:4 + 2 * spatial])
        return src.shape[dims[1]], window, int(dims[1]), int(dims[-1])
    contracting = node.attrs.get("lhs_contracting_dims")
    if contracting is None:
        return src.shape[-1], 1, contract_dim, out_feat_dim
    size = math.prod(src.shape[d] for d in contracting)
    return size, 1, (int(contracting[0]) if len(contracting) else contract_dim), out_feat_dim


def _count_default_consumers(program: Program, u: int, consumers: list[list[int]], is_config: np.ndarray) -> int:
    """Layout-rigid consumers reached from ``u`` through shape-preserving elementwise ops."""
    shape = program.nodes[u].shape
    count, stack, seen = 0, [u], {u}
    while stack:
        for c in consumers[stack.pop()]:
            if c in seen:
                continue
            seen.add(c)
            node = program.nodes[c]
            if is_config[c]:
                continue
            if node.opcode in TRANSPARENT_OPCODES and node.shape == shape:
                stack.append(c)
            elif node.opcode in RIGID_CONSUMERS:
                count += 1
    return count


def _base_ns(program: Program, is_config: np.ndarray, params: CostParams) -> float:
    """Roofline cost of every non-configurable op at its default layout, times ``FUSED_SHARE``."""
    nodes = program.nodes
    total = 0.0
    for u, node in enumerate(nodes):
        if is_config[u] or node.opcode in _NO_COST_OPS or not node.shape:
            continue
        shapes = [node.shape] + [nodes[v].shape for v in node.inputs]
        layouts = [node.layout] + [nodes[v].layout for v in node.inputs]
        nbytes = 0.0
        for shape, layout in zip(shapes, layouts):
            if not shape:
                continue
            padded = padded_elements(np.array([_shape6(shape)]), np.array([len(shape)]),
                                     np.array([_pad6(layout, -1)]))[0]
            nbytes += padded * ELEMENT_BYTES[node.etype]
        total += max(nbytes / params.hbm_bytes_ns, math.prod(node.shape) / params.vpu_ops_ns) + params.op_launch_ns
    return total * params.fused_share


def resolve_defaults(blocks: np.ndarray, defaults: np.ndarray) -> np.ndarray:
    """Replace every all -1 six-slot block of ``blocks`` (c, nc, 18) by the node's default layout."""
    out = blocks.copy()
    for start in (0, 6, 12):
        unset = blocks[:, :, start] < 0
        out[:, :, start:start + 6] = np.where(unset[..., None], defaults[None, :, start:start + 6],
                                              blocks[:, :, start:start + 6])
    return out


@dataclass
class _Resolved:
    """Resolved layouts of a batch of configs and the padded sizes derived from them."""

    p_out: np.ndarray  # (c, nc, 6)
    p_in: np.ndarray
    p_ker: np.ndarray
    out_b: np.ndarray  # (c, nc) padded bytes
    in_b: np.ndarray
    ker_b: np.ndarray
    out_dma: np.ndarray  # (c, nc) ns of DMA run overhead for moving the tensor once
    in_dma: np.ndarray
    ker_dma: np.ndarray


def _resolve(model: LayoutCostModel, blocks: np.ndarray) -> _Resolved:
    dma_run_ns = model.params.dma_run_ns
    res = resolve_defaults(blocks, model.defaults)
    p_out, p_in = res[:, :, 0:6], res[:, :, 6:12]
    p_ker = np.where(model.ker_configurable[None, :, None], res[:, :, 12:18], model.ker_fixed_perm[None])
    has_ker = model.ker_rank > 0
    pad_ker = np.where(has_ker, padded_elements(model.ker_shape, np.maximum(model.ker_rank, 1), p_ker), 0.0)
    ker_runs = np.where(has_ker, dma_runs(model.ker_shape, model.ker_rank, p_ker), 0.0)
    return _Resolved(p_out, p_in, p_ker,
                     padded_elements(model.out_shape, model.out_rank, p_out) * model.out_bytes,
                     padded_elements(model.in_shape, model.in_rank, p_in) * model.in_bytes,
                     pad_ker * model.ker_bytes,
                     dma_runs(model.out_shape, model.out_rank, p_out) * dma_run_ns,
                     dma_runs(model.in_shape, model.in_rank, p_in) * dma_run_ns, ker_runs * dma_run_ns)


def node_costs(model: LayoutCostModel, blocks: np.ndarray) -> np.ndarray:
    """Own cost (ns) of every configurable node under each config, links excluded: (c, nc)."""
    return _node_costs(model, _resolve(model, blocks))


def _node_costs(model: LayoutCostModel, r: _Resolved) -> np.ndarray:
    p = model.params
    has_ker = model.ker_rank > 0
    ratio = np.sqrt(r.out_b / (np.prod(model.out_shape, axis=1) * model.out_bytes)
                    * r.in_b / (np.prod(model.in_shape, axis=1) * model.in_bytes)
                    * np.where(has_ker, r.ker_b / (np.prod(model.ker_shape, axis=1) * np.maximum(model.ker_bytes, 1)),
                               1.0))
    if p.pad_compute_power != 1.0:
        ratio = ratio ** p.pad_compute_power
    contract = model.contract_dim[None, :]
    contract_minor = (r.p_in[..., 0] == contract) | (r.p_in[..., 1] == contract)
    feature_minor = r.p_out[..., 0] == model.out_feat_dim[None, :]
    compute = (model.flops / model.peak) * ratio * np.where(contract_minor, 1.0, p.contract_not_minor) \
        * np.where(feature_minor, 1.0, p.feature_not_minor)
    memory = (r.out_b + r.in_b + r.ker_b) / p.hbm_bytes_ns + r.out_dma + r.in_dma + r.ker_dma
    mxu_cost = np.maximum(compute, memory) + p.op_launch_ns
    bitcast = np.all(r.p_in == model.row_major_in[None], axis=2) & np.all(r.p_out == model.row_major_out[None], axis=2)
    reshape_cost = np.where(bitcast, p.bitcast_ns,
                            (r.out_b + r.in_b) / p.hbm_bytes_ns + r.out_dma + r.in_dma + p.op_launch_ns)
    return np.where(model.kind == RESHAPE, reshape_cost, mxu_cost)


def layout_costs(model: LayoutCostModel, blocks: np.ndarray) -> np.ndarray:
    """Noise-free runtime (ns, one program run) of each config; ``blocks`` int8 (c, nc, 18)."""
    p = model.params
    hbm = p.hbm_bytes_ns
    r = _resolve(model, blocks)
    total = _node_costs(model, r).sum(axis=1)
    block_bytes = (r.in_b + r.in_dma * hbm, r.ker_b + r.ker_dma * hbm)
    out_b = r.out_b + r.out_dma * hbm  # bytes plus DMA overhead, in byte-equivalents
    block_perm = (r.p_in, r.p_ker)
    for block in (0, 1):
        sel = model.c2c_block == block
        if np.any(sel):
            src, dst = model.c2c_src[sel], model.c2c_dst[sel]
            mismatch = np.any(r.p_out[:, src] != block_perm[block][:, dst], axis=2)
            copy = (out_b[:, src] + block_bytes[block][:, dst]) / hbm + p.copy_launch_ns
            total += (mismatch * copy).sum(axis=1)
        sel = model.fixed_block == block
        if np.any(sel):
            dst = model.fixed_dst[sel]
            mismatch = np.any(block_perm[block][:, dst] != model.fixed_perm[sel][None], axis=2)
            total += (mismatch * (p.fixed_copy_passes * block_bytes[block][:, dst] / hbm
                                  + p.copy_launch_ns)).sum(axis=1)
    off_default = np.any(r.p_out != model.defaults[None, :, 0:6], axis=2)
    total += (off_default * model.out_fanout * (p.fixed_copy_passes * out_b / hbm + p.copy_launch_ns)).sum(axis=1)
    return total + model.base_ns


def chunked_costs(model: LayoutCostModel, blocks: np.ndarray, cells: int = 1_000_000) -> np.ndarray:
    """``layout_costs`` in row chunks of about ``cells`` config-node entries (bounded memory)."""
    rows = max(1, cells // max(model.num_configurable, 1))
    out = np.empty(blocks.shape[0], dtype=np.float64)
    for start in range(0, blocks.shape[0], rows):
        out[start:start + rows] = layout_costs(model, blocks[start:start + rows])
    return out


# ----------------------------------------------------------------------------- tile kernels


def _tile_padded(bounds: np.ndarray) -> np.ndarray:
    """Padded elements of tiles (c, r) with the last dim minor-most (row-major inside VMEM)."""
    rank = bounds.shape[1]
    if rank == 0:
        return np.zeros(bounds.shape[0])
    minor = _ceil_to(bounds[:, -1], 128)
    if rank == 1:
        return minor
    return np.prod(bounds[:, :-2], axis=1) * _ceil_to(bounds[:, -2], 8) * minor


def tile_costs(kernel: TileKernel, config_feat: np.ndarray, params: CostParams = DEFAULT_PARAMS) -> np.ndarray:
    """Noise-free runtime (ns, one kernel run) of each tile config (c, 24) of ``kernel``."""
    p = params
    out_rank, in_rank = len(kernel.out_shape), len(kernel.in_shape)
    ker_rank = (len(kernel.window) + 2 if kernel.kind == "conv" else 2) if kernel.contract else 0
    ker_t = config_feat[:, 0:ker_rank].astype(np.float64)
    out_t = config_feat[:, 8:8 + out_rank].astype(np.float64)
    in_t = config_feat[:, 16:16 + in_rank].astype(np.float64)
    out_shape = np.array(kernel.out_shape, dtype=np.float64)
    # output tiles are shared out over the chip's cores; one big tile leaves the other cores idle
    n_tiles = np.ceil(np.prod(np.ceil(out_shape / out_t), axis=1) / TILE_CORES)
    eb = float(kernel.elem_bytes)
    peak = p.peak_flops_ns / (F32_SLOWDOWN if eb >= 4 else 1.0)
    out_pad, in_pad = _tile_padded(out_t), _tile_padded(in_t)
    if kernel.contract:
        k_tile = ker_t[:, -2]  # contracted (input-feature) bound of the kernel tile
        k_steps = np.ceil(kernel.contract / k_tile)
        ker_pad = _tile_padded(ker_t)
        window = float(math.prod(kernel.window)) if kernel.window else 1.0
        compute = 2.0 * out_pad * k_tile * window / peak + kernel.epilogue * out_pad / p.vpu_ops_ns / k_steps
    else:
        k_steps = np.ones(len(config_feat))
        ker_pad = np.zeros(len(config_feat))
        compute = (kernel.epilogue + 1) * np.maximum(in_pad, out_pad) / p.vpu_ops_ns
    memory = ((in_pad + ker_pad) * eb + out_pad * eb / k_steps) / p.hbm_bytes_ns
    working_set = 2.0 * (in_pad + ker_pad) * eb + out_pad * 4.0
    spill = 1.0 + p.spill_slope * np.maximum(0.0, working_set / p.vmem_bytes - 1.0)
    step = np.maximum(compute, memory * spill) + p.tile_step_ns
    # the first tile's loads and the last tile's store are not overlapped (pipeline fill and drain)
    return n_tiles * k_steps * step + memory * spill + p.tile_launch_ns


# ----------------------------------------------------------------------------- measurement


def noisy(costs_ns: np.ndarray, repeats: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Measured int64 runtimes: ``repeats`` runs, multiplicative log-normal noise of width ``sigma``."""
    measured = costs_ns * repeats * np.exp(sigma * rng.standard_normal(costs_ns.shape))
    return np.maximum(np.rint(measured), 1).astype(np.int64)
