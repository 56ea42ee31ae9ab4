"""Issue 71, class 2: a stage output file that cannot be parsed (written cut short or as garbage, its
manifest's hash matching) is a FormatError naming the file and its stage folder, never a polars or
zipfile traceback."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipelines.cli import main
from pipelines.core.errors import FormatError
from pipelines.core.stage_files import read_parquet
from pipelines.data.node_arrays import load_graph_arrays

DAMAGE = {
    "truncated": lambda data: data[: len(data) // 2],
    "garbage": lambda data: os.urandom(len(data)),
    "empty": lambda data: b"",
}


def reseal(target: Path, damage) -> None:
    """Damage ``target`` and record the damaged bytes in its stage manifest, as a writer cut short
    before hashing would have: the engine's checksums then pass, the parser is what must refuse."""
    data = damage(target.read_bytes())
    target.write_bytes(data)
    folder = next(p for p in target.parents if (p / "manifest.json").is_file())
    manifest = json.loads((folder / "manifest.json").read_text())
    rel = target.relative_to(folder).as_posix()
    for item in manifest["outputs"]:
        if item["path"] == rel:
            item["bytes"], item["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_an_unreadable_parquet_file_is_an_error_naming_it_and_its_stage_folder(tmp_path, kind):
    folder = tmp_path / "features" / "0123abcd"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text("{}")
    target = folder / "train" / "table.parquet"
    target.parent.mkdir()
    pl.DataFrame({"a": list(range(100))}).write_parquet(target)
    target.write_bytes(DAMAGE[kind](target.read_bytes()))
    with pytest.raises(FormatError) as caught:
        read_parquet(target)
    assert caught.value.path == target and str(folder) in str(caught.value) and "--force" in str(caught.value)


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_unreadable_cached_graph_arrays_are_an_error_naming_the_file(tmp_path, kind):
    target = tmp_path / "g.npz"
    np.savez(target, meta=np.array(["tile:xla", "g", "train"]), x=np.zeros(3))
    target.write_bytes(DAMAGE[kind](target.read_bytes()))
    with pytest.raises(FormatError, match="unreadable cached graph arrays") as caught:
        load_graph_arrays(target)
    assert caught.value.path == target


@pytest.mark.parametrize("stage, pattern, model", [("features", "*/train/graph_features.parquet", "gbdt"),
                                                    ("node_arrays", "*/train/*.npz", "gnn")])
def test_a_run_on_a_cached_stage_output_written_unreadable_stops_naming_the_file(tiny_world, tmp_path, capsys,
                                                                              stage, pattern, model):
    args = ["train", "--data-root", str(tiny_world), "--work-dir", str(tmp_path / "work"), "--config", "smoke",
            "--collections", "layout:nlp:random", "--model", model, "--set", "gbdt.n_estimators=5"]
    assert main(["prepare", *args[1:5], "--config", "smoke", "--collections", "layout:nlp:random"]) == 0
    target = sorted((tmp_path / "work" / stage).glob(pattern))[0]
    reseal(target, DAMAGE["garbage"])
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"error: {target}: unreadable" in err and "Traceback" not in err
