"""Reader/writer of the npz format: round trips, dtype casts, chunked config reads, and one clear
FormatError per kind of bad file."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from pipelines.data.root import DataRoot
from pipelines.data import tpugraphs
from pipelines.core.collection import LAYOUT_NLP_RANDOM, LAYOUT_XLA_DEFAULT, TILE_XLA
from pipelines.core.errors import FormatError
from pipelines.data.tpugraphs import LayoutGraph, TileGraph, load_graph, save_graph


def _chain_edges(n: int) -> np.ndarray:
    # node u consumes node u-1: rows sorted, u > v
    return np.stack([np.arange(1, n), np.arange(0, n - 1)], axis=1).astype(np.int64)


def make_layout(rng: np.random.Generator, n: int = 12, nc: int = 3, c: int = 40) -> LayoutGraph:
    configs = rng.integers(-1, 6, size=(c, nc, 18)).astype(np.int8)
    configs[:, :, 14:] = -1
    return LayoutGraph(
        stem="resnet50.4x4.fp16",
        node_feat=rng.random((n, 140), dtype=np.float32),
        node_opcode=rng.integers(1, 121, n).astype(np.uint8),
        edge_index=_chain_edges(n),
        node_config_ids=np.sort(rng.choice(n, nc, replace=False)).astype(np.int64),
        node_config_feat=configs,
        config_runtime=rng.integers(2**25, 2**33, c).astype(np.int64),
        node_splits=np.array([[0, n // 2, n]], dtype=np.int64),
    )


def make_tile(rng: np.random.Generator, n: int = 6, c: int = 9) -> TileGraph:
    return TileGraph(
        stem="alexnet_train_batch_32_-1bae27a41d70f4dc",
        node_feat=rng.random((n, 140), dtype=np.float32),
        node_opcode=rng.integers(1, 121, n).astype(np.uint8),
        edge_index=_chain_edges(n),
        config_feat=rng.integers(0, 64, (c, 24)).astype(np.float32),
        config_runtime=rng.integers(2**25, 2**33, c).astype(np.int64),
        config_runtime_normalizers=rng.integers(2**20, 2**22, c).astype(np.int64),
    )


def write_raw(path: Path, arrays: dict[str, np.ndarray], compressed: bool = True) -> Path:
    """Write arrays as a plain np.savez(_compressed) file, bypassing our writer (as the real files were made)."""
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    return path


def layout_arrays(graph: LayoutGraph) -> dict[str, np.ndarray]:
    return {
        "node_feat": graph.node_feat, "node_opcode": graph.node_opcode, "edge_index": graph.edge_index,
        "node_config_ids": graph.node_config_ids,
        "node_config_feat": graph.node_config_feat.astype(np.float32),
        "config_runtime": graph.config_runtime, "node_splits": graph.node_splits,
    }


def tile_arrays(graph: TileGraph) -> dict[str, np.ndarray]:
    return {
        "node_feat": graph.node_feat, "node_opcode": graph.node_opcode, "edge_index": graph.edge_index,
        "config_feat": graph.config_feat, "config_runtime": graph.config_runtime,
        "config_runtime_normalizers": graph.config_runtime_normalizers,
    }


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def test_layout_round_trip_keeps_values_and_casts_configs_to_int8(tmp_path, rng):
    graph = make_layout(rng)
    save_graph(tmp_path / "g.npz", graph)
    on_disk = np.load(tmp_path / "g.npz")
    assert on_disk["node_config_feat"].dtype == np.float32  # the real files' dtype
    assert on_disk["node_opcode"].dtype == np.uint8 and on_disk["config_runtime"].dtype == np.int64
    loaded = load_graph(tmp_path / "g.npz", LAYOUT_XLA_DEFAULT)
    assert loaded.stem == "g"
    assert loaded.node_config_feat.dtype == np.int8
    np.testing.assert_array_equal(loaded.node_config_feat, graph.node_config_feat)
    np.testing.assert_array_equal(loaded.config_runtime, graph.config_runtime)
    assert loaded.config_runtime.dtype == np.int64
    np.testing.assert_array_equal(loaded.node_feat, graph.node_feat)


def test_runtimes_above_float32_precision_stay_distinct(tmp_path, rng):
    graph = make_layout(rng, c=2)
    graph.config_runtime = np.array([2**30 + 1, 2**30 + 2], dtype=np.int64)  # equal as float32
    save_graph(tmp_path / "g.npz", graph)
    loaded = load_graph(tmp_path / "g.npz", LAYOUT_XLA_DEFAULT)
    assert loaded.config_runtime[0] != loaded.config_runtime[1]


def test_chunked_config_read_matches_whole_read(tmp_path, rng, monkeypatch):
    graph = make_layout(rng, nc=5, c=1000)
    path = write_raw(tmp_path / "g.npz", layout_arrays(graph))
    monkeypatch.setattr(tpugraphs, "CHUNK_BYTES", 5 * 18 * 4 * 7)  # 7 configs per chunk, last one partial
    loaded = load_graph(path, LAYOUT_NLP_RANDOM)
    np.testing.assert_array_equal(loaded.node_config_feat, graph.node_config_feat)


def test_reads_uncompressed_archives_and_plain_npz_from_numpy(tmp_path, rng):
    graph = make_tile(rng)
    path = write_raw(tmp_path / "t.npz", tile_arrays(graph), compressed=False)
    loaded = load_graph(path, TILE_XLA)
    np.testing.assert_array_equal(loaded.config_feat, graph.config_feat)
    np.testing.assert_allclose(loaded.target, graph.config_runtime / graph.config_runtime_normalizers)


def test_casts_foreign_dtypes_as_documented(tmp_path, rng):
    graph = make_layout(rng)
    arrays = layout_arrays(graph)
    arrays["node_opcode"] = arrays["node_opcode"].astype(np.int64)
    arrays["node_feat"] = arrays["node_feat"].astype(np.float64)
    arrays["config_runtime"] = arrays["config_runtime"].astype(np.float64)
    loaded = load_graph(write_raw(tmp_path / "g.npz", arrays), LAYOUT_XLA_DEFAULT)
    assert loaded.node_opcode.dtype == np.uint8
    assert loaded.node_feat.dtype == np.float32
    assert loaded.config_runtime.dtype == np.int64


def test_structure_only_load_skips_configs(tmp_path, rng):
    graph = make_layout(rng)
    save_graph(tmp_path / "g.npz", graph)
    loaded = load_graph(tmp_path / "g.npz", LAYOUT_XLA_DEFAULT, with_configs=False)
    assert loaded.node_config_feat.shape == (0, graph.node_config_ids.shape[0], 18)
    np.testing.assert_array_equal(loaded.config_runtime, graph.config_runtime)


LAYOUT_BREAKAGES = {
    "missing key": (lambda a: a.pop("node_splits"), "missing key(s) node_splits"),
    "node_feat columns": (lambda a: a.update(node_feat=a["node_feat"][:, :139]), "node_feat: expected 140 columns"),
    "node_feat rank": (lambda a: a.update(node_feat=a["node_feat"][0]), "node_feat: expected shape"),
    "NaN feature": (lambda a: a["node_feat"].__setitem__((3, 5), np.nan), "node_feat: NaN"),
    "opcode count": (lambda a: a.update(node_opcode=a["node_opcode"][:-1]), "node_opcode: 11 entries for 12 nodes"),
    "edge out of range": (lambda a: a["edge_index"].__setitem__((0, 0), 12), "edge_index: node id out of range"),
    "edge shape": (lambda a: a.update(edge_index=a["edge_index"].T.copy()), "edge_index: expected shape (m, 2)"),
    "config count": (lambda a: a.update(config_runtime=a["config_runtime"][:-1]),
                     "config_runtime: 39 entries but node_config_feat has 40 configs"),
    "nc mismatch": (lambda a: a.update(node_config_ids=a["node_config_ids"][:-1]),
                    "node_config_feat: 3 configurable nodes per config but node_config_ids lists 2"),
    "config value": (lambda a: a["node_config_feat"].__setitem__((1, 0, 0), 9), "values must lie in [-1, 5]"),
    "fractional config": (lambda a: a["node_config_feat"].__setitem__((1, 0, 0), 0.5), "non-integer layout values"),
    "config rank": (lambda a: a.update(node_config_feat=a["node_config_feat"][:, :, :17]),
                    "node_config_feat: expected shape (c, nc, 18)"),
    "negative runtime": (lambda a: a["config_runtime"].__setitem__(2, -5), "config_runtime: negative value"),
    "unsorted config ids": (lambda a: a.update(node_config_ids=a["node_config_ids"][::-1].copy()),
                            "strictly ascending"),
    "splits beyond n": (lambda a: a.update(node_splits=np.array([[0, 99]])), "node_splits"),
    "object array": (lambda a: a.update(node_opcode=np.array([None] * 12, dtype=object)), "object arrays"),
}


@pytest.mark.parametrize("case", sorted(LAYOUT_BREAKAGES))
def test_each_broken_layout_file_raises_one_clear_error(tmp_path, rng, case):
    break_it, expected = LAYOUT_BREAKAGES[case]
    arrays = layout_arrays(make_layout(rng))
    break_it(arrays)
    path = tmp_path / "broken.npz"
    with zipfile.ZipFile(path, "w") as archive:  # like np.savez, but object arrays allowed to be stored
        for key, value in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.asarray(value), allow_pickle=True)
            archive.writestr(f"{key}.npy", buffer.getvalue())
    with pytest.raises(FormatError) as info:
        load_graph(path, LAYOUT_XLA_DEFAULT)
    assert str(path) in str(info.value)
    assert expected in str(info.value)


def test_tile_config_count_mismatch_names_the_file(tmp_path, rng):
    arrays = tile_arrays(make_tile(rng))
    arrays["config_runtime_normalizers"] = arrays["config_runtime_normalizers"][:3]
    path = write_raw(tmp_path / "t.npz", arrays)
    with pytest.raises(FormatError, match="config_runtime_normalizers: 3 entries but config_feat has 9"):
        load_graph(path, TILE_XLA)


def test_layout_file_read_as_tile_is_missing_keys(tmp_path, rng):
    path = write_raw(tmp_path / "g.npz", layout_arrays(make_layout(rng)))
    with pytest.raises(FormatError, match="missing key.*config_feat"):
        load_graph(path, TILE_XLA)


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.95])
def test_truncated_archive_is_reported(tmp_path, rng, cut):
    path = tmp_path / "g.npz"
    save_graph(path, make_layout(rng, c=400))
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(FormatError, match="g.npz"):
        load_graph(path, LAYOUT_XLA_DEFAULT)


def test_flipped_bytes_in_compressed_data_are_reported(tmp_path, rng):
    path = tmp_path / "g.npz"
    save_graph(path, make_layout(rng, c=400))
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 16] = bytes(16)
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="g.npz"):
        load_graph(path, LAYOUT_XLA_DEFAULT)


def test_foreign_and_missing_files(tmp_path):
    text = tmp_path / "notes.npz"
    text.write_text("not an archive")
    with pytest.raises(FormatError, match="corrupt or truncated archive"):
        load_graph(text, TILE_XLA)
    with pytest.raises(FormatError, match="file not found"):
        load_graph(tmp_path / "absent.npz", TILE_XLA)


def test_finds_kaggle_and_plain_roots_and_lists_sorted_stems(tmp_path, rng):
    for root in (tmp_path / "kaggle" / "npz_all" / "npz", tmp_path / "plain" / "npz"):
        directory = root / "tile" / "xla" / "train"
        directory.mkdir(parents=True)
        for stem in ("b_1", "a_2"):
            save_graph(directory / f"{stem}.npz", make_tile(rng))
        (directory / "README.txt").write_text("ignored")
    for data_root in (tmp_path / "kaggle", tmp_path / "plain"):
        refs = DataRoot(data_root).graphs(TILE_XLA, "train")
        assert [r.stem for r in refs] == ["a_2", "b_1"]
        assert refs[0].submission_id == "tile:xla:a_2"
        assert DataRoot(data_root).collections() == [TILE_XLA]
    with pytest.raises(FormatError, match="missing directory for tile:xla valid"):
        DataRoot(tmp_path / "kaggle").graphs(TILE_XLA, "valid")
    with pytest.raises(FormatError, match="no TpuGraphs data here"):
        DataRoot(tmp_path).npz


def test_a_data_root_says_where_writers_put_files_and_is_a_path(tmp_path):
    """Writers (synth: the Kaggle layout; rank and records: the plain one) and readers ask one object
    where a split lives; the folders a writer is told are the ones the reader then lists."""
    import os

    from pipelines.core.collection import parse_collection

    layout = parse_collection("layout:nlp:random")
    kaggle, plain = DataRoot(tmp_path / "k"), DataRoot(tmp_path / "p")
    assert kaggle.new_split_dir(layout, "valid") == tmp_path / "k/npz_all/npz/layout/nlp/random/valid"
    assert plain.new_split_dir(layout, "test", kaggle=False) == tmp_path / "p/npz/layout/nlp/random/test"
    for root, kaggle_layout in ((kaggle, True), (plain, False)):
        root.new_split_dir(layout, "train", kaggle=kaggle_layout).mkdir(parents=True)
        assert root.split_dir(layout, "train") == root.new_split_dir(layout, "train", kaggle=kaggle_layout)
        assert root.collections() == [layout]
    assert os.fspath(kaggle) == str(tmp_path / "k") and Path(kaggle) == tmp_path / "k"
    assert DataRoot(kaggle) == kaggle and kaggle.sample_submission == tmp_path / "k/sample_submission.csv"
    with pytest.raises(FormatError, match="data root does not exist"):
        DataRoot(tmp_path / "nowhere").collections()
    with pytest.raises(ValueError, match="unknown split"):
        kaggle.new_split_dir(layout, "dev")
    assert kaggle.defaults() == {}  # the Kaggle data marks no default
    (tmp_path / "k/labels").mkdir()
    (tmp_path / "k/labels/defaults.json").write_text('{"layout:nlp:random": {"g": 3}}')
    assert kaggle.defaults() == {"layout:nlp:random": {"g": 3}}
    (tmp_path / "k/defaults.json").write_text('{"layout:nlp:random": {"g": -1}}')  # the root's own file first
    with pytest.raises(FormatError, match="defaults.json: expected"):
        kaggle.defaults()


@pytest.mark.parametrize("case,break_it,expected", [
    ("self-loop", lambda a: a["edge_index"].__setitem__((3, 1), 4), "no self-loops or cycles"),
    ("cycle", lambda a: a.update(edge_index=np.concatenate([a["edge_index"], [[2, 7]]])), "u > v"),
    ("zero runtime", lambda a: a["config_runtime"].__setitem__(5, 0), "config_runtime: 0 in config 5 of a train"),
    ("all-zero runtimes", lambda a: a["config_runtime"].__setitem__(slice(None), 0), "config_runtime: 0 in config 0"),
    ("boolean runtimes", lambda a: a.update(config_runtime=a["config_runtime"] > 2**30), "got booleans"),
])
@pytest.mark.parametrize("kind", ["tile", "layout"])
def test_graph_and_runtime_rules_are_checked_by_the_reader_naming_the_file(tmp_path, rng, case, break_it,
                                                                           expected, kind):
    """Issue 71: these were accepted (trained on, or crashed a later stage without naming the file)."""
    arrays = tile_arrays(make_tile(rng, n=12)) if kind == "tile" else layout_arrays(make_layout(rng))
    break_it(arrays)
    (tmp_path / "train").mkdir()
    path = write_raw(tmp_path / "train" / "g.npz", arrays)
    with pytest.raises(FormatError, match=expected) as info:
        load_graph(path, TILE_XLA if kind == "tile" else LAYOUT_XLA_DEFAULT)
    assert str(path) in str(info.value)
    test_file = arrays | {"config_runtime": np.zeros_like(arrays["config_runtime"], dtype=np.int64)}
    if "runtime" in case:  # the same runtimes are what a test file holds: all zero is right there
        (tmp_path / "test").mkdir()
        assert not load_graph(write_raw(tmp_path / "test" / "g.npz", test_file),
                              TILE_XLA if kind == "tile" else LAYOUT_XLA_DEFAULT).has_labels
