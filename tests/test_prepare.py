"""The preparation stages end to end on a tiny hand-built world: outputs, reuse, and new keys."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipelines.cli import main
from pipelines.core.collection import LAYOUT_XLA_DEFAULT, TILE_XLA
from pipelines.config.settings import load_config
from pipelines.data.node_arrays import NODE_FEATURE_DIM
from pipelines.flows.prepare import prepare
from pipelines.data.tpugraphs import LayoutGraph, TileGraph, save_graph

LAYOUT_STEMS = {
    "train": ["resnet50.4x4.fp16", "resnet50.2x2.fp32", "unet_3d.4x4.bf16", "inception_v3_batch_128_train"],
    "valid": ["mlperf_bert_batch_24_2x2"],
    "test": ["0123456789abcdef0123456789abcdef"],
}
TILE_STEMS = {
    "train": ["alexnet_train_batch_32_-1bae27a41d70f4dc", "alexnet_train_batch_64_3a5e27a41d70f4dc",
              "resnet_v1_50_official_batch_128_bf16_5c1e9f0a2b3c4d5e"],
    "valid": ["inception_v3_batch_8_train_7d4b5c1e9f0a2b3c"],
    "test": ["fedcba9876543210fedcba9876543210"],
}
DUPLICATES = 3  # config rows of each labelled layout graph that repeat an earlier row


def layout_graph(rng: np.random.Generator, stem: str, labelled: bool) -> LayoutGraph:
    n = 24
    node_feat = np.zeros((n, 140), dtype=np.float32)
    node_feat[:, 13] = 1  # f32
    dims = rng.integers(1, 300, size=(n, 2))
    node_feat[:, 21:23] = dims
    node_feat[:, 27] = dims.sum(axis=1)
    node_feat[:, 28] = dims.prod(axis=1)
    node_feat[:, 134:136] = (1, 0)
    opcode = rng.integers(1, 100, n).astype(np.uint8)
    config_ids = np.array([5, 11, 17])
    opcode[config_ids] = (26, 34, 75)
    edges = np.array(sorted({(u, int(rng.integers(0, u))) for u in range(1, n)} | {(u, u - 1) for u in range(1, n)}))
    configs = rng.integers(-1, 2, size=(12, 3, 18)).astype(np.int8)
    configs[:, :, 2:] = -1
    configs[-DUPLICATES:] = configs[:DUPLICATES]
    runtime = rng.integers(10**6, 10**9, 12) if labelled else np.zeros(12, dtype=np.int64)
    return LayoutGraph(stem, node_feat, opcode, edges, config_ids, configs, runtime, np.array([[0, n]]))


def tile_graph(rng: np.random.Generator, stem: str, labelled: bool) -> TileGraph:
    n = 5
    node_feat = np.zeros((n, 140), dtype=np.float32)
    node_feat[:, 21:23] = rng.integers(1, 500, size=(n, 2))
    node_feat[:, 28] = node_feat[:, 21] * node_feat[:, 22]
    node_feat[-1, 0] = 1
    edges = np.array([[u, u - 1] for u in range(1, n)])
    config = rng.integers(0, 9, size=(8, 24)).astype(np.float32)
    config[-1] = config[0]
    runtime = rng.integers(100, 10**6, 8) if labelled else np.zeros(8, dtype=np.int64)
    normalizers = rng.integers(1, 5, 8) if labelled else np.ones(8, dtype=np.int64)
    return TileGraph(stem, node_feat, rng.integers(1, 100, n).astype(np.uint8), edges, config, runtime, normalizers)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("world")
    rng = np.random.default_rng(0)
    for collection, stems, make in ((LAYOUT_XLA_DEFAULT, LAYOUT_STEMS, layout_graph), (TILE_XLA, TILE_STEMS, tile_graph)):
        for split, names in stems.items():
            directory = root / "npz_all" / "npz" / collection.relative_dir / split
            directory.mkdir(parents=True)
            for stem in names:
                save_graph(directory / f"{stem}.npz", make(rng, stem, split != "test"))
    return root


@pytest.fixture(scope="module")
def quick():
    return load_config(None, ["folds.k=2", "features.max_configs_per_graph=7"])


def test_prepare_end_to_end_and_cache(world: Path, tmp_path: Path, quick) -> None:
    work = tmp_path / "work"
    first = prepare(quick, world, work, ["layout:xla:default", "tile:xla"])
    layout, tile = first["layout:xla:default"], first["tile:xla"]
    assert set(layout.stages) == {"prune", "features", "node_arrays", "folds"}
    assert not any(layout.cached.values())
    assert layout.graphs("train") == sorted(LAYOUT_STEMS["train"])
    assert layout.graphs("test") == LAYOUT_STEMS["test"]

    # prune: 12 configs per layout graph, DUPLICATES of them repeated, removed from labelled graphs only
    graphs = layout.graph_table
    assert graphs.filter(pl.col("split") != "test")["configs_after"].to_list() == [12 - DUPLICATES] * 5
    assert graphs.filter(pl.col("split") == "test")["configs_after"].to_list() == [12]
    assert (graphs["nodes_after"] <= graphs["nodes_before"]).all()
    assert layout.stages["prune"].metrics["configs_removed_by_dedup"] == 5 * DUPLICATES

    # features: capped at 7 for labelled graphs, never for test; schema; graph aggregates joined
    stem = LAYOUT_STEMS["train"][0]
    features = layout.load_features([stem, LAYOUT_STEMS["test"][0]])
    assert features.filter(pl.col("graph") == stem).height == 7
    assert features.filter(pl.col("graph") == LAYOUT_STEMS["test"][0]).height == 12
    assert features.columns[:3] == ["graph", "config_index", "target"]
    assert any(c.startswith("f_freq") for c in features.columns)  # default search
    assert any(c.startswith("g_") for c in features.columns) and features["g_num_nodes"].null_count() == 0
    raw_runtime = layout.runtimes(stem)
    assert raw_runtime.dtype == np.float64 and raw_runtime.shape == (12,)
    train_rows = features.filter(pl.col("graph") == stem)
    np.testing.assert_array_equal(train_rows["target"].to_numpy(), raw_runtime[train_rows["config_index"].to_numpy()])
    assert layout.load_features([stem], max_configs=3, seed=1).height == 3

    # node arrays
    arrays = layout.load_graph_arrays(stem)
    assert arrays.node_feat.shape[1] == NODE_FEATURE_DIM and arrays.num_configs == 12 - DUPLICATES
    np.testing.assert_array_equal(arrays.target, raw_runtime[arrays.config_index])

    # tile: target is runtime / normalizer; duplicate config row removed from labelled graphs
    tile_counts = dict(tile.graph_table.select("split", "configs_after").unique().iter_rows())
    assert tile_counts == {"train": 7, "valid": 7, "test": 8}
    tile_stem = TILE_STEMS["train"][0]
    tile_features = tile.load_features([tile_stem])
    assert tile_features.height == 7 and "f_tile_waste" in tile_features.columns
    assert "f_freq_mean" not in tile_features.columns
    assert tile.load_graph_arrays(tile_stem).config_nodes.size == 0

    # folds: every labelled graph, grouped by family
    folds = layout.folds()
    assert sorted(folds["graph"].to_list()) == sorted(LAYOUT_STEMS["train"] + LAYOUT_STEMS["valid"])
    resnet = folds.filter(pl.col("family") == "resnet50")["fold"].unique()
    assert resnet.len() == 1

    # second call: everything reused, same keys
    again = prepare(quick, world, work, ["layout:xla:default", "tile:xla"])
    for name, prepared in again.items():
        assert all(prepared.cached.values()), name
        assert {k: o.key for k, o in prepared.stages.items()} == {k: o.key for k, o in first[name].stages.items()}

    # a pruning change re-keys prune and what reads it, not the folds; tile ignores hops
    deeper = load_config(None, ["folds.k=2", "features.max_configs_per_graph=7", "prune.hops=2"])
    changed = prepare(deeper, world, work, ["layout:xla:default", "tile:xla"])
    new, old = changed["layout:xla:default"], first["layout:xla:default"]
    for stage in ("prune", "features", "node_arrays"):
        assert new.stages[stage].key != old.stages[stage].key and not new.cached[stage]
    assert new.stages["folds"].key == old.stages["folds"].key and new.cached["folds"]
    assert all(changed["tile:xla"].cached.values())


def test_cli_prepare_reports_keys_and_cache(world: Path, tmp_path: Path, capsys) -> None:
    args = ["prepare", "--data-root", str(world), "--work-dir", str(tmp_path / "w"), "--collections", "tile:xla",
            "--set", "folds.k=2"]
    summary = str(tmp_path / "w")  # the summary lines end with the output folder

    def report() -> list[str]:
        return [line for line in capsys.readouterr().out.splitlines() if summary in line]

    assert main(args) == 0
    lines = report()
    assert len(lines) == 4 and all(" computed " in line for line in lines)
    assert main(args) == 0
    lines = report()
    assert len(lines) == 4 and all(" cached " in line for line in lines)
    assert [line.split()[1] for line in lines] == ["prune", "features", "node_arrays", "folds"]
    assert main(args[:-1] + ["folds.k=9"]) == 2  # more folds than families: a clear error, exit code 2
    assert "folds.k = 9" in capsys.readouterr().err


def stage_bytes(prepared: dict) -> dict[str, bytes]:
    """Every file the data stages wrote (manifests aside: they hold wall times), by relative path."""
    out = {}
    for name, item in prepared.items():
        for stage, output in item.stages.items():
            for path in sorted(output.path.rglob("*")):
                if path.is_file() and path.name != "manifest.json":
                    out[f"{name}/{stage}/{path.relative_to(output.path)}"] = path.read_bytes()
    return out


def test_data_stages_write_the_same_bytes_with_any_number_of_workers(world: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("pipelines.data.features.TILE_GRAPHS_PER_PART", 2)  # tile tables in several parts
    runs = {}
    for jobs in (1, 3):
        config = load_config(None, ["folds.k=2", "features.max_configs_per_graph=7", f"run.n_jobs={jobs}"])
        runs[jobs] = prepare(config, world, tmp_path / f"jobs{jobs}", ["layout:xla:default", "tile:xla"])
    one, three = (stage_bytes(runs[j]) for j in (1, 3))
    assert len(one) > 20 and one == three
    # the worker count is not part of any stage key: one cache serves every machine
    for name in runs[1]:
        assert {s: o.key for s, o in runs[1][name].stages.items()} == {s: o.key for s, o in runs[3][name].stages.items()}


def test_errors_raised_in_a_worker_process_keep_their_file_and_problem(tmp_path: Path) -> None:
    import pickle

    from pipelines.core.errors import FormatError, SubmissionError

    error = pickle.loads(pickle.dumps(FormatError(tmp_path / "a.npz", "truncated archive")))
    assert isinstance(error, FormatError) and error.path == tmp_path / "a.npz" and error.problem == "truncated archive"
    assert str(error) == f"{tmp_path / 'a.npz'}: truncated archive"
    submission = pickle.loads(pickle.dumps(SubmissionError("s.csv", ["row 3: bad id"])))
    assert submission.violations == ["row 3: bad id"] and "1 problem(s)" in str(submission)


def test_tile_feature_tables_in_parts_read_back_as_each_graph_s_own_table(world: Path, tmp_path: Path,
                                                                          monkeypatch) -> None:
    import pipelines.data.features as features_module
    from pipelines.core.errors import PipelineError
    from pipelines.data.features import config_feature_table, read_feature_rows

    config = load_config(None, ["folds.k=2"])
    loaded = {}
    for size in (1, 2, 64):
        monkeypatch.setattr(features_module, "TILE_GRAPHS_PER_PART", size)
        item = prepare(config, world, tmp_path / f"parts{size}", [TILE_XLA])[TILE_XLA.name]
        train = item.stages["features"].path / "train" / "configs"
        assert len(list(train.glob("part-*.parquet"))) == -(-len(TILE_STEMS["train"]) // size)
        assert not (train / f"{TILE_STEMS['train'][0]}.parquet").exists()
        graphs = sorted(item.graph_table["graph"].to_list())
        for graph in graphs:  # each graph's rows are its own table, whichever part holds them
            rows = item.load_features([graph])
            own = config_feature_table(item.pruned_graph(graph))
            assert rows.select(own.columns).equals(own) and rows.height == own.height > 0
        loaded[size] = item.load_features(graphs[::-1], max_configs=3, seed=1)
        with pytest.raises(PipelineError, match="no graph 'nope'"):
            read_feature_rows(item.stages["features"], [("nope", "train")])
    assert loaded[1].equals(loaded[2]) and loaded[1].equals(loaded[64]) and loaded[1].height == 3 * len(graphs)


@pytest.mark.slow
def test_relative_work_dir_and_data_root_hold_when_the_worker_pool_was_started_elsewhere(tiny_world, tmp_path,
                                                                                         monkeypatch):
    """joblib keeps its loky workers for the life of the process, with the working directory they were
    started in. A second prepare from another folder, given relative paths, must still write its stage
    files there (the workers once wrote them into the first folder: a cached prune output then lacked
    the files the features stage asked for)."""
    import os

    from pipelines.config.settings import load_config
    from pipelines.flows.prepare import prepare

    config = load_config("smoke", ["run.n_jobs=2"])
    for name in ("first", "second"):
        folder = tmp_path / name
        (folder / "data").mkdir(parents=True)
        (folder / "data" / "world").symlink_to(tiny_world, target_is_directory=True)
        monkeypatch.chdir(folder)
        prepared = prepare(config, "data/world", "data/work", ["tile:xla"])
        prune = prepared["tile:xla"].stages["prune"].path
        assert Path(os.path.abspath(prune)).is_relative_to(folder), prune
        assert sorted(p.name for p in (folder / "data/work/prune").iterdir() if not p.name.startswith("."))
    # each folder's prune output holds every graph's file, none landed in the other folder
    for name in ("first", "second"):
        pruned = list((tmp_path / name / "data/work/prune").rglob("*.pruned"))
        assert len(pruned) == sum(len(list((tiny_world / "npz_all/npz/tile/xla" / s).glob("*.npz")))
                                  for s in ("train", "valid", "test")), name
