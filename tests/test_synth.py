"""The synthetic world generator against the reader and against TPUGRAPHS_FORMAT.md.

A tiny world is generated once; every file is loaded with the project's reader and with np.load
(dtypes as stored), and the documented format facts are asserted. Then determinism, the --limit
prefix property, the refusal/resume rules, hand-computed cost-model cases and learnability.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import kendalltau

from pipelines.core.collection import ALL_COLLECTIONS, LAYOUT_NLP_RANDOM, LAYOUT_XLA_DEFAULT, LAYOUT_XLA_RANDOM, TILE_XLA
from pipelines.core.errors import ConfigError
from pipelines.synth import costmodel, generate_world, searches
from pipelines.synth.programs import Family, Variant, build_program, build_tile_kernel
from pipelines.data.folds import program_family
from pipelines.data.tpugraphs import load_graph
from pipelines.data.root import DataRoot

SEED = 3


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("synth") / "world"
    generate_world(root, scale="tiny", seed=SEED)
    return root


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _check_common(path: Path, raw: np.lib.npyio.NpzFile, graph) -> None:
    assert raw["node_feat"].dtype == np.float32 and raw["node_feat"].shape[1] == 140
    assert raw["node_opcode"].dtype == np.uint8
    assert raw["edge_index"].dtype == np.int64 and raw["edge_index"].shape[1] == 2
    n = graph.num_nodes
    edges = graph.edge_index
    assert np.all(edges[:, 0] > edges[:, 1]), f"{path}: topological order u > v"
    assert np.array_equal(edges, np.unique(edges, axis=0)), f"{path}: rows sorted, no duplicates"
    feat = graph.node_feat
    assert feat[:, 0].sum() == 1 and np.all(feat[:, 1] == 0)
    assert np.all(feat[:, 2:21].sum(axis=1) == 1), "exactly one element type"
    dims = feat[:, 21:27]
    assert np.allclose(feat[:, 27], dims.sum(axis=1))
    products = np.array([math.prod(d[d > 0]) for d in dims.astype(np.int64)], dtype=np.float64)
    assert np.allclose(feat[:, 28], products, rtol=1e-6), "product of dims (1 for scalars)"
    ranks = (dims > 0).sum(axis=1)
    for rank, layout in zip(ranks, feat[:, 134:140].astype(np.int64)):
        assert sorted(layout[:rank]) == list(range(rank)) and not layout[rank:].any()
    for start in (37, 45, 53, 61, 69, 77):  # window groups: slots, sum, product (1 when empty)
        slots = feat[:, start:start + 6]
        assert np.allclose(feat[:, start + 6], slots.sum(axis=1))
    conv = graph.node_opcode == 26
    windowed = np.isin(graph.node_opcode, (26, 72))  # convolution, reduce-window
    assert np.all(feat[conv, 107] >= 1) and np.all(feat[~windowed, 44] == 1) and np.all(feat[~windowed, 37:43] == 0)
    assert graph.node_opcode.min() >= 1 and graph.node_opcode.max() <= 120
    assert n >= 2


def test_every_file_loads_and_matches_the_format(world: Path) -> None:
    tile_runtimes = []
    for collection in ALL_COLLECTIONS:
        for split in ("train", "valid", "test"):
            refs = DataRoot(world).graphs(collection, split)
            assert refs, f"{collection} {split} is empty"
            for ref in refs:
                graph = load_graph(ref.path, collection)
                with np.load(ref.path) as raw:
                    _check_common(ref.path, raw, graph)
                    assert raw["config_runtime"].dtype == np.int64
                    if collection.is_tile:
                        assert raw["config_feat"].dtype == np.float32 and raw["config_feat"].shape[1] == 24
                        assert raw["config_runtime_normalizers"].dtype == np.int64
                    else:
                        assert raw["node_config_feat"].dtype == np.float32
                        assert raw["node_config_ids"].dtype == np.int64
                        assert raw["node_splits"].dtype == np.int64
                if collection.is_tile:
                    _check_tile(graph, split)
                    tile_runtimes.append(graph.config_runtime)
                else:
                    _check_layout(graph, split)
    labelled = np.concatenate([r for r in tile_runtimes if r.any()])
    assert np.mean(labelled > 2**24) > 0.5, "runtimes mostly above 2**24 ns"


def _check_tile(graph, split: str) -> None:
    cf = graph.config_feat.astype(np.float64)
    for start in (0, 8, 16):
        slots = cf[:, start:start + 6]
        assert np.allclose(cf[:, start + 6], slots.sum(axis=1))
        expected = np.where((slots > 0).any(axis=1), np.prod(np.where(slots > 0, slots, 1), axis=1), 0)
        assert np.allclose(cf[:, start + 7], expected), "product (0 for an empty list)"
    assert len(np.unique(cf, axis=0)) == len(cf), "tile configs are distinct"
    if split == "test":
        assert not graph.config_runtime.any() and np.all(graph.config_runtime_normalizers == 1)
    else:
        assert np.all(graph.config_runtime > 0) and np.all(graph.config_runtime_normalizers > 0)


def _check_layout(graph, split: str) -> None:
    n = graph.num_nodes
    ids = graph.node_config_ids
    assert np.all(np.diff(ids) > 0)
    assert set(graph.node_opcode[ids]) <= {26, 34, 75}
    assert np.array_equal(ids, np.flatnonzero(np.isin(graph.node_opcode, (26, 34, 75))))
    splits = graph.node_splits
    assert splits.shape[0] == 1 and splits[0, 0] == 0 and splits[0, -1] == n
    cfg = graph.node_config_feat
    assert np.all(cfg[:, :, 14:18] == -1)
    out_rank = (graph.node_feat[ids, 21:27] > 0).sum(axis=1)
    blocks = cfg.reshape(cfg.shape[0], cfg.shape[1], 3, 6)
    for b in range(3):
        block = blocks[:, :, b, :]
        set_slots = (block >= 0).sum(axis=2)
        # a permutation of 0..k-1 followed by -1: sorted values are -1.. then 0..k-1
        expected = np.where(np.arange(6)[None, None] < (6 - set_slots)[..., None], -1,
                            np.arange(6)[None, None] - (6 - set_slots)[..., None])
        assert np.array_equal(np.sort(block, axis=2), expected)
        assert np.all((block[..., :-1] >= 0) | (block[..., 1:] < 0)), "-1 only after the rank"
        if b == 0:
            assert np.all((set_slots == 0) | (set_slots == out_rank[None])), "output block has the node's rank"
    if split == "test":
        assert not graph.config_runtime.any()
    else:
        assert np.all(graph.config_runtime > 0)


def test_collection_level_facts(world: Path) -> None:
    # duplicates in layout train files (default search), tile tests with fewer than 5 configs
    dup_shares = []
    for collection in (LAYOUT_XLA_DEFAULT,):
        for ref in DataRoot(world).graphs(collection, "train"):
            cfg = load_graph(ref.path, collection).node_config_feat
            dup_shares.append(1 - len(np.unique(cfg.reshape(len(cfg), -1), axis=0)) / len(cfg))
    assert max(dup_shares) > 0.2
    tile_test = [load_graph(r.path, TILE_XLA).num_configs for r in DataRoot(world).graphs(TILE_XLA, "test")]
    assert min(tile_test) < 5
    for source in ("xla", "nlp"):
        default, random = (next(c for c in ALL_COLLECTIONS if c.name == f"layout:{source}:{s}")
                           for s in ("default", "random"))
        d_test = [r.stem for r in DataRoot(world).graphs(default, "test")]
        assert d_test == [r.stem for r in DataRoot(world).graphs(random, "test")]
        assert all(re.fullmatch(r"[0-9a-f]{32}", s) for s in d_test)
    d_valid = DataRoot(world).graphs(LAYOUT_XLA_DEFAULT, "valid")
    r_valid = DataRoot(world).graphs(LAYOUT_XLA_RANDOM, "valid")
    assert [r.stem for r in d_valid] == [r.stem for r in r_valid]
    for d, r in zip(d_valid, r_valid):
        gd = load_graph(d.path, LAYOUT_XLA_DEFAULT, with_configs=False)
        gr = load_graph(r.path, LAYOUT_XLA_RANDOM, with_configs=False)
        assert np.array_equal(gd.node_feat, gr.node_feat) and np.array_equal(gd.edge_index, gr.edge_index)
    for ref in DataRoot(world).graphs(TILE_XLA, "train"):
        assert re.fullmatch(r"[a-z0-9_]+_(train|inference)_batch_\d+_-?[0-9a-f]{16}", ref.stem)


def test_sample_submission_matches_test_files(world: Path) -> None:
    with open(world / "sample_submission.csv", newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["ID", "TopConfigs"]
    got = dict(rows[1:])
    expected = {}
    for collection in ALL_COLLECTIONS:
        for ref in DataRoot(world).graphs(collection, "test"):
            c = load_graph(ref.path, collection).num_configs
            top = range(min(5, c)) if collection.is_tile else range(c)
            expected[ref.submission_id] = ";".join(map(str, top))
    assert got == expected and len(rows) - 1 == len(expected)


def test_families_have_several_variants(world: Path) -> None:
    stems = [r.stem for c in ALL_COLLECTIONS[1:] for s in ("train", "valid") for r in DataRoot(world).graphs(c, s)]
    counts: dict[str, set[str]] = {}
    for stem in stems:
        counts.setdefault(program_family(stem), set()).add(stem)
    assert max(len(v) for v in counts.values()) >= 2


def test_same_arguments_give_identical_bytes_and_jobs_do_not_matter(world: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    generate_world(again, scale="tiny", seed=SEED, jobs=2)
    assert _files(again) == _files(world)
    other = tmp_path / "other"
    generate_world(other, scale="tiny", seed=SEED + 1, collections="tile:xla")
    ours = [r.path.read_bytes() for r in DataRoot(world).graphs(TILE_XLA, "train")]
    theirs = [r.path.read_bytes() for r in DataRoot(other).graphs(TILE_XLA, "train")]
    assert len(ours) == len(theirs) and not set(ours) & set(theirs)


def test_limit_writes_a_prefix_of_the_unlimited_world(world: Path, tmp_path: Path) -> None:
    limited = tmp_path / "limited"
    generate_world(limited, scale="tiny", seed=SEED, limit=1, collections="tile:xla,layout:xla:random")
    for collection in (TILE_XLA, LAYOUT_XLA_RANDOM):
        for split in ("train", "valid", "test"):
            refs = DataRoot(limited).graphs(collection, split)
            full = DataRoot(world).graphs(collection, split)
            assert len(refs) == 1 and refs[0].stem == full[0].stem
            assert refs[0].path.read_bytes() == full[0].path.read_bytes()


def test_cli_synth_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines.cli import main

    args = ["synth", "--out", str(tmp_path / "cli"), "--scale", "tiny", "--seed", "0", "--limit", "1",
            "--collections", "layout:nlp:random"]
    assert main(args) == 0
    assert "3 written" in capsys.readouterr().out
    assert len(DataRoot(tmp_path / "cli").graphs(LAYOUT_NLP_RANDOM, "train")) == 1
    assert main(["synth", "--out", str(tmp_path / "cli"), "--scale", "tiny", "--limit", "0"]) == 2


def test_refuses_foreign_directories_and_resumes_its_own(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="non-empty"):
        generate_world(foreign, scale="tiny", seed=0, collections="tile:xla")
    assert (foreign / "notes.txt").read_text() == "mine"

    root = tmp_path / "w"
    generate_world(root, scale="tiny", seed=0, collections="tile:xla")
    assert "already complete" in generate_world(root, scale="tiny", seed=0, collections="tile:xla")
    with pytest.raises(ConfigError, match="other arguments"):
        generate_world(root, scale="tiny", seed=1, collections="tile:xla")
    before = _files(root)
    # simulate an interrupted run: marker not yet written, one file missing
    victim = next(iter(sorted((root / "npz_all").rglob("*.npz"))))
    victim.unlink()
    marker = (root / "synth.json").read_text()
    (root / "synth.json").unlink()
    (root / ".synth-incomplete.json").write_text(marker)
    summary = generate_world(root, scale="tiny", seed=0, collections="tile:xla")
    assert "1 written" in summary
    assert _files(root) == before


def test_padding_and_defaults_by_hand() -> None:
    shape = np.array([[3.0, 224.0, 1, 1, 1, 1]])
    rank = np.array([2])
    # 224 minor -> 256 lanes, 3 second-minor -> 8 sublanes; the other way round: 128 x 224
    assert costmodel.padded_elements(shape, rank, np.array([[[1, 0, -1, -1, -1, -1]]]))[0, 0] == 8 * 256
    assert costmodel.padded_elements(shape, rank, np.array([[[0, 1, -1, -1, -1, -1]]]))[0, 0] == 128 * 224
    blocks = np.full((1, 1, 18), -1, dtype=np.int8)
    blocks[0, 0, 6:8] = [0, 1]
    defaults = np.array([[1, 0, -1, -1, -1, -1, 1, 0, -1, -1, -1, -1] + [-1] * 6], dtype=np.int8)
    resolved = costmodel.resolve_defaults(blocks, defaults)
    assert resolved[0, 0, :2].tolist() == [1, 0] and resolved[0, 0, 6:8].tolist() == [0, 1]


def test_layout_runtimes_are_learnable_but_not_trivial() -> None:
    """Padding alone ranks configs positively but far from perfectly; the cost itself ranks well."""
    rng = np.random.default_rng(0)
    taus_heuristic, taus_oracle = [], []
    for family in (Family("resnet50", "cnn", 300, 32), Family("bert", "transformer", 300, 128, seq=64),
                   Family("unet_3d", "cnn", 200, 16, spatial_rank=3, image=32)):
        model = costmodel.layout_cost_model(build_program(family, Variant(16, "bf16", True), rng))
        configs = searches.random_search(model, 300, rng)
        runtime = costmodel.noisy(costmodel.layout_costs(model, configs), 100, 0.01, rng)
        resolved = costmodel.resolve_defaults(configs, model.defaults)
        padding = (costmodel.padded_elements(model.out_shape, model.out_rank, resolved[:, :, 0:6])
                   * model.out_bytes).sum(axis=1)
        taus_heuristic.append(kendalltau(padding, runtime)[0])
        taus_oracle.append(kendalltau(costmodel.layout_costs(model, configs), runtime)[0])
    assert 0.05 < np.mean(taus_heuristic) < 0.7
    assert np.mean(taus_oracle) > np.mean(taus_heuristic) + 0.2


def test_tile_runtimes_have_an_interior_optimum() -> None:
    rng = np.random.default_rng(1)
    taus = []
    for kind in ("conv", "dot", "reduce", "eltwise"):
        _, kernel = build_tile_kernel(Family("m", "cnn", 0, 64), Variant(32, "bf16"), kind, 10, rng)
        configs = searches.tile_configs(kernel, 300, rng)
        costs = costmodel.tile_costs(kernel, configs)
        tile_size = configs[:, 15]  # product of the output tile
        taus.append(kendalltau(-tile_size, costs)[0])
        assert np.all(costs > 0)
    assert np.mean(taus) < 0.9


def test_window_and_slice_columns_follow_their_attributes() -> None:
    program = build_program(Family("resnet50", "cnn", 40, 16, image=32), Variant(2), np.random.default_rng(0))
    feat, ops = program.node_feat, program.node_opcode
    pool = np.flatnonzero(ops == 72)[0]  # reduce-window 1x3x3x1, stride 1x2x2x1
    assert feat[pool, 37:45].tolist() == [1, 3, 3, 1, 0, 0, 8, 9]
    assert feat[pool, 45:53].tolist() == [1, 2, 2, 1, 0, 0, 6, 4]
    assert feat[pool, 91:93].tolist() == [0, 4]  # reversal: true count, false count
    conv = np.flatnonzero(ops == 26)[0]  # 7x7 stride-2 stem conv, SAME padding 3/3
    assert feat[conv, 37:45].tolist() == [7, 7, 0, 0, 0, 0, 14, 49]
    assert feat[conv, 53:55].tolist() == [3, 3] and feat[conv, 61:63].tolist() == [3, 3]
    assert feat[conv, 93:107].tolist() == [0, 3, 1, 2, 0, 0, 2, 3, 0, 1, 0, 0, 0, 3]
    bert = build_program(Family("bert", "transformer", 60, 64, seq=16), Variant(4), np.random.default_rng(0))
    cut = np.flatnonzero(bert.node_opcode == 92)[0]  # slice (4, 16, 64) -> (4, 1, 64)
    assert bert.node_feat[cut, 109:121].tolist() == [0, 0, 0, 0, 1, 1, 3, 1, 4, 1, 69, 256]


def test_searches_spanning_many_chunks_write_only_valid_layout_values(monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: a loop variable once shadowed the chunk size, leaving rows of uninitialised memory
    # in full-scale default-search files. Tiny chunks make every search span many of them.
    from pipelines.synth import searches

    monkeypatch.setattr(searches, "CHUNK_CELLS", 1)
    rng = np.random.default_rng(5)
    program = build_program(Family("bert", "transformer", 60, 64, seq=16), Variant(4), rng)
    model = costmodel.layout_cost_model(program)
    for configs in (searches.default_search(model, 300, rng, duplicate_share=0.5, mutations=1.0),
                    searches.random_search(model, 300, rng)):
        assert configs.shape == (300, model.num_configurable, 18)
        assert configs.min() >= -1 and configs.max() <= 5
        assert (configs[:, :, 14:] == -1).all()


# ----------------------------------------------------------------------------- hidden labels and variants

# sha256 over (relative path, bytes) of npz_all/** and sample_submission.csv of `synth --scale tiny`,
# computed with the generator as it was before the label sidecar and variants were added: variant 0
# must keep writing the same bytes.
TINY_WORLD_SHA256 = {0: "ef7ae71a12d7f09e60f5fab8a9e0dbd049a236518dedd87403b805a8074f7fac",
                     3: "1585096405c61a6031b844cd4e7f07beb4a8961059538e55c23cd6e6aa6bb1aa"}


def _real_format_sha256(root: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    for path in sorted([*(root / "npz_all").rglob("*"), root / "sample_submission.csv"]):
        if path.is_file():
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def test_variant_zero_writes_the_same_bytes_as_before_the_sidecar(world: Path, tiny_world: Path) -> None:
    assert _real_format_sha256(world) == TINY_WORLD_SHA256[SEED]
    assert _real_format_sha256(tiny_world) == TINY_WORLD_SHA256[0]


def test_sidecar_holds_every_split_and_matches_the_files(world: Path) -> None:
    from pipelines.synth.world import labels_marker, read_labels

    marker = labels_marker(world)
    assert marker["variant"] == 0 and marker["seed"] == SEED and marker["cost_params"]["hbm_bytes_ns"] == 700.0
    assert not list((world / "npz_all").rglob("labels*")), "the sidecar lives outside npz_all/"
    for collection in ALL_COLLECTIONS:
        for split in ("train", "valid", "test"):
            for ref in DataRoot(world).graphs(collection, split):
                graph = load_graph(ref.path, collection)
                labels = read_labels(world, collection, split, ref.stem)
                assert labels.runtime.shape == (graph.num_configs,) and labels.runtime.min() > 0
                # measurement noise is a few percent around the noise-free runtime
                ratio = labels.runtime / labels.noise_free
                assert 0.8 < ratio.min() and ratio.max() < 1.25 and not np.all(ratio == 1.0)
                if split == "test":
                    assert not graph.config_runtime.any(), "test files stay unlabelled"
                else:
                    assert np.array_equal(labels.runtime, graph.config_runtime)
                if collection.is_tile:
                    if split != "test":
                        assert np.array_equal(labels.normalizer, graph.config_runtime_normalizers)
                    assert labels.normalizer.min() > 0


def test_a_world_without_sidecar_gets_its_labels_and_keeps_its_files(tmp_path: Path) -> None:
    import shutil

    from pipelines.synth.world import labels_marker

    root = tmp_path / "w"
    generate_world(root, scale="tiny", seed=0, collections="layout:xla:random")
    before = _real_format_sha256(root)
    shutil.rmtree(root / "labels")  # a world written before the sidecar existed
    assert labels_marker(root) is None
    summary = generate_world(root, scale="tiny", seed=0, collections="layout:xla:random")
    assert "30 written" not in summary and labels_marker(root) is not None
    assert _real_format_sha256(root) == before
    assert len(list((root / "labels").rglob("*.npz"))) == len(list((root / "npz_all").rglob("*.npz")))


def test_two_variants_rank_the_same_graphs_differently(tmp_path: Path) -> None:
    from pipelines.synth.world import read_labels

    chosen = "tile:xla,layout:xla:random,layout:nlp:random"
    generate_world(tmp_path / "v0", scale="tiny", seed=0, collections=chosen)
    generate_world(tmp_path / "v1", scale="tiny", seed=0, collections=chosen, variant=1)
    assert json_of(tmp_path / "v1" / "synth.json")["variant"] == 1
    for collection in (TILE_XLA, LAYOUT_XLA_RANDOM, LAYOUT_NLP_RANDOM):
        taus, other_fastest = [], 0
        for split in ("train", "valid", "test"):
            for ref0, ref1 in zip(DataRoot(tmp_path / "v0").graphs(collection, split),
                                  DataRoot(tmp_path / "v1").graphs(collection, split)):
                g0, g1 = load_graph(ref0.path, collection), load_graph(ref1.path, collection)
                configs = (g0.config_feat, g1.config_feat) if collection.is_tile else \
                    (g0.node_config_feat, g1.node_config_feat)
                assert ref0.stem == ref1.stem and np.array_equal(*configs), "same graphs, same configs"
                truth0 = read_labels(tmp_path / "v0", collection, split, ref0.stem).noise_free
                truth1 = read_labels(tmp_path / "v1", collection, split, ref1.stem).noise_free
                if np.ptp(truth0) > 0 and np.ptp(truth1) > 0:
                    taus.append(kendalltau(truth0, truth1)[0])
                other_fastest += int(np.argmin(truth0) != np.argmin(truth1))
        # related machines (the physics is shared) that disagree on orderings and on the fastest config
        assert 0.5 < np.mean(taus) < 0.97 and other_fastest >= 1, (collection, np.mean(taus), other_fastest)


def test_variant_constants_stay_in_their_documented_ranges() -> None:
    assert costmodel.variant_params(0) == costmodel.CostParams()
    for variant in range(1, 30):
        params = costmodel.variant_params(variant)
        assert params == costmodel.variant_params(variant), "a variant number is one fixed machine"
        for name, (low, high, _) in costmodel.VARIANT_RANGES.items():
            if hasattr(params, name):
                assert low <= getattr(params, name) <= high, (variant, name)
        assert abs(sum(params.anchor_mix) - 1.0) < 1e-9 and params.mutation_unset < params.mutation_tuned
        for low, high in (params.tile_noise, params.default_noise, params.random_noise):
            assert 0 < low < high < 0.1
    with pytest.raises(ConfigError, match="variant"):
        generate_world(Path("unused"), scale="tiny", seed=0, variant=-1)


def test_medium_scale_sits_between_small_and_full() -> None:
    from pipelines.synth import SCALES

    small, medium, full = SCALES["small"], SCALES["medium"], SCALES["full"]
    for name in small.layout_counts:
        assert sum(medium.layout_counts[name]) == 3 * sum(small.layout_counts[name])
    assert sum(medium.tile_counts) == 3 * sum(small.tile_counts) < sum(full.tile_counts)
    for source in ("xla", "nlp"):
        assert small.layout_budget[source][0] < medium.layout_budget[source][0] < full.layout_budget[source][0]


def json_of(path: Path) -> dict:
    import json

    return json.loads(path.read_text())


def test_cli_synth_takes_medium_and_variant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines.cli import main
    from pipelines.synth.world import labels_marker

    args = ["synth", "--out", str(tmp_path / "v2"), "--scale", "medium", "--variant", "2", "--limit", "1",
            "--collections", "tile:xla"]
    assert main(args) == 0
    assert "variant=2" in capsys.readouterr().out
    marker = labels_marker(tmp_path / "v2")
    assert marker["variant"] == 2 and marker["scale"] == "medium"
    assert marker["cost_params"] == costmodel.params_dict(costmodel.variant_params(2))
    assert main(["synth", "--out", str(tmp_path / "bad"), "--scale", "tiny", "--variant", "-1"]) == 2


def test_synth_logs_its_files_as_it_writes_them(tmp_path, monkeypatch, caplog):
    import logging

    import pipelines.synth.world as world
    from pipelines.synth import generate_world

    monkeypatch.setattr(world, "PROGRESS_EVERY_S", 0.0)
    with caplog.at_level(logging.INFO, logger="pipelines"):
        generate_world(tmp_path / "w", scale="tiny", seed=0, limit=1, collections="tile:xla")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("synth: writing 3 of 3 files under")
    assert [line.split(" (")[0] for line in lines if line.startswith("synth ")] == \
        ["synth 1/3 files", "synth 2/3 files", "synth 3/3 files"]
