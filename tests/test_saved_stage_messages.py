"""Issue 71, class 7: messages about the stages a run names say what is wrong. A resized model file
was reported as the models being "gone" by report and ensemble --runs (the engine knew it was damaged);
``ensemble --runs`` on a predict run blamed a graph missing from the prepared data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.config.settings import load_config
from pipelines.flows.run import run_pipeline


@pytest.fixture(scope="module")
def published(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    base = tmp_path_factory.mktemp("messages")
    result = run_pipeline(load_config("smoke"), tiny_world, work_dir=base / "work", models=["random"],
                          submissions_dir=base / "subs")
    return base, result.run_id


def private_copy(published, tmp_path: Path) -> tuple[Path, Path, str]:
    """The run's work dir and submissions folder copied, the manifest pointing at the copied work dir."""
    base, run_id = published
    work, subs = tmp_path / "work", tmp_path / "subs"
    shutil.copytree(base / "work", work)
    shutil.copytree(base / "subs", subs)
    path = subs / run_id / "manifest.json"
    path.write_text(path.read_text().replace(str((base / "work").resolve()), str(work.resolve()))
                    .replace(str(base / "work"), str(work)))
    return work, subs, run_id


def training_stage(work: Path) -> Path:
    return sorted(p for p in (work / "train-random").iterdir() if not p.name.startswith("."))[0]


@pytest.mark.parametrize("command", ["report", "ensemble", "predict"])
def test_a_resized_model_file_is_named_as_damaged_never_gone(published, tiny_world, tmp_path, capsys, command):
    work, subs, run_id = private_copy(published, tmp_path)
    model = sorted((training_stage(work) / "models").iterdir())[0]
    model.write_bytes(model.read_bytes() + b" ")
    args = {"report": ["report", run_id, "--out", str(tmp_path / "r.html")], "ensemble": ["ensemble", "--runs", run_id],
            "predict": ["predict", "--run", run_id, "--data-root", str(tiny_world)]}[command]
    assert main([*args, "--submissions-dir", str(subs)]) == 1
    err = capsys.readouterr().err
    assert f"damaged: {model} has" in err and "gone" not in err, err


@pytest.mark.parametrize("command", ["report", "ensemble"])
def test_a_deleted_stage_folder_is_gone(published, tmp_path, capsys, command):
    work, subs, run_id = private_copy(published, tmp_path)
    stage = training_stage(work)
    shutil.rmtree(stage)
    args = (["report", run_id, "--out", str(tmp_path / "r.html")] if command == "report"
            else ["ensemble", "--runs", run_id])
    assert main([*args, "--submissions-dir", str(subs)]) == 1
    assert f"is gone: {stage}" in capsys.readouterr().err


def test_ensemble_of_a_predict_run_says_it_is_one(published, tiny_world, tmp_path, capsys):
    work, subs, run_id = private_copy(published, tmp_path)
    assert main(["predict", "--run", run_id, "--data-root", str(tiny_world), "--submissions-dir", str(subs)]) == 0
    predicted = next(p.name for p in subs.iterdir() if p.name != run_id and
                     json.loads((p / "manifest.json").read_text()).get("kind") == "predict")
    capsys.readouterr()
    assert main(["ensemble", "--runs", predicted, "--submissions-dir", str(subs)]) == 2
    err = capsys.readouterr().err
    assert f"run {predicted} is a 'predict' run" in err and f"its source run {run_id}" in err
    assert "in the prepared data" not in err
