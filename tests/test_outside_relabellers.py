"""``benchmarks.outside_world_d`` and ``benchmarks.outside_world_e``: two outside authors' cost models,
each relabelling a world's graphs (written blind, from public facts).

Only their shared contract is tested here (what they keep, what they rewrite, their refusals), never
their rules: those stay out of the model work (their READMEs).
"""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipelines.core.collection import ALL_COLLECTIONS
from pipelines.data.root import DataRoot
from pipelines.data.submission import read_submission
from pipelines.flows.evaluate import SUBMISSION, evaluate_rows


@pytest.fixture(scope="module")
def source(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny world with the sidecar an outside world carries (programs and compiler defaults)."""
    root = tmp_path_factory.mktemp("world-d-source") / "in"
    shutil.copytree(tiny_world, root)
    graphs = {c.name: [ref.stem for split in ("train", "valid", "test") for ref in DataRoot(root).graphs(c, split)]
              for c in ALL_COLLECTIONS}
    (root / "labels" / "programs.json").write_text(json.dumps(
        {name: {stem: {"kind": "cnn", "program": "tiny"} for stem in stems} for name, stems in graphs.items()}))
    (root / "labels" / "defaults.json").write_text(json.dumps(
        {name: {stem: 0 for stem in stems} for name, stems in graphs.items()}))
    return root


@pytest.fixture(scope="module", params=["outside_world_d", "outside_world_e"])
def author(request: pytest.FixtureRequest) -> str:
    return request.param


def relabel_main(author: str, argv: list[str]) -> int:
    return importlib.import_module(f"benchmarks.{author}.__main__").main(argv)


@pytest.fixture(scope="module")
def relabelled(source: Path, author: str) -> Path:
    out = source.parent / f"out-{author}"
    assert relabel_main(author, ["--in", str(source), "--out", str(out), "--seed", "3", "--quiet"]) == 0
    return out


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_relabelled_world_keeps_graphs_and_configs_and_rewrites_runtimes(source: Path, relabelled: Path,
                                                                          author: str) -> None:
    selfcheck = importlib.import_module(f"benchmarks.{author}.selfcheck").main
    assert selfcheck([str(relabelled), "--in", str(source)]) == 0
    assert json.loads((relabelled / "labels" / "labels.json").read_text())["generator"] == author
    changed = 0
    for collection in ALL_COLLECTIONS:
        for split in ("train", "valid", "test"):
            for ref in DataRoot(source).graphs(collection, split):
                before, after = np.load(ref.path), np.load(relabelled / ref.path.relative_to(source))
                for key in before.files:
                    if key not in ("config_runtime", "config_runtime_normalizers") or split == "test":
                        np.testing.assert_array_equal(before[key], after[key], err_msg=f"{ref.path}: {key}")
                if split != "test":
                    assert (after["config_runtime"] > 0).all()
                    changed += not np.array_equal(before["config_runtime"], after["config_runtime"])
    assert changed > 0
    # the test split is scored on the new hidden labels
    scores = evaluate_rows(relabelled, {SUBMISSION: read_submission(relabelled / "sample_submission.csv")})
    assert set(scores.collection_scores(SUBMISSION)) == {c.name for c in ALL_COLLECTIONS}


def test_the_same_input_and_seed_give_the_same_bytes(source: Path, relabelled: Path, author: str, tmp_path: Path) -> None:
    again = tmp_path / "again"
    assert relabel_main(author, ["--in", str(source), "--out", str(again), "--seed", "3", "--quiet"]) == 0
    assert _files(again) == _files(relabelled)


def test_bad_input_and_a_used_output_are_refused_before_any_work(source: Path, author: str, tmp_path: Path,
                                                                capsys) -> None:
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("a user's file")
    assert relabel_main(author, ["--in", str(source), "--out", str(used), "--seed", "1"]) == 2
    assert "not empty" in capsys.readouterr().err and (used / "keep.txt").read_text() == "a user's file"
    assert relabel_main(author, ["--in", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o"), "--seed", "1"]) == 2
    assert "not a TpuGraphs world" in capsys.readouterr().err and not (tmp_path / "o").exists()
