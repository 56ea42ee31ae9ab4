"""Regression tests for the 13 holes of issue 13 (a black-box attack on the pipeline), one or more per
numbered item (``test_NN_...``); each failed on the code before the fix. Tiny data, seconds each.

The same attack, with more inputs and a summary table, is replayed by ``benchmarks/attack.py``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from pipelines.cli import main
from pipelines.core.collection import LAYOUT_NLP_RANDOM, TILE_XLA
from pipelines.config.settings import load_config
from pipelines.core.errors import ConfigError, FormatError, SubmissionError
from pipelines.flows.prepare import prepare
from pipelines.flows.run import run_pipeline
from pipelines.outputs.run_folders import SUBMISSION_FILE
from pipelines.data.submission import validate_submission
from pipelines.data.tpugraphs import TileGraph, load_graph, save_graph
from pipelines.data.root import DataRoot

REPO = Path(__file__).resolve().parents[1]


def fast_config(*extra: str):
    return load_config("smoke", extra)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry under a data root with its size and mtime (links not followed): raw data must not change."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = os.lstat(Path(dirpath) / name)
            out[str(Path(dirpath, name).relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def world(tiny_world: Path, tmp_path: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(tiny_world, root, symlinks=True)
    return root


@pytest.fixture(scope="module")
def published(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One cheap run (the random baseline) of the tiny world."""
    base = tmp_path_factory.mktemp("published")
    result = run_pipeline(fast_config(), tiny_world, work_dir=base / "work", models=["random"],
                          submissions_dir=base / "subs")
    return {"root": tiny_world, "subs": base / "subs", "work": base / "work", "result": result}


def first_test_ref(root: Path, collection=TILE_XLA):
    return DataRoot(root).graphs(collection, "test")[0]


def csv_without(submission: Path, sid: str, out: Path) -> Path:
    lines = [line for line in submission.read_text().splitlines() if not line.startswith(sid + ",")]
    out.write_text("\n".join(lines) + "\n")
    return out


# ----------------------------------------------------------------------------- 1. report --out


@pytest.mark.slow
def test_01_report_out_never_overwrites_a_submission_or_a_foreign_file(published, tmp_path, capsys):
    run_id, subs = published["result"].run_id, tmp_path / "subs"
    shutil.copytree(published["subs"] / run_id, subs / run_id)  # the shared run stays intact whatever happens
    csv = subs / run_id / SUBMISSION_FILE
    before = csv.read_bytes()
    assert main(["report", run_id, "--submissions-dir", str(subs), "--out", str(csv)]) == 1
    assert csv.read_bytes() == before
    assert "refusing to overwrite" in capsys.readouterr().err
    foreign = tmp_path / "notes.html"
    foreign.write_text("<html>my notes</html>")
    assert main(["report", run_id, "--submissions-dir", str(subs), "--out", str(foreign)]) == 1
    assert foreign.read_text() == "<html>my notes</html>"
    # its own earlier report is replaced
    ours = tmp_path / "report.html"
    assert main(["report", run_id, "--submissions-dir", str(subs), "--out", str(ours)]) == 0
    assert main(["report", run_id, "--submissions-dir", str(subs), "--out", str(ours)]) == 0


# ----------------------------------------------------------------------------- 2. sample_submission.csv


def test_02_a_submission_missing_a_deleted_test_file_is_invalid(published, world, tmp_path):
    ref = first_test_ref(world)
    ref.path.unlink()
    partial = csv_without(published["result"].submission, ref.submission_id, tmp_path / "partial.csv")
    with pytest.raises(FormatError, match=ref.submission_id):
        validate_submission(partial, world)


def test_02_a_dangling_symlink_test_file_is_invalid(published, world, tmp_path):
    ref = first_test_ref(world)
    ref.path.unlink()
    ref.path.symlink_to(tmp_path / "gone.npz")
    partial = csv_without(published["result"].submission, ref.submission_id, tmp_path / "partial.csv")
    with pytest.raises(FormatError, match="dangling symlink"):
        validate_submission(partial, world)


@pytest.mark.parametrize("sample", [None, "garbage\n", "ID,TopConfigs\nnot-an-id,0\n", "\xef\xbb\xbfID,TopConfigs\n"])
def test_02_a_missing_or_garbage_sample_submission_is_an_error(published, world, sample):
    path = world / "sample_submission.csv"
    path.unlink()
    if sample is not None:
        path.write_text(sample, encoding="latin-1")
    with pytest.raises(FormatError, match="sample_submission.csv"):
        validate_submission(published["result"].submission, world)


# ----------------------------------------------------------------------------- 3. unreadable entries


def _plant_unreadable(folder: Path, tmp_path: Path) -> list[Path]:
    bad = [folder / "dangling.npz", folder / "loop.npz", folder / "folder.npz", folder / "pipe.npz"]
    bad[0].symlink_to(tmp_path / "nowhere.npz")
    bad[1].symlink_to(bad[1])
    bad[2].mkdir()
    os.mkfifo(bad[3])
    return bad


def test_03_unreadable_train_entries_are_errors_naming_each(world, tmp_path):
    bad = _plant_unreadable(DataRoot(world).split_dir(TILE_XLA, "train"), tmp_path)
    with pytest.raises(FormatError) as caught:
        prepare(fast_config(), world, tmp_path / "work", [TILE_XLA])
    message = str(caught.value)
    assert all(str(path) in message for path in bad)
    assert "dangling symlink" in message and "symlink loop" in message and "FIFO" in message
    assert not (tmp_path / "work").exists()  # found before the first stage


def test_03_with_skip_unreadable_entries_are_recorded_warnings(world, tmp_path, caplog):
    bad = _plant_unreadable(DataRoot(world).split_dir(TILE_XLA, "train"), tmp_path)
    prepared = prepare(fast_config("data.on_bad_file=skip"), world, tmp_path / "work", [TILE_XLA])
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    skipped = prepared[TILE_XLA.name].stages["prune"].metrics["skipped_files"]
    assert sorted(item["path"] for item in skipped) == sorted(str(p) for p in bad)
    assert all(any(str(p) in line and "warning" in line for line in lines) for p in bad)


# ----------------------------------------------------------------------------- 4. before the first stage


def test_04_a_missing_collection_fails_before_any_stage(world, tmp_path):
    shutil.rmtree(DataRoot(world).split_dir(LAYOUT_NLP_RANDOM, "train").parent)
    with pytest.raises(FormatError, match="layout/nlp/random"):
        run_pipeline(fast_config(), world, work_dir=tmp_path / "work", models=["random"],
                     submissions_dir=tmp_path / "subs")
    assert not (tmp_path / "work").exists() and not (tmp_path / "subs").exists()


def test_04_an_empty_test_split_is_named_before_any_stage(world, tmp_path):
    test_dir = DataRoot(world).split_dir(TILE_XLA, "test")
    for path in test_dir.iterdir():
        path.unlink()
    with pytest.raises(FormatError) as caught:
        run_pipeline(fast_config(), world, work_dir=tmp_path / "work", models=["random"],
                     submissions_dir=tmp_path / "subs")
    assert str(test_dir) in str(caught.value) and "tile:xla" in str(caught.value)
    assert not (tmp_path / "work").exists()


# ----------------------------------------------------------------------------- 5. decompression bombs


def write_edge_bomb(path: Path, edges: int) -> None:
    """A valid tile npz whose edge_index declares ``edges`` zero rows: a few hundred KB on disk."""
    source = np.load(path.with_name("source.npz"))
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for key in source.files:
            if key == "edge_index":
                continue
            with archive.open(f"{key}.npy", "w") as stream:
                np.lib.format.write_array(stream, source[key])
        with archive.open("edge_index.npy", "w", force_zip64=True) as stream:
            np.lib.format.write_array_header_1_0(stream, {"descr": "<i8", "fortran_order": False,
                                                          "shape": (edges, 2)})
            chunk = bytes(1 << 24)
            left = edges * 16
            while left:
                stream.write(chunk[: min(left, len(chunk))])
                left -= min(left, len(chunk))


PEAK_RSS_PROBE = """
import json, resource, sys
from pipelines.core.collection import TILE_XLA
from pipelines.core.errors import FormatError
from pipelines.data.tpugraphs import load_graph
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    load_graph(sys.argv[1], TILE_XLA)
    outcome = "accepted"
except FormatError as exc:
    outcome = "FormatError: " + str(exc)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"outcome": outcome, "peak_rss_growth_mb": (after - before) / 1024}))
"""


def load_in_subprocess(path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", PEAK_RSS_PROBE, str(path)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300, check=True)
    return json.loads(done.stdout)


def test_05_an_edge_bomb_is_refused_from_its_headers_with_bounded_memory(tiny_world, tmp_path):
    shutil.copy(first_test_ref(tiny_world).path, tmp_path / "source.npz")
    bomb = tmp_path / "bomb.npz"
    write_edge_bomb(bomb, 20_000_000)  # 320 MB of int64 zeros in ~0.3 MB
    assert bomb.stat().st_size < 2_000_000
    result = load_in_subprocess(bomb)
    assert result["outcome"].startswith("FormatError") and "edge_index" in result["outcome"], result
    assert result["peak_rss_growth_mb"] < 64, result


def test_05_extra_a_lying_npy_header_is_refused_before_reading(tiny_world, tmp_path):
    """config_feat declares 10**8 configs (9.6 GB) but holds a few: refused from the headers."""
    import io

    source = np.load(first_test_ref(tiny_world).path)
    path = tmp_path / "liar.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for key in source.files:
            buffer = io.BytesIO()
            if key == "config_feat":
                np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False,
                                                              "shape": (10**8, 24)})
                buffer.write(source[key].astype("<f4").tobytes())
            else:
                np.lib.format.write_array(buffer, source[key])
            archive.writestr(f"{key}.npy", buffer.getvalue())
    with pytest.raises(FormatError, match="config_feat: declared shape"):
        load_graph(path, TILE_XLA)


# ----------------------------------------------------------------------------- 6. zero normalizer


def labelled_tile(normalizers: list[int]) -> TileGraph:
    node_feat = np.zeros((2, 140), dtype=np.float32)
    return TileGraph("t", node_feat, np.array([1, 2], dtype=np.uint8), np.array([[1, 0]], dtype=np.int64),
                     np.ones((len(normalizers), 24), dtype=np.float32),
                     np.arange(1, len(normalizers) + 1, dtype=np.int64) * 100, np.array(normalizers, dtype=np.int64))


def test_06_a_zero_normalizer_in_a_labelled_tile_file_is_an_error(tmp_path):
    save_graph(tmp_path / "t.npz", labelled_tile([3, 0, 2]))
    with pytest.raises(FormatError, match="config_runtime_normalizers.*config 1"):
        load_graph(tmp_path / "t.npz", TILE_XLA)
    save_graph(tmp_path / "ok.npz", labelled_tile([3, 1, 2]))
    assert load_graph(tmp_path / "ok.npz", TILE_XLA).target[1] == 200.0


# ----------------------------------------------------------------------------- 7. duplicate members


def test_07_a_duplicate_archive_member_is_an_error(tmp_path):
    save_graph(tmp_path / "t.npz", labelled_tile([3, 1, 2]))
    with zipfile.ZipFile(tmp_path / "t.npz") as archive:
        members = [(name, archive.read(name)) for name in archive.namelist()]
    with pytest.warns(UserWarning), zipfile.ZipFile(tmp_path / "dup.npz", "w") as archive:
        for name, data in members + [m for m in members if m[0] == "config_runtime.npy"]:
            archive.writestr(name, data)
    with pytest.raises(FormatError, match="duplicate archive member.*config_runtime.npy"):
        load_graph(tmp_path / "dup.npz", TILE_XLA)


# ----------------------------------------------------------------------------- 8. no raw tracebacks


def test_08_a_work_dir_that_is_a_file_is_a_message(world, tmp_path, capsys):
    afile = tmp_path / "passwd"
    afile.write_text("root:x:0:0\n")
    assert main(["prepare", "--data-root", str(world), "--work-dir", str(afile), "--collections", "tile:xla"]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert afile.read_text() == "root:x:0:0\n"


def test_08_a_work_dir_that_cannot_be_created_is_a_message(world, tmp_path, capsys):
    code = main(["prepare", "--data-root", str(world), "--work-dir", "/proc/tpugraphs-no-such-dir",
                 "--collections", "tile:xla"])
    assert code == 1 and "/proc/tpugraphs-no-such-dir" in capsys.readouterr().err


def test_08_exclude_features_that_excludes_everything_fails_before_any_stage(world, tmp_path, capsys):
    code = main(["run", "--data-root", str(world), "--work-dir", str(tmp_path / "work"), "--submissions-dir",
                 str(tmp_path / "subs"), "--models", "gbdt", "--set", 'gbdt.exclude_features=["f_"]',
                 "--config", "smoke"])
    assert code == 2 and "exclude_features" in capsys.readouterr().err
    assert not (tmp_path / "work").exists()


def test_08_a_stage_folder_replaced_by_a_file_is_a_message(world, tmp_path, capsys):
    work = tmp_path / "work"
    args = ["prepare", "--data-root", str(world), "--work-dir", str(work), "--collections", "tile:xla",
            "--config", "quick", "--set", "folds.k=2"]
    assert main(args) == 0
    stage = next(p for p in (work / "folds").iterdir() if not p.name.startswith("."))
    shutil.rmtree(stage)
    stage.write_text("in the way")
    capsys.readouterr()
    assert main(args) == 1
    assert str(stage) in capsys.readouterr().err
    assert stage.read_text() == "in the way"


# ----------------------------------------------------------------------------- 9. debris after kill -9


def test_09_publishing_debris_is_cleaned_and_a_manifestless_run_is_named_incomplete(published, tmp_path, capsys):
    subs = tmp_path / "subs"
    debris = subs / "20260101T000000Z-0123abcd"
    debris.mkdir(parents=True)
    (debris / ".submission.csv.draft").write_text("ID,TopConfigs\n")
    (debris / ".submission.csv.x1y2.tmp").write_text("ID,TopConfigs\n")
    csv_only = subs / "20260101T000001Z-0123abcd"
    csv_only.mkdir()
    shutil.copy(published["result"].submission, csv_only / SUBMISSION_FILE)
    staging = subs / ".tmp-run-deadbeef"  # a killed publish: lock file with a pid nobody holds
    staging.mkdir()
    (staging / ".lock").write_text("999999\n")
    (staging / SUBMISSION_FILE).write_text("partial")

    assert main(["status", "--work-dir", str(tmp_path / "work"), "--submissions-dir", str(subs)]) == 0
    out = capsys.readouterr().out
    assert not debris.exists() and not staging.exists()
    assert (csv_only / SUBMISSION_FILE).is_file()  # never delete a submission
    assert "incomplete run folder" in out and csv_only.name in out
    for command in (["report", csv_only.name], ["ensemble", "--runs", csv_only.name]):
        assert main([*command, "--submissions-dir", str(subs)]) == 1
        assert "incomplete run folder" in capsys.readouterr().err
    from pipelines.outputs.run_folders import tidy_submissions

    assert tidy_submissions(subs) == [{"run_id": csv_only.name, "path": str(csv_only), "state": "incomplete",
                                       "files": [SUBMISSION_FILE]}]


def test_09_extra_an_interrupted_publish_leaves_no_run_folder(published, tmp_path, monkeypatch):
    import pipelines.outputs.run_folders as run_folders

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_folders, "write_json_atomic", killed)
    from pipelines.data.submission import read_submission

    rows = read_submission(published["result"].submission)
    with pytest.raises(KeyboardInterrupt):
        run_folders.publish_submission(rows, {"config": {}, "stages": {}}, data_root=published["root"],
                                       submissions_dir=tmp_path / "subs")
    assert list((tmp_path / "subs").iterdir()) == []


def test_09_a_dead_runs_tmp_stage_folder_goes_when_the_stage_is_reused(published, tmp_path):
    work = published["work"]
    stage_dir = work / "prune"
    key = next(p.name for p in stage_dir.iterdir() if not p.name.startswith("."))
    leftover = stage_dir / f".tmp-{key}-killed1"
    leftover.mkdir()
    (leftover / ".lock").write_text("999999\n")
    prepare(fast_config(), published["root"], work, [TILE_XLA])
    assert not leftover.exists()


# ----------------------------------------------------------------------------- 10. bounded submissions


def test_10_an_oversized_submission_is_refused_before_it_is_read(published, tmp_path, monkeypatch):
    big = tmp_path / "big.csv"
    with open(big, "wb") as handle:
        handle.write(published["result"].submission.read_bytes())
        handle.write(b"tile:xla:x," + b"0;" * (10 << 20) + b"0\n")

    read_bytes = Path.read_bytes

    def no_read(self):
        assert self != big, "the oversized file was read"
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", no_read)
    with pytest.raises(SubmissionError, match="at most .* bytes"):
        validate_submission(big, published["root"])


# ----------------------------------------------------------------------------- 11. config bounds


@pytest.mark.parametrize("override", ["gbdt.learning_rate=nan", "gbdt.learning_rate=inf", "gbdt.feature_fraction=-inf"])
def test_11_non_finite_numbers_are_rejected(override):
    with pytest.raises(ConfigError, match="finite"):
        load_config("quick", [override])


def test_11_an_oversized_config_file_is_refused_unread(tmp_path):
    big = tmp_path / "big.toml"
    big.write_text('extends = "base"\n' + "# padding\n" * 300_000)
    with pytest.raises(ConfigError, match="larger than"):
        load_config(big)


def test_11_dev_zero_is_not_a_config():
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config("/dev/zero")


# ----------------------------------------------------------------------------- 12. work dir in raw data


@pytest.mark.parametrize("inside", [".", "work", "npz_all/work"])
def test_12_a_work_dir_in_the_data_root_is_refused_and_nothing_is_written(world, inside):
    before = snapshot(world)
    with pytest.raises(ConfigError, match="inside the data root"):
        prepare(fast_config(), world, world / inside, [TILE_XLA])
    assert snapshot(world) == before


# ----------------------------------------------------------------------------- 13. messages


def test_13_a_negative_index_and_a_bom_get_clear_messages(published, tmp_path):
    text = published["result"].submission.read_text()
    lines = text.splitlines()
    sid = lines[1].split(",")[0]
    lines[1] = f"{sid},-1;" + lines[1].split(",")[1].split(";", 1)[1]
    negative = tmp_path / "negative.csv"
    negative.write_text("\n".join(lines) + "\n")
    with pytest.raises(SubmissionError, match="negative index -1"):
        validate_submission(negative, published["root"])
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    with pytest.raises(SubmissionError, match="byte-order mark"):
        validate_submission(bom, published["root"])


def test_13_a_full_submissions_disk_names_the_path(published, tmp_path, monkeypatch, capsys):
    def disk_full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    subs = tmp_path / "subs"
    code = main(["run", "--data-root", str(published["root"]), "--work-dir", str(published["work"]),
                 "--submissions-dir", str(subs), "--models", "random", "--config", "quick",
                 "--set", "folds.k=2", "--set", "run.n_jobs=1"])
    err = capsys.readouterr().err
    assert code == 1 and str(subs) in err and "No space left on device" in err, err
    assert [p for p in subs.iterdir()] == []


def test_13_a_scheduler_password_is_never_echoed(world, tmp_path, capsys):
    pytest.importorskip("distributed")
    code = main(["run", "--data-root", str(world), "--work-dir", str(tmp_path / "work"), "--submissions-dir",
                 str(tmp_path / "subs"), "--models", "random", "--scheduler", "tcp://alice:hunter2@127.0.0.1:1"])
    captured = capsys.readouterr()
    assert code == 1 and "hunter2" not in captured.err + captured.out and "alice:***@" in captured.err
