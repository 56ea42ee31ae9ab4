"""Submission files end to end on a tiny hand-built data root: write, read, validate, score, CLI,
and the non-learned baseline."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from pipelines.models.baseline import baseline_rows, layout_costs, tile_costs
from pipelines.cli import main
from pipelines.core.collection import ALL_COLLECTIONS, LAYOUT_XLA_DEFAULT, TILE_XLA
from pipelines.core.errors import ConfigError, FormatError, PipelineError, SubmissionError
from pipelines.data.submission import (
    HEADER,
    format_submission,
    read_submission,
    score_submission,
    validate_submission,
    write_submission,
)
from pipelines.data.tpugraphs import LayoutGraph, TileGraph, count_configs, save_graph
from pipelines.data.root import DataRoot

# configs per graph, by split: tile test holds a 3-config graph (c < 5), layout graphs have distinct runtimes.
TILE_SIZES = {"train": [6], "valid": [7, 4], "test": [6, 3]}
LAYOUT_SIZES = {"train": [5], "valid": [6, 5], "test": [5]}
TEST_STEMS = ["0a1b2c3d4e5f60718293a4b5c6d7e8f9", "f0e1d2c3b4a5968778695a4b3c2d1e0f"]


def _edges(n: int) -> np.ndarray:
    return np.stack([np.arange(1, n), np.arange(0, n - 1)], axis=1).astype(np.int64)


def tile_graph(stem: str, runtime: np.ndarray, rng: np.random.Generator) -> TileGraph:
    c = runtime.shape[0]
    node_feat = np.zeros((3, 140), dtype=np.float32)
    node_feat[:, 21:23] = [64, 128]
    node_feat[2, 0] = 1  # root
    return TileGraph(stem, node_feat, np.array([63, 34, 41], dtype=np.uint8), _edges(3),
                     rng.integers(1, 200, (c, 24)).astype(np.float32), runtime,
                     np.where(runtime > 0, 2, 1).astype(np.int64))


def layout_graph(stem: str, runtime: np.ndarray, rng: np.random.Generator) -> LayoutGraph:
    c = runtime.shape[0]
    node_feat = np.zeros((4, 140), dtype=np.float32)
    node_feat[:, 21:24] = [8, 512, 4]
    configs = rng.integers(-1, 6, (c, 2, 18)).astype(np.int8)
    configs[:, :, 14:] = -1
    return LayoutGraph(stem, node_feat, np.array([63, 34, 75, 41], dtype=np.uint8), _edges(4),
                       np.array([1, 2], dtype=np.int64), configs, runtime, np.array([[0, 4]], dtype=np.int64))


def build_root(root: Path, runtimes: Callable[[np.random.Generator, int], np.ndarray]) -> dict[str, np.ndarray]:
    """Write every collection and split; returns the metric's truth per valid-split submission ID."""
    rng, runtime_rng = np.random.default_rng(0), np.random.default_rng(1)  # features never depend on runtimes
    (root / "npz_all" / "npz").mkdir(parents=True)
    truths, sample = {}, []
    for collection in ALL_COLLECTIONS:
        for split in ("train", "valid", "test"):
            sizes = (TILE_SIZES if collection.is_tile else LAYOUT_SIZES)[split]
            for i, c in enumerate(sizes):
                stem = TEST_STEMS[i] if split == "test" else f"{collection.source}_model_{split}_{i}"
                runtime = np.zeros(c, dtype=np.int64) if split == "test" else runtimes(runtime_rng, c)
                make = tile_graph if collection.is_tile else layout_graph
                graph = make(stem, runtime, rng)
                save_graph(DataRoot(root).split_dir(collection, split) / f"{stem}.npz", graph)
                if split == "valid":
                    truths[collection.submission_id(stem)] = graph.target
                if split == "test":
                    sample.append(f"{collection.submission_id(stem)},{';'.join(map(str, range(min(c, 5))))}")
    (root / "sample_submission.csv").write_text("\n".join([HEADER, *sorted(sample)]) + "\n")
    return truths


def _distinct_runtimes(rng: np.random.Generator, c: int) -> np.ndarray:
    return (2**30 + rng.choice(10**6, c, replace=False)).astype(np.int64)  # beyond float32 precision


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("world")
    return root, build_root(root, _distinct_runtimes)


def valid_test_rows() -> dict[str, list[int]]:
    """A correct test-split submission (any order is valid)."""
    rows = {}
    for collection in ALL_COLLECTIONS:
        sizes = (TILE_SIZES if collection.is_tile else LAYOUT_SIZES)["test"]
        for stem, c in zip(TEST_STEMS, sizes):
            rows[collection.submission_id(stem)] = list(range(min(5, c) if collection.is_tile else c))
    return rows


def rows_from_truth(truths: dict[str, np.ndarray], reverse: bool) -> dict[str, list[int]]:
    rows = {}
    for sid, target in truths.items():
        order = np.argsort(-target if reverse else target, kind="stable")
        rows[sid] = order[:5].tolist() if sid.startswith("tile:") else order.tolist()
    return rows


def write_text(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def violations_of(path: Path, root: Path, split: str = "test") -> list[str]:
    with pytest.raises(SubmissionError) as caught:
        validate_submission(path, root, split=split)
    return caught.value.violations


# ----------------------------------------------------------------------------- validation


def test_a_correct_submission_validates(world, tmp_path):
    root, _ = world
    path = write_submission(tmp_path / "sub.csv", valid_test_rows())
    assert validate_submission(path, root) == 2 + 4 * 1
    assert path.read_text().splitlines()[0] == HEADER


TILE_ID = TILE_XLA.submission_id(TEST_STEMS[0])  # 6 configs
SMALL_TILE_ID = TILE_XLA.submission_id(TEST_STEMS[1])  # 3 configs
LAYOUT_ID = LAYOUT_XLA_DEFAULT.submission_id(TEST_STEMS[0])  # 5 configs


def _replace(sid: str, top: str) -> Callable[[list[str]], list[str]]:
    return lambda lines: [f"{sid},{top}" if line.startswith(sid + ",") else line for line in lines]


VIOLATIONS = {
    "bad header": (lambda lines: ["id,TopConfigs"] + lines[1:], "line 1: bad header"),
    "duplicate ID": (lambda lines: lines + [lines[1]], "duplicate ID (first on line 2)"),
    "missing ID": (lambda lines: [l for l in lines if not l.startswith(LAYOUT_ID + ",")],
                   f"ID {LAYOUT_ID}: missing"),
    "unknown ID": (lambda lines: lines + ["tile:xla:no_such_graph,0"], "ID tile:xla:no_such_graph (line 8): unknown ID"),
    "unknown collection": (lambda lines: lines + ["tile:nlp:x,0"], "ID tile:nlp:x (line 8): unknown ID"),
    "tile too short": (_replace(TILE_ID, "0;1;2"), f"ID {TILE_ID} (line 6): tile list has 3 indices, expected 5"),
    "small tile too long": (_replace(SMALL_TILE_ID, "0;1;2;3"), "tile list has 4 indices, expected 3"),
    "tile duplicate index": (_replace(TILE_ID, "0;1;1;2;3"), f"ID {TILE_ID} (line 6): duplicate index 1"),
    "tile out of range": (_replace(TILE_ID, "0;1;2;3;6"), "index out of range [0, 6): 6"),
    "layout non-permutation": (_replace(LAYOUT_ID, "0;1;2;3;3"), "not a permutation of 0..4: missing index 4"),
    "layout too short": (_replace(LAYOUT_ID, "0;1;2;3"), "layout order has 4 indices, expected a permutation"),
    "non-integer token": (_replace(LAYOUT_ID, "0;1;x;3;4"), "non-integer token(s) 'x'"),
    "negative index": (_replace(LAYOUT_ID, "0;1;-2;3;4"), "negative index -2"),
    "empty token": (_replace(LAYOUT_ID, "0;1;;3;4"), "non-integer token(s) ''"),
    "field count": (lambda lines: lines + ["a,b,c"], "line 8: expected 2 fields"),
}


@pytest.mark.parametrize("case", sorted(VIOLATIONS))
def test_each_violation_is_reported_by_name(world, tmp_path, case):
    root, _ = world
    lines = format_submission(valid_test_rows()).splitlines()
    mutate, expected = VIOLATIONS[case]
    found = violations_of(write_text(tmp_path / "bad.csv", mutate(lines)), root)
    assert any(expected in v for v in found), found
    # A duplicate in a full-length order also leaves an index out; an extra index of a 3-config tile is out of range.
    assert len(found) == (2 if case in ("layout non-permutation", "small tile too long") else 1), found


def test_every_violation_is_collected_in_one_error(world, tmp_path):
    root, _ = world
    lines = format_submission(valid_test_rows()).splitlines()
    for case in ("bad header", "tile too short", "layout too short", "unknown ID", "duplicate ID"):
        lines = VIOLATIONS[case][0](lines)
    found = violations_of(write_text(tmp_path / "bad.csv", lines), root)
    assert len(found) == 5, found


def test_a_validation_split_submission_is_not_valid_for_test(world, tmp_path):
    root, truths = world
    path = write_submission(tmp_path / "valid.csv", rows_from_truth(truths, reverse=False))
    found = violations_of(path, root, split="test")
    assert sum("unknown ID" in v for v in found) == len(truths)
    assert sum("missing" in v for v in found) == 6


def test_a_missing_collection_directory_is_named(world, tmp_path):
    root, _ = world
    partial = tmp_path / "partial"
    shutil.copytree(root, partial)
    missing_dir = DataRoot(partial).split_dir(LAYOUT_XLA_DEFAULT, "test")
    shutil.rmtree(missing_dir)
    path = write_submission(tmp_path / "sub.csv", valid_test_rows())
    with pytest.raises(FormatError, match="missing directory for layout:xla:default test") as caught:
        validate_submission(path, partial)
    assert caught.value.path == missing_dir


# ----------------------------------------------------------------------------- writing and reading


def test_write_is_sorted_reproducible_and_round_trips(tmp_path):
    rows = valid_test_rows()
    first = write_submission(tmp_path / "a.csv", rows)
    second = write_submission(tmp_path / "b.csv", dict(reversed(list(rows.items()))))
    assert first.read_bytes() == second.read_bytes()
    ids = [line.split(",")[0] for line in first.read_text().splitlines()[1:]]
    assert ids == sorted(rows)
    assert read_submission(first) == rows
    assert f"{TILE_ID},0;1;2;3;4" in first.read_text().splitlines()


def test_write_refuses_to_overwrite_and_leaves_the_file_intact(tmp_path):
    path = write_submission(tmp_path / "sub.csv", {"tile:xla:a": [0, 1]})
    before = path.read_bytes()
    with pytest.raises(PipelineError, match="already exists"):
        write_submission(path, {"tile:xla:b": [2, 3]})
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub.csv"]  # no temp file left behind


def test_write_without_hard_links_still_never_overwrites(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise PermissionError("hard links not supported")

    monkeypatch.setattr("pipelines.data.submission.os.link", no_links)
    path = write_submission(tmp_path / "sub.csv", {"tile:xla:a": [0, 1]})
    assert path.read_text() == f"{HEADER}\ntile:xla:a,0;1\n"
    with pytest.raises(PipelineError, match="already exists"):
        write_submission(path, {"tile:xla:b": [2, 3]})
    assert path.read_text() == f"{HEADER}\ntile:xla:a,0;1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub.csv"]


@pytest.mark.parametrize("rows, problem", [
    ({"tile:xla:a,b": [0]}, "not writable"),
    ({"tile:xla:a": []}, "empty TopConfigs"),
    ({"tile:xla:a": [0, -1]}, "negative index -1"),
    ({"tile:xla:a": [0, 1.5]}, "must be integers"),
])
def test_write_refuses_unwritable_rows(tmp_path, rows, problem):
    with pytest.raises(SubmissionError, match=problem):
        write_submission(tmp_path / "sub.csv", rows)
    assert not (tmp_path / "sub.csv").exists()


def test_read_reports_syntax_problems(tmp_path):
    path = write_text(tmp_path / "bad.csv", ["ID,TopConfigs", "a,1;2", "a,3", "b,x"])
    with pytest.raises(SubmissionError) as caught:
        read_submission(path)
    assert len(caught.value.violations) == 2
    with pytest.raises(FormatError, match="not found"):
        read_submission(tmp_path / "absent.csv")


def test_an_index_of_thousands_of_digits_is_out_of_range_in_linear_time(world, tmp_path, capsys):
    """Issue 71, class 3/5: a 5,000-digit index was Python's int() ValueError traceback."""
    import time

    root, truths = world
    for command, rows in (("validate-submission", valid_test_rows()), ("score", rows_from_truth(truths, False))):
        lines = format_submission(rows).splitlines()
        sid, top = lines[1].split(",")
        lines[1] = f"{sid},{'9' * 5000};{top.split(';', 1)[1]}"
        bad = write_text(tmp_path / f"{command}.csv", lines)
        assert main([command, "--data-root", str(root), str(bad)]) == 1
        err = capsys.readouterr().err
        assert f"ID {sid} (line 2): index of 5000 digits" in err and "Traceback" not in err
    times = []
    for digits in (100_000, 1_000_000):
        huge = write_text(tmp_path / f"huge-{digits}.csv", ["ID,TopConfigs", f"tile:xla:a,{'7' * digits};1",
                                                           f"tile:xla:b,-{'8' * digits}"])
        started = time.perf_counter()
        with pytest.raises(SubmissionError, match=f"index of {digits} digits") as caught:
            read_submission(huge)
        times.append(time.perf_counter() - started)
        assert len(caught.value.violations) == 2  # the negative one too, named once
    assert times[1] < 1.0 and times[1] < 30 * max(times[0], 1e-3)  # 10x the digits: ~10x the time


def test_count_configs_reads_only_the_header(world, tmp_path):
    root, _ = world
    tile = DataRoot(root).split_dir(TILE_XLA, "test") / f"{TEST_STEMS[1]}.npz"
    layout = DataRoot(root).split_dir(LAYOUT_XLA_DEFAULT, "valid") / "xla_model_valid_0.npz"
    assert count_configs(tile, TILE_XLA) == 3
    assert count_configs(layout, LAYOUT_XLA_DEFAULT) == 6
    with pytest.raises(FormatError, match="missing key node_config_feat"):
        count_configs(tile, LAYOUT_XLA_DEFAULT)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(FormatError, match="corrupt"):
        count_configs(tmp_path / "junk.npz", TILE_XLA)


# ----------------------------------------------------------------------------- scoring


def test_scoring_a_perfect_and_a_reversed_submission(world, tmp_path):
    root, truths = world
    perfect = score_submission(write_submission(tmp_path / "p.csv", rows_from_truth(truths, False)), root)
    scores = dict(zip(perfect.per_collection["collection"], perfect.per_collection["score"]))
    assert scores == {c.name: 1.0 for c in ALL_COLLECTIONS}
    assert perfect.combined.complete and perfect.combined.value == 1.0
    assert perfect.per_graph.height == len(truths)

    reverse = score_submission(write_submission(tmp_path / "r.csv", rows_from_truth(truths, True)), root)
    by_graph = {(r["collection"], r["graph"]): r for r in reverse.per_graph.iter_rows(named=True)}
    for collection in ALL_COLLECTIONS:
        if collection.is_layout:
            assert reverse.per_collection.filter(
                reverse.per_collection["collection"] == collection.name)["score"].item() == -1.0
    # Tile: the reversed top-5 of the 7-config graph misses the two best configs.
    target = truths[TILE_XLA.submission_id("xla_model_valid_0")]
    expected = 2 - np.sort(target)[2] / target.min()
    assert by_graph[("tile:xla", "xla_model_valid_0")]["score"] == pytest.approx(expected)
    assert by_graph[("layout:nlp:random", "nlp_model_valid_1")]["opa"] == 0.0
    assert "combined score (unweighted mean of 5 collections)" in reverse.to_text()


def test_scoring_the_test_split_is_refused(world, tmp_path):
    root, _ = world
    with pytest.raises(ConfigError, match="no runtimes"):
        score_submission(write_submission(tmp_path / "t.csv", valid_test_rows()), root, split="test")


# ----------------------------------------------------------------------------- CLI


def test_cli_validate_and_score(world, tmp_path, capsys):
    root, truths = world
    good = write_submission(tmp_path / "good.csv", valid_test_rows())
    assert main(["validate-submission", "--data-root", str(root), str(good)]) == 0
    assert "valid submission with 6 rows" in capsys.readouterr().out

    bad = write_text(tmp_path / "bad.csv", format_submission(valid_test_rows()).splitlines()[:-1])
    assert main(["validate-submission", "--data-root", str(root), str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "1 problem(s)" in err and ": missing" in err

    valid = write_submission(tmp_path / "valid.csv", rows_from_truth(truths, False))
    assert main(["score", "--data-root", str(root), str(valid)]) == 0
    out = capsys.readouterr().out
    assert "layout:nlp:random" in out and "combined score (unweighted mean of 5 collections): 1.0000" in out


# ----------------------------------------------------------------------------- baseline and demo


def test_baseline_is_valid_and_never_reads_runtimes(world, tmp_path):
    root, _ = world
    rows = baseline_rows(root, "valid")
    path = write_submission(tmp_path / "baseline.csv", rows)
    assert validate_submission(path, root, split="valid") == len(rows)
    # The same world with other runtimes yields the same rows: the heuristic cannot see them.
    other = tmp_path / "other"
    build_root(other, lambda rng, c: rng.permutation(np.arange(1, c + 1)).astype(np.int64) * 1000)
    assert baseline_rows(other, "valid") == rows
    assert len(baseline_rows(root, "test")[TILE_XLA.submission_id(TEST_STEMS[1])]) == 3


def test_tile_baseline_prefers_tiles_that_cover_the_output_without_padding():
    node_feat = np.zeros((2, 140), dtype=np.float32)
    node_feat[1, 0], node_feat[1, 21:23] = 1, [128, 256]
    config_feat = np.zeros((4, 24), dtype=np.float32)
    config_feat[:, 8:10] = [[128, 256], [64, 128], [100, 256], [256, 512]]  # exact, 4 tiles, padded, oversized
    graph = TileGraph("t", node_feat, np.array([63, 34], dtype=np.uint8), _edges(2), config_feat,
                      np.zeros(4, dtype=np.int64), np.ones(4, dtype=np.int64))
    costs = tile_costs(graph)
    assert costs[0] == 0.0 and np.argmin(costs) == 0
    assert costs[1] == pytest.approx(np.log(4))  # 2 x 2 tiles, no padding
    assert costs[3] == pytest.approx(np.log(4))  # 1 tile, padded to 4x the output


def test_layout_baseline_prefers_default_blocks_and_the_largest_dim_minor_most():
    node_feat = np.zeros((2, 140), dtype=np.float32)
    node_feat[1, 21:23] = [8, 512]  # dim 1 is the largest
    configs = np.full((3, 1, 18), -1, dtype=np.int8)
    configs[1, 0, 0:2] = [1, 0]  # largest dim minor-most: one non-default block
    configs[2, 0, 0:2] = [0, 1]  # small dim minor-most: misplaced
    graph = LayoutGraph("g", node_feat, np.array([63, 34], dtype=np.uint8), _edges(2), np.array([1]),
                        configs, np.zeros(3, dtype=np.int64), np.array([[0, 2]]))
    assert layout_costs(graph).tolist() == pytest.approx([0.0, 0.1, 1.1])
