"""Stage keys follow the code: an edit that changes what a stage runs recomputes it; a comment,
docstring or unrelated-module edit does not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.core import engine
from pipelines.core.engine import Code, code_fingerprint, stage_key
from pipelines.data.features import FEATURES_CODE
from pipelines.data.folds import FOLDS_CODE
from pipelines.data.prune import PRUNE_CODE

REPO = Path(__file__).resolve().parents[1]
GBDT_TRAIN_CODE = Code(("pipelines.training.fit",))
GNN_TRAIN_CODE = Code(("pipelines.training.fit", "pipelines.models.gnn"))


@pytest.fixture
def package_copy(tmp_path, monkeypatch) -> Path:
    """A copy of the ``pipelines`` sources that the fingerprints read instead of the real ones."""
    copy = tmp_path / "src" / "pipelines"
    shutil.copytree(REPO / "pipelines", copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(engine, "_PACKAGE_DIR", copy)
    _clear_caches()
    yield copy
    _clear_caches()


def _clear_caches() -> None:
    engine._code_fingerprint.cache_clear()
    engine._module_source.cache_clear()


def _fingerprints() -> dict[str, str]:
    _clear_caches()
    codes = {"prune": PRUNE_CODE, "features": FEATURES_CODE, "folds": FOLDS_CODE, "train-gbdt": GBDT_TRAIN_CODE,
             "train-gnn": GNN_TRAIN_CODE}
    return {name: code.fingerprint() for name, code in codes.items()}


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) >= 1, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


@pytest.mark.slow
def test_fingerprint_is_per_stage_and_ignores_comments_and_docstrings(package_copy):
    before = _fingerprints()
    assert len(set(before.values())) == len(before)

    # comments, docstrings and blank lines do not change what runs
    features = package_copy / "data" / "features.py"
    features.write_text("# a new comment\n\n" + features.read_text().replace('"""', '"""Reworded. ', 1))
    assert _fingerprints() == before

    # a real edit to the features module: features recomputes, and the GNN's training (its tile physics are
    # the features module's tile columns); prune, folds and the GBDT's training do not
    _edit(features, "def config_feature_table(", "UNUSED_CONSTANT = 3\n\n\ndef config_feature_table(")
    after = _fingerprints()
    assert after["features"] != before["features"] and after["train-gnn"] != before["train-gnn"]
    assert {k: after[k] for k in ("prune", "folds", "train-gbdt")} == {k: before[k] for k in ("prune", "folds", "train-gbdt")}

    # the layout geometry both read (chain ends, (8, 128) tile padding): features and the GNN's training
    _edit(package_copy / "data" / "layout_geometry.py", "def tile_padding(", "Z = 4\n\n\ndef tile_padding(")
    geometry = _fingerprints()
    assert geometry["features"] != after["features"] and geometry["train-gnn"] != after["train-gnn"]
    assert {k: geometry[k] for k in ("prune", "folds", "train-gbdt")} == {k: after[k] for k in ("prune", "folds", "train-gbdt")}
    after = geometry

    # a module a stage imports transitively (the reader, under prune) changes both prune and features
    _edit(package_copy / "data" / "tpugraphs.py", "from __future__ import annotations", "from __future__ import annotations\nX = 1")
    again = _fingerprints()
    assert again["prune"] != after["prune"] and again["features"] != after["features"]
    assert again["folds"] == after["folds"]

    # the GNN's internals change the GNN's training key only
    model = package_copy / "models" / "gnn" / "model.py"
    _edit(model, "from __future__ import annotations", "from __future__ import annotations\nY = 2")
    gnn = _fingerprints()
    assert gnn["train-gnn"] != again["train-gnn"]
    assert {k: v for k, v in gnn.items() if k != "train-gnn"} == {k: v for k, v in again.items() if k != "train-gnn"}


def test_library_versions_are_part_of_the_key(monkeypatch):
    key = stage_key("feat", {"a": 1}, {}, PRUNE_CODE)
    monkeypatch.setattr(engine, "library_versions", lambda: {**engine._library_versions(), "lightgbm": "99.0"})
    assert stage_key("feat", {"a": 1}, {}, PRUNE_CODE) != key


def test_unknown_module_is_an_error():
    with pytest.raises(Exception, match="no such module"):
        code_fingerprint(["pipelines.no_such_module"])


@pytest.mark.slow
def test_editing_a_stage_module_recomputes_that_stage_end_to_end(tmp_path, tiny_world):
    """Through the real command line: run prepare, edit a copy of the features module, run again."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "pipelines", src / "pipelines", ignore=shutil.ignore_patterns("__pycache__"))
    work = tmp_path / "work"

    first = _run_and_collect(src, tiny_world, work)
    assert all(first.values())

    comment_only = src / "pipelines" / "data" / "features.py"
    comment_only.write_text(comment_only.read_text() + "\n# nothing that runs\n")
    assert _run_and_collect(src, tiny_world, work) == first  # every stage reused

    _edit(src / "pipelines" / "data" / "features.py", "def config_feature_table(",
          "UNUSED_CONSTANT = 3\n\n\ndef config_feature_table(")
    second = _run_and_collect(src, tiny_world, work)
    assert second["features"] != first["features"]
    assert {s: second[s] for s in ("prune", "node_arrays", "folds")} == {s: first[s] for s in ("prune", "node_arrays", "folds")}
    assert len(_complete(work / "features")) == 2 and len(_complete(work / "prune")) == 1

    # the chain ends of the node arrays come from the layout geometry: editing it recomputes both
    _edit(src / "pipelines" / "data" / "layout_geometry.py", "def tile_padding(", "Z = 4\n\n\ndef tile_padding(")
    third = _run_and_collect(src, tiny_world, work)
    assert third["features"] != second["features"] and third["node_arrays"] != second["node_arrays"]
    assert {s: third[s] for s in ("prune", "folds")} == {s: second[s] for s in ("prune", "folds")}


def _complete(stage_dir: Path) -> list[Path]:
    return [p for p in stage_dir.iterdir() if (p / "manifest.json").is_file()]


def _run_and_collect(src: Path, data_root: Path, work: Path) -> dict[str, str]:
    """Run ``prepare`` with the package at ``src``; the key each stage's output got (the newest)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, "-m", "pipelines", "prepare", "--data-root", str(data_root), "--work-dir", str(work),
         "--collections", "layout:xla:random", "--set", "folds.k=2",
         "--set", "gnn.extra_train_collections=[]"],  # only xla:random's stages (base adds nlp:random's)
        cwd=src, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    keys = {}
    for stage in ("prune", "features", "node_arrays", "folds"):
        newest = max(_complete(work / stage), key=lambda p: (p / "manifest.json").stat().st_mtime_ns)
        keys[stage] = newest.name
    return keys


def test_type_checking_imports_are_not_followed(package_copy):
    """The stage modules import the config class for type hints only: an edit of config.py reaches
    their keys as resolved values, not as code, so the data stages' code keys ignore it."""
    before = _fingerprints()
    _edit(package_copy / "config" / "settings.py", "from __future__ import annotations", "from __future__ import annotations\nZ = 3")
    after = _fingerprints()
    data_stages = ("prune", "features", "folds")
    assert {k: after[k] for k in data_stages} == {k: before[k] for k in data_stages}
