"""Per-graph arrays the GNN consumes, cached per graph by the node-arrays stage.

This is the contract between feature preparation and the graph network: everything is already
pruned, de-duplicated and transformed, so a model only has to tensorise it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.core.collection import SPLITS
from pipelines.core.engine import Code, StageOutput
from pipelines.core.stage_files import npz_errors, unreadable
from pipelines.data.layout_geometry import Chains, ConfigNodes
from pipelines.core.parallel import file_cost, map_in_order
from pipelines.core.progress import Progress
from pipelines.core.stages import Stage, StageCall, run_declared
from pipelines.data.prune import PrunedGraph, load_pruned, pruned_path, read_graph_table
from pipelines.data.tpugraphs import GraphSize, NodeFeat


@dataclass
class GraphArrays(GraphSize):
    collection: str  # e.g. "layout:xla:default"
    stem: str
    split: str  # "train", "valid" or "test"
    node_opcode: np.ndarray  # int64 (n,) opcode ids 0..120
    node_feat: np.ndarray  # float32 (n, F): transformed features, F fixed per collection
    # int64 (2, m), PyG convention: row 0 = producer (message source), row 1 = consumer. Not named
    # edge_index: that name means the file's (m, 2) [consumer, producer] rows in every other graph type.
    message_edges: np.ndarray
    config_nodes: np.ndarray  # int64 (nc,): positions of configurable nodes in this graph; empty for tile
    # int8 (c, nc, 18) for layout (a GNN fit holds them compact: models.gnn.batch.LayoutConfigs); float32 (c, 24) tile
    config_feat: np.ndarray
    target: np.ndarray  # float64 (c,): runtime (layout) or runtime/normalizer (tile); zeros on test
    config_index: np.ndarray  # int64 (c,): row of each config in the original file (after de-duplication)
    # Layout: where two layouts meet, directly or through elementwise chains (layout_geometry.Chains), one
    # row per "chain end" e: configurable producer -> configurable consumer, fixed producer (-1) ->
    # configurable consumer, configurable producer -> fixed consumer (-1). Empty for tile graphs.
    chain_src: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (E,) position in config_nodes or -1
    chain_dst: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (E,) position in config_nodes or -1
    chain_kernel: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # (E,) consumer's kernel block, else input
    # (E, 6) the producer's layout where no config decides it: a configurable producer's default
    # (its all -1 output block resolves to it), a fixed producer's layout; -1 past the rank
    chain_src_layout: np.ndarray = field(default_factory=lambda: np.zeros((0, 6), np.int8))
    chain_dims: np.ndarray = field(default_factory=lambda: np.zeros((0, 6), np.int64))  # (E, 6) the tensor's shape
    chain_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))  # (E,) its unpadded bytes


_ARRAY_FIELDS = [f.name for f in fields(GraphArrays) if f.name not in ("collection", "stem", "split")]
# Member names in the stage's npz files, which predate the field names (the files stay byte-identical).
_STORED_AS = {name: name for name in _ARRAY_FIELDS} | {"node_opcode": "opcode", "message_edges": "edge_index",
                                                        "target": "runtime"}


def save_graph_arrays(path: Path | str, arrays: GraphArrays) -> None:
    """Write uncompressed (fast to load); the caller's stage folder is renamed into place atomically."""
    path = Path(path)
    meta = np.array([arrays.collection, arrays.stem, arrays.split])
    with open(path, "wb") as handle:
        np.savez(handle, meta=meta, **{_STORED_AS[name]: getattr(arrays, name) for name in _ARRAY_FIELDS})


def load_graph_arrays(path: Path | str) -> GraphArrays:
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            collection, stem, split = (str(v) for v in archive["meta"])
            values = {name: archive[_STORED_AS[name]] for name in _ARRAY_FIELDS}
    except npz_errors() as exc:  # (a damaged archive is a zipfile.BadZipFile, neither OSError nor ValueError)
        raise unreadable(path, "cached graph arrays", exc) from None
    return GraphArrays(collection=collection, stem=stem, split=split, **values)


# ----------------------------------------------------------------------------- computing the arrays

# node_feat columns kept as they are: flags, one-hot types, dim indices, small counts, layouts.
RAW_COLUMNS = (NodeFeat.IS_ROOT, *NodeFeat.columns(NodeFeat.ELEMENT_TYPE), *NodeFeat.columns(NodeFeat.DIMENSIONS),
               *range(NodeFeat.WINDOW_REVERSAL.start, NodeFeat.CONVOLUTION_DIMS.stop), NodeFeat.IS_STABLE,
               *NodeFeat.columns(NodeFeat.LAYOUT))
# Sizes, sums and products (up to ~3e9, some possibly negative paddings): signed log1p.
LOG_COLUMNS = (NodeFeat.SHAPE_SUM, NodeFeat.SHAPE_PRODUCT, NodeFeat.TUPLE_SIZE, NodeFeat.PARAMETER_NUMBER,
               *NodeFeat.columns(NodeFeat.WINDOW), *range(NodeFeat.GROUP_COUNTS.start, NodeFeat.PAD.stop))
# Shape dims: signed log1p plus the TPU-tile view x % 128 (scaled to [0, 1)) and log1p(x // 128).
DIM_COLUMNS = NodeFeat.columns(NodeFeat.SHAPE_DIMS)
NODE_FEATURE_DIM = len(RAW_COLUMNS) + len(LOG_COLUMNS) + 3 * len(DIM_COLUMNS)  # 151; column 1 is always 0


def node_feature_names() -> list[str]:
    """Names of the transformed node-feature columns, in order (``c<j>`` = node_feat column j)."""
    return ([f"c{j}" for j in RAW_COLUMNS] + [f"log_c{j}" for j in LOG_COLUMNS]
            + [f"log_c{j}" for j in DIM_COLUMNS] + [f"mod128_c{j}" for j in DIM_COLUMNS]
            + [f"log_div128_c{j}" for j in DIM_COLUMNS])


def transform_node_feat(node_feat: np.ndarray) -> np.ndarray:
    """float32 (n, NODE_FEATURE_DIM) scaled node features from raw (n, 140) node_feat."""
    raw = node_feat.astype(np.float64)
    wide = raw[:, LOG_COLUMNS]
    dims = np.maximum(raw[:, DIM_COLUMNS], 0.0)
    return np.concatenate([
        raw[:, RAW_COLUMNS],
        np.sign(wide) * np.log1p(np.abs(wide)),
        np.log1p(dims),
        np.mod(dims, 128.0) / 128.0,
        np.log1p(np.floor_divide(dims, 128.0)),
    ], axis=1).astype(np.float32)


LAYOUT_COLUMNS = NodeFeat.columns(NodeFeat.LAYOUT)  # minor_to_major of the node's own (default) layout


def shape_and_layout(transformed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Raw shape dims (n, 6) and default minor_to_major (n, 6) back from transformed node features.

    Dims come from the exact integer parts ``x // 128`` and ``x % 128`` (``expm1`` of the log would
    be off by float error at multiples of 128, which is where tile padding changes); the float32
    log of ``x // 128`` keeps them exact for dims up to ~6e7.
    """
    base = len(RAW_COLUMNS) + len(LOG_COLUMNS) + len(DIM_COLUMNS)
    k = len(DIM_COLUMNS)
    remainder = np.rint(transformed[:, base:base + k].astype(np.float64) * 128.0)
    quotient = np.rint(np.expm1(transformed[:, base + k:base + 2 * k].astype(np.float64)))
    layout = transformed[:, [RAW_COLUMNS.index(c) for c in LAYOUT_COLUMNS]]
    # clipped: the transform clips negative dims to 0, so anything below is not a shape
    return np.maximum(quotient * 128.0 + remainder, 0.0), np.clip(np.rint(layout), -1, 5).astype(np.int64)


def kept_raw_node_feat(transformed: np.ndarray) -> np.ndarray:
    """float32 (n, 140) raw node features back from transformed ones, for what the transform keeps
    exactly: the columns it copies (flags, element types, dim indices, layouts) and the shape dims
    (:func:`shape_and_layout`); every other column is 0."""
    raw = np.zeros((transformed.shape[0], 140), np.float32)
    raw[:, list(RAW_COLUMNS)] = transformed[:, :len(RAW_COLUMNS)]
    raw[:, NodeFeat.SHAPE_DIMS] = shape_and_layout(transformed)[0]
    return raw


def chain_end_arrays(graph: PrunedGraph) -> dict[str, np.ndarray]:
    """The ``chain_*`` fields of a layout graph: the ends of :class:`pipelines.data.layout_geometry.Chains` (the
    GBDT's chain features use the same ones), as rows ``src -> dst`` with -1 for a fixed-layout end."""
    nodes = ConfigNodes.of(graph)
    chains = Chains.of(graph, nodes)
    fixed_out = np.flatnonzero(chains.fixed_out)
    none = np.full(fixed_out.size, -1, np.int64)
    src = np.concatenate([chains.pair_producer, np.full(chains.fixed_in_consumer.size, -1, np.int64), fixed_out])
    return {
        "chain_src": src.astype(np.int64),
        "chain_dst": np.concatenate([chains.pair_consumer, chains.fixed_in_consumer, none]).astype(np.int64),
        "chain_kernel": np.concatenate([chains.pair_kernel, chains.fixed_in_kernel, np.zeros(fixed_out.size, bool)]),
        "chain_src_layout": np.concatenate([nodes.default[chains.pair_producer], chains.fixed_in_layout,
                                            nodes.default[fixed_out]]).astype(np.int8).reshape(-1, 6),
        "chain_dims": np.concatenate([nodes.dims[chains.pair_producer], chains.fixed_in_dims,
                                      nodes.dims[fixed_out]]).astype(np.int64).reshape(-1, 6),
        "chain_bytes": np.concatenate([nodes.nbytes[chains.pair_producer], chains.fixed_in_bytes,
                                       nodes.nbytes[fixed_out]]).astype(np.float64),
    }


def make_graph_arrays(graph: PrunedGraph, collection: str, split: str) -> GraphArrays:
    """The GNN arrays of one pruned (and, for labelled splits, de-duplicated) graph.

    Edges turn from the file convention (row ``[consumer, producer]``) into PyG's ``(2, m)`` with
    row 0 = producer (message source) and row 1 = consumer. Configs keep their raw values: int8
    (c, nc, 18) layout blocks (the model embeds them) or float32 (c, 24) tile values (the model
    scales them itself, sign * log1p). Layout graphs also carry their chain ends (``chain_*``).
    """
    edges = graph.edge_index.reshape(-1, 2)
    config_feat = (graph.config_feat.astype(np.float32, copy=False) if graph.kind == "tile"
                   else graph.config_feat.astype(np.int8, copy=False))
    return GraphArrays(
        collection=collection,
        stem=graph.stem,
        split=split,
        node_opcode=graph.node_opcode.astype(np.int64),
        node_feat=transform_node_feat(graph.node_feat),
        message_edges=np.ascontiguousarray(edges[:, ::-1].T).astype(np.int64),
        config_nodes=graph.config_nodes.astype(np.int64),
        config_feat=config_feat,
        target=graph.target.astype(np.float64),
        config_index=graph.config_index.astype(np.int64),
        **(chain_end_arrays(graph) if graph.kind == "layout" else {}),
    )


# ----------------------------------------------------------------------------- stage: node arrays (I/O shell)

# The code the stage runs (part of its key): this module and what it imports (prune, the reader, and
# the layout geometry, whose chain logic gives the chain ends).
NODE_ARRAYS_CODE = Code(("pipelines.data.node_arrays",))


def _arrays_name(split: str, stem: str) -> str:
    return f"{split}/{stem}.npz"


def _node_arrays_to(folder: Path, prune_path: Path, stem: str, split: str, collection: str) -> None:
    pruned = load_pruned(pruned_path(prune_path, split, stem))
    save_graph_arrays(folder / _arrays_name(split, stem), make_graph_arrays(pruned, collection, split))


def run_node_arrays(call: StageCall) -> StageOutput:
    """The node-arrays stage: every graph the prune stage (``call.upstream["prune"]``) kept -> one
    :class:`GraphArrays` file each (read back with :func:`read_graph_arrays`)."""
    collection, prune = call.collection, call.upstream["prune"]
    graphs = read_graph_table(prune)

    def compute(folder: Path) -> dict[str, Any]:
        for split in SPLITS:
            (folder / split).mkdir()
        progress = Progress("[node_arrays]", graphs.height)
        jobs = [(folder, prune.path, stem, split, collection.name)
                for stem, split in graphs.select("graph", "split").iter_rows()]
        costs = [file_cost(pruned_path(prune.path, split, stem)) for _, _, stem, split, _ in jobs]
        for _ in map_in_order(_node_arrays_to, jobs, call.config.run.n_jobs, costs=costs):
            progress.step()
        return {"graphs": graphs.height}

    return run_declared(NODE_ARRAYS, call, compute)


def _node_arrays_inputs(call: StageCall) -> dict[str, str]:
    return {"prune": call.upstream["prune"].key}


# The node-arrays stage as data (pipelines.core.stages): no setting shapes it.
NODE_ARRAYS = Stage("node_arrays", inputs=("prune",), code=NODE_ARRAYS_CODE, settings={}, run=run_node_arrays,
                    input_keys=_node_arrays_inputs)


def read_graph_arrays(node_arrays: StageOutput, split: str, stem: str) -> GraphArrays:
    return load_graph_arrays(node_arrays.file(_arrays_name(split, stem)))
