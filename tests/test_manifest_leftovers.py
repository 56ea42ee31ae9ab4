"""Leftovers of the previous attack (issue 78): a run manifest that records no ``work_dir`` (edited by
hand, or of an early version) is a clean error that says to pass ``--work-dir``, in every command that
reads a run's stages, never a KeyError traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipelines.cli import main

RUN = "20261201T000000Z-aaaaaaaa"


def _program(folder: Path) -> Path:
    """A one-dot HLO module for `rank`."""
    path = folder / "dot.txt"
    path.write_text("HloModule m\n\nENTRY e {\n  p = f32[4,8]{1,0} parameter(0)\n  q = f32[8,4]{1,0} parameter(1)\n"
                    "  ROOT d = f32[4,4]{1,0} dot(p, q), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n")
    return path


@pytest.fixture
def subs(tmp_path: Path, tiny_world: Path) -> Path:
    folder = tmp_path / "subs" / RUN
    folder.mkdir(parents=True)
    shutil.copy(tiny_world / "sample_submission.csv", folder / "submission.csv")
    (folder / "manifest.json").write_text(json.dumps({
        "run_id": RUN, "kind": "run", "data_root": str(tiny_world), "collections": ["tile:xla", "layout:xla:default"],
        "config": {"ensemble": {"method": "minmax"}},
        "stages": {name: {"prepare": {"prune": "0" * 16}, "ensemble": "2" * 16,
                          "train": {"random": {"stage": "train-random", "key": "1" * 16}}}
                   for name in ("tile:xla", "layout:xla:default")}}))
    return tmp_path / "subs"


@pytest.mark.parametrize("command", [
    lambda subs, root: ["report", RUN, "--out", str(subs.parent / "r.html")],
    lambda subs, root: ["predict", "--run", RUN, "--data-root", str(root)],
    lambda subs, root: ["ensemble", "--runs", RUN],
    lambda subs, root: ["evaluate", RUN, "--data-root", str(root)],
    lambda subs, root: ["rank", "--run", RUN, str(_program(subs.parent)), "--out", str(subs.parent / "ranked")],
], ids=["report", "predict", "ensemble", "evaluate", "rank"])
def test_a_run_manifest_without_work_dir_asks_for_one(subs, tiny_world, capsys, command):
    assert main([*command(subs, tiny_world), "--submissions-dir", str(subs)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "records no work dir" in err and "--work-dir" in err and RUN in err
