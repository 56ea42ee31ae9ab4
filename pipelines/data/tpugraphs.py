"""The one module that knows the TpuGraphs npz format: find, list, load (validated) and write graphs.

Everything else in the package works with :class:`TileGraph` and :class:`LayoutGraph`. Loading
casts every key to the dtype documented in ``shared/TPUGRAPHS_FORMAT.md`` and validates shapes,
ranges and cross-array consistency; any deviation raises :class:`FormatError` naming the file.

Layout ``node_config_feat`` is float32 on disk (up to 100,040 x 121 x 18, ~1 GB). It is streamed
from the compressed archive member in bounded chunks and stored as int8 (values -1..5), so the
float32 array never exists in memory. Members are inflated by ``pipelines.data.zip_member`` (zlib-ng, about
twice zlib's speed, with zipfile's checks); ``zipfile`` reads the central directory. The writer streams
the same way in reverse, through zipfile's own deflate.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import tempfile
import tokenize
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterator, Sequence

import numpy as np

from pipelines.core.atomic import chmod_like_new_file
from pipelines.core.collection import Collection
from pipelines.core.errors import FormatError
from pipelines.data.zip_member import MemberReader

NODE_FEAT_DIM = 140


class NodeFeat:
    """What the 140 ``node_feat`` columns mean (shared/TPUGRAPHS_FORMAT.md): the one place that knows."""

    IS_ROOT = 0
    ELEMENT_TYPE = slice(2, 21)  # one-hot: invalid, pred, s8, s16, s32, s64, u8 ... tuple, opaque, token
    SHAPE_DIMS = slice(21, 27)  # output shape dims 0-5 (0 = unused)
    SHAPE_SUM, SHAPE_PRODUCT = 27, 28
    TUPLE_SIZE, PARAMETER_NUMBER = 29, 30
    DIMENSIONS = slice(31, 37)  # the `dimensions` attribute
    WINDOW = slice(37, 85)  # size, stride, padding low/high, dilation, base dilation: 6 dims + sum + product
    WINDOW_SIZE_PRODUCT = 44
    WINDOW_REVERSAL = slice(85, 93)
    CONVOLUTION_DIMS = slice(93, 107)
    GROUP_COUNTS = slice(107, 109)  # feature_group_count, batch_group_count
    SLICE = slice(109, 121)
    DYNAMIC_SLICE = slice(121, 125)
    PAD = slice(125, 133)
    IS_STABLE = 133
    LAYOUT = slice(134, 140)  # minor_to_major of the node's default layout (0-padded: 0 is ambiguous)

    @staticmethod
    def columns(part: slice) -> tuple[int, ...]:
        return tuple(range(part.start, part.stop))


TILE_CONFIG_DIM = 24
LAYOUT_CONFIG_DIM = 18
LAYOUT_VALUE_MIN, LAYOUT_VALUE_MAX = -1, 5
# Bytes of compressed-member payload decoded per step when streaming node_config_feat.
CHUNK_BYTES = 32 * 1024 * 1024

COMMON_KEYS = ("node_feat", "node_opcode", "edge_index")
TILE_KEYS = COMMON_KEYS + ("config_feat", "config_runtime", "config_runtime_normalizers")
LAYOUT_KEYS = COMMON_KEYS + ("node_config_ids", "node_config_feat", "config_runtime", "node_splits")

# Bounds on declared sizes, checked from the zip and npy headers before anything is decompressed, so
# a decompression bomb or a lying header costs no memory. Each is a few times the largest real value
# (shared/TPUGRAPHS_FORMAT.md: <= ~44k nodes, nc <= 3143, <= 100,040 configs, node_config_feat of
# 100040 x 121 x 18), so no legitimate file comes near them.
MAX_NODES = 200_000
MAX_EDGES = 2_000_000
MAX_CONFIGS = 400_000
MAX_CONFIG_NODES = 20_000
MAX_LAYOUT_CONFIG_ITEMS = 500_000_000  # c * nc * 18; stored as int8 (<= 500 MB), streamed from disk
MAX_ITEMSIZE = 8  # every key holds plain numbers
_MAX_ITEMS = {
    "node_feat": MAX_NODES * NODE_FEAT_DIM,
    "node_opcode": MAX_NODES,
    "edge_index": MAX_EDGES * 2,
    "config_feat": MAX_CONFIGS * TILE_CONFIG_DIM,
    "config_runtime": MAX_CONFIGS,
    "config_runtime_normalizers": MAX_CONFIGS,
    "node_config_ids": MAX_CONFIG_NODES,
    "node_config_feat": MAX_LAYOUT_CONFIG_ITEMS,
    "node_splits": MAX_NODES + 1,
}
_NPY_HEADER_SLACK = 1 << 16  # npy magic + header (numpy refuses headers above 10,000 bytes anyway)
_DEFLATE_MAX_RATIO = 1100  # deflate cannot expand one byte into more than ~1032


# ----------------------------------------------------------------------------- data classes


class GraphSize:
    """``num_nodes`` and ``num_configs`` of every graph record along the flow (raw, pruned, GNN arrays):
    rows of ``node_feat`` and of the record's config array (``CONFIG_ARRAY``)."""

    CONFIG_ARRAY = "config_feat"

    @property
    def num_nodes(self) -> int:
        return int(self.node_feat.shape[0])  # type: ignore[attr-defined]

    @property
    def num_configs(self) -> int:
        return int(getattr(self, self.CONFIG_ARRAY).shape[0])


@dataclass
class TileGraph(GraphSize):
    """One tile:xla kernel graph with its tile-size configurations."""

    stem: str
    node_feat: np.ndarray  # float32 (n, 140)
    node_opcode: np.ndarray  # uint8 (n,)
    edge_index: np.ndarray  # int64 (m, 2); row [u, v]: u consumes v's output
    config_feat: np.ndarray  # float32 (c, 24)
    config_runtime: np.ndarray  # int64 (c,) ns; all 0 in test files
    config_runtime_normalizers: np.ndarray  # int64 (c,)

    @property
    def target(self) -> np.ndarray:
        """runtime / normalizer as float64 (the quantity the tile metric ranks)."""
        return self.config_runtime.astype(np.float64) / np.maximum(self.config_runtime_normalizers, 1)

    @property
    def has_labels(self) -> bool:
        return bool(np.any(self.config_runtime != 0))


@dataclass
class LayoutGraph(GraphSize):
    """One layout graph: program graph plus per-config layouts of its configurable nodes."""

    CONFIG_ARRAY = "node_config_feat"

    stem: str
    node_feat: np.ndarray  # float32 (n, 140)
    node_opcode: np.ndarray  # uint8 (n,)
    edge_index: np.ndarray  # int64 (m, 2)
    node_config_ids: np.ndarray  # int64 (nc,) ascending node ids of configurable nodes
    node_config_feat: np.ndarray  # int8 (c, nc, 18), values -1..5
    config_runtime: np.ndarray  # int64 (c,) ns; all 0 in test files
    node_splits: np.ndarray  # int64 (1, s)

    @property
    def target(self) -> np.ndarray:
        return self.config_runtime.astype(np.float64)

    @property
    def has_labels(self) -> bool:
        return bool(np.any(self.config_runtime != 0))


Graph = TileGraph | LayoutGraph


@dataclass(frozen=True, order=True)
class GraphRef:
    """Where one graph file lives: its collection, split, stem and path."""

    collection: Collection
    split: str
    stem: str
    path: Path = field(compare=False)

    @property
    def submission_id(self) -> str:
        return self.collection.submission_id(self.stem)


# ----------------------------------------------------------------------------- reading


def load_graph(path: Path | str, collection: Collection, *, with_configs: bool = True) -> Graph:
    """Load and validate one graph file of ``collection``.

    ``with_configs=False`` skips the large layout config array (an empty (0, nc, 18) array is
    returned in its place, and ``config_runtime`` is still loaded) for callers that only need
    the graph structure.
    """
    path = Path(path)
    stem = path.name[: -len(".npz")] if path.name.endswith(".npz") else path.stem
    check_readable_file(path)
    # one handle on the file: zipfile reads the directory through it, MemberReader the members
    with _archive_errors(path), open(path, "rb") as file, zipfile.ZipFile(file) as archive:
        members = _checked_members(archive, path)
        required = TILE_KEYS if collection.is_tile else LAYOUT_KEYS
        problem = _missing_members(members, required, collection)
        if problem:
            raise FormatError(path, problem)
        arrays = {
            key: _read_member(file, archive.getinfo(members[key]), path, key)
            for key in required
            if key != "node_config_feat"
        }
        if collection.is_layout:
            arrays["node_config_feat"] = (
                _read_layout_configs(file, archive.getinfo(members["node_config_feat"]), path)
                if with_configs
                else None
            )
    builder = _build_tile if collection.is_tile else _build_layout
    return builder(path, stem, arrays)


def load_ref(ref: GraphRef, *, with_configs: bool = True) -> Graph:
    return load_graph(ref.path, ref.collection, with_configs=with_configs)


def iter_graphs(refs: list[GraphRef], *, with_configs: bool = True) -> Iterator[tuple[GraphRef, Graph]]:
    """Load graphs one at a time so only one is ever in memory."""
    for ref in refs:
        yield ref, load_ref(ref, with_configs=with_configs)


def count_configs(path: Path | str, collection: Collection) -> int:
    """Number of configs of one graph file, from the npy header of its config array alone.

    Reads ``config_feat`` (tile) or ``node_config_feat`` (layout) up to the end of its header, so no
    array data is decompressed: cheap enough to check every row of a submission.
    """
    path = Path(path)
    key, rank, width = (("config_feat", 2, TILE_CONFIG_DIM) if collection.is_tile
                        else ("node_config_feat", 3, LAYOUT_CONFIG_DIM))
    check_readable_file(path)
    with _archive_errors(path), open(path, "rb") as file, zipfile.ZipFile(file) as archive:
        members = _checked_members(archive, path)
        if key not in members:
            raise FormatError(path, f"missing key {key} for {collection.name}")
        info = archive.getinfo(members[key])
        shape, _, dtype = _checked_header(MemberReader(file, info), info, path, key)
    if len(shape) != rank or shape[-1] != width or shape[0] == 0 or dtype.hasobject:
        expected = "(c, 24)" if collection.is_tile else "(c, nc, 18)"
        raise FormatError(path, f"{key}: expected a numeric array of shape {expected} with c > 0, "
                                f"got {dtype} {shape}")
    return int(shape[0])


def _missing_members(members, required: Sequence[str], collection: Collection) -> str | None:
    """What is wrong when a graph file lacks arrays its collection needs, or None."""
    missing = [k for k in required if k not in members]
    if not missing:
        return None
    return f"missing key(s) {', '.join(missing)} for {collection.name} (found: {', '.join(sorted(members)) or 'none'})"


def probe_problem(path: Path | str, collection: Collection) -> str | None:
    """What a quick look finds wrong with a graph file, or None: its archive directory and the npy header
    of every member the collection needs (a few KB read, no array data): garbage, a truncated file, a
    missing or malformed member. Damage inside the compressed data is found when the file is read."""
    path = Path(path)
    try:
        check_readable_file(path)
        with _archive_errors(path), open(path, "rb") as file, zipfile.ZipFile(file) as archive:
            members = _checked_members(archive, path)
            required = TILE_KEYS if collection.is_tile else LAYOUT_KEYS
            problem = _missing_members(members, required, collection)
            if problem:
                return problem
            for key in required:
                info = archive.getinfo(members[key])
                _checked_header(MemberReader(file, info), info, path, key)
    except FormatError as exc:
        return exc.problem
    return None


def unreadable_reason(path: Path | str) -> str | None:
    """Why ``path`` cannot be read as a graph file without opening it (None: a regular file).

    Checked before any open: opening a FIFO would block forever, a directory or a dangling link
    would otherwise surface as a confusing archive error.
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "dangling symlink (its target does not exist)" if path.is_symlink() else "file not found"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symlink loop"
        return f"cannot read ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file")
    return f"not a regular file: {kind}"


def check_readable_file(path: Path) -> None:
    reason = unreadable_reason(path)
    if reason is not None:
        raise FormatError(path, reason)


def _checked_members(archive: zipfile.ZipFile, path: Path) -> dict[str, str]:
    """``{key: member name}`` of the ``.npy`` members, after checking the zip headers alone: no
    duplicate member, only stored/deflated members, declared sizes within the format's bounds and
    consistent with the file's size (so nothing is decompressed from a bomb)."""
    infos = archive.infolist()
    names = [info.filename for info in infos]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise FormatError(path, f"duplicate archive member(s) {', '.join(duplicates)} (which copy is meant is "
                                "ambiguous)")
    file_size = path.stat().st_size
    if sum(info.compress_size for info in infos) > file_size:
        raise FormatError(path, "archive members declare more compressed bytes than the file holds")
    members = {}
    for info in infos:
        if not info.filename.endswith(".npy"):
            continue
        key = info.filename[: -len(".npy")]
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise FormatError(path, f"{key}: unsupported compression method {info.compress_type} "
                                    "(np.savez writes stored or deflated members)")
        limit = _MAX_ITEMS.get(key)
        if limit is not None and info.file_size > limit * MAX_ITEMSIZE + _NPY_HEADER_SLACK:
            raise FormatError(path, f"{key}: declares {info.file_size} bytes uncompressed, more than any "
                                    f"TpuGraphs file holds (at most {limit} values); refusing to decompress it")
        if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
            raise FormatError(path, f"{key}: stored member declares {info.file_size} bytes but holds "
                                    f"{info.compress_size}")
        if info.file_size > _DEFLATE_MAX_RATIO * info.compress_size + _NPY_HEADER_SLACK:
            raise FormatError(path, f"{key}: declares {info.file_size} bytes from {info.compress_size} "
                                    "compressed bytes, more than deflate can produce")
        members[key] = info.filename
    return members


def _checked_header(stream: IO[bytes], info: zipfile.ZipInfo, path: Path,
                    key: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """The npy header of a member, checked against the format's bounds and the member's declared size
    before any array data is read."""
    shape, fortran_order, dtype = _read_header(stream)
    if dtype.hasobject:
        raise FormatError(path, f"{key}: object arrays are not allowed")
    if dtype.kind not in "fiub" or dtype.itemsize > MAX_ITEMSIZE:
        raise FormatError(path, f"{key}: expected a numeric array, got dtype {dtype}")
    if any(d < 0 for d in shape):
        raise FormatError(path, f"{key}: negative dimension in shape {shape}")
    count = 1
    for dim in shape:
        count *= int(dim)  # Python int: no overflow on absurd shapes
    limit = _MAX_ITEMS.get(key)
    if limit is not None and count > limit:
        raise FormatError(path, f"{key}: declared shape {shape} ({count} values) exceeds what any TpuGraphs "
                                f"file holds (at most {limit}); refusing to read it")
    data_bytes = count * dtype.itemsize
    if data_bytes > info.file_size:
        raise FormatError(path, f"{key}: declared shape {shape} needs {data_bytes} bytes but the member holds "
                                f"{info.file_size}")
    return shape, fortran_order, dtype


@contextmanager
def _archive_errors(path: Path) -> Iterator[None]:
    """Turn whatever a missing, truncated or corrupt archive raises into one FormatError naming it."""
    try:
        yield
    except FormatError:
        raise
    except FileNotFoundError:
        raise FormatError(path, "file not found") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as exc:
        raise FormatError(path, f"corrupt or truncated archive ({type(exc).__name__}: {exc})") from None


def _read_header(stream: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(stream)
    if version not in ((1, 0), (2, 0)):
        raise ValueError(f"unsupported npy format version {version}")
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    try:
        return read(stream)
    except (SyntaxError, TypeError, tokenize.TokenError, RecursionError) as exc:  # numpy's parser on garbage
        raise ValueError(f"unreadable npy header ({type(exc).__name__})") from None


def _read_member(file: IO[bytes], info: zipfile.ZipInfo, path: Path, key: str) -> np.ndarray:
    """Read one (small: its size is bounded by _checked_members) array member of the archive open as
    ``file`` completely; its size and CRC-32 are checked before its header is parsed. Object arrays are
    refused."""
    member = MemberReader(file, info)
    whole = member.read(info.file_size)
    _drain(member)
    stream = io.BytesIO(whole)
    shape, fortran_order, dtype = _checked_header(stream, info, path, key)
    count = int(np.prod(shape, dtype=np.int64))
    data = _read_exact(stream, count * dtype.itemsize, path, key)
    _drain(stream)
    array = np.frombuffer(data, dtype=dtype, count=count)
    return array.reshape(shape, order="F" if fortran_order else "C")


def _read_exact(stream: IO[bytes], nbytes: int, path: Path, key: str) -> bytes:
    data = stream.read(nbytes)
    if len(data) != nbytes:
        raise FormatError(path, f"{key}: truncated array data ({len(data)} of {nbytes} bytes)")
    return data


def _drain(stream: IO[bytes]) -> None:
    """Read to the end of a member so its size and CRC-32 are verified; trailing bytes mean corruption."""
    if stream.read(1):
        raise ValueError("array member has trailing bytes")


def _read_layout_configs(file: IO[bytes], info: zipfile.ZipInfo, path: Path) -> np.ndarray:
    """Stream node_config_feat into an int8 array chunk by chunk, checking values are integers in -1..5."""
    key = "node_config_feat"
    stream = MemberReader(file, info)
    shape, fortran_order, dtype = _checked_header(stream, info, path, key)
    if len(shape) != 3 or shape[2] != LAYOUT_CONFIG_DIM:
        raise FormatError(path, f"{key}: expected shape (c, nc, {LAYOUT_CONFIG_DIM}), got {shape}")
    if dtype.hasobject or dtype.kind not in "fiub":
        raise FormatError(path, f"{key}: expected a numeric dtype, got {dtype}")
    if fortran_order:  # never written by np.savez for C-contiguous data; accept it unchunked
        whole = np.frombuffer(_read_exact(stream, int(np.prod(shape)) * dtype.itemsize, path, key), dtype)
        _drain(stream)
        source = whole.reshape(shape, order="F")
        out = np.empty(shape, dtype=np.int8)
        for start in range(0, shape[0], 1024):
            out[start : start + 1024] = _to_layout_int8(source[start : start + 1024], path, start)
        return out
    num_configs, row_items = shape[0], shape[1] * shape[2]
    out = np.empty(shape, dtype=np.int8)
    row_bytes = max(row_items * dtype.itemsize, 1)
    rows_per_chunk = max(1, CHUNK_BYTES // row_bytes)
    buffer = bytearray(min(rows_per_chunk, num_configs) * row_bytes if row_items else 0)  # one, reused
    for start in range(0, num_configs, rows_per_chunk):
        rows = min(rows_per_chunk, num_configs - start)
        wanted = memoryview(buffer)[: rows * row_bytes if row_items else 0]
        if stream.readinto(wanted) != len(wanted):
            raise FormatError(path, f"{key}: truncated array data (config {start} onwards)")
        chunk = np.frombuffer(wanted, dtype=dtype).reshape((rows, *shape[1:]))
        out[start : start + rows] = _to_layout_int8(chunk, path, start)
    _drain(stream)
    return out


def _to_layout_int8(chunk: np.ndarray, path: Path, first_row: int) -> np.ndarray:
    if chunk.size == 0:
        return chunk.astype(np.int8)
    # Fast path, two passes over the chunk: cast, then compare back. A value survives the round trip
    # only if it is an integer in int8 range (NaN, infinities, fractions and large values do not),
    # so the int8 range check finishes the validation; anything else gets the exact error below.
    with np.errstate(invalid="ignore"):
        as_int = chunk.astype(np.int8)
    if np.array_equal(as_int, chunk) and as_int.min() >= LAYOUT_VALUE_MIN and as_int.max() <= LAYOUT_VALUE_MAX:
        return as_int
    if chunk.dtype.kind == "f" and not np.isfinite(chunk).all():
        row = first_row + int(np.argwhere(~np.isfinite(chunk))[0][0])
        raise FormatError(path, f"node_config_feat: non-finite value in config {row}")
    low, high = chunk.min(), chunk.max()
    if low < LAYOUT_VALUE_MIN or high > LAYOUT_VALUE_MAX:
        raise FormatError(path, f"node_config_feat: values must lie in [{LAYOUT_VALUE_MIN}, "
                                f"{LAYOUT_VALUE_MAX}], found range [{low}, {high}] near config {first_row}")
    as_int = chunk.astype(np.int8)
    if chunk.dtype.kind == "f" and not np.array_equal(as_int, chunk):
        raise FormatError(path, "node_config_feat: non-integer layout values")
    return as_int


# ----------------------------------------------------------------------------- validation


def _as_float32(array: np.ndarray, path: Path, key: str, shape_hint: str) -> np.ndarray:
    if array.dtype.kind not in "fiub":
        raise FormatError(path, f"{key}: expected a numeric array {shape_hint}, got dtype {array.dtype}")
    out = array.astype(np.float32)
    if not np.isfinite(out).all():
        bad = int(np.argwhere(~np.isfinite(out))[0][0])
        raise FormatError(path, f"{key}: NaN or infinite value (first in row {bad})")
    return out


def _as_int64(array: np.ndarray, path: Path, key: str) -> np.ndarray:
    if array.dtype.kind in "iub":
        if array.dtype.kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
            raise FormatError(path, f"{key}: value out of int64 range")
        return array.astype(np.int64)
    if array.dtype.kind == "f":
        if not np.isfinite(array).all():
            raise FormatError(path, f"{key}: NaN or infinite value")
        if np.any(np.abs(array.astype(np.float64)) >= 2.0**63):
            raise FormatError(path, f"{key}: value out of int64 range")
        as_int = array.astype(np.int64)
        if not np.array_equal(as_int, array):
            raise FormatError(path, f"{key}: expected integers, found fractional values")
        return as_int
    raise FormatError(path, f"{key}: expected an integer array, got dtype {array.dtype}")


def _expect_rank(array: np.ndarray, rank: int, path: Path, key: str, shape_hint: str) -> None:
    if array.ndim != rank:
        raise FormatError(path, f"{key}: expected shape {shape_hint}, got {array.shape}")


def _float_matrix(path: Path, arrays: dict[str, np.ndarray], key: str, rows: str, width: int, empty: str) -> np.ndarray:
    """``arrays[key]`` as float32 after checking it is 2-D with the documented width and has rows."""
    array = arrays[key]
    shape_hint = f"({rows}, {width})"
    _expect_rank(array, 2, path, key, shape_hint)
    if array.shape[1] != width:
        raise FormatError(path, f"{key}: expected {width} columns, got shape {array.shape}")
    if array.shape[0] == 0:
        raise FormatError(path, f"{key}: {empty}")
    return _as_float32(array, path, key, shape_hint)


def _common(path: Path, arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    node_feat = _float_matrix(path, arrays, "node_feat", "n", NODE_FEAT_DIM, "graph has no nodes")
    num_nodes = node_feat.shape[0]

    opcode = _as_int64(arrays["node_opcode"], path, "node_opcode")
    _expect_rank(opcode, 1, path, "node_opcode", "(n,)")
    if opcode.shape[0] != num_nodes:
        raise FormatError(path, f"node_opcode: {opcode.shape[0]} entries for {num_nodes} nodes")
    if opcode.size and (opcode.min() < 0 or opcode.max() > 255):
        raise FormatError(path, f"node_opcode: values must lie in [0, 255], found [{opcode.min()}, {opcode.max()}]")

    edges = _as_int64(arrays["edge_index"], path, "edge_index")
    if edges.size == 0:
        edges = edges.reshape(0, 2)
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise FormatError(path, f"edge_index: expected shape (m, 2), got {edges.shape}")
    if edges.size and (edges.min() < 0 or edges.max() >= num_nodes):
        raise FormatError(path, f"edge_index: node id out of range [0, {num_nodes}) "
                                f"(found [{edges.min()}, {edges.max()}])")
    if edges.size and np.any(edges[:, 0] <= edges[:, 1]):
        # the files' convention (nodes in topological order), which pruning and the chain search rely on;
        # it also rules out self-loops and cycles
        row = int(np.argmax(edges[:, 0] <= edges[:, 1]))
        raise FormatError(path, f"edge_index: row {row} is [{edges[row, 0]}, {edges[row, 1]}]; a consumer must "
                                "come after its producer (u > v): no self-loops or cycles")
    return node_feat, opcode.astype(np.uint8), edges


def _runtimes(path: Path, arrays: dict[str, np.ndarray], key: str, count: int, what: str) -> np.ndarray:
    if arrays[key].dtype.kind == "b":
        raise FormatError(path, f"{key}: expected integer nanoseconds, got booleans")
    values = _as_int64(arrays[key], path, key)
    _expect_rank(values, 1, path, key, "(c,)")
    if values.shape[0] != count:
        raise FormatError(path, f"{key}: {values.shape[0]} entries but {what} has {count} configs")
    if values.size and values.min() < 0:
        raise FormatError(path, f"{key}: negative value {values.min()}")
    labelled = path.parent.name in ("train", "valid")  # test files carry all-zero runtimes
    if labelled and values.size and values.min() == 0:
        row = int(np.argmin(values))
        raise FormatError(path, f"{key}: 0 in config {row} of a {path.parent.name} file (a labelled file's "
                                "runtimes must all be positive)")
    return values


def _build_tile(path: Path, stem: str, arrays: dict[str, np.ndarray]) -> TileGraph:
    node_feat, opcode, edges = _common(path, arrays)
    config_feat = _float_matrix(path, arrays, "config_feat", "c", TILE_CONFIG_DIM, "no configs")
    num_configs = config_feat.shape[0]
    runtime = _runtimes(path, arrays, "config_runtime", num_configs, "config_feat")
    normalizers = _runtimes(path, arrays, "config_runtime_normalizers", num_configs, "config_feat")
    if np.any(runtime != 0) and np.any(normalizers == 0):
        row = int(np.argmax(normalizers == 0))
        raise FormatError(path, f"config_runtime_normalizers: 0 in config {row} of a labelled file "
                                "(the target runtime / normalizer would be undefined)")
    return TileGraph(stem, node_feat, opcode, edges, config_feat, runtime, normalizers)


def _build_layout(path: Path, stem: str, arrays: dict[str, np.ndarray]) -> LayoutGraph:
    node_feat, opcode, edges = _common(path, arrays)
    num_nodes = node_feat.shape[0]
    config_ids = _as_int64(arrays["node_config_ids"], path, "node_config_ids")
    _expect_rank(config_ids, 1, path, "node_config_ids", "(nc,)")
    if config_ids.size == 0:
        raise FormatError(path, "node_config_ids: no configurable nodes")
    if config_ids.min() < 0 or config_ids.max() >= num_nodes:
        raise FormatError(path, f"node_config_ids: node id out of range [0, {num_nodes})")
    if np.any(np.diff(config_ids) <= 0):
        raise FormatError(path, "node_config_ids: ids must be strictly ascending")

    runtime = arrays["config_runtime"]
    configs = arrays["node_config_feat"]
    if configs is None:  # structure-only load
        configs = np.empty((0, config_ids.shape[0], LAYOUT_CONFIG_DIM), dtype=np.int8)
        runtime = _runtimes(path, arrays, "config_runtime", runtime.shape[0] if runtime.ndim == 1 else -1,
                            "config_runtime")
    else:
        if configs.shape[1] != config_ids.shape[0]:
            raise FormatError(path, f"node_config_feat: {configs.shape[1]} configurable nodes per config but "
                                    f"node_config_ids lists {config_ids.shape[0]}")
        if configs.shape[0] == 0:
            raise FormatError(path, "node_config_feat: no configs")
        runtime = _runtimes(path, arrays, "config_runtime", configs.shape[0], "node_config_feat")

    splits = _as_int64(arrays["node_splits"], path, "node_splits")
    if splits.ndim == 1:
        splits = splits.reshape(1, -1)
    if splits.ndim != 2 or splits.shape[0] != 1:
        raise FormatError(path, f"node_splits: expected shape (1, s), got {arrays['node_splits'].shape}")
    if splits.size and (splits.min() < 0 or splits.max() > num_nodes or np.any(np.diff(splits[0]) < 0)):
        raise FormatError(path, f"node_splits: expected non-decreasing offsets within [0, {num_nodes}]")
    return LayoutGraph(stem, node_feat, opcode, edges, config_ids, configs, runtime, splits)


# ----------------------------------------------------------------------------- writing


def save_graph(path: Path | str, graph: Graph) -> None:
    """Write ``graph`` in the on-disk format (compressed npz, real dtypes), atomically.

    Layout configs are converted from int8 to float32 chunk by chunk while streaming into the
    archive, so writing a 100k-config graph needs no float32 copy of the array.
    """
    path = Path(path)
    if isinstance(graph, TileGraph):
        members: dict[str, tuple[np.ndarray, np.dtype]] = {
            "node_feat": (graph.node_feat, np.dtype("<f4")),
            "node_opcode": (graph.node_opcode, np.dtype("u1")),
            "edge_index": (graph.edge_index, np.dtype("<i8")),
            "config_feat": (graph.config_feat, np.dtype("<f4")),
            "config_runtime": (graph.config_runtime, np.dtype("<i8")),
            "config_runtime_normalizers": (graph.config_runtime_normalizers, np.dtype("<i8")),
        }
    else:
        members = {
            "node_feat": (graph.node_feat, np.dtype("<f4")),
            "node_opcode": (graph.node_opcode, np.dtype("u1")),
            "edge_index": (graph.edge_index, np.dtype("<i8")),
            "node_config_ids": (graph.node_config_ids, np.dtype("<i8")),
            "node_config_feat": (graph.node_config_feat, np.dtype("<f4")),
            "config_runtime": (graph.config_runtime, np.dtype("<i8")),
            "node_splits": (graph.node_splits, np.dtype("<i8")),
        }
    write_npz_atomic(path, members)


def write_npz_atomic(path: Path, members: dict[str, tuple[np.ndarray, np.dtype]]) -> None:
    """Write arrays (each cast to its dtype in row chunks) as a compressed npz via temp file + rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp_name, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as archive:
            for key, (array, dtype) in members.items():
                array = np.ascontiguousarray(array)
                with archive.open(f"{key}.npy", "w", force_zip64=True) as stream:
                    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                              "shape": array.shape}
                    np.lib.format.write_array_header_1_0(stream, header)
                    row_bytes = max(int(np.prod(array.shape[1:], dtype=np.int64)) * dtype.itemsize, 1)
                    step = max(1, CHUNK_BYTES // row_bytes)
                    for start in range(0, max(array.shape[0] if array.ndim else 1, 1), step):
                        part = array[start : start + step] if array.ndim else array
                        stream.write(part.astype(dtype, copy=False).tobytes())
        chmod_like_new_file(tmp_name)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise

