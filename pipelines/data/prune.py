"""Graph pruning and config de-duplication (pure functions), plus the pruned-graph file format.

Layout graphs are cut down to their configurable nodes and a k-hop neighbourhood of them (public
solutions lost nothing with 1 hop and saved 4x memory). Identical config rows, frequent in layout
training files, are collapsed so that no model sees the same configuration twice with two labels.
Tile graphs are small and have no configurable nodes: they pass through unpruned.

The result of both steps is a :class:`PrunedGraph`, which the features and node-arrays stages read
(file format: :func:`save_pruned`).
"""

from __future__ import annotations

import io
import json
import logging
import math
import struct
import tokenize
import zipfile
import zlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import zstandard
from zlib_ng import zlib_ng

from pipelines.core.collection import LABELLED, Collection
from pipelines.core.engine import Code, StageOutput
from pipelines.core.errors import ConfigError, FormatError
from pipelines.core.logs import with_tag
from pipelines.core.parallel import file_cost, map_in_order
from pipelines.core.progress import Progress
from pipelines.core.stages import Stage, StageCall, run_declared, section_fields
from pipelines.core.stage_files import read_parquet
from pipelines.data.tpugraphs import GraphRef, GraphSize, LayoutGraph, TileGraph, load_ref

if TYPE_CHECKING:  # type hints only: the config reaches the key as resolved values
    from pipelines.config.settings import PipelineConfig

logger = logging.getLogger(__name__)

PRUNE_MODES = ("khop", "config_only")
DEDUP_MODES = ("first", "mean", "min", "none")
# Rows x bytes handled at once when hashing or comparing config rows (temporaries ~16 MB).
CHUNK_CELLS = 2**21


@dataclass
class PrunedGraph(GraphSize):
    """A graph after pruning (layout) and, for labelled splits, config de-duplication.

    ``edge_index`` keeps the file convention: row ``[u, v]`` means node ``u`` consumes ``v``'s
    output, both relabelled to positions in this graph; ``node_ids`` maps positions back to the
    node ids of the original file.
    """

    stem: str
    kind: str  # "tile" or "layout"
    node_feat: np.ndarray  # float32 (n, 140)
    node_opcode: np.ndarray  # uint8 (n,)
    edge_index: np.ndarray  # int64 (m, 2), file convention, relabelled
    node_ids: np.ndarray  # int64 (n,) original node id of each kept node
    config_nodes: np.ndarray  # int64 (nc,) positions of configurable nodes; empty for tile
    config_feat: np.ndarray  # int8 (c, nc, 18) layout; float32 (c, 24) tile
    config_index: np.ndarray  # int64 (c,) row of each kept config in the original file
    target: np.ndarray  # float64 (c,) runtime (layout) or runtime/normalizer (tile), aggregated over duplicates
    file_target: np.ndarray  # float64 (c_file,) the target of every config of the file, in file order


@dataclass(frozen=True)
class PruneStats:
    nodes_before: int
    nodes_after: int
    edges_before: int
    edges_after: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


# ----------------------------------------------------------------------------- pruning


def khop_mask(num_nodes: int, edge_index: np.ndarray, seeds: np.ndarray, hops: int) -> np.ndarray:
    """Boolean mask of the nodes within ``hops`` undirected steps of any seed node.

    One vectorised pass over the edge list per hop (O(hops * m)), no adjacency structure needed.
    """
    if hops < 0:
        raise ConfigError(f"prune.hops must be >= 0, got {hops}")
    mask = np.zeros(num_nodes, dtype=bool)
    mask[seeds] = True
    consumer, producer = edge_index[:, 0], edge_index[:, 1]
    for _ in range(hops):
        grown = mask.copy()
        grown[consumer[mask[producer]]] = True
        grown[producer[mask[consumer]]] = True
        if np.array_equal(grown, mask):  # the neighbourhood stopped growing
            break
        mask = grown
    return mask


def prune_layout_graph(graph: LayoutGraph, hops: int, mode: str) -> tuple[PrunedGraph, PruneStats]:
    """Keep the configurable nodes and their ``hops``-hop neighbourhood (``mode="khop"``), or the
    configurable nodes alone (``mode="config_only"``, the same as ``hops=0``).

    Edges survive when both ends are kept. Kept nodes keep their relative (topological) order, so
    relabelled edges stay sorted and ``u > v`` still holds. Configs are not copied: the result shares
    the graph's config array, and de-duplication (:func:`select_configs`) makes the only copy.
    """
    if mode not in PRUNE_MODES:
        raise ConfigError(f"prune.mode must be one of {', '.join(PRUNE_MODES)}, got {mode!r}")
    depth = 0 if mode == "config_only" else hops
    keep = khop_mask(graph.num_nodes, graph.edge_index, graph.node_config_ids, depth)
    kept = np.flatnonzero(keep)
    new_id = np.full(graph.num_nodes, -1, dtype=np.int64)
    new_id[kept] = np.arange(kept.size, dtype=np.int64)
    edges = graph.edge_index
    edge_kept = keep[edges[:, 0]] & keep[edges[:, 1]]
    target = graph.target
    pruned = PrunedGraph(
        stem=graph.stem,
        kind="layout",
        node_feat=graph.node_feat[kept],
        node_opcode=graph.node_opcode[kept],
        edge_index=new_id[edges[edge_kept]].reshape(-1, 2),
        node_ids=kept.astype(np.int64),
        config_nodes=new_id[graph.node_config_ids],
        config_feat=graph.node_config_feat,
        config_index=np.arange(graph.num_configs, dtype=np.int64),
        target=target,
        file_target=target,
    )
    stats = PruneStats(graph.num_nodes, int(kept.size), int(edges.shape[0]), int(edge_kept.sum()))
    return pruned, stats


def tile_as_pruned(graph: TileGraph) -> PrunedGraph:
    """A tile graph in the pruned-graph form, unchanged (tile graphs have no configurable nodes)."""
    target = graph.target
    return PrunedGraph(
        stem=graph.stem,
        kind="tile",
        node_feat=graph.node_feat,
        node_opcode=graph.node_opcode,
        edge_index=graph.edge_index.reshape(-1, 2),
        node_ids=np.arange(graph.num_nodes, dtype=np.int64),
        config_nodes=np.zeros(0, dtype=np.int64),
        config_feat=graph.config_feat,
        config_index=np.arange(graph.num_configs, dtype=np.int64),
        target=target,
        file_target=target,
    )


# ----------------------------------------------------------------------------- de-duplication


def deduplicate_configs(config_rows: np.ndarray, runtimes: np.ndarray, how: str) -> tuple[np.ndarray, np.ndarray]:
    """Collapse identical config rows; return the kept row indices (ascending) and their runtimes.

    Rows are compared byte for byte. Each group of duplicates is represented by its first row; its
    runtime is that row's (``"first"``), or the group's ``"mean"`` or ``"min"``. ``"none"`` keeps
    every row. Only ever apply this to labelled (train/valid) data.
    """
    if how not in DEDUP_MODES:
        raise ConfigError(f"prune.dedup must be one of {', '.join(DEDUP_MODES)}, got {how!r}")
    runtimes = np.asarray(runtimes, dtype=np.float64)
    count = config_rows.shape[0]
    if runtimes.shape != (count,):
        raise ValueError(f"{count} config rows but runtimes has shape {runtimes.shape}")
    if how == "none" or count == 0:
        return np.arange(count, dtype=np.int64), runtimes.copy()
    first, group = duplicate_groups(config_rows)
    if how == "first":
        return first, runtimes[first]
    if how == "mean":
        sums = np.bincount(group, weights=runtimes, minlength=first.size)
        return first, sums / np.bincount(group, minlength=first.size)
    lowest = np.full(first.size, np.inf)
    np.minimum.at(lowest, group, runtimes)
    return first, lowest


def duplicate_groups(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Groups of byte-identical rows: ``first`` (int64, ascending) holds the first row of each group,
    ``group`` (int64 (c,)) the group of every row, numbered in order of first appearance.

    Rows are grouped by a 64-bit hash of their bytes (CRC-32 and Adler-32 side by side), so no copy
    of the (up to ~220 MB) config array is made; every row that joined an earlier row's group is then
    checked against that row, and a hash collision (never expected) falls back to an exact sort of
    the rows. The result does not depend on the hash: groups are exact and numbered by first row.
    """
    count = rows.shape[0]
    data = np.ascontiguousarray(rows).reshape(count, -1).view(np.uint8)
    hashes = _row_hashes(data)
    _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    joined = np.flatnonzero(first[inverse] != np.arange(count))  # rows that are not their group's first
    step = max(1, CHUNK_CELLS // max(data.shape[1], 1))
    for start in range(0, joined.size, step):
        part = joined[start : start + step]
        if not np.array_equal(data[part], data[first[inverse[part]]]):
            keys = data.view(np.dtype((np.void, data.shape[1]))).ravel()
            _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
            break
    # np.unique numbers groups in sorted-key order; renumber them in order of first appearance.
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return first[order].astype(np.int64), rank[inverse.ravel()].astype(np.int64)


def _row_hashes(data: np.ndarray) -> np.ndarray:
    """uint64 (c,) hash of each uint8 row of a C-contiguous array: CRC-32 (high half) and Adler-32
    (low half) of its bytes, each computed at memory speed by zlib-ng (3x zlib's; the same values)."""
    width = data.shape[1]
    if width == 0:
        return np.zeros(data.shape[0], dtype=np.uint64)
    flat = memoryview(data.reshape(-1))
    return np.array([zlib_ng.crc32(flat[start : start + width]) << 32 | zlib_ng.adler32(flat[start : start + width])
                     for start in range(0, data.shape[0] * width, width)], dtype=np.uint64).reshape(data.shape[0])


def select_configs(graph: PrunedGraph, rows: np.ndarray, target: np.ndarray | None = None) -> PrunedGraph:
    """The graph restricted to config ``rows`` (positions in its current config array).

    ``target`` replaces the selected targets (e.g. the mean over a duplicate group).
    """
    rows = np.asarray(rows, dtype=np.int64)
    return PrunedGraph(
        stem=graph.stem,
        kind=graph.kind,
        node_feat=graph.node_feat,
        node_opcode=graph.node_opcode,
        edge_index=graph.edge_index,
        node_ids=graph.node_ids,
        config_nodes=graph.config_nodes,
        config_feat=graph.config_feat[rows],
        config_index=graph.config_index[rows],
        target=graph.target[rows] if target is None else np.asarray(target, dtype=np.float64),
        file_target=graph.file_target,
    )


def deduplicate_graph(graph: PrunedGraph, how: str) -> PrunedGraph:
    """Apply :func:`deduplicate_configs` to a (labelled) graph's configs."""
    rows, target = deduplicate_configs(graph.config_feat, graph.target, how)
    if rows.size == graph.num_configs:  # nothing removed: keep the config array, do not copy it
        return replace(graph, target=target)
    return select_configs(graph, rows, target)


def sample_configs(graph: PrunedGraph, max_configs: int, rng: np.random.Generator) -> PrunedGraph:
    """At most ``max_configs`` configs drawn without replacement, kept in file order (0: no cap)."""
    if max_configs <= 0 or graph.num_configs <= max_configs:
        return graph
    rows = np.sort(rng.choice(graph.num_configs, size=max_configs, replace=False))
    return select_configs(graph, rows)


# ----------------------------------------------------------------------------- file format

# A pruned graph is one ``<stem>.pruned`` file plus, for layout graphs, a configs file beside it.
# ``<stem>.pruned``: PRUNED_MAGIC, the length and CRC-32 of a JSON header (little-endian uint32 each),
# the header, then one zstd frame (level 1, with zstd's content checksum) per array, in header order.
# The header names each array's dtype, shape and frame length, so a reader of one array (the per-file
# targets) decompresses only its frame. The format replaced an npz whose zip directory, deflate and
# nine .npy header parses cost as much as reading the raw tile file: a tile graph was written and read
# back at ~2.4x the time numpy takes to load the raw file; one open, one json.loads and a few zstd
# frames now do it.
# Layout configs are the bulk (up to ~220 MB of int8 for the largest layout file) and live in their own
# file, either
# * ``<stem>.configs.npy``, a plain .npy: written at memory speed and memory-mapped by readers, who touch
#   only the rows they use and hold no private copy (random-search configs: zstd would shrink them ~7x
#   for 0.6x the time of reading the raw file), or
# * ``<stem>.configs.npy.zst``, the same bytes as one zstd frame (level 1), when a probe of the first
#   rows shrinks at least ZSTD_MIN_RATIO times: default-search configs, mostly -1, shrink ~1000x and
#   compress and decompress faster than the plain file is written and checked (read whole on load).
# Their CRC-32 and storage, in the header, are checked on every load. Tile configs (at most a few
# thousand rows of 24 floats) are an array of the .pruned file itself (storage "inline").
PRUNED_SUFFIX = ".pruned"
PRUNED_MAGIC = b"TPGPRUN\x01"
_PREFIX = struct.Struct("<8sII")  # magic, header length, header CRC-32
_GRAPH_ARRAYS = ("node_feat", "node_opcode", "edge_index", "node_ids", "config_nodes", "config_index", "target",
                 "file_target")
CONFIGS_SUFFIX = {"npy": ".configs.npy", "zst": ".configs.npy.zst"}
ZSTD_MIN_RATIO = 20
ZSTD_PROBE_BYTES = 4 * 2**20
# A header limit far above any real one (a few hundred bytes): a damaged length must not allocate gigabytes.
_MAX_HEADER_BYTES = 2**20


def configs_path(path: Path | str, storage: str = "npy") -> Path:
    """The configs file of the layout graph at ``path``: ``g.pruned`` -> ``g.configs.npy``
    (``storage="npy"``) or ``g.configs.npy.zst`` (``"zst"``)."""
    path = Path(path)
    return path.with_name(path.stem + CONFIGS_SUFFIX[storage])


def configs_storage(configs: np.ndarray, compress: str = "auto") -> str:
    """``"zst"`` when ``compress`` is ``"always"``, or (``"auto"``) when the first ZSTD_PROBE_BYTES of the
    (C-contiguous) configs shrink at least ZSTD_MIN_RATIO times with zstd level 1; else ``"npy"``."""
    if compress == "always":
        return "zst"
    probe = memoryview(configs).cast("B")[:ZSTD_PROBE_BYTES] if configs.size else b""
    if not probe:
        return "npy"
    return "zst" if len(zstandard.ZstdCompressor(level=1).compress(probe)) * ZSTD_MIN_RATIO <= len(probe) else "npy"


def save_pruned(path: Path | str, graph: PrunedGraph, compress: str = "auto") -> None:
    """Write a pruned graph: ``path`` (a ``.pruned`` file) and, for a layout graph, its configs
    (:func:`configs_path`, stored as :func:`configs_storage` decides for ``compress``,
    ``prune.compress_configs``).

    Not atomic by itself: stages write into a temporary folder that is renamed into place.
    """
    path = Path(path)
    configs = np.ascontiguousarray(graph.config_feat)
    arrays = {name: np.ascontiguousarray(getattr(graph, name)) for name in _GRAPH_ARRAYS}
    if graph.kind == "tile":
        storage, checksum = "inline", ""
        arrays["config_feat"] = configs
    else:
        storage, checksum = configs_storage(configs, compress), f"{zlib_ng.crc32(configs):08x}"
        _write_layout_configs(configs_path(path, storage), configs, storage)
    compressor = zstandard.ZstdCompressor(level=1, write_checksum=True)
    frames = [compressor.compress(memoryview(array).cast("B") if array.size else b"") for array in arrays.values()]
    header = json.dumps({
        "stem": graph.stem, "kind": graph.kind, "configs": {"storage": storage, "crc32": checksum},
        "arrays": [[name, array.dtype.str, list(array.shape), len(frame)]
                   for (name, array), frame in zip(arrays.items(), frames)],
    }, separators=(",", ":")).encode()
    with open(path, "wb") as stream:
        stream.write(_PREFIX.pack(PRUNED_MAGIC, len(header), zlib.crc32(header)))
        stream.write(header)
        for frame in frames:
            stream.write(frame)


def _write_layout_configs(path: Path, configs: np.ndarray, storage: str) -> None:
    with open(path, "wb") as stream:
        if storage == "npy":
            np.lib.format.write_array(stream, configs, allow_pickle=False)
            return
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(configs))
        size = header.tell() + configs.nbytes  # in the frame header, so a reader allocates once
        with zstandard.ZstdCompressor(level=1).stream_writer(stream, size=size, closefd=False) as writer:
            writer.write(header.getvalue())
            writer.write(memoryview(configs).cast("B") if configs.size else b"")


def load_pruned(path: Path | str) -> PrunedGraph:
    """Read a pruned graph. A layout graph's ``config_feat`` is read-only: a memory map of a plain configs
    file (rows are read from the page cache when used: select or copy the rows you keep), or the
    decompressed array of a zstd one."""
    path = Path(path)
    if path.suffix == LEGACY_SUFFIX:
        return _load_legacy_npz(path)
    header, values = _read_pruned(path)
    storage = header["configs"]["storage"]
    if header["kind"] == "tile" and storage == "inline" and "config_feat" in values:
        config_feat = values.pop("config_feat")
    elif header["kind"] == "layout" and storage in CONFIGS_SUFFIX:
        shape = (values["config_index"].shape[0], values["config_nodes"].shape[0], 18)
        config_feat = _load_configs(configs_path(path, storage), shape, np.dtype(np.int8), header["configs"]["crc32"])
    else:
        raise FormatError(path, f"cannot read pruned graph (a {header['kind']!r} graph with configs {storage!r})")
    return PrunedGraph(stem=header["stem"], kind=header["kind"], config_feat=config_feat, **values)


def load_file_target(path: Path | str) -> np.ndarray:
    """Only the per-file targets of a pruned graph (decompresses that one array)."""
    path = Path(path)
    if path.suffix == LEGACY_SUFFIX:
        return _load_legacy_npz(path).file_target
    return _read_pruned(path, only="file_target")[1]["file_target"]


# The npz format of prune outputs written before the one-file ``.pruned`` format (older runs keep their stage outputs, which
# notebooks and `analysis` still read): ``meta`` = (stem, kind, configs CRC-32, storage), the arrays, and
# the configs in their own file beside it, tile configs too. Read only; nothing writes it any more.
LEGACY_SUFFIX = ".npz"


def _load_legacy_npz(path: Path) -> PrunedGraph:
    try:
        with np.load(path, allow_pickle=False) as archive:
            stem, kind, checksum, storage = (str(v) for v in archive["meta"])
            values = {name: archive[name] for name in _GRAPH_ARRAYS}
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise FormatError(path, f"cannot read pruned graph ({type(exc).__name__}: {exc})") from None
    if storage not in CONFIGS_SUFFIX:
        raise FormatError(path, f"cannot read pruned graph (configs stored as {storage!r})")
    shape = ((values["config_index"].shape[0], values["config_nodes"].shape[0], 18) if kind == "layout"
             else (values["config_index"].shape[0], 24))
    dtype = np.dtype(np.int8 if kind == "layout" else np.float32)
    config_feat = _load_configs(configs_path(path, storage), shape, dtype, checksum)
    return PrunedGraph(stem=stem, kind=kind, config_feat=config_feat, **values)


def _read_pruned(path: Path, only: str | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The header of a ``.pruned`` file and its arrays (just ``only`` if given), checked against the header
    and zstd's checksums; any damage is a FormatError naming the file."""
    try:
        with open(path, "rb") as stream:
            magic, size, checksum = _PREFIX.unpack(stream.read(_PREFIX.size))
            if magic != PRUNED_MAGIC or size > _MAX_HEADER_BYTES:
                raise ValueError("not a pruned-graph file")
            raw_header = stream.read(size)
            if zlib.crc32(raw_header) != checksum:
                raise ValueError("its header does not match its CRC-32")
            header = json.loads(raw_header)
            data = memoryview(stream.read())
        values, offset, decompressor = {}, 0, zstandard.ZstdDecompressor()
        for name, dtype, shape, length in header["arrays"]:
            if offset + length > len(data):
                raise ValueError(f"array {name} is cut short")
            if only in (None, name):
                dtype = np.dtype(dtype)
                raw = decompressor.decompress(data[offset:offset + length])
                expected = dtype.itemsize * math.prod(shape)
                if len(raw) != expected:
                    raise ValueError(f"array {name} holds {len(raw)} bytes, expected {expected}")
                values[name] = np.frombuffer(raw, dtype=dtype).reshape(shape)
            offset += length
        if offset != len(data):
            raise ValueError(f"{len(data) - offset} bytes after its last array")
        missing = set(_GRAPH_ARRAYS if only is None else (only,)) - set(values)
        if missing:
            raise ValueError(f"no array {', '.join(sorted(missing))}")
    except (OSError, ValueError, TypeError, KeyError, struct.error, zstandard.ZstdError) as exc:
        raise FormatError(path, f"cannot read pruned graph ({type(exc).__name__}: {exc})") from None
    return header, values


def _load_configs(path: Path, shape: tuple[int, ...], dtype: np.dtype, checksum: str) -> np.ndarray:
    try:
        if path.suffix == ".zst":
            configs = _read_npy_bytes(zstandard.ZstdDecompressor().decompress(path.read_bytes()))
        else:
            configs = np.load(path, mmap_mode="r", allow_pickle=False)
    # (numpy's parser of a damaged .npy header raises SyntaxError or TokenError)
    except (OSError, ValueError, SyntaxError, tokenize.TokenError, zstandard.ZstdError) as exc:
        raise FormatError(path, f"cannot read pruned configs ({type(exc).__name__}: {exc})") from None
    if configs.shape != shape or configs.dtype != dtype:
        raise FormatError(path, f"pruned configs are {configs.dtype} {configs.shape}, expected {dtype} {shape} "
                                "from the graph beside them")
    if f"{zlib_ng.crc32(configs):08x}" != checksum:
        raise FormatError(path, "pruned configs do not match their CRC-32 (a corrupt file)")
    return configs


def _read_npy_bytes(data: bytes) -> np.ndarray:
    """The array in ``data`` (the bytes of a .npy file), read-only and without a copy."""
    stream = io.BytesIO(data)
    if np.lib.format.read_magic(stream) != (1, 0):
        raise ValueError("not a version 1.0 .npy")
    shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
    if fortran_order or dtype.hasobject:
        raise ValueError("unexpected .npy layout")
    count = int(np.prod(shape))
    if len(data) != stream.tell() + count * dtype.itemsize:
        raise ValueError(f"{len(data)} bytes for a {dtype} {shape} array")
    return np.frombuffer(data, dtype=dtype, count=count, offset=stream.tell()).reshape(shape)


# ----------------------------------------------------------------------------- stage: prune (I/O shell)

# The code the stage runs (part of its key): this module and what it imports.
PRUNE_CODE = Code(("pipelines.data.prune",))
GRAPHS_TABLE = "graphs.parquet"
_GRAPHS_SCHEMA = {"graph": pl.String, "split": pl.String, "nodes_before": pl.Int64, "nodes_after": pl.Int64,
                  "edges_before": pl.Int64, "edges_after": pl.Int64, "configs_before": pl.Int64,
                  "configs_after": pl.Int64}


def _pruned_name(split: str, stem: str) -> str:
    return f"{split}/{stem}{PRUNED_SUFFIX}"


def pruned_path(folder: Path, split: str, stem: str) -> Path:
    """Where the prune stage's ``folder`` holds the pruned graph ``stem`` of ``split`` (for workers,
    which get the folder rather than the whole :class:`StageOutput`)."""
    return folder / _pruned_name(split, stem)


def prune_settings(config: PipelineConfig, collection: Collection) -> dict[str, str]:
    """The settings the prune stage of ``collection`` is keyed by (tile graphs ignore the pruning knobs and
    ``compress_configs``: their configs are part of the graph file)."""
    own = {"dedup": "prune.dedup"} if collection.is_tile else section_fields(config, "prune")
    # on_bad_file is keyed: an output that skipped files must never be reused by a run that asks for errors
    return {**own, "on_bad_file": "data.on_bad_file"}


def prune_config(config: PipelineConfig, collection: Collection) -> dict[str, Any]:
    """What the prune stage of ``collection`` depends on: the config of its key (:data:`PRUNE`)."""
    return PRUNE.key_config(StageCall(config, collection))


def prune_one(ref: GraphRef, config: PipelineConfig) -> tuple[PrunedGraph, dict[str, Any]]:
    """Load, prune (layout) and de-duplicate (labelled splits) one graph; returns it and its stats row."""
    graph = load_ref(ref)
    if isinstance(graph, LayoutGraph):
        pruned, stats = prune_layout_graph(graph, config.prune.hops, config.prune.mode)
        counts = stats.as_dict()
    else:
        pruned = tile_as_pruned(graph)
        counts = {"nodes_before": graph.num_nodes, "nodes_after": graph.num_nodes,
                  "edges_before": int(graph.edge_index.shape[0]), "edges_after": int(graph.edge_index.shape[0])}
    del graph  # the pruned graph shares the config array; nothing else of the raw graph is kept
    configs_before = pruned.num_configs
    if ref.split in LABELLED:
        pruned = deduplicate_graph(pruned, config.prune.dedup)
    row = {"graph": ref.stem, "split": ref.split, **counts,
           "configs_before": configs_before, "configs_after": pruned.num_configs}
    return pruned, row


def _prune_to(folder: Path, ref: GraphRef,
              config: PipelineConfig) -> tuple[dict[str, Any] | None, tuple[str, str] | None]:
    """One prune job: writes the pruned graph and returns its stats row, or (None, (path, problem))
    for a bad file: a worker returns the problem rather than raising it, so the stage decides in
    file order (and a FormatError need not cross a process boundary)."""
    try:
        pruned, row = prune_one(ref, config)
    except FormatError as exc:
        return None, (str(exc.path), exc.problem)
    save_pruned(pruned_path(folder, ref.split, ref.stem), pruned, config.prune.compress_configs)
    return row, None


def check_something_left(collection: Collection, refs: dict[str, list[GraphRef]], skipped: list[dict]) -> None:
    """``data.on_bad_file = "skip"`` leaves bad files out, never a whole split: with every train file of
    a collection bad, training on the valid graphs alone (a handful, scored on themselves) is an error."""
    train = refs.get("train") or []
    bad = [item for item in skipped if item["split"] == "train"]
    if train and len(bad) == len(train):
        examples = "; ".join(f"{Path(item['path']).name}: {item['reason']}" for item in bad[:3])
        raise FormatError(Path(train[0].path).parent,
                          f"{collection.name}: every train file ({len(train)}) is unreadable, nothing is left to "
                          f"train on (data.on_bad_file = \"skip\" leaves bad files out, not a whole split): "
                          f"{examples}{' ...' if len(bad) > 3 else ''}")


def run_prune(call: StageCall) -> StageOutput:
    """The prune stage: the raw files of ``call.raw`` -> per graph a ``.pruned`` file and, for layout, its
    configs file (see :func:`save_pruned`), plus ``graphs.parquet`` (read them back with
    :func:`read_graph_table`, :func:`read_pruned`, :func:`read_file_target`). Files left out
    (``data.on_bad_file = "skip"``) are warned about on every call, cached or not."""
    config, refs = call.config, call.raw.refs

    def compute(folder: Path) -> dict[str, Any]:
        rows, skipped = [], []
        for split in refs:
            (folder / split).mkdir()
        every = [ref for items in refs.values() for ref in items]
        progress = Progress("[prune]", len(every))
        results = map_in_order(_prune_to, [(folder, ref, config) for ref in every], config.run.n_jobs,
                               costs=[file_cost(ref.path) for ref in every])
        for ref, (row, bad) in zip(every, results):
            progress.step()
            if bad is None:
                rows.append(row)
                continue
            path, problem = bad
            if ref.split not in LABELLED:  # the submission needs a row for every test file
                raise FormatError(path, f"{problem} (a test file cannot be left out: data.on_bad_file = \"skip\" "
                                        "applies to train and valid files)")
            if config.data.on_bad_file != "skip":
                raise FormatError(path, f"{problem} (to leave such files out with a warning: "
                                        "--set data.on_bad_file=skip)")
            skipped.append({"split": ref.split, "graph": ref.stem, "path": str(ref.path), "reason": problem})
        check_something_left(call.collection, refs, skipped)
        table = pl.DataFrame(rows, schema=_GRAPHS_SCHEMA)
        table.write_parquet(folder / GRAPHS_TABLE)
        labelled = table.filter(pl.col("split").is_in(LABELLED))
        return {
            "graphs": {split: table.filter(pl.col("split") == split).height for split in refs},
            "nodes_removed": int((table["nodes_before"] - table["nodes_after"]).sum()),
            "edges_removed": int((table["edges_before"] - table["edges_after"]).sum()),
            "node_share_kept": float(table["nodes_after"].sum() / max(table["nodes_before"].sum(), 1)),
            "configs_removed_by_dedup": int((labelled["configs_before"] - labelled["configs_after"]).sum()),
            "skipped_files": skipped,
        }

    output = run_declared(PRUNE, call, compute)
    for item in output.metrics.get("skipped_files", []):
        logger.warning(with_tag(f"warning: skipped bad file {item['path']}: {item['reason']} "
                                "(data.on_bad_file = \"skip\")"))
    return output


def _prune_inputs(call: StageCall) -> dict[str, str]:
    return {"data": call.raw.data_key}


# The prune stage as data (pipelines.core.stages): its key is built from this declaration alone.
PRUNE = Stage("prune", inputs=(), code=PRUNE_CODE, settings=prune_settings, run=run_prune, input_keys=_prune_inputs)


def kept_refs(refs: Mapping[str, Sequence[GraphRef]], prune: StageOutput) -> dict[str, list[GraphRef]]:
    """``refs`` (split -> graph references) without the graphs the prune stage ``prune`` left out (bad
    files skipped): the raw files of the stages that read its output."""
    kept = set(read_graph_table(prune)["graph"].to_list())
    return {split: [ref for ref in items if ref.stem in kept] for split, items in refs.items()}


def read_graph_table(prune: StageOutput) -> pl.DataFrame:
    """One row per kept graph: ``graph``, ``split`` and the before/after counts."""
    return read_parquet(prune.file(GRAPHS_TABLE))


def read_pruned(prune: StageOutput, split: str, stem: str) -> PrunedGraph:
    return load_pruned(_stored_graph(prune, split, stem))


def read_file_target(prune: StageOutput, split: str, stem: str) -> np.ndarray:
    """float64 target of every config of the original file in file order (zeros for test)."""
    return load_file_target(_stored_graph(prune, split, stem))


def _stored_graph(prune: StageOutput, split: str, stem: str) -> Path:
    """The graph file of ``stem`` in a prune output: ``.pruned``, or the npz of an output written before it."""
    legacy = prune.path / f"{split}/{stem}{LEGACY_SUFFIX}"
    if not (prune.path / _pruned_name(split, stem)).exists() and legacy.is_file():
        return legacy
    return prune.file(_pruned_name(split, stem))
