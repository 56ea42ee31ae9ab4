"""Issue 71, classes 3 and 4: what the data-root check and the prune stage refuse before training.

* a test file whose name a submission ID cannot carry (``;``, ``,``, a quote, whitespace, non-ASCII)
  is refused before any stage, naming it (a ``;`` passed and crashed at publishing, after every stage);
* ``data.on_bad_file = "skip"`` leaves bad train/valid files out, never a whole split: every train
  file of a collection bad is an error (it trained on the valid graphs and reported OOF 1.0000), and a
  bad test file is an error before the first stage (it was found only after every stage).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.core.collection import LAYOUT_NLP_RANDOM, TILE_XLA, stem_problem
from pipelines.data.root import DataRoot
from tests.test_faults import _flipped, _garbage, _truncated

FAST = ["--config", "smoke", "--models", "random"]


@pytest.fixture
def world(tiny_world: Path, tmp_path: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(tiny_world, root, symlinks=True)
    return root


def run_args(world: Path, tmp_path: Path, *extra: str) -> list[str]:
    return ["run", "--data-root", str(world), "--work-dir", str(tmp_path / "work"), "--submissions-dir",
            str(tmp_path / "subs"), *FAST, *extra]


def rename_test_file(world: Path, name: str, in_sample: bool = True) -> Path:
    victim = DataRoot(world).graphs(TILE_XLA, "test")[0]
    target = victim.path.with_name(f"{name}.npz")
    victim.path.rename(target)
    sample = world / "sample_submission.csv"
    if in_sample:
        sample.write_text(sample.read_text().replace(f"tile:xla:{victim.stem},", f"tile:xla:{name},"))
    else:
        sample.unlink()
    return target


def nothing_computed(tmp_path: Path) -> bool:
    return not list((tmp_path / "work").glob("*/*/manifest.json")) and not (tmp_path / "subs").exists()


@pytest.mark.parametrize("stem, ok", [("alexnet_train_batch_32_-1bae27a41d70f4dc", True), ("resnet50.4x4.fp16", True),
                                      ("0123456789abcdef0123456789abcdef", True), ("a;b", False), ("a,b", False),
                                      ('a"b', False), ("a:b", False), ("a b", False), ("a\tb", False),
                                      ("caf\u00e9", False), ("", False)])
def test_the_stems_a_submission_id_can_carry(stem, ok):
    assert (stem_problem(stem) is None) == ok


def test_a_test_file_named_with_a_semicolon_is_refused_before_any_stage(world, tmp_path, capsys):
    bad = rename_test_file(world, "ab;cd")  # listed in sample_submission.csv as well
    assert main(run_args(world, tmp_path)) == 1
    err = capsys.readouterr().err
    assert f"{bad}: its name holds ';'" in err and "Traceback" not in err
    assert nothing_computed(tmp_path)


@pytest.mark.parametrize("name", ["a,b", "sp ace", "caf\u00e9"])
def test_without_a_sample_submission_prepare_refuses_such_a_name_too(world, tmp_path, capsys, name):
    bad = rename_test_file(world, name, in_sample=False)
    assert main(["prepare", "--data-root", str(world), "--work-dir", str(tmp_path / "work"), "--config", "smoke"]) == 1
    assert str(bad) in capsys.readouterr().err and nothing_computed(tmp_path)


def test_skip_with_every_train_file_of_a_collection_bad_is_an_error(world, tmp_path, capsys):
    train = DataRoot(world).graphs(TILE_XLA, "train")
    for ref in train:
        _garbage(ref.path)
    assert main(run_args(world, tmp_path, "--set", "data.on_bad_file=skip")) == 1
    err = capsys.readouterr().err
    assert f"{DataRoot(world).split_dir(TILE_XLA, 'train')}: tile:xla: every train file ({len(train)}) is unreadable" in err
    assert not (tmp_path / "subs").exists()


def test_skip_with_some_train_files_bad_still_trains_on_the_others(world, tmp_path):
    for ref in DataRoot(world).graphs(TILE_XLA, "train")[:-1]:
        _garbage(ref.path)
    assert main(["prepare", "--data-root", str(world), "--work-dir", str(tmp_path / "work"), "--config", "smoke",
                 "--collections", "tile:xla", "--set", "data.on_bad_file=skip"]) == 0


@pytest.mark.parametrize("damage", [_garbage, _truncated])
def test_skip_with_a_bad_test_file_fails_before_the_first_stage(world, tmp_path, capsys, damage):
    victim = DataRoot(world).graphs(LAYOUT_NLP_RANDOM, "test")[0].path  # the last collection prepared
    damage(victim)
    assert main(run_args(world, tmp_path, "--set", "data.on_bad_file=skip")) == 1
    err = capsys.readouterr().err
    assert f"{victim}: corrupt or truncated archive" in err and "nothing was computed" in err
    assert nothing_computed(tmp_path)


def test_skip_never_leaves_out_a_test_file_damaged_deep_inside(world, tmp_path, capsys):
    victim = DataRoot(world).graphs(TILE_XLA, "test")[0].path
    _flipped(victim)  # headers intact: found when the prune stage reads the data
    assert main(run_args(world, tmp_path, "--set", "data.on_bad_file=skip")) == 1
    err = capsys.readouterr().err
    assert str(victim) in err and "Traceback" not in err and not (tmp_path / "subs").exists()
    assert not list((tmp_path / "work").glob("train-*/*/manifest.json"))  # before any training
