"""TpuGraphs tuning records (``tuning.proto``) in, TpuGraphs graphs with their measured runtimes out.

A records file is a serialized ``TuningData`` (``modules``: many ``ModuleTuningData``) or a single
``ModuleTuningData``: an ``HloModuleProto`` and its ``runs``, each a config with a measured
``ExecutionProfile`` (``compute_time_ns``), ``is_default`` and ``error``. This is the format the
dataset's own pipeline (``tpu_graphs/process_data/xla/tuning_data_iterator.cc``) turns into the Kaggle
npz files, and the rules here are that iterator's:

* a module whose runs carry ``module_config`` (a ``LayoutConfig``) is a **layout** graph: the whole
  module, ``node_config_ids`` = ``config_index_to_node``, one ``node_config_feat`` row per kept run (per
  configurable node three six-slot ``dims`` blocks of its ``TensorLayoutConfig`` entries, -1 padded,
  as ``FeaturizeLayoutConfig`` writes them), ``config_runtime`` the run's ``compute_time_ns``. A run is
  kept when it has a module config, no ``error`` and a profile (a non-positive time is dropped too,
  where the official iterator stops on a CHECK); without a default run among the kept ones every run is
  dropped (the official iterator clears them: no normalizer);
* a module whose runs carry ``op_config`` (a ``TileSizeConfig``) is a **tile** graph: the whole (small)
  module, one ``config_feat`` row per kept run (kernel, output and input bounds: six leading values,
  their sum and product, product 0 for an empty list, as ``FeaturizeTileSizeConfig``), the run's time
  as ``config_runtime`` and the default run's time as every row's normalizer. As the official op
  iterator: a module with at most one run, or with a run lacking a tile config, is left out; a run
  with ``error`` or a time <= 1 ns is dropped. A module without a default run among the kept ones is
  left out here (the official iterator fails the whole file).

Nodes are numbered as ``HloEncoder`` numbers them (:mod:`pipelines.hlo.parse`), node features as
:mod:`pipelines.hlo.featurize` computes them. Every decision (what was kept, dropped, and why) is
returned with the graph, for the sidecar the flow writes. Nothing here writes files.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.core.errors import FormatError
from pipelines.data.tpugraphs import (LAYOUT_CONFIG_DIM, LAYOUT_VALUE_MAX, LAYOUT_VALUE_MIN, MAX_CONFIGS,
                                      MAX_LAYOUT_CONFIG_ITEMS, TILE_CONFIG_DIM, LayoutGraph, TileGraph)

MAX_RECORDS_BYTES = 2 << 30  # protobuf's own limit on one message
LAYOUT_TENSORS = 3  # output, input, kernel: kLayoutMaxTensors
LAYOUT_DIMS = 6  # kLayoutMaxDims
MIN_TILE_TIME_NS = 2  # the op iterator drops runs of compute_time_ns <= 1


@dataclass
class RecordGraph:
    """One module of a records file as a graph (``graph`` None when every run was dropped or the module
    left out; ``reason`` then says why)."""

    kind: str  # "layout" or "tile"
    module: str  # the HloModuleProto's name
    index: int  # position of the ModuleTuningData in the file
    fingerprint: int
    stem: str
    graph: LayoutGraph | TileGraph | None
    runs: int
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> runs
    reason: str | None = None  # why no graph
    facts: dict[str, Any] = field(default_factory=dict)  # default runtime, config_index_to_node check ...

    def summary(self) -> dict[str, Any]:
        kept = self.graph.num_configs if self.graph is not None else 0
        return {"module": self.module, "index": self.index, "fingerprint": self.fingerprint, "kind": self.kind,
                "stem": self.stem if self.graph is not None else None, "runs": self.runs, "kept": kept,
                "dropped": dict(sorted(self.dropped.items())), "left_out": self.reason, **self.facts}


# ----------------------------------------------------------------------------- the file


def read_records(path: Path | str) -> tuple[str, list[Any]]:
    """``("TuningData" | "ModuleTuningData", [ModuleTuningData, ...])`` of a records file, or a FormatError
    naming it. The kind is read from the bytes: a ``ModuleTuningData`` has runs, a fingerprint or
    ``config_index_to_node`` next to its module; a ``TuningData`` holds only ``modules``."""
    from pipelines.hlo.parse import read_bounded
    from pipelines.hlo.schema import decode_error, tuning_message

    path = Path(path)
    data = read_bounded(path, MAX_RECORDS_BYTES, "one protobuf message may be")
    for kind in ("ModuleTuningData", "TuningData"):
        try:
            message = tuning_message(kind).FromString(data)
        except decode_error():
            continue
        if kind == "ModuleTuningData" and message.module and (message.runs or message.config_index_to_node
                                                              or message.fingerprint):
            return kind, [message]
        if kind == "TuningData" and message.modules and all(m.module and m.runs for m in message.modules):
            return kind, list(message.modules)
    raise FormatError(path, "not a TpuGraphs tuning record (a serialized TuningData or ModuleTuningData of "
                            "tpu_graphs/proto/tuning.proto): truncated, empty of runs, or another message")


def record_graphs(path: Path | str) -> tuple[str, list[RecordGraph]]:
    """Every module of a records file as a :class:`RecordGraph` (see the module docstring)."""
    path = Path(path)
    kind, modules = read_records(path)
    graphs = [module_graph_of(record, index, path) for index, record in enumerate(modules)]
    return kind, graphs


def signed_hex(fingerprint: int) -> str:
    """A uint64 fingerprint as the dataset's tile stems write it: signed 64-bit hex (``-1bae27a41d70f4dc``)."""
    value = fingerprint - (1 << 64) if fingerprint >= 1 << 63 else fingerprint
    return f"-{-value:x}" if value < 0 else f"{value:x}"


def record_stem(module: str, fingerprint: int, index: int) -> str:
    name = re.sub(r"[^A-Za-z0-9_.+-]", "_", module).strip("_") or "module"
    return f"{name}_{signed_hex(fingerprint)}" if fingerprint else f"{name}_m{index}"


# ----------------------------------------------------------------------------- one module


def module_graph_of(record: Any, index: int, path: Path) -> RecordGraph:
    """The graph of one ``ModuleTuningData`` (layout or tile by its runs' config kind)."""
    from pipelines.hlo.parse import module_from_proto_bytes, proto_module_bytes

    where = f"{path} (module {index})"
    kinds = Counter(run.WhichOneof("config") for run in record.runs)
    kind = "layout" if kinds.get("module_config") else "tile"
    if kinds.get("module_config") and kinds.get("op_config"):
        raise FormatError(path, f"module {index}: its runs mix layout (module_config) and tile (op_config) configs")
    name = "module"
    if record.module:
        from pipelines.hlo.schema import hlo_message

        name = hlo_message("HloModuleProto").FromString(proto_module_bytes(record.module, where)).name.decode(
            "utf-8", "replace")
    entry = RecordGraph(kind, name, index, int(record.fingerprint), record_stem(name, int(record.fingerprint), index),
                        None, len(record.runs))
    if not record.module:
        entry.reason = "no module (an empty HloModuleProto)"
        return entry
    if kind == "tile" and len(record.runs) <= 1:
        entry.reason = f"{len(record.runs)} run(s): nothing to rank (the official op iterator loads modules of 2+ runs)"
        return entry
    if kind == "tile" and any(not run.HasField("op_config") or not run.op_config.HasField("tile_size_config")
                              for run in record.runs):
        entry.reason = "a run without a tile_size_config (the official op iterator leaves such a module out)"
        return entry
    from pipelines.hlo import featurize_module

    featurized = featurize_module(module_from_proto_bytes(record.module, where), where)
    if kind == "layout":
        _layout(entry, record, featurized, path)
    else:
        _tile(entry, record, featurized, path)
    return entry


def _kept_runs(entry: RecordGraph, runs: list[Any], reasons: list[tuple[str, Any]]) -> list[Any]:
    kept = []
    for run in runs:
        why = next((reason for reason, drop in reasons if drop(run)), None)
        if why is None:
            kept.append(run)
        else:
            entry.dropped[why] = entry.dropped.get(why, 0) + 1
    return kept


def _with_default(entry: RecordGraph, kept: list[Any], what: str) -> Any | None:
    default = next((run for run in kept if run.is_default), None)
    if default is None and kept:
        entry.dropped[what] = entry.dropped.get(what, 0) + len(kept)
        entry.reason = f"no default run among the {len(kept)} kept runs ({what})"
    elif not kept:
        entry.reason = "no run kept"
    return default


def _layout(entry: RecordGraph, record: Any, featurized: Any, path: Path) -> None:
    layout = featurized.layout
    n = int(layout.node_feat.shape[0])
    ids = np.array(record.config_index_to_node, dtype=np.uint64)
    if ids.size == 0:
        raise FormatError(path, f"module {entry.index}: layout runs but no config_index_to_node")
    if ids.max() >= n or np.unique(ids).size != ids.size:
        raise FormatError(path, f"module {entry.index}: config_index_to_node holds ids outside [0, {n}) or repeats")
    ids = ids.astype(np.int64)
    nc = ids.size
    kept = _kept_runs(entry, list(record.runs), [
        ("error", lambda run: run.error),
        ("no profile", lambda run: not run.HasField("profile")),
        ("no layout_config", lambda run: not run.module_config.HasField("layout_config")),
        ("compute_time_ns <= 0", lambda run: run.profile.compute_time_ns <= 0),
        (f"layout config of another node count than config_index_to_node ({nc})",
         lambda run: len(run.module_config.layout_config.nodes) != nc),
        (f"a node with more than {LAYOUT_TENSORS} tensors",
         lambda run: any(len(node.tensors) > LAYOUT_TENSORS for node in run.module_config.layout_config.nodes)),
        (f"a layout dim outside [{LAYOUT_VALUE_MIN}, {LAYOUT_VALUE_MAX}]",
         lambda run: any(not LAYOUT_VALUE_MIN <= d <= LAYOUT_VALUE_MAX for node in run.module_config.layout_config.nodes
                         for tensor in node.tensors for d in tensor.dims[:LAYOUT_DIMS])),
    ])
    default = _with_default(entry, kept, "the official iterator drops every run of a module without one")
    own = featurized.config_ids
    entry.facts = {"nodes": n, "configurable_nodes": nc,
                   "config_index_to_node_is_ours": bool(np.array_equal(np.sort(ids), own)),
                   "config_index_to_node_not_ours": sorted(set(ids.tolist()) - set(own.tolist()))[:20],
                   "ours_not_in_config_index_to_node": sorted(set(own.tolist()) - set(ids.tolist()))[:20]}
    if default is None:
        return
    entry.facts["default_runtime_ns"] = int(default.profile.compute_time_ns)
    entry.facts["default_index"] = kept.index(default)  # the config the compiler picks on its own (is_default)
    _check_count(path, entry, len(kept), nc * LAYOUT_CONFIG_DIM)
    configs = np.full((len(kept), nc, LAYOUT_CONFIG_DIM), -1, dtype=np.int8)
    for row, run in enumerate(kept):
        for k, node in enumerate(run.module_config.layout_config.nodes):
            for t, tensor in enumerate(node.tensors):
                dims = list(tensor.dims[:LAYOUT_DIMS])
                configs[row, k, t * LAYOUT_DIMS:t * LAYOUT_DIMS + len(dims)] = dims
    order = np.argsort(ids, kind="stable")  # the format wants ascending node ids: columns follow their node
    if not np.array_equal(order, np.arange(nc)):
        entry.facts["config_index_to_node_sorted"] = True
    runtime = np.array([run.profile.compute_time_ns for run in kept], dtype=np.int64)
    entry.graph = LayoutGraph(entry.stem, layout.node_feat, layout.node_opcode, layout.edge_index, ids[order],
                              configs[:, order], runtime, layout.node_splits)


def _check_count(path: Path, entry: RecordGraph, runs: int, values_per_run: int) -> None:
    """The format's bounds on one graph's configs (:data:`MAX_CONFIGS`, and the layout values a file may hold)."""
    if runs > MAX_CONFIGS or runs * values_per_run > MAX_LAYOUT_CONFIG_ITEMS:
        raise FormatError(path, f"module {entry.index} ({entry.module}): {runs} kept runs, more than one graph file "
                                f"may hold ({MAX_CONFIGS} configs, {MAX_LAYOUT_CONFIG_ITEMS} layout values)")


def tile_config_row(config: Any) -> list[float]:
    """The 24 ``config_feat`` values of one ``TileSizeConfig``."""
    row: list[float] = []
    for values in (list(config.kernel_bounds), list(config.output_bounds), list(config.input_bounds)):
        row += [float(v) for v in values[:6]] + [0.0] * (6 - min(len(values), 6))
        row += [float(sum(values)), float(math.prod(values)) if values else 0.0]
    return row


def _tile(entry: RecordGraph, record: Any, featurized: Any, path: Path) -> None:
    layout = featurized.layout
    kept = _kept_runs(entry, list(record.runs), [
        ("error", lambda run: run.error),
        (f"compute_time_ns < {MIN_TILE_TIME_NS}", lambda run: run.profile.compute_time_ns < MIN_TILE_TIME_NS),
    ])
    default = _with_default(entry, kept, "the official op iterator fails the whole file on such a module")
    entry.facts = {"nodes": int(layout.node_feat.shape[0])}
    if default is None:
        return
    _check_count(path, entry, len(kept), 1)
    normalizer = int(default.profile.compute_time_ns)
    entry.facts["default_runtime_ns"] = normalizer
    entry.facts["default_index"] = kept.index(default)
    feat = np.array([tile_config_row(run.op_config.tile_size_config) for run in kept],
                    dtype=np.float32).reshape(-1, TILE_CONFIG_DIM)
    runtime = np.array([run.profile.compute_time_ns for run in kept], dtype=np.int64)
    entry.graph = TileGraph(entry.stem, layout.node_feat, layout.node_opcode, layout.edge_index, feat, runtime,
                            np.full(len(kept), normalizer, dtype=np.int64))


__all__ = ["RecordGraph", "read_records", "record_graphs", "module_graph_of", "tile_config_row", "signed_hex"]
