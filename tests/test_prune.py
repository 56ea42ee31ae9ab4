"""Pruning keeps exactly the k-hop set with correct relabelling; de-duplication on hand cases."""

from __future__ import annotations

import json
import zlib
from collections import deque
from dataclasses import replace

import numpy as np
import pytest

from pipelines.core.engine import StageOutput
from pipelines.core.errors import ConfigError, FormatError
from pipelines.data.prune import (
    configs_path,
    configs_storage,
    deduplicate_configs,
    deduplicate_graph,
    load_file_target,
    load_pruned,
    prune_config,
    prune_layout_graph,
    read_file_target,
    read_pruned,
    sample_configs,
    save_pruned,
    tile_as_pruned,
)
from pipelines.data.tpugraphs import LayoutGraph, TileGraph


def random_layout_graph(rng: np.random.Generator, n: int = 14, configs: int = 6) -> LayoutGraph:
    """A random DAG in the file convention (rows [u, v], u > v, sorted) with random configurable nodes."""
    pairs = {(int(u), int(v)) for u in range(1, n) for v in range(u) if rng.random() < 0.15}
    edges = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)
    config_ids = np.sort(rng.choice(n, size=int(rng.integers(1, 4)), replace=False)).astype(np.int64)
    node_feat = rng.normal(size=(n, 140)).astype(np.float32)
    node_feat[:, 0] = np.arange(n)  # a column that identifies each node
    return LayoutGraph(
        stem="g", node_feat=node_feat, node_opcode=rng.integers(1, 120, n).astype(np.uint8), edge_index=edges,
        node_config_ids=config_ids,
        node_config_feat=rng.integers(-1, 6, (configs, config_ids.size, 18)).astype(np.int8),
        config_runtime=rng.integers(1, 10**9, configs), node_splits=np.array([[0, n]]),
    )


def brute_force_khop(n: int, edges: np.ndarray, seeds: np.ndarray, hops: int) -> set[int]:
    neighbours: dict[int, set[int]] = {i: set() for i in range(n)}
    for u, v in edges:
        neighbours[int(u)].add(int(v))
        neighbours[int(v)].add(int(u))
    depth = {int(s): 0 for s in seeds}
    queue = deque(depth)
    while queue:
        node = queue.popleft()
        if depth[node] == hops:
            continue
        for nxt in neighbours[node]:
            if nxt not in depth:
                depth[nxt] = depth[node] + 1
                queue.append(nxt)
    return set(depth)


@pytest.mark.parametrize("hops", [0, 1, 2, 3])
def test_khop_matches_brute_force_bfs_and_relabels_edges(hops: int) -> None:
    rng = np.random.default_rng(hops)
    for _ in range(25):
        graph = random_layout_graph(rng)
        pruned, stats = prune_layout_graph(graph, hops, "khop")
        expected = brute_force_khop(graph.num_nodes, graph.edge_index, graph.node_config_ids, hops)
        assert set(pruned.node_ids.tolist()) == expected
        assert np.all(np.diff(pruned.node_ids) > 0)  # original order kept
        # edges: exactly the original edges with both ends kept, mapped back through node_ids
        back = {tuple(e) for e in pruned.node_ids[pruned.edge_index].tolist()}
        want = {(int(u), int(v)) for u, v in graph.edge_index if u in expected and v in expected}
        assert back == want and len(back) == pruned.edge_index.shape[0]
        assert np.all(pruned.edge_index[:, 0] > pruned.edge_index[:, 1])
        np.testing.assert_array_equal(pruned.node_ids[pruned.config_nodes], graph.node_config_ids)
        np.testing.assert_array_equal(pruned.node_feat, graph.node_feat[pruned.node_ids])
        np.testing.assert_array_equal(pruned.node_opcode, graph.node_opcode[pruned.node_ids])
        assert stats.as_dict() == {"nodes_before": graph.num_nodes, "nodes_after": len(expected),
                                   "edges_before": graph.edge_index.shape[0], "edges_after": len(want)}


def test_config_only_is_hops_zero() -> None:
    graph = random_layout_graph(np.random.default_rng(7))
    only, _ = prune_layout_graph(graph, 3, "config_only")
    zero, _ = prune_layout_graph(graph, 0, "khop")
    np.testing.assert_array_equal(only.node_ids, graph.node_config_ids)
    np.testing.assert_array_equal(zero.node_ids, graph.node_config_ids)
    np.testing.assert_array_equal(only.config_nodes, np.arange(graph.node_config_ids.size))


def test_chain_by_hand() -> None:
    # 0 -> 1 -> 2 -> 3 -> 4 (producer -> consumer); node 2 configurable; file rows [consumer, producer]
    edges = np.array([[1, 0], [2, 1], [3, 2], [4, 3]], dtype=np.int64)
    graph = LayoutGraph("chain", np.zeros((5, 140), np.float32), np.arange(5, dtype=np.uint8), edges,
                        np.array([2]), np.zeros((2, 1, 18), np.int8), np.array([5, 6]), np.array([[0, 5]]))
    pruned, _ = prune_layout_graph(graph, 1, "khop")
    np.testing.assert_array_equal(pruned.node_ids, [1, 2, 3])
    np.testing.assert_array_equal(pruned.edge_index, [[1, 0], [2, 1]])
    np.testing.assert_array_equal(pruned.config_nodes, [1])
    np.testing.assert_array_equal(pruned.node_opcode, [1, 2, 3])


def test_bad_mode_and_hops_raise_config_error() -> None:
    graph = random_layout_graph(np.random.default_rng(1))
    with pytest.raises(ConfigError, match="prune.mode"):
        prune_layout_graph(graph, 1, "everything")
    with pytest.raises(ConfigError, match="hops"):
        prune_layout_graph(graph, -1, "khop")
    with pytest.raises(ConfigError, match="dedup"):
        deduplicate_configs(np.zeros((2, 3), np.int8), np.zeros(2), "max")


ROWS = np.array([[1, 2], [3, 4], [1, 2], [5, 6], [3, 4], [1, 2]], dtype=np.int8)
RUNTIMES = np.array([10, 20, 40, 7, 2, 1], dtype=np.int64)


@pytest.mark.parametrize(
    ("how", "kept", "runtimes"),
    [
        ("first", [0, 1, 3], [10, 20, 7]),
        ("mean", [0, 1, 3], [17, 11, 7]),
        ("min", [0, 1, 3], [1, 2, 7]),
        ("none", [0, 1, 2, 3, 4, 5], [10, 20, 40, 7, 2, 1]),
    ],
)
def test_deduplicate_by_hand(how: str, kept: list[int], runtimes: list[float]) -> None:
    rows, values = deduplicate_configs(ROWS, RUNTIMES, how)
    assert rows.dtype == np.int64 and values.dtype == np.float64
    np.testing.assert_array_equal(rows, kept)
    np.testing.assert_allclose(values, runtimes)


def test_deduplicate_3d_layout_and_float_tile_rows() -> None:
    configs = np.zeros((4, 2, 18), dtype=np.int8)
    configs[1, 1, 17] = 1  # differs from row 0 in its very last value only
    configs[3] = configs[1]
    rows, values = deduplicate_configs(configs, np.array([1.0, 2.0, 3.0, 4.0]), "mean")
    np.testing.assert_array_equal(rows, [0, 1])
    np.testing.assert_allclose(values, [2.0, 3.0])
    tile = np.array([[1.5, 2.0], [1.5, 2.0], [0.5, 2.0]], dtype=np.float32)
    rows, values = deduplicate_configs(tile, np.array([3.0, 1.0, 2.0]), "min")
    np.testing.assert_array_equal(rows, [0, 2])
    np.testing.assert_allclose(values, [1.0, 2.0])


def test_deduplicate_graph_keeps_file_rows_and_file_targets() -> None:
    graph = random_layout_graph(np.random.default_rng(3), configs=5)
    graph.node_config_feat[3] = graph.node_config_feat[1]
    pruned, _ = prune_layout_graph(graph, 1, "khop")
    deduped = deduplicate_graph(pruned, "mean")
    np.testing.assert_array_equal(deduped.config_index, [0, 1, 2, 4])
    assert deduped.target[1] == pytest.approx((graph.config_runtime[1] + graph.config_runtime[3]) / 2)
    np.testing.assert_array_equal(deduped.config_feat, graph.node_config_feat[[0, 1, 2, 4]])
    np.testing.assert_array_equal(deduped.file_target, graph.config_runtime.astype(np.float64))


def test_sample_configs_is_seeded_sorted_and_capped() -> None:
    graph = tile_as_pruned(TileGraph("t", np.zeros((2, 140), np.float32), np.zeros(2, np.uint8),
                                     np.array([[1, 0]]), np.arange(240, dtype=np.float32).reshape(10, 24),
                                     np.arange(1, 11), np.full(10, 2)))
    a = sample_configs(graph, 4, np.random.default_rng(5))
    b = sample_configs(graph, 4, np.random.default_rng(5))
    assert a.num_configs == 4 and np.all(np.diff(a.config_index) > 0)
    np.testing.assert_array_equal(a.config_index, b.config_index)
    np.testing.assert_allclose(a.target, (a.config_index + 1) / 2)
    assert sample_configs(graph, 10, np.random.default_rng(5)) is graph


def test_save_load_round_trip(tmp_path) -> None:
    graph = random_layout_graph(np.random.default_rng(4))
    pruned, _ = prune_layout_graph(graph, 2, "khop")
    save_pruned(tmp_path / "g.pruned", pruned)
    back = load_pruned(tmp_path / "g.pruned")
    assert (back.stem, back.kind) == ("g", "layout")
    for name in ("node_feat", "node_opcode", "edge_index", "node_ids", "config_nodes", "config_feat",
                 "config_index", "target", "file_target"):
        np.testing.assert_array_equal(getattr(back, name), getattr(pruned, name))
        assert getattr(back, name).dtype == getattr(pruned, name).dtype
    np.testing.assert_array_equal(load_file_target(tmp_path / "g.pruned"), pruned.file_target)
    # the configs are a plain .npy beside the graph file, memory-mapped read-only (no private copy)
    assert configs_path(tmp_path / "g.pruned") == tmp_path / "g.configs.npy"
    assert isinstance(back.config_feat, np.memmap) and not back.config_feat.flags.writeable


def test_tile_round_trip_with_deduplicated_and_no_configs(tmp_path) -> None:
    graph = tile_as_pruned(TileGraph("t", np.ones((3, 140), np.float32), np.arange(3, dtype=np.uint8),
                                     np.array([[1, 0], [2, 1]]), np.repeat(np.arange(24.0, dtype=np.float32)[None], 4, 0),
                                     np.arange(1, 5), np.full(4, 2)))
    for case in (deduplicate_graph(graph, "first"), replace(graph, config_feat=graph.config_feat[:0],
                                                              config_index=graph.config_index[:0],
                                                              target=graph.target[:0])):
        save_pruned(tmp_path / "t.pruned", case)
        assert [p.name for p in tmp_path.iterdir()] == ["t.pruned"]  # tile configs live in the graph file
        back = load_pruned(tmp_path / "t.pruned")
        assert (back.stem, back.kind, back.config_feat.dtype) == ("t", "tile", np.float32)
        for name in ("node_feat", "edge_index", "config_feat", "config_index", "target", "file_target"):
            np.testing.assert_array_equal(getattr(back, name), getattr(case, name))


def _damaged(tmp_path, damage) -> FormatError:
    pruned, _ = prune_layout_graph(random_layout_graph(np.random.default_rng(4), configs=40), 1, "khop")
    save_pruned(tmp_path / "g.pruned", pruned)
    damage(tmp_path / "g.pruned", tmp_path / "g.configs.npy")
    with pytest.raises(FormatError) as raised:
        load_pruned(tmp_path / "g.pruned")
    return raised.value


def _cut(path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _flip(path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


def test_a_truncated_or_corrupt_graph_file_is_a_format_error_naming_it(tmp_path) -> None:
    size = lambda graph: graph.stat().st_size  # noqa: E731
    flips = [lambda graph, npy, at=at: _flip(graph, int(size(graph) * at) if at < 1 else at)
             for at in (3, 9, 20, 0.1, 0.3, 0.5, 0.7)]  # magic, header length, header, arrays
    cuts = [lambda graph, npy, keep=keep: _cut(graph, keep) for keep in (0.005, 0.05, 0.6, 0.99)]
    for damage in [*cuts, *flips, lambda graph, npy: graph.write_bytes(b"not a pruned graph"),
                   lambda graph, npy: graph.write_bytes(graph.read_bytes() + b"\0")]:
        error = _damaged(tmp_path, damage)
        assert error.path == tmp_path / "g.pruned" and "cannot read pruned graph" in error.problem


def test_a_missing_truncated_corrupt_or_foreign_configs_file_is_a_format_error_naming_it(tmp_path) -> None:
    other, _ = prune_layout_graph(random_layout_graph(np.random.default_rng(5), configs=7), 1, "khop")
    save_pruned(tmp_path / "other.pruned", other)
    cases = {
        "cannot read pruned configs": [lambda graph, npy: npy.unlink(), lambda graph, npy: _cut(npy, 0.9),
                                       lambda graph, npy: npy.write_bytes(b"\x93NUMPY garbage"),
                                       lambda graph, npy: _flip(npy, 40)],  # inside the header's dict
        "do not match their CRC-32": [lambda graph, npy: _flip(npy, npy.stat().st_size - 5)],  # one config value
        "expected int8": [lambda graph, npy: npy.write_bytes((tmp_path / "other.configs.npy").read_bytes())],
    }
    for problem, damages in cases.items():
        for damage in damages:
            error = _damaged(tmp_path, damage)
            assert error.path == tmp_path / "g.configs.npy" and problem in error.problem, error


def test_hash_collisions_fall_back_to_exact_grouping(monkeypatch) -> None:
    monkeypatch.setattr("pipelines.data.prune._row_hashes", lambda data: np.zeros(data.shape[0], dtype=np.uint64))
    rows, values = deduplicate_configs(ROWS, RUNTIMES, "mean")
    np.testing.assert_array_equal(rows, [0, 1, 3])
    np.testing.assert_allclose(values, [17, 11, 7])


def test_chunked_hashing_and_checks_agree(monkeypatch) -> None:
    rng = np.random.default_rng(9)
    configs = rng.integers(-1, 2, size=(200, 3, 18)).astype(np.int8)[rng.integers(0, 40, 200)]
    expected = deduplicate_configs(configs, np.arange(200.0), "min")
    monkeypatch.setattr("pipelines.data.prune.CHUNK_CELLS", 60)  # one row per chunk
    rows, values = deduplicate_configs(configs, np.arange(200.0), "min")
    np.testing.assert_array_equal(rows, expected[0])
    np.testing.assert_array_equal(values, expected[1])
    np.testing.assert_array_equal(values, rows)  # the minimum of each group is its first row's index
    assert len({configs[i].tobytes() for i in range(200)}) == rows.size


def test_configs_that_compress_well_are_stored_with_zstd_and_read_back_the_same(tmp_path) -> None:
    graph = random_layout_graph(np.random.default_rng(6), n=30, configs=500)
    graph.node_config_feat[:] = -1  # mostly "the compiler chooses", as in default-search files
    graph.node_config_feat[::50, 0, :2] = (0, 1)
    pruned, _ = prune_layout_graph(graph, 1, "khop")
    assert configs_storage(pruned.config_feat) == "zst"
    save_pruned(tmp_path / "g.pruned", pruned)
    assert configs_path(tmp_path / "g.pruned", "zst").is_file() and not configs_path(tmp_path / "g.pruned").exists()
    back = load_pruned(tmp_path / "g.pruned")
    np.testing.assert_array_equal(back.config_feat, pruned.config_feat)
    assert back.config_feat.dtype == np.int8 and not back.config_feat.flags.writeable

    zst = configs_path(tmp_path / "g.pruned", "zst")
    good = zst.read_bytes()
    for damaged in (good[: len(good) // 2], good[:-1], b"garbage", good[:20] + bytes([good[20] ^ 0x40]) + good[21:],
                    good[:-3] + bytes([good[-3] ^ 0x01]) + good[-2:]):
        zst.write_bytes(damaged)
        with pytest.raises(FormatError) as raised:
            load_pruned(tmp_path / "g.pruned")
        assert raised.value.path == zst and "pruned configs" in raised.value.problem


def test_random_configs_stay_plain() -> None:
    configs = np.random.default_rng(0).integers(-1, 6, (300, 20, 18)).astype(np.int8)
    assert configs_storage(configs) == "npy" and configs_storage(configs[:0]) == "npy"


def test_compress_configs_always_stores_random_configs_with_zstd_and_reads_them_back(tmp_path) -> None:
    configs = np.random.default_rng(0).integers(-1, 6, (300, 20, 18)).astype(np.int8)
    assert configs_storage(configs, "always") == "zst"
    pruned, _ = prune_layout_graph(random_layout_graph(np.random.default_rng(7), n=30, configs=400), 1, "khop")
    save_pruned(tmp_path / "g.pruned", pruned, "always")
    assert configs_path(tmp_path / "g.pruned", "zst").is_file() and not configs_path(tmp_path / "g.pruned").exists()
    np.testing.assert_array_equal(load_pruned(tmp_path / "g.pruned").config_feat, pruned.config_feat)


def test_compress_configs_is_part_of_the_layout_prune_key_only() -> None:
    from pipelines.core.collection import parse_collection
    from pipelines.config.settings import load_config

    for name in ("tile:xla", "layout:xla:random"):
        collection = parse_collection(name)
        auto = prune_config(load_config(None), collection)
        always = prune_config(load_config(None, ["prune.compress_configs=\"always\""]), collection)
        if collection.is_tile:  # tile configs live in the graph file whatever the option: one key
            assert auto == always and "compress_configs" not in always
        else:
            assert auto != always and always["compress_configs"] == "always"  # two storages, two stage keys


def _save_legacy_npz(folder, graph) -> None:
    """A prune output file as the code before the .pruned format wrote it: an npz with ``meta`` and the arrays,
    the configs in a plain .npy beside it."""
    configs = np.ascontiguousarray(graph.config_feat)
    np.save(folder / f"{graph.stem}.configs.npy", configs)
    arrays = {name: getattr(graph, name) for name in ("node_feat", "node_opcode", "edge_index", "node_ids",
                                                       "config_nodes", "config_index", "target", "file_target")}
    np.savez_compressed(folder / f"{graph.stem}.npz", meta=np.array([graph.stem, graph.kind,
                                                                     f"{zlib.crc32(configs):08x}", "npy"]), **arrays)


def test_prune_outputs_of_the_earlier_npz_format_are_still_read(tmp_path) -> None:
    """Runs made before the .pruned format keep their prune outputs; analysis of them reads those."""
    layout, _ = prune_layout_graph(random_layout_graph(np.random.default_rng(4)), 2, "khop")
    tile = tile_as_pruned(TileGraph("t", np.ones((3, 140), np.float32), np.arange(3, dtype=np.uint8),
                                    np.array([[1, 0], [2, 1]]), np.arange(48.0, dtype=np.float32).reshape(2, 24),
                                    np.arange(1, 3), np.full(2, 2)))
    (tmp_path / "train").mkdir()
    output = StageOutput("prune", "k", tmp_path, {})
    for graph in (replace(layout, stem="g"), tile):
        _save_legacy_npz(tmp_path / "train", graph)
        back = read_pruned(output, "train", graph.stem)
        assert (back.stem, back.kind) == (graph.stem, graph.kind)
        for name in ("node_feat", "edge_index", "config_nodes", "config_feat", "config_index", "target"):
            np.testing.assert_array_equal(getattr(back, name), getattr(graph, name))
        np.testing.assert_array_equal(read_file_target(output, "train", graph.stem), graph.file_target)
    save_pruned(tmp_path / "train" / "g.pruned", replace(layout, stem="g", target=layout.target + 1))
    assert read_pruned(output, "train", "g").target[0] == layout.target[0] + 1  # the .pruned file wins
    (tmp_path / "train" / "t.configs.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(FormatError, match="cannot read pruned configs"):
        read_pruned(output, "train", "t")


def _rewrite_header(path, edit) -> None:
    """Apply ``edit`` to the JSON header of a .pruned file, keeping its arrays (and a valid header CRC)."""
    raw = path.read_bytes()
    size = int.from_bytes(raw[8:12], "little")
    header = json.loads(raw[16:16 + size])
    edit(header)
    new = json.dumps(header).encode()
    path.write_bytes(raw[:8] + len(new).to_bytes(4, "little") + zlib.crc32(new).to_bytes(4, "little") + new
                     + raw[16 + size:])


def test_a_graph_file_whose_header_disagrees_with_its_arrays_is_a_format_error(tmp_path) -> None:
    layout, _ = prune_layout_graph(random_layout_graph(np.random.default_rng(4)), 1, "khop")
    edits = {
        "a 'tile' graph with configs": lambda h: h.update(kind="tile", configs={"storage": "inline", "crc32": ""}),
        "array node_feat holds": lambda h: h["arrays"][0][2].__setitem__(0, h["arrays"][0][2][0] + 1),
        "no array file_target": lambda h: h["arrays"][-1].__setitem__(0, "other"),
    }
    for problem, edit in edits.items():
        save_pruned(tmp_path / "g.pruned", layout)
        _rewrite_header(tmp_path / "g.pruned", edit)
        with pytest.raises(FormatError, match=problem) as raised:
            load_pruned(tmp_path / "g.pruned")
        assert raised.value.path == tmp_path / "g.pruned"
