"""Fuzz the reader: randomly mutated npz files either load as a valid graph or raise FormatError.

Never anything else (no IndexError, MemoryError, zipfile.BadZipFile, ...). Mutations: wrong dtypes,
wrong shapes, NaN/inf, negative runtimes, empty arrays, dropped keys, truncation and byte flips.
"""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from pipelines.core.collection import LAYOUT_XLA_RANDOM, TILE_XLA
from pipelines.core.errors import FormatError
from pipelines.data.tpugraphs import LayoutGraph, TileGraph, load_graph
from tests.test_tpugraphs import layout_arrays, make_layout, make_tile, tile_arrays

DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint64,
          np.bool_, np.complex64, "U3"]


def _mutate(arrays: dict[str, np.ndarray], rng: np.random.Generator) -> None:
    key = rng.choice(sorted(arrays))
    value = np.asarray(arrays[key])
    kind = rng.integers(0, 9)
    if kind == 0:
        arrays.pop(key)
    elif kind == 1:
        dtype = DTYPES[rng.integers(len(DTYPES))]
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                arrays[key] = value.astype(dtype)
        except (ValueError, TypeError, OverflowError):
            arrays[key] = np.zeros(value.shape, dtype=dtype)
    elif kind == 2 and value.size:
        flat = value.astype(np.float64).reshape(-1)
        flat[rng.integers(flat.size)] = rng.choice([np.nan, np.inf, -np.inf])
        arrays[key] = flat.reshape(value.shape)
    elif kind == 3 and value.size:
        flat = value.astype(np.int64).reshape(-1)
        flat[rng.integers(flat.size)] = rng.choice([-1, -(2**40), 2**40, 127, 255, 256])
        arrays[key] = flat.reshape(value.shape)
    elif kind == 4:
        arrays[key] = value.reshape(-1)[: rng.integers(0, max(value.size, 1))]
    elif kind == 5:
        arrays[key] = np.zeros((0,) + value.shape[1:], dtype=value.dtype)
    elif kind == 6 and value.ndim >= 1:
        arrays[key] = np.expand_dims(value, axis=int(rng.integers(0, value.ndim + 1)))
    elif kind == 7 and value.ndim >= 2:
        arrays[key] = np.ascontiguousarray(np.swapaxes(value, 0, 1))
    else:
        arrays[key] = np.asfortranarray(value) if value.ndim >= 2 else value[::-1].copy()


def _write(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def _check_valid(graph) -> None:
    n = graph.node_feat.shape[0]
    assert graph.node_feat.dtype == np.float32 and graph.node_feat.shape == (n, 140)
    assert np.isfinite(graph.node_feat).all()
    assert graph.node_opcode.dtype == np.uint8 and graph.node_opcode.shape == (n,)
    assert graph.edge_index.dtype == np.int64 and graph.edge_index.shape[1] == 2
    assert graph.edge_index.size == 0 or (0 <= graph.edge_index.min() and graph.edge_index.max() < n)
    assert graph.config_runtime.dtype == np.int64 and (graph.config_runtime >= 0).all()
    if isinstance(graph, LayoutGraph):
        c, nc, width = graph.node_config_feat.shape
        assert graph.node_config_feat.dtype == np.int8 and width == 18
        assert nc == graph.node_config_ids.shape[0] and graph.config_runtime.shape == (c,)
        assert graph.node_config_feat.min() >= -1 and graph.node_config_feat.max() <= 5
    else:
        assert isinstance(graph, TileGraph)
        c = graph.config_feat.shape[0]
        assert graph.config_feat.shape == (c, 24) and graph.config_runtime_normalizers.shape == (c,)


@pytest.mark.parametrize("collection", [TILE_XLA, LAYOUT_XLA_RANDOM], ids=str)
def test_mutated_files_load_validly_or_raise_format_error(tmp_path, collection):
    rng = np.random.default_rng(2024)
    outcomes = {"loaded": 0, "format_error": 0}
    for trial in range(150):
        base = make_tile(rng) if collection.is_tile else make_layout(rng, c=20)
        arrays = tile_arrays(base) if collection.is_tile else layout_arrays(base)
        for _ in range(rng.integers(1, 3)):
            _mutate(arrays, rng)
        data = _write(arrays)
        if rng.random() < 0.25:  # damage the archive bytes too
            if rng.random() < 0.5:
                data = data[: rng.integers(0, len(data))]
            else:
                data = bytearray(data)
                position = rng.integers(0, len(data))
                data[position] ^= 0xFF
                data = bytes(data)
        path = tmp_path / f"fuzz{trial}.npz"
        path.write_bytes(data)
        try:
            graph = load_graph(path, collection)
        except FormatError as exc:
            assert str(path) in str(exc)
            outcomes["format_error"] += 1
            continue
        _check_valid(graph)
        outcomes["loaded"] += 1
    # both outcomes must occur, or the fuzzer is not exercising the reader
    assert outcomes["loaded"] > 5 and outcomes["format_error"] > 50, outcomes


def test_zip_member_with_flipped_bit_fails_crc(tmp_path):
    rng = np.random.default_rng(3)
    arrays = tile_arrays(make_tile(rng))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for key, value in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, value)
            archive.writestr(f"{key}.npy", member.getvalue())
    data = bytearray(buffer.getvalue())
    # flip a bit inside the stored config_feat payload (uncompressed, so the CRC is the only guard)
    start = data.find(b"config_feat.npy") + 200
    data[start] ^= 0x01
    path = tmp_path / "crc.npz"
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="crc.npz"):
        load_graph(path, TILE_XLA)
