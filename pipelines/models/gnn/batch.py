"""Turn GraphArrays into tensors the model consumes: per-graph preparation once, cheap batching per step.

Layout graphs carry, besides the full graph, the *hop levels* used by the fused config layers:
``D_0`` is the set of configurable nodes and ``D_j`` adds the neighbours (both edge directions) of
``D_{j-1}``. After ``j`` config-dependent layers only nodes in ``D_j`` can differ between configs,
so config layer ``j`` needs per-config states only on ``D_j`` and messages only from ``D_{j-1}``
(see ``model.py``). Everything here is computed once per graph with vectorised numpy.

Layout graphs also carry their *chain ends* (``GraphArrays.chain_*``): where the layouts of two
configurable nodes (or of one and a fixed-layout node) meet, directly or through elementwise chains.
Per config, ``chain_layouts`` says what each end sees: the two layouts and whether they disagree (a
copy) with the copy's (8, 128)-padded bytes; the model's config-pair term reads them (O(ends x K)).
It runs in torch inside the model, on the model's device, from the configs of a step (``ConfigBatch``)
and the ends' static arrays (``GraphBatch``, copied once per graph batch): nothing per end and config
is built on the host or copied to the device. ``layout_physics`` (what a layout implies per node and
config) works the same way, so a step copies only its sampled configs' distinct blocks and inverse.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from functools import cached_property
from typing import ClassVar

import numpy as np
import polars as pl
import torch

from pipelines.config.gnn import GNNConfig
from pipelines.core.errors import FormatError
from pipelines.data.features import tile_config_features, tile_feature_names
from pipelines.data.node_arrays import NODE_FEATURE_DIM, RAW_COLUMNS, GraphArrays, kept_raw_node_feat, shape_and_layout
from pipelines.data.layout_geometry import CONV, DOT, RESHAPE, output_bytes, reshape_stride_constraints
from pipelines.data.tpugraphs import GraphSize, NodeFeat

LAYOUT_VALUE_OFFSET = 1  # layout config values -1..5 become embedding ids 0..6
LAYOUT_NUM_VALUES = 7
LAYOUT_BLOCK = 18  # layout values per configurable node and config: output, input, kernel layout
PHYSICS_DIM = 12  # per configurable node and config: 6 values for the output and 6 for the input tensor
TPU_TILE = (128, 8)  # HBM tiles pad the minor-most dim to a multiple of 128, the second-minor to 8
# What a dim of a configurable node's output, input or kernel is to its op (``dim_roles``, ``dot_roles``): a
# convolution names its batch, feature and spatial dims; a dot's batch, contracted, lhs-free (spatial) and
# rhs-free (output feature) dims follow from its shapes; other ops' dims have no known role.
ROLE_ABSENT, ROLE_OTHER, ROLE_BATCH, ROLE_CONTRACTED, ROLE_OUT_FEATURE, ROLE_SPATIAL = range(6)
NUM_ROLES = 6
# per configurable node and config (``layout_roles``): the kernel tensor's 6 padding values as in
# ``layout_physics``, and the role of the minor-most and second-minor dim of the output, input and kernel
ROLES_DIM = 6 + 3 * 2 * NUM_ROLES
# per reshape node and config (``reshape_physics``): its shapes can be told apart as a bitcast or not, the
# two layouts make it a bitcast (no copy), its minor-most and its second-minor dim keep their sizes
RESHAPE_DIM = 4
# per chain end and config: disagree, tiled dims disagree, log copy bytes, log tensor bytes, consumer
# block explicit, producer block explicit, end kind (config->config, fixed->config, config->fixed)
CHAIN_DIM = 9


def graph_kind(graph: GraphArrays) -> str:
    """"layout" when configs are per node (c, nc, 18), "tile" when per graph (c, 24)."""
    return "layout" if graph.config_feat.ndim == 3 else "tile"


@dataclass
class PreparedLevel:
    """Messages of config layer j: from rows of D_{j-1} (``*_src`` positions) to rows of D_j."""

    rows: np.ndarray  # node ids in D_j (sorted)
    root: np.ndarray  # position in ``rows`` of each row of D_{j-1}
    fwd_src: np.ndarray  # producer's position in D_{j-1}; edge producer -> consumer
    fwd_dst: np.ndarray  # consumer's position in D_j
    fwd_w: np.ndarray  # 1 / in-degree of the consumer (mean aggregation)
    bwd_src: np.ndarray  # consumer's position in D_{j-1}; reversed edge consumer -> producer
    bwd_dst: np.ndarray  # producer's position in D_j
    bwd_w: np.ndarray  # 1 / out-degree of the producer


@dataclass
class PreparedGraph(GraphSize):
    """One graph's tensors-to-be plus its (numpy, possibly huge) configs and runtimes."""

    kind: str
    node_opcode: np.ndarray
    node_feat: np.ndarray
    message_edges: np.ndarray
    inv_deg_in: np.ndarray
    inv_deg_out: np.ndarray
    config_nodes: np.ndarray
    levels: list[PreparedLevel]
    config_in_final: np.ndarray  # position of each configurable node in the last level's rows
    config_shapes: np.ndarray  # float64 (nc, 3, 6): dims of each configurable node's output, input and kernel
    config_layouts: np.ndarray  # int64 (nc, 3, 6): their default minor_to_major (node features 134-139)
    config_roles: np.ndarray  # int8 (nc, 3, 6): the role (ROLE_*) of each of their dims
    reshape_rows: np.ndarray  # int64 (nr,) positions of the reshapes among the configurable nodes
    reshape_checkable: np.ndarray  # bool (nr,) their operand and output hold as many elements
    reshape_constraints: np.ndarray  # int64 (C, 7) [reshape (0..nr-1), stride equality, see reshape_stride_constraints]
    # layout: LayoutConfigs (c, nc, 18); tile: float32 (c, 24), with tile physics (c, 24 + TILE_PHYSICS_DIM)
    config_feat: LayoutConfigs | np.ndarray
    target: np.ndarray  # float64 (c,)
    chain_src: np.ndarray  # int64 (E,) chain ends, see GraphArrays.chain_*
    chain_dst: np.ndarray
    chain_kernel: np.ndarray
    chain_src_layout: np.ndarray
    chain_dims: np.ndarray
    chain_bytes: np.ndarray

    @property
    def varying_rows(self) -> np.ndarray:
        """The nodes whose state differs between configs: D_L (the last level's rows), or without a config
        layer the configurable nodes themselves (none in a tile graph)."""
        return self.levels[-1].rows if self.levels else self.config_nodes

    @cached_property
    def varying_bytes_share(self) -> np.ndarray:
        """float32 (|D_L|,) each varying row's output bytes as a share of its graph's (readout
        "pooled+sum+bytes"); computed once per prepared graph, at its first batch."""
        return bytes_share(self.node_feat[self.varying_rows])

    @cached_property
    def varying_work_shares(self) -> np.ndarray:
        """float32 (|D_L|, 2) each varying row's bytes moved and flops as shares of its graph's (readout
        "pooled+sum+work"); computed once per prepared graph, at its first batch."""
        return work_shares(self.node_feat, self.node_opcode, self.message_edges[0], self.message_edges[1],
                           self.varying_rows)


def _check(graph: GraphArrays) -> None:
    """Raise FormatError naming the graph when its arrays disagree."""
    where = f"{graph.collection}:{graph.stem}"
    n = graph.num_nodes
    problems = []
    if graph.node_feat.ndim != 2 or graph.node_feat.shape[0] != n:
        problems.append(f"node_feat shape {graph.node_feat.shape} does not match {n} nodes")
    if graph.message_edges.ndim != 2 or graph.message_edges.shape[0] != 2:
        problems.append(f"message_edges must be (2, m), got {graph.message_edges.shape}")
    elif graph.message_edges.size and (graph.message_edges.min() < 0 or graph.message_edges.max() >= n):
        problems.append("message_edges refers to a node out of range")
    if graph.target.shape != (graph.num_configs,):
        problems.append(f"target shape {graph.target.shape} does not match {graph.num_configs} configs")
    if graph.num_configs < 1:
        problems.append("no configs")
    if graph_kind(graph) == "layout":
        nc = graph.config_nodes.shape[0]
        if graph.node_feat.ndim == 2 and graph.node_feat.shape[1] != NODE_FEATURE_DIM:
            problems.append(f"node_feat has {graph.node_feat.shape[1]} columns, expected the "
                            f"{NODE_FEATURE_DIM} of node_arrays (shapes and layouts are read from them)")
        if graph.config_feat.shape[1:] != (nc, 18):
            problems.append(f"config_feat shape {graph.config_feat.shape} does not match {nc} configurable nodes")
        if nc and (graph.config_nodes.min() < 0 or graph.config_nodes.max() >= n):
            problems.append("config_nodes refers to a node out of range")
        if np.unique(graph.config_nodes).shape[0] != nc:
            problems.append("config_nodes has repeated nodes")
        if (not isinstance(graph.config_feat, LayoutConfigs) and graph.config_feat.size
                and (graph.config_feat.min() < -1 or graph.config_feat.max() > 5)):
            problems.append("layout config values outside -1..5")
    elif graph.config_feat.ndim != 2 or graph.config_feat.shape[1] != 24:
        problems.append(f"tile config_feat must be (c, 24), got {graph.config_feat.shape}")
    if problems:
        raise FormatError(where, "; ".join(problems))


def dim_roles(conv_numbers: np.ndarray, is_conv: np.ndarray) -> np.ndarray:
    """int8 (n, 3, 6): the role (``ROLE_*``) of dims 0-5 of each node's output, input and kernel.

    ``conv_numbers`` int64 (n, 14) are the convolution dimension numbers (``_convolution_dims``: input
    batch and feature, 4 input spatial, kernel input and output feature, 4 kernel spatial, output batch
    and feature). A convolution's named dims get their role and its other dims ``ROLE_SPATIAL``; every
    dim of another op is ``ROLE_OTHER``. Dims past a tensor's rank are the caller's to mask.
    """
    numbers = conv_numbers
    named = {0: ((12, ROLE_BATCH), (13, ROLE_OUT_FEATURE)),  # output
             1: ((0, ROLE_BATCH), (1, ROLE_CONTRACTED)),  # input
             2: ((6, ROLE_CONTRACTED), (7, ROLE_OUT_FEATURE))}  # kernel
    dim = np.arange(6)[None, :]
    roles = np.empty((numbers.shape[0], 3, 6), np.int8)
    for block, pairs in named.items():
        block_roles = np.where(is_conv[:, None], ROLE_SPATIAL, ROLE_OTHER) + 0 * dim
        for column, role in pairs:
            block_roles = np.where(is_conv[:, None] & (dim == numbers[:, column][:, None]), role, block_roles)
        roles[:, block] = block_roles
    return roles


def dot_roles(out: np.ndarray, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray | None:
    """int8 (3, 6): the roles of a dot's output, lhs and rhs dims from their shapes alone, or None when no
    dot of these shapes exists (then the operands may be the other way round).

    The files keep no dot dimension numbers, but HLO fixes a dot's output order: its batch dims, then
    the lhs's free dims, then the rhs's, each in operand order; every other operand dim is contracted,
    lhs and rhs in pairs of equal size. Batch dims get ``ROLE_BATCH``, contracted ``ROLE_CONTRACTED``, the
    lhs's free dims ``ROLE_SPATIAL`` (rows, as a convolution's spatial dims) and the rhs's
    ``ROLE_OUT_FEATURE``. Of several readings the fewest batch dims win, then the lhs contracting its
    last dims and the rhs its first (a plain ``x @ w``), as jax writes a matmul. Shapes are (6,) with 0
    past the rank.
    """
    o, a, b = (tuple(int(v) for v in t[t > 0]) for t in (out, lhs, rhs))
    for batch in range(min(len(o), len(a), len(b)) + 1):
        twice_lhs_free = len(a) - len(b) + len(o) - batch
        if twice_lhs_free < 0 or twice_lhs_free % 2:
            continue
        lhs_free = twice_lhs_free // 2
        rhs_free = len(o) - batch - lhs_free
        if rhs_free < 0 or len(a) - batch - lhs_free < 0:
            continue
        found = _dot_reading(o, a, b, batch, lhs_free)
        if found is not None:
            roles = np.zeros((3, 6), np.int8)
            for block, dims in enumerate((o, a, b)):
                roles[block, :len(dims)] = found[block]
            return roles
    return None


def _dot_reading(o: tuple, a: tuple, b: tuple, batch: int, lhs_free: int) -> list[list[int]] | None:
    """Roles of (output, lhs, rhs) dims for ``batch`` batch and ``lhs_free`` lhs-free dims, or None."""
    for lhs_batch in itertools.combinations(range(len(a)), batch):
        if tuple(a[i] for i in lhs_batch) != o[:batch]:
            continue
        for rhs_batch in itertools.combinations(range(len(b)), batch):
            if tuple(b[i] for i in rhs_batch) != o[:batch]:
                continue
            rest_a = [i for i in range(len(a)) if i not in lhs_batch]
            rest_b = [i for i in range(len(b)) if i not in rhs_batch]
            for free_a in itertools.combinations(rest_a, lhs_free):  # earliest free dims first: lhs contracts last
                if tuple(a[i] for i in free_a) != o[batch:batch + lhs_free]:
                    continue
                contracted_a = sorted(a[i] for i in rest_a if i not in free_a)
                # latest free dims first: the rhs contracts its first dims
                for free_b in reversed(list(itertools.combinations(rest_b, len(o) - batch - lhs_free))):
                    if (tuple(b[i] for i in free_b) != o[batch + lhs_free:]
                            or sorted(b[i] for i in rest_b if i not in free_b) != contracted_a):
                        continue
                    out_roles = [ROLE_BATCH] * batch + [ROLE_SPATIAL] * lhs_free + [ROLE_OUT_FEATURE] * (len(o) - batch - lhs_free)
                    lhs_roles = [ROLE_BATCH if i in lhs_batch else ROLE_SPATIAL if i in free_a else ROLE_CONTRACTED
                                 for i in range(len(a))]
                    rhs_roles = [ROLE_BATCH if i in rhs_batch else ROLE_OUT_FEATURE if i in free_b else ROLE_CONTRACTED
                                 for i in range(len(b))]
                    return [out_roles, lhs_roles, rhs_roles]
    return None


def _operands(num_nodes: int, src: np.ndarray, dst: np.ndarray, nodes: np.ndarray) -> list[np.ndarray]:
    """The producers on each of ``nodes``' first and second incoming edge (-1 where it has fewer)."""
    order = np.argsort(dst, kind="stable")
    consumers, first, counts = np.unique(dst[order], return_index=True, return_counts=True)
    result = []
    for k in range(2):
        producer = np.full(num_nodes, -1, np.int64)
        has = counts > k
        producer[consumers[has]] = src[order[first[has] + k]]
        result.append(producer[nodes])
    return result


def _convolution_dims(node_feat: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """int64 (len(nodes), 14) the convolution dimension numbers (node_feat 93-106) of ``nodes``."""
    columns = [RAW_COLUMNS.index(c) for c in NodeFeat.columns(NodeFeat.CONVOLUTION_DIMS)]
    return np.rint(node_feat[nodes][:, columns]).astype(np.int64)


def _config_tensors(node_feat: np.ndarray, node_opcode: np.ndarray, src: np.ndarray, dst: np.ndarray,
                    config_nodes: np.ndarray, match_operands: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shapes, default layouts and dim roles of the output (the node), input and kernel tensor of each
    configurable node, each (nc, 3, 6).

    The input and kernel are the producers on the node's first and second incoming edge. With
    ``match_operands``, for a convolution, whose dimension numbers say which dims must agree (input
    batch = output batch, kernel output feature = output feature, input feature = kernel input
    feature), the two are swapped when the swap agrees better, and for a dot when only the swapped
    order reads as a dot (``dot_roles``); files need not list edges in operand order. A missing
    tensor gets zeros, i.e. "no tensor".
    """
    dims, layout = shape_and_layout(node_feat)
    first, second = _operands(node_feat.shape[0], src, dst, config_nodes)
    conv = node_opcode[config_nodes] == CONV
    numbers = _convolution_dims(node_feat, config_nodes)
    in_batch, in_feature, kernel_in, kernel_out, out_batch, out_feature = (numbers[:, j] for j in (0, 1, 6, 7, 12, 13))
    out = dims[config_nodes]

    def at(tensor_dims: np.ndarray, index: np.ndarray) -> np.ndarray:
        return np.take_along_axis(tensor_dims, np.clip(index, 0, 5)[:, None], axis=1)[:, 0]

    def agreement(inp: np.ndarray, ker: np.ndarray) -> np.ndarray:
        di = np.where((inp >= 0)[:, None], dims[np.maximum(inp, 0)], 0.0)
        dk = np.where((ker >= 0)[:, None], dims[np.maximum(ker, 0)], 0.0)
        return ((at(di, in_batch) == at(out, out_batch)).astype(int) + (at(dk, kernel_out) == at(out, out_feature))
                + (at(di, in_feature) == at(dk, kernel_in)))

    swap = match_operands & conv & (second >= 0) & (agreement(second, first) > agreement(first, second))
    roles = dim_roles(numbers, conv)
    for i in np.flatnonzero(node_opcode[config_nodes] == DOT):
        operand_dims, kernel_dims = (dims[p] if p >= 0 else np.zeros(6) for p in (first[i], second[i]))
        reading = dot_roles(out[i], operand_dims, kernel_dims)
        if reading is None and match_operands:
            reading = dot_roles(out[i], kernel_dims, operand_dims)
            swap[i] = reading is not None
        if reading is not None:
            roles[i] = reading
    operand, kernel = np.where(swap, second, first), np.where(swap, first, second)
    tensors_dims, tensors_layout = [out], [layout[config_nodes]]
    for producer in (operand, kernel):
        has = (producer >= 0)[:, None]
        tensors_dims.append(np.where(has, dims[np.maximum(producer, 0)], 0.0))
        tensors_layout.append(np.where(has, layout[np.maximum(producer, 0)], 0))
    shapes = np.stack(tensors_dims, axis=1)
    roles = np.where(np.arange(6) < (shapes > 0).sum(2)[..., None], roles, ROLE_ABSENT)
    return shapes, np.stack(tensors_layout, axis=1), roles.astype(np.int8)


def _log_tile_waste(size: torch.Tensor, multiple: int) -> torch.Tensor:
    """log(padded / actual) of a dim padded up to ``multiple``; 0 for absent dims (size 0)."""
    safe = size.clamp(min=1.0)
    return torch.where(size > 0, torch.log(torch.ceil(safe / multiple) * multiple / safe), 0.0)


def _minor_dims(values: torch.Tensor, inverse: torch.Tensor, block: int, shapes: torch.Tensor,
                layouts: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """Of tensor ``block`` (0 output, 1 input, 2 kernel) of each (configurable node, config): whether the
    config sets its layout (R, K), and, for its minor-most and second-minor slot, the dim index the layout
    puts there and whether that slot holds a dim (each (R, K)). The layout is the config's minor_to_major,
    or the tensor's default where the config leaves it to the compiler (-1)."""
    perm = values[:, 6 * block:6 * block + 2].long()[inverse] - LAYOUT_VALUE_OFFSET  # (R, K, 2): slots 0-1
    rank = (shapes[:, block] > 0).sum(1)[:, None]  # (R, 1)
    chosen = perm[..., 0] >= 0
    indices, present = [], []
    for slot in range(len(TPU_TILE)):
        index = torch.where(chosen, perm[..., slot], layouts[:, block, slot].long()[:, None])  # (R, K)
        # slot < rank: default layouts are 0-padded, so slot 1 of a rank-1 tensor reads a 0 that is no dim
        indices.append(index)
        present.append((index >= 0) & (index < rank) & (slot < rank))
    return chosen, indices, present


def _block_physics(values: torch.Tensor, inverse: torch.Tensor, block: int, shapes: torch.Tensor,
                   layouts: torch.Tensor) -> list[torch.Tensor]:
    """The 6 padding values of tensor ``block`` (see ``layout_physics``), each (R, K) float64."""
    chosen, indices, present = _minor_dims(values, inverse, block, shapes, layouts)
    dims = shapes[:, block]  # (R, 6)
    out, sizes = [], []
    for slot, multiple in enumerate(TPU_TILE):
        size = torch.where(present[slot], dims.gather(1, indices[slot].clamp(0, 5)), 0.0)
        sizes.append(size)
        out += [torch.log1p(size), _log_tile_waste(size, multiple)]
    return out + [chosen.to(torch.float64), ((sizes[0] > 0) & (sizes[0] >= dims.max(1).values[:, None])).to(torch.float64)]


def layout_physics(values: torch.Tensor, inverse: torch.Tensor, shapes: torch.Tensor,
                   layouts: torch.Tensor) -> torch.Tensor:
    """(R, K, PHYSICS_DIM) float32: what the layout of each (configurable node, config) implies in memory.

    ``values`` (U, 18) layout ids 0..6 and ``inverse`` (R, K) are a ``ConfigBatch``'s distinct blocks and
    each node's block per config; ``shapes`` (float64) and ``layouts`` (R, 3, 6) are ``GraphBatch.config_*``.
    Runs on their device (in the model), so only the sampled blocks cross to a GPU per step.
    Per tensor (output block 0-5 with the node's shape, input block 6-11 with its operand's), the
    layout is the config's minor_to_major, or the tensor's default where the config leaves it to
    the compiler (-1). From it: set-by-config flag, log size and log (8 x 128) tile waste of the
    minor-most and second-minor dims, and whether the largest dim is minor-most. These are the
    padding facts a TPU layout decides; message passing alone would have to learn an index lookup.
    Computed in float64 and rounded once to float32.
    """
    shapes = shapes.to(torch.float64)
    out = [v for block in range(2) for v in _block_physics(values, inverse, block, shapes, layouts)]
    return torch.stack(out, dim=-1).to(torch.float32)


def layout_roles(values: torch.Tensor, inverse: torch.Tensor, shapes: torch.Tensor, layouts: torch.Tensor,
                 roles: torch.Tensor) -> torch.Tensor:
    """(R, K, ROLES_DIM) float32: which dims the layout of each (configurable node, config) puts minor-most.

    The kernel tensor's (block 12-17) 6 padding values as ``layout_physics`` gives the other two, then,
    for the output, input and kernel, one-hot the role (``ROLE_*``: batch, contracted or output feature,
    spatial, unknown, absent) of the dim in the minor-most and the second-minor slot. Which role a TPU
    wants in its 128 lanes is left for the model to learn; the features only spare it the index lookup
    from a permutation into the op's dimension numbers.
    """
    shapes = shapes.to(torch.float64)
    out = _block_physics(values, inverse, 2, shapes, layouts)
    for block in range(3):
        _, indices, present = _minor_dims(values, inverse, block, shapes, layouts)
        block_roles = roles[:, block].long()  # (R, 6)
        for slot in range(len(TPU_TILE)):
            role = torch.where(present[slot], block_roles.gather(1, indices[slot].clamp(0, 5)), ROLE_ABSENT)
            out += list(torch.nn.functional.one_hot(role, NUM_ROLES).to(torch.float64).unbind(-1))
    return torch.stack(out, dim=-1).to(torch.float32)


def _dim_slots(values: torch.Tensor, inverse: torch.Tensor, block: int, shapes: torch.Tensor,
               layouts: torch.Tensor) -> torch.Tensor:
    """int64 (R, K, 6): the slot (0: minor-most) each dim of tensor ``block`` of each (configurable node,
    config) takes in its layout; -1 past the tensor's rank. The layout is the config's minor_to_major; a
    partial one (its minor-most dims, then -1: the real records' rank-5 blocks) goes on with the other dims
    in the order the default layout has them, and an unset one is the default."""
    perm = values[:, 6 * block:6 * block + 6].long()[inverse] - LAYOUT_VALUE_OFFSET  # (R, K, slot) -> dim
    slots = torch.arange(6, device=perm.device)
    in_rank = slots[None, :] < (shapes[:, block] > 0).sum(1)[:, None]  # (R, 6): slots and dims alike
    named = (layouts[:, block].long()[:, :, None] == slots) & in_rank[:, :, None]  # (R, slot, dim)
    default_order = torch.where(named, slots[None, :, None], 6).amin(1) * 6 + slots  # (R, dim); ties by dim
    listed = (perm >= 0) & in_rank[:, None, :]  # (R, K, slot)
    at = listed[..., None] & (perm[..., None] == slots)  # (R, K, slot, dim)
    is_listed = at.any(2) & in_rank[:, None, :]
    rest = ~is_listed & in_rank[:, None, :]
    before = rest[..., None, :] & (default_order[:, None, None, :] < default_order[:, None, :, None])
    rest_slot = listed.sum(-1, keepdim=True) + before.sum(-1)
    return torch.where(is_listed, torch.where(at, slots[:, None], 6).amin(2), torch.where(rest, rest_slot, -1))


def _layout_strides(dim_slots: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """int64 (R, K, 6): each dim's stride in memory, the product of the sizes of the dims at lower slots
    (``dim_slots`` from ``_dim_slots``; ``sizes`` int64 (R, 6); dims past the rank count as size 1)."""
    sized = torch.where(dim_slots >= 0, sizes[:, None, :], 1)
    order = torch.where(dim_slots >= 0, dim_slots, 6).argsort(-1)
    by_slot = sized.gather(-1, order)
    below = torch.cat([torch.ones_like(by_slot[..., :1]), by_slot.cumprod(-1)[..., :-1]], -1)
    return torch.empty_like(below).scatter_(-1, order, below)


def reshape_physics(values: torch.Tensor, inverse: torch.Tensor, batch: GraphBatch) -> torch.Tensor:
    """(R0, K, RESHAPE_DIM) float32, zero but on reshapes: what the output and operand layouts of each
    reshape imply under each config. A reshape keeps the row-major order of the logical index; it is a
    bitcast (no data moves) when every element keeps its place in memory under the two layouts, which
    ``GraphBatch.reshape_constraints`` test as equalities of strides (exact, see
    ``layout_geometry.reshape_stride_constraints``); otherwise XLA copies the tensor. Then whether the
    minor-most and the second-minor dim, the ones the TPU's (8, 128) tiles cover, keep their sizes.
    ``values`` and ``inverse``: a ``ConfigBatch``'s (see ``layout_physics``)."""
    k = inverse.shape[1]
    out = torch.zeros((inverse.shape[0], k, RESHAPE_DIM), dtype=torch.float32, device=inverse.device)
    rows = batch.reshape_rows
    if rows.shape[0] == 0:
        return out
    node_inverse = inverse.index_select(0, rows)
    shapes, layouts = batch.config_shapes.index_select(0, rows), batch.config_layouts.index_select(0, rows)
    slots = [_dim_slots(values, node_inverse, block, shapes, layouts) for block in (0, 1)]  # output, operand
    sizes = [shapes[:, block].long() for block in (0, 1)]
    strides = torch.stack([_layout_strides(s, size) for s, size in zip(slots, sizes)], 1)  # (nr, 2, K, 6)
    c = batch.reshape_constraints
    broken = strides[c[:, 0], c[:, 1], :, c[:, 2]] * c[:, 3:4] != strides[c[:, 0], c[:, 4], :, c[:, 5]] * c[:, 6:7]
    broken_count = torch.zeros((rows.shape[0], k), device=inverse.device).index_add_(0, c[:, 0], broken.float())
    checkable = batch.reshape_checkable[:, None].expand(-1, k)

    def size_at(slot: int, block: int) -> torch.Tensor:
        return torch.where(slots[block] == slot, sizes[block][:, None, :], 0).sum(-1)

    found = torch.stack([checkable, checkable & (broken_count == 0),
                         size_at(0, 0) == size_at(0, 1), size_at(1, 0) == size_at(1, 1)], -1)
    return out.index_copy_(0, rows, found.float())


def _reshape_constraints(config_shapes: np.ndarray, config_opcode: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``PreparedGraph.reshape_*`` fields from the configurable nodes' shapes and opcodes."""
    rows = np.flatnonzero(config_opcode == RESHAPE).astype(np.int64)
    checkable = np.zeros(rows.shape[0], bool)
    parts = [np.zeros((0, 7), np.int64)]
    for i, row in enumerate(rows):
        found = reshape_stride_constraints(config_shapes[row, 1], config_shapes[row, 0])
        if found is not None:
            checkable[i] = True
            parts.append(np.concatenate([np.full((found.shape[0], 1), i, np.int64), found], axis=1))
    return rows, checkable, np.concatenate(parts)


TILE_PHYSICS = tile_feature_names()[24:]  # the GBDT's tile columns beyond the 24 raw config values
TILE_PHYSICS_DIM = len(TILE_PHYSICS)


def tile_physics(graph: GraphArrays) -> np.ndarray:
    """float32 (c, TILE_PHYSICS_DIM): what each tile config implies against the kernel's output shape
    and the (8, 128) vector registers (``features.tile_config_features``: tile count and waste,
    register padding of the output, input and kernel tiles, traffic, working set), from the graph's
    transformed node features (the shapes, types and layouts they keep exactly)."""
    columns = tile_config_features(graph.config_feat, kept_raw_node_feat(graph.node_feat))
    return np.stack([columns[name] for name in TILE_PHYSICS], axis=1).astype(np.float32)


def prepare_for(graph: GraphArrays, cfg: GNNConfig) -> PreparedGraph:
    """A graph's inputs for a model of ``cfg`` (its config layers, the operands ``match_operands`` or
    ``layout_roles`` pairs, and what ``layout_roles``, ``reshape_physics`` and ``tile_physics`` add)."""
    return prepare_graph(graph, cfg.config_layers, cfg.match_operands or cfg.layout_roles, cfg.tile_physics,
                         cfg.reshape_physics)


def prepare_graph(graph: GraphArrays, config_layers: int, match_operands: bool = False,
                  with_tile_physics: bool = False, with_reshapes: bool = False) -> PreparedGraph:
    """Validate one graph and precompute degrees and (layout) the hop levels of the fused layers;
    ``match_operands``: see ``_config_tensors`` (``GNNConfig.match_operands``, on with ``layout_roles``);
    ``with_tile_physics``: a tile graph's configs carry :func:`tile_physics` after their 24 values
    (``GNNConfig.tile_physics``); ``with_reshapes``: the ``reshape_*`` fields are filled (else empty: no
    reshape is seen, ``GNNConfig.reshape_physics``)."""
    _check(graph)
    n = graph.num_nodes
    src, dst = (graph.message_edges[i].astype(np.int64, copy=False) for i in (0, 1))
    inv_in = 1.0 / np.maximum(np.bincount(dst, minlength=n), 1).astype(np.float32)
    inv_out = 1.0 / np.maximum(np.bincount(src, minlength=n), 1).astype(np.float32)
    kind = graph_kind(graph)
    config_nodes = graph.config_nodes.astype(np.int64) if kind == "layout" else np.zeros(0, np.int64)
    levels: list[PreparedLevel] = []
    config_in_final = np.zeros(0, np.int64)
    if kind == "layout":
        prev_rows = config_nodes
        prev_mask = np.zeros(n, bool)
        prev_mask[prev_rows] = True
        prev_pos = np.full(n, -1, np.int64)
        prev_pos[prev_rows] = np.arange(prev_rows.shape[0])
        for _ in range(config_layers):
            mask = prev_mask.copy()
            mask[dst[prev_mask[src]]] = True
            mask[src[prev_mask[dst]]] = True
            rows = np.flatnonzero(mask)
            pos = np.full(n, -1, np.int64)
            pos[rows] = np.arange(rows.shape[0])
            fwd, bwd = prev_mask[src], prev_mask[dst]
            levels.append(PreparedLevel(
                rows=rows, root=pos[prev_rows],
                fwd_src=prev_pos[src[fwd]], fwd_dst=pos[dst[fwd]], fwd_w=inv_in[dst[fwd]],
                bwd_src=prev_pos[dst[bwd]], bwd_dst=pos[src[bwd]], bwd_w=inv_out[src[bwd]],
            ))
            prev_rows, prev_mask, prev_pos = rows, mask, pos
        config_in_final = prev_pos[config_nodes]
    config_shapes, config_layouts, config_roles = _config_tensors(graph.node_feat, graph.node_opcode, src, dst,
                                                                  config_nodes, match_operands)
    reshape_rows, reshape_checkable, reshape_constraints = _reshape_constraints(
        config_shapes, graph.node_opcode[config_nodes] if with_reshapes else np.zeros(0, np.int64))
    return PreparedGraph(
        # copy=False: a collection's node features can take GBs; never hold them twice
        kind=kind, node_opcode=graph.node_opcode.astype(np.int64, copy=False),
        node_feat=graph.node_feat.astype(np.float32, copy=False), message_edges=np.stack([src, dst]),
        inv_deg_in=inv_in, inv_deg_out=inv_out,
        config_nodes=config_nodes, levels=levels, config_in_final=config_in_final,
        config_shapes=config_shapes, config_layouts=config_layouts, config_roles=config_roles,
        reshape_rows=reshape_rows, reshape_checkable=reshape_checkable, reshape_constraints=reshape_constraints,
        config_feat=(_layout_configs(graph.config_feat) if kind == "layout"
                     else np.concatenate([graph.config_feat, tile_physics(graph)], axis=1) if with_tile_physics
                     else graph.config_feat),
        target=graph.target.astype(np.float64, copy=False),
        chain_src=graph.chain_src, chain_dst=graph.chain_dst, chain_kernel=graph.chain_kernel,
        chain_src_layout=graph.chain_src_layout, chain_dims=graph.chain_dims, chain_bytes=graph.chain_bytes,
    )


def bytes_share(node_feat: np.ndarray) -> np.ndarray:
    """float32 (n,): each node's output bytes (at least one per element, a scalar one element) as a share
    of the nodes' total, from transformed node features (the shapes and element types they keep exactly)."""
    raw = kept_raw_node_feat(node_feat)  # keeps the dims and the element type, not the shape-product column
    nbytes = output_bytes(raw, elements=_elements(raw))
    total = nbytes.sum()
    return (nbytes / total if total > 0 else nbytes).astype(np.float32)


def _elements(raw: np.ndarray) -> np.ndarray:
    """float64 (n,) elements of each node's output from raw node features (a scalar: one)."""
    dims = raw[:, NodeFeat.SHAPE_DIMS].astype(np.float64)
    return np.where(dims > 0, dims, 1.0).prod(axis=1)


def work_shares(node_feat: np.ndarray, node_opcode: np.ndarray, src: np.ndarray, dst: np.ndarray,
                rows: np.ndarray) -> np.ndarray:
    """float32 (len(rows), 2): per row, the bytes its kernel moves (its output and its operands'
    outputs) and its flops, each as a share of the rows' total.

    The flops of a dot or convolution are taken as 2 sqrt(lhs x rhs x out) elements, exact for a
    matmul without batch dims and within a factor sqrt(window) or sqrt(batch) for the others, whichever
    operand is the kernel (a weight gradient's output is small, its flops are not); any other op does
    one flop per element it reads or writes, the larger. From transformed node features (the shapes and
    element types they keep exactly) and producer -> consumer edges ``src -> dst``."""
    num_nodes = node_feat.shape[0]
    in_rows = np.zeros(num_nodes, bool)
    in_rows[rows] = True
    incoming = in_rows[dst]
    producers, consumers = src[incoming], dst[incoming]
    needed = np.union1d(rows, producers)
    raw = kept_raw_node_feat(node_feat[needed])
    elements = np.zeros(num_nodes)
    nbytes = np.zeros(num_nodes)
    elements[needed] = _elements(raw)
    nbytes[needed] = output_bytes(raw, elements=elements[needed])
    moved = nbytes + np.bincount(consumers, weights=nbytes[producers], minlength=num_nodes)
    read = np.bincount(consumers, weights=elements[producers], minlength=num_nodes)
    flops = np.maximum(elements, read)[rows]
    first, second = _operands(num_nodes, src, dst, rows)
    contraction = np.isin(node_opcode[rows], (CONV, DOT)) & (first >= 0) & (second >= 0)
    product = elements[first] * elements[second] * elements[rows]
    flops = np.where(contraction, 2.0 * np.sqrt(np.where(contraction, product, 0.0)), flops)
    shares = np.stack([moved[rows], flops], axis=1)
    total = shares.sum(axis=0)
    return (shares / np.where(total > 0, total, 1.0)).astype(np.float32)


def _to_device(obj, device: torch.device, non_blocking: bool):
    """A copy of dataclass ``obj`` with every tensor (also inside lists) on ``device``; other fields shared.

    On CPU the tensors are returned as they are (``Tensor.to`` of the same device is a no-op).
    """
    def move(value):
        if isinstance(value, torch.Tensor):
            return value.to(device, non_blocking=non_blocking)
        if isinstance(value, list):
            return [move(v) for v in value]
        if hasattr(value, "__dataclass_fields__"):
            return _to_device(value, device, non_blocking)
        return value

    return type(obj)(**{name: move(getattr(obj, name)) for name in obj.__dataclass_fields__})


@dataclass
class Level:
    rows: torch.Tensor
    root: torch.Tensor
    fwd_src: torch.Tensor
    fwd_dst: torch.Tensor
    fwd_w: torch.Tensor
    bwd_src: torch.Tensor
    bwd_dst: torch.Tensor
    bwd_w: torch.Tensor


@dataclass
class GraphBatch:
    """A disjoint union of graphs (node ids offset per graph), PyG-style with a ``node_graph`` vector."""

    num_graphs: int
    node_opcode: torch.Tensor  # (N,)
    node_feat: torch.Tensor  # (N, F)
    message_edges: torch.Tensor  # (2, M)
    inv_deg_in: torch.Tensor  # (N,)
    inv_deg_out: torch.Tensor  # (N,)
    node_graph: torch.Tensor  # (N,) graph of each node
    num_nodes: torch.Tensor  # (B,) float
    config_rows: torch.Tensor  # (R0,) configurable nodes, graph after graph
    config_graph: torch.Tensor  # (R0,) graph of each configurable node
    num_config_nodes: torch.Tensor  # (B,) float
    levels: list[Level]
    config_in_final: torch.Tensor  # (R0,) position of each configurable node in levels[-1].rows
    # (|D_L|,) the nodes whose state differs between configs: levels[-1].rows, or without a config layer
    # the configurable nodes (PreparedGraph.varying_rows, offset per graph)
    final_rows: torch.Tensor
    final_graph: torch.Tensor  # (|D_L|,) graph of each row of the last level
    final_bytes_share: torch.Tensor  # (|D_L|,) float32 the row's output bytes / its graph's D_L bytes
    final_work_share: torch.Tensor  # (|D_L|, 2) float32 the row's bytes moved and flops / its graph's D_L ones
    outside_final: torch.Tensor  # (N,) bool: node outside D_L (its state is the same for every config)
    # Host-side facts, so the model never reads a size back from the device (a GPU sync) per step:
    outside_rows: torch.Tensor  # (N - |D_L|,) ids of the nodes outside D_L, sorted
    node_counts: list[int]  # nodes per graph
    final_counts: list[int]  # rows of the last level per graph
    outside_counts: list[int]  # nodes outside D_L per graph
    chain_graph: torch.Tensor | None = None  # (E,) graph of each chain end
    # what ``chain_layouts`` reads per end (small dtypes; it widens them where an op needs it):
    chain_src: torch.Tensor | None = None  # int32 (E,) producer's row among the configurable nodes, -1 = fixed
    chain_dst: torch.Tensor | None = None  # int32 (E,) consumer's row, -1 = fixed
    chain_kernel: torch.Tensor | None = None  # bool (E,) the consumer's kernel block, else its input block
    chain_src_layout: torch.Tensor | None = None  # int8 (E, 6) producer's layout where no config decides it
    chain_dims: torch.Tensor | None = None  # int64 (E, 6) the tensor's shape
    chain_bytes: torch.Tensor | None = None  # float64 (E,) its unpadded bytes
    num_chain_ends: torch.Tensor | None = None  # (B,) float
    # what ``layout_physics`` reads per configurable node (layout graphs)
    config_shapes: torch.Tensor | None = None  # float64 (R0, 3, 6) dims of its output, input and kernel tensor
    config_layouts: torch.Tensor | None = None  # int8 (R0, 3, 6) their default minor_to_major
    config_roles: torch.Tensor | None = None  # int8 (R0, 3, 6) the role of each of their dims (``layout_roles``)
    # what ``reshape_physics`` reads: the reshapes' rows among the configurable nodes, whether each can be
    # told, and their stride equalities ([reshape's position in reshape_rows, ...], PreparedGraph.reshape_*)
    reshape_rows: torch.Tensor | None = None  # int64 (nr,)
    reshape_checkable: torch.Tensor | None = None  # bool (nr,)
    reshape_constraints: torch.Tensor | None = None  # int64 (C, 7)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> GraphBatch:
        """This batch with every tensor on ``device`` (once per graph batch, not per config chunk)."""
        return _to_device(self, torch.device(device), non_blocking)


def _cat(parts: list[np.ndarray], dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0)).to(dtype)


def collate(graphs: list[PreparedGraph]) -> GraphBatch:
    """Join prepared graphs into one batch (configs are gathered separately, see ``gather_configs``)."""
    node_off = np.cumsum([0] + [g.num_nodes for g in graphs])
    b = len(graphs)
    graph_ids = [np.full(g.num_nodes, i, np.int64) for i, g in enumerate(graphs)]
    num_levels = len(graphs[0].levels)
    levels = []
    config_offsets = np.cumsum([0] + [g.config_nodes.shape[0] for g in graphs])  # of each graph's configurable nodes
    prev_off = config_offsets
    for j in range(num_levels):
        ls = [g.levels[j] for g in graphs]
        off = np.cumsum([0] + [lv.rows.shape[0] for lv in ls])
        levels.append(Level(
            rows=_cat([lv.rows + node_off[i] for i, lv in enumerate(ls)], torch.long),
            root=_cat([lv.root + off[i] for i, lv in enumerate(ls)], torch.long),
            fwd_src=_cat([lv.fwd_src + prev_off[i] for i, lv in enumerate(ls)], torch.long),
            fwd_dst=_cat([lv.fwd_dst + off[i] for i, lv in enumerate(ls)], torch.long),
            fwd_w=_cat([lv.fwd_w for lv in ls], torch.float32),
            bwd_src=_cat([lv.bwd_src + prev_off[i] for i, lv in enumerate(ls)], torch.long),
            bwd_dst=_cat([lv.bwd_dst + off[i] for i, lv in enumerate(ls)], torch.long),
            bwd_w=_cat([lv.bwd_w for lv in ls], torch.float32),
        ))
        prev_off = off
    node_graph = _cat(graph_ids, torch.long)
    config_rows = _cat([g.config_nodes + node_off[i] for i, g in enumerate(graphs)], torch.long)
    if num_levels:
        final_rows = levels[-1].rows
        config_in_final = _cat([g.config_in_final + prev_off[i] for i, g in enumerate(graphs)], torch.long)
    else:  # no config layer: only the configurable nodes differ between configs (none in a tile graph)
        final_rows = config_rows
        config_in_final = torch.arange(config_rows.shape[0])
    final_graph = node_graph[final_rows]
    outside = torch.ones(int(node_off[-1]), dtype=torch.bool)
    outside[final_rows] = False
    node_counts = [g.num_nodes for g in graphs]
    chain_src, chain_dst = _chain_rows(graphs, config_offsets)
    reshape_offsets = np.cumsum([0] + [g.reshape_rows.shape[0] for g in graphs])
    final_counts = [g.varying_rows.shape[0] for g in graphs]
    return GraphBatch(
        num_graphs=b,
        node_opcode=_cat([g.node_opcode for g in graphs], torch.long),
        node_feat=torch.from_numpy(np.concatenate([g.node_feat for g in graphs])),
        message_edges=torch.from_numpy(np.concatenate([g.message_edges + node_off[i] for i, g in enumerate(graphs)],
                                                       axis=1)),
        inv_deg_in=_cat([g.inv_deg_in for g in graphs], torch.float32),
        inv_deg_out=_cat([g.inv_deg_out for g in graphs], torch.float32),
        node_graph=node_graph,
        num_nodes=torch.tensor([g.num_nodes for g in graphs], dtype=torch.float32),
        config_rows=config_rows,
        config_graph=_cat([np.full(g.config_nodes.shape[0], i, np.int64) for i, g in enumerate(graphs)], torch.long),
        num_config_nodes=torch.tensor([g.config_nodes.shape[0] for g in graphs], dtype=torch.float32),
        levels=levels,
        config_in_final=config_in_final,
        final_rows=final_rows,
        final_graph=final_graph,
        final_bytes_share=_cat([g.varying_bytes_share for g in graphs], torch.float32),
        final_work_share=torch.from_numpy(np.concatenate([g.varying_work_shares for g in graphs])),
        outside_final=outside,
        outside_rows=torch.nonzero(outside).squeeze(1),
        node_counts=node_counts,
        final_counts=final_counts,
        outside_counts=[n - f for n, f in zip(node_counts, final_counts)],
        chain_graph=_cat([np.full(g.chain_src.shape[0], i, np.int64) for i, g in enumerate(graphs)], torch.long),
        chain_src=torch.from_numpy(chain_src.astype(np.int32)),
        chain_dst=torch.from_numpy(chain_dst.astype(np.int32)),
        chain_kernel=_cat([g.chain_kernel for g in graphs], torch.bool),
        chain_src_layout=_cat([g.chain_src_layout for g in graphs], torch.int8).reshape(-1, 6),
        chain_dims=_cat([g.chain_dims for g in graphs], torch.long).reshape(-1, 6),
        chain_bytes=_cat([g.chain_bytes for g in graphs], torch.float64),
        num_chain_ends=torch.tensor([g.chain_src.shape[0] for g in graphs], dtype=torch.float32),
        config_shapes=torch.from_numpy(np.concatenate([g.config_shapes for g in graphs]).reshape(-1, 3, 6)),
        config_layouts=torch.from_numpy(np.concatenate([g.config_layouts for g in graphs]).reshape(-1, 3, 6)
                                        .astype(np.int8)),
        config_roles=torch.from_numpy(np.concatenate([g.config_roles for g in graphs]).reshape(-1, 3, 6)),
        reshape_rows=_cat([g.reshape_rows + off for g, off in zip(graphs, config_offsets)], torch.long),
        reshape_checkable=_cat([g.reshape_checkable for g in graphs], torch.bool),
        reshape_constraints=torch.from_numpy(np.concatenate(
            [g.reshape_constraints + np.array([off, 0, 0, 0, 0, 0, 0]) for g, off in zip(graphs, reshape_offsets)]
        ).reshape(-1, 7)),
    )


def _chain_rows(graphs: list[PreparedGraph], config_offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The chain ends' producer and consumer rows among the configurable nodes of the union of
    ``graphs`` (each graph's positions offset by the configurable nodes before it, ``config_offsets``;
    -1 stays -1)."""

    def rows(ends: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([np.where(e >= 0, e + offset, -1) for e, offset in zip(ends, config_offsets)])

    return rows([g.chain_src for g in graphs]), rows([g.chain_dst for g in graphs])


@dataclass
class ConfigBatch:
    """K configs for each graph of a batch; padded slots (graphs with fewer configs) are masked.

    Layout: the 18-value block of a node under a config is node-independent input to the config
    embedding, and few distinct blocks occur (a node keeps its default in most configs), so only
    the distinct blocks are embedded: ``values`` holds them and ``inverse`` maps each
    (configurable node, config) to its block.
    """

    values: torch.Tensor  # layout: int8 (U, 18) distinct blocks, ids 0..6; tile: float (B, K, 24) log-scaled
    mask: torch.Tensor  # bool (B, K)
    target: torch.Tensor  # float64 (B, K)
    inverse: torch.Tensor | None = None  # layout: int32 (R0, K) row of ``values`` of each node and config

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ConfigBatch:
        """This batch on ``device``: the only host-to-device copy of a training step (the K sampled configs'
        distinct blocks and inverse; what they imply, ``layout_physics`` and ``chain_layouts``, is
        computed from them on the device)."""
        return _to_device(self, torch.device(device), non_blocking)


def gather_configs(graphs: list[PreparedGraph], indices: list[np.ndarray]) -> ConfigBatch:
    """Configs ``indices[i]`` of graph i, padded to a common K by repeating the first one (masked)."""
    k = max(idx.shape[0] for idx in indices)
    mask = np.zeros((len(graphs), k), bool)
    padded = []
    for i, idx in enumerate(indices):
        mask[i, : idx.shape[0]] = True
        padded.append(np.concatenate([idx, np.repeat(idx[:1], k - idx.shape[0])]))
    target = torch.from_numpy(np.stack([g.target[p] for g, p in zip(graphs, padded)]))
    if graphs[0].kind == "layout":
        # packed blocks (K, nc) per graph -> (nc, K): node-major like the node states
        blocks, inverse = distinct_packed(np.concatenate([g.config_feat.block_keys(p).T
                                                          for g, p in zip(graphs, padded)]))
        # small dtypes cross to the device; the model widens them where an op needs long
        return ConfigBatch(values=torch.from_numpy(blocks.astype(np.int8)), mask=torch.from_numpy(mask), target=target,
                           inverse=torch.from_numpy(inverse.astype(np.int32)))
    raw = np.stack([g.config_feat[p] for g, p in zip(graphs, padded)]).astype(np.float32)
    values = torch.from_numpy(np.sign(raw) * np.log1p(np.abs(raw)))
    return ConfigBatch(values=values, mask=torch.from_numpy(mask), target=target)


def pack_blocks(values: np.ndarray) -> np.ndarray:
    """(..., 18) layout values -1..5 -> (...) int64 keys: slot j's id (value + 1) is base-7 digit j (7**18 < 2**63).

    Horner's rule, one slot at a time: no (..., 18) int64 copy of the values (8x their int8 bytes)."""
    keys = np.zeros(values.shape[:-1], np.int64)
    for slot in reversed(range(values.shape[-1])):
        keys *= LAYOUT_NUM_VALUES
        keys += values[..., slot]
    # every digit's + LAYOUT_VALUE_OFFSET at once: the offset times 1 + 7 + ... + 7**17
    keys += (LAYOUT_NUM_VALUES ** values.shape[-1] - 1) // (LAYOUT_NUM_VALUES - 1) * LAYOUT_VALUE_OFFSET
    return keys


def unpack_blocks(keys: np.ndarray) -> np.ndarray:
    """(U,) keys of ``pack_blocks`` -> (U, 18) int64 ids 0..6 (layout values + 1)."""
    powers = LAYOUT_NUM_VALUES ** np.arange(LAYOUT_BLOCK, dtype=np.int64)
    return (keys[:, None] // powers) % LAYOUT_NUM_VALUES


def distinct_blocks(config_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(R, K, 18) layout values -1..5 -> distinct blocks (U, 18) as ids 0..6, and (R, K) positions in them.

    Each block is packed base 7 into one int64 (``pack_blocks``) so ``np.unique`` runs on scalars.
    """
    return distinct_packed(pack_blocks(config_values))


def distinct_packed(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(R, K) packed blocks (``pack_blocks``) -> distinct blocks (U, 18) as ids 0..6, and (R, K) positions in them."""
    distinct, inverse = np.unique(keys, return_inverse=True)
    return unpack_blocks(distinct), inverse.reshape(keys.shape)


@dataclass(frozen=True)
class LayoutConfigs:
    """A layout graph's configs (c, nc, 18) as each (config, configurable node)'s row among the graph's
    distinct 18-value blocks: 2 bytes per pair (4 past 65,536 blocks) instead of the int8 array's 18.

    A fit holds up to ``load_max_configs`` configs of each of its graphs (training, held-out, and those of
    ``gnn.extra_train_collections``) from start to end; few distinct blocks occur (a node keeps its
    default in most configs), and as int8 arrays a real fold's graphs take GBs. Rows select configs as
    on the array (``configs[rows]``); ``gather_configs`` reads the packed blocks of a step's configs,
    the keys ``distinct_blocks`` packs from the values, so a step's ``ConfigBatch`` is the same.
    """

    keys: np.ndarray  # int64 (U,) ascending: the distinct blocks, packed (``pack_blocks``)
    ids: np.ndarray  # uint16, or int32 past 65,536 blocks (c, nc): each config's and node's row of ``keys``
    ndim: ClassVar[int] = 3

    @classmethod
    def from_values(cls, values: np.ndarray) -> LayoutConfigs:
        """From int8 (c, nc, 18) layout values -1..5 (checked by the caller: see ``compact_configs``).

        polars' hashing instead of ``np.unique``'s sort: several times faster on a real-size graph's loaded
        configs (a fit compacts every graph it loads); the same sorted keys and ids."""
        packed = pl.Series(pack_blocks(values).ravel())
        keys = np.sort(packed.unique().to_numpy())
        dtype = pl.UInt16 if keys.shape[0] <= np.iinfo(np.uint16).max + 1 else pl.Int32
        ids = packed.replace_strict(keys, np.arange(keys.shape[0]), return_dtype=dtype).to_numpy()
        return cls(keys=keys, ids=ids.reshape(values.shape[:-1]))

    @property
    def shape(self) -> tuple[int, int, int]:
        return (*self.ids.shape, LAYOUT_BLOCK)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.ids.nbytes

    def __getitem__(self, rows) -> LayoutConfigs:
        return LayoutConfigs(self.keys, self.ids[rows])

    def block_keys(self, rows: np.ndarray) -> np.ndarray:
        """int64 (len(rows), nc): the packed block of each selected config and configurable node."""
        return self.keys[self.ids[rows]]

    def values(self) -> np.ndarray:
        """The int8 (c, nc, 18) layout values -1..5."""
        return (unpack_blocks(self.keys) - LAYOUT_VALUE_OFFSET).astype(np.int8)[self.ids]


def _layout_configs(config_feat: LayoutConfigs | np.ndarray) -> LayoutConfigs:
    return config_feat if isinstance(config_feat, LayoutConfigs) else LayoutConfigs.from_values(config_feat)


def compact_configs(graph: GraphArrays) -> GraphArrays:
    """``graph`` with a layout graph's configs as ``LayoutConfigs`` (checked first: a bad graph is named);
    a tile graph as it is. A fit's graphs are held so (``GNNAdapter.load``)."""
    if graph_kind(graph) != "layout" or isinstance(graph.config_feat, LayoutConfigs):
        return graph
    _check(graph)
    return replace(graph, config_feat=LayoutConfigs.from_values(graph.config_feat))


def _tile_padding(dims: torch.Tensor, layouts: torch.Tensor) -> torch.Tensor:
    """float64 (E, K): ``layout_geometry.tile_padding`` of each end's tensor (``dims`` float64 (E, 6)) under
    the layouts (E, K, 6) of each config, in torch (the GBDT's numpy version; the same float64 steps)."""
    def size(slot: torch.Tensor) -> torch.Tensor:
        return torch.where(slot >= 0, dims.gather(1, slot.clamp(min=0)), 1.0).clamp(min=1.0)

    minor_slot, second_slot = layouts[..., 0], layouts[..., 1]
    minor, second = size(minor_slot), size(second_slot)
    padded = torch.ceil(minor / TPU_TILE[0]) * TPU_TILE[0] / minor
    return padded * torch.where(second_slot >= 0, torch.ceil(second / TPU_TILE[1]) * TPU_TILE[1] / second, 1.0)


@dataclass
class ChainLayouts:
    """What the E chain ends see under K configs (``chain_layouts``). Layouts are rows of ``table``, the
    distinct 6-value layouts a step can hold: every distinct config block's output, input and kernel
    part and every end's default, so the model embeds each of them once, not once per end and config."""

    table: torch.Tensor  # long (3U + E, 6) ids 0..6: output parts, input parts, kernel parts, the ends' defaults
    produced: torch.Tensor  # long (E, K) row of ``table`` of the producer's layout
    wanted: torch.Tensor  # long (E, K) row of ``table`` of the layout the consumer wants
    feat: torch.Tensor  # float32 (E, K, CHAIN_DIM)

    def ids(self) -> torch.Tensor:
        """long (E, K, 12): the producer's and the consumer's layout, ids 0..6."""
        return torch.cat([self.table[self.produced], self.table[self.wanted]], dim=-1)


def chain_layouts(values: torch.Tensor, inverse: torch.Tensor, src: torch.Tensor, dst: torch.Tensor,
                  kernel: torch.Tensor, src_layout: torch.Tensor, dims: torch.Tensor,
                  nbytes: torch.Tensor) -> ChainLayouts:
    """What each chain end (E of them) sees under each of K configs, on the device of the inputs.

    ``values`` (U, 18) layout ids 0..6 and ``inverse`` (R, K) are a ``ConfigBatch``'s distinct blocks
    and each (configurable node, config)'s block; the ends are ``GraphBatch.chain_*`` (``src``/``dst``
    rows among the R configurable nodes, -1 = a fixed-layout end). The producer's layout is its output
    block, or ``src_layout`` where the block is all -1 or the producer is fixed. The consumer wants its
    input (or kernel) block; an all -1 block lets the compiler take the operand's layout (no copy); a
    fixed consumer keeps the producer's default. A copy where they disagree reads and writes the tensor
    in (8, 128) tiles, as the GBDT's chain features count it (``features._chain_copies``); the features
    are computed in float64, as the GBDT's, and cast to float32.
    """
    e, k, u = src.shape[0], inverse.shape[1], values.shape[0]
    ids = values.long()
    table = torch.cat([ids[:, 0:6], ids[:, 6:12], ids[:, 12:18], src_layout.long() + LAYOUT_VALUE_OFFSET])
    layouts = table - LAYOUT_VALUE_OFFSET  # values -1..5
    fixed_src, fixed_dst = src < 0, dst < 0
    own_default = (3 * u + torch.arange(e, device=src.device))[:, None]  # (E, 1) row of each end's default
    at_src = inverse.index_select(0, src.clamp(min=0).long())  # (E, K) block of the producer per config
    at_dst = inverse.index_select(0, dst.clamp(min=0).long())
    src_chosen = ~fixed_src[:, None] & (layouts[at_src, 0] >= 0)
    produced = torch.where(src_chosen, at_src, own_default)
    wanted = torch.where(fixed_dst[:, None], own_default, at_dst + torch.where(kernel, 2 * u, u)[:, None])
    produced_layout, wanted_layout = layouts[produced], layouts[wanted]  # (E, K, 6)
    explicit = fixed_dst[:, None] | (wanted_layout[..., 0] >= 0)
    differ = explicit & (produced_layout != wanted_layout).any(-1)
    tiled = explicit & (produced_layout[..., :2] != wanted_layout[..., :2]).any(-1)
    shape = dims.to(torch.float64)
    moved = _tile_padding(shape, produced_layout) + _tile_padding(shape, wanted_layout)
    nbytes = nbytes.to(torch.float64)
    copy_bytes = differ * moved * nbytes[:, None]
    # float32 columns: 0/1 flags are exact, the logs are rounded once from float64 (as the GBDT's are)
    per_end = torch.stack([(torch.log1p(nbytes) / 10.0).float(), (~fixed_src & ~fixed_dst).float(),
                           fixed_src.float(), fixed_dst.float()], dim=1)[:, None, :].expand(e, k, 4)
    feat = torch.cat([torch.stack([differ.float(), tiled.float(), (torch.log1p(copy_bytes) / 10.0).float()], dim=-1),
                      per_end[..., :1], torch.stack([explicit.float(), src_chosen.float()], dim=-1), per_end[..., 1:]],
                     dim=-1)
    return ChainLayouts(table, produced, wanted, feat)
