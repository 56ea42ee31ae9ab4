"""Saved fold models, ``predict`` without training, and training stages that resume after a kill."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import pipelines.training.fit as train
from pipelines.cli import main
from pipelines.core.collection import TILE_XLA, parse_collection
from pipelines.config.settings import load_config
from pipelines.core.errors import ConfigError, PipelineError
from pipelines.flows.predict import predict_run
from pipelines.flows.prepare import prepare
from pipelines.reports.report import write_run_report
from pipelines.flows.run import run_pipeline
from pipelines.data.submission import validate_submission

pytestmark = pytest.mark.slow  # end-to-end: left out of make test-quick

# On top of the smoke config: a GNN small enough for seconds per fold on one core, trained a few epochs.
TINY_GNN = ["gnn.epochs=3", "gnn.patience=0", "gnn.hidden=8", "gnn.free_layers=1", "gnn.configs_per_graph=4",
            "gnn.eval_max_configs=16"]


@pytest.fixture(scope="module")
def run(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("predict")
    result = run_pipeline(load_config("smoke"), tiny_world, work_dir=base / "work", models=["gbdt", "feature"],
                          submissions_dir=base / "subs")
    return {"result": result, "base": base, "root": tiny_world}


def test_training_stage_keeps_every_fold_model_with_its_hash(run):
    result = run["result"]
    ref = result.manifest["stages"][TILE_XLA.name]["train"]["gbdt"]
    folder = run["base"] / "work" / ref["stage"] / ref["key"]
    models = json.loads((folder / "manifest.json").read_text())["metrics"]["models"]
    assert sorted((m["fold"], m["seed"]) for m in models) == [(0, 0), (1, 0)]
    for entry in models:
        text_model = next(f for f in entry["files"] if f.endswith(".txt"))
        assert (folder / text_model).read_text().startswith("tree")  # a LightGBM text model
        for name in entry["files"]:
            assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == entry["sha256"][name]
    assert not list((run["base"] / "work" / ref["stage"]).glob(".folds-*"))  # finished: no partial folder left


def test_predict_on_the_original_data_root_reproduces_the_csv_byte_for_byte(run, monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("predict must not train")

    monkeypatch.setattr(train, "fit_predict_fold", no_training)
    source = run["result"]
    again = predict_run(source.run_id, run["root"], submissions_dir=run["base"] / "subs")
    assert again.run_id != source.run_id
    assert again.submission.read_bytes() == source.submission.read_bytes()
    assert again.manifest["kind"] == "predict" and again.manifest["source_run"] == source.run_id
    write_run_report(again.run_id, run["base"] / "subs")
    report = (again.run_dir / "report.html").read_text(encoding="utf-8")
    assert f"ranked by the saved fold models and blend weights of run {source.run_id}" in report


def test_predict_ranks_a_new_data_root_holding_only_test_graphs(run, tmp_path):
    from pipelines.data.root import DataRoot

    new_root = tmp_path / "mine"
    shutil.copytree(run["root"], new_root)
    for collection in run["result"].manifest["collections"]:
        for split in ("train", "valid"):
            shutil.rmtree(DataRoot(new_root).split_dir(parse_collection(collection), split), ignore_errors=True)
    code = main(["predict", "--run", run["result"].run_id, "--data-root", str(new_root),
                 "--submissions-dir", str(run["base"] / "subs")])
    assert code == 0
    latest = sorted((run["base"] / "subs").iterdir())[-1]
    assert validate_submission(latest / "submission.csv", new_root) > 0
    assert (latest / "submission.csv").read_bytes() == run["result"].submission.read_bytes()


def test_predict_into_another_work_dir_finds_the_models_through_the_manifest(run, tmp_path):
    other = tmp_path / "other"
    again = predict_run(run["result"].run_id, run["root"], submissions_dir=run["base"] / "subs", work_dir=other)
    assert again.submission.read_bytes() == run["result"].submission.read_bytes()
    assert sorted(p.name for p in other.iterdir() if not p.name.startswith(".")) == ["features", "node_arrays",
                                                                                      "prune"]
    ref = again.manifest["stages"][TILE_XLA.name]["train"]["gbdt"]
    assert Path(ref["work_dir"]) == (run["base"] / "work").resolve()  # where its models were found


def test_predict_without_the_sample_submission_fails_before_any_stage(run, tmp_path):
    root = tmp_path / "no-sample"
    shutil.copytree(run["root"], root, ignore=lambda folder, names: [n for n in names if n == "sample_submission.csv"])
    with pytest.raises(PipelineError, match="sample_submission.csv"):
        predict_run(run["result"].run_id, root, submissions_dir=run["base"] / "subs", work_dir=tmp_path / "work")
    assert not (tmp_path / "work").exists()


def test_predict_refuses_a_tampered_model(run, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(run["base"] / "work", work)
    ref = run["result"].manifest["stages"][TILE_XLA.name]["train"]["gbdt"]
    model = sorted((work / ref["stage"] / ref["key"] / "models").glob("*.txt"))[0]
    model.write_text(model.read_text().replace("tree", "TREE", 1))  # same size: the stage still looks complete
    with pytest.raises(PipelineError, match="SHA-256"):
        predict_run(run["result"].run_id, run["root"], submissions_dir=run["base"] / "subs", work_dir=work)


# ----------------------------------------------------------------------------- resume after a kill


class Killed(BaseException):
    """Stands in for SIGKILL: nothing after it runs, the stage's work folder is abandoned."""


def _train_killed_after(config, prepared, model, work, jobs_done, monkeypatch):
    """Train until ``jobs_done`` fold jobs have finished, then die as a killed process would."""
    real = train.fit_predict_fold
    calls = []

    def dying(*args, **kwargs):
        if len(calls) == jobs_done:
            raise Killed()
        calls.append(args[5:7])
        return real(*args, **kwargs)

    monkeypatch.setattr(train, "fit_predict_fold", dying)
    with pytest.raises(Killed):
        train.train_model(config, prepared, model=model, work_dir=work)
    monkeypatch.setattr(train, "fit_predict_fold", real)
    return calls


def test_a_killed_training_stage_trains_only_the_unfinished_folds_and_gives_the_same_bytes(tiny_world, tmp_path,
                                                                                          monkeypatch, caplog):
    config = load_config("smoke", ["folds.k=3", "run.seeds=[0, 1]"])
    prepared = prepare(config, tiny_world, tmp_path / "work", [TILE_XLA])[TILE_XLA.name]
    reference = train.train_model(config, prepared, model="gbdt", work_dir=tmp_path / "clean")

    done_before = _train_killed_after(config, prepared, "gbdt", tmp_path / "work", 4, monkeypatch)
    trained_after = []
    real = train.fit_predict_fold
    monkeypatch.setattr(train, "fit_predict_fold", lambda *a, **k: trained_after.append(a[5:7]) or real(*a, **k))
    caplog.set_level(logging.INFO, logger="pipelines")
    caplog.clear()
    resumed = train.train_model(config, prepared, model="gbdt", work_dir=tmp_path / "work")
    lines = caplog.messages
    assert len(done_before) == 4 and len(trained_after) == 2
    assert not set(done_before) & set(trained_after)
    assert any("resuming: 4 of 6 fold jobs already done" in line for line in lines)
    jobs = [line for line in lines if " fold job " in line]
    assert [line.split(" fold job ")[1].split()[0] for line in jobs] == ["5/6", "6/6"]
    assert "ETA" in jobs[0] and "ETA" not in jobs[1]
    assert resumed.key == reference.key and resumed.metrics["resumed_fold_jobs"] == 4
    for name in (train.PREDICTIONS_FILE, train.SCORES_FILE, train.IMPORTANCE_FILE):
        assert (resumed.path / name).read_bytes() == (reference.path / name).read_bytes(), name


def test_fold_jobs_keep_their_threads_when_resumed_or_bound_by_memory(tiny_world, tmp_path, monkeypatch, caplog):
    # A GNN fit's floats depend on its thread count: a resumed stage with one fold job left, or one the
    # free memory lets run only one job at a time, must give each job the threads of a fresh stage.
    monkeypatch.setattr(train, "available_cores", lambda: 2)
    base = ["folds.k=3", "run.seeds=[0, 1]", "gbdt.num_threads=0"]  # smoke fixes 1 thread
    config = load_config("smoke", base + ["run.n_jobs=2"])
    prepared = prepare(config, tiny_world, tmp_path / "work", [TILE_XLA])[TILE_XLA.name]
    assert train.stage_job_threads(2, 6) == 1 and train.stage_job_threads(2, 1) == 2

    _train_killed_after(load_config("smoke", base), prepared, "gbdt", tmp_path / "work", 5, monkeypatch)
    threads = []
    real = train.fit_predict_fold
    monkeypatch.setattr(train, "fit_predict_fold", lambda *a, **k: threads.append(a[7]) or real(*a, **k))
    resumed = train.train_model(config, prepared, model="gbdt", work_dir=tmp_path / "work")
    assert resumed.metrics["resumed_fold_jobs"] == 5
    assert threads == [1]  # a fresh stage of 6 jobs on 2 workers: 1 thread each

    threads.clear()
    monkeypatch.setattr(train, "available_memory", lambda: 1)  # room for one job at a time
    caplog.set_level(logging.INFO, logger="pipelines")
    bound = train.train_model(config, prepared, model="gbdt", work_dir=tmp_path / "bound")
    assert any("1 job(s) x 1 thread(s)" in line for line in caplog.messages)
    assert threads == [1] * 6 and bound.metrics["threads_per_job"] == 1

    threads.clear()  # a model's own thread count (num_threads > 0) wins over the stage's share
    fixed = load_config("smoke", base[:2] + ["run.n_jobs=2", "gbdt.num_threads=3"])
    assert train.train_model(fixed, prepared, model="gbdt", work_dir=tmp_path / "fixed").metrics["threads_per_job"] == 3
    assert threads == [3] * 6


def test_predict_loads_fold_models_with_the_threads_their_stage_used(tiny_world, tmp_path, monkeypatch):
    from pipelines.models.gnn import GNNRanker
    from pipelines.flows.predict import predict_test

    config = load_config("smoke", TINY_GNN + ["gnn.num_threads=2"])
    prepared = prepare(config, tiny_world, tmp_path / "work", [TILE_XLA])[TILE_XLA.name]
    output = train.train_model(config, prepared, model="gnn", work_dir=tmp_path / "work")
    assert output.metrics["threads_per_job"] == 2
    loaded_with = []
    real_load = GNNRanker.load.__func__
    monkeypatch.setattr(GNNRanker, "load", classmethod(
        lambda cls, *a, **k: loaded_with.append(k.get("num_threads")) or real_load(cls, *a, **k)))
    again = predict_test(output, prepared)  # a GNN's last bits depend on its thread count
    assert loaded_with == [2, 2]  # one per fold model, as the stage predicted
    stage = pl.read_parquet(output.path / train.PREDICTIONS_FILE).filter(pl.col("split") == "test")
    assert np.array_equal(again["score"].to_numpy(), stage["score"].to_numpy())
    predict_test(output, prepared, num_threads=1)  # an explicit count wins
    assert loaded_with[2:] == [1, 1]


def test_a_killed_run_restarts_and_submits_the_same_csv(tiny_world, tmp_path, monkeypatch):
    config = load_config("smoke", ["folds.k=3"])
    real = train.fit_predict_fold
    calls = []

    def dying(*args, **kwargs):
        if len(calls) == 2:
            raise Killed()
        calls.append(args[5:7])
        return real(*args, **kwargs)

    monkeypatch.setattr(train, "fit_predict_fold", dying)
    with pytest.raises(Killed):
        run_pipeline(config, tiny_world, work_dir=tmp_path / "work", models=["gbdt"],
                     submissions_dir=tmp_path / "subs")
    monkeypatch.setattr(train, "fit_predict_fold", real)
    resumed = run_pipeline(config, tiny_world, work_dir=tmp_path / "work", models=["gbdt"],
                           submissions_dir=tmp_path / "subs")
    clean = run_pipeline(config, tiny_world, work_dir=tmp_path / "clean", models=["gbdt"],
                         submissions_dir=tmp_path / "subs")
    assert resumed.submission.read_bytes() == clean.submission.read_bytes()
    tile = resumed.manifest["stages"][TILE_XLA.name]["train"]["gbdt"]
    stage = load_stage_manifest(tmp_path / "work", tile)
    assert stage["metrics"]["resumed_fold_jobs"] == 2


def load_stage_manifest(work: Path, ref: dict) -> dict:
    return json.loads((work / ref["stage"] / ref["key"] / "manifest.json").read_text())


def test_a_killed_gnn_fold_resumes_from_its_last_epoch_with_the_same_predictions(tiny_world, tmp_path, monkeypatch,
                                                                                 caplog):
    from pipelines.models.gnn import trainer

    config = load_config("smoke", TINY_GNN)
    prepared = prepare(config, tiny_world, tmp_path / "work", [TILE_XLA])[TILE_XLA.name]
    reference = train.train_model(config, prepared, model="gnn", work_dir=tmp_path / "clean")

    real_save = trainer.save_checkpoint
    saved = []

    def dying_save(*args):
        real_save(*args)
        saved.append(args[5].epoch)  # the TrainState
        if len(saved) == 5:  # fold 0 finished (3 epochs), fold 1 killed after its 2nd epoch
            raise Killed()

    monkeypatch.setattr(trainer, "save_checkpoint", dying_save)
    with pytest.raises(Killed):
        train.train_model(config, prepared, model="gnn", work_dir=tmp_path / "work")
    monkeypatch.setattr(trainer, "save_checkpoint", real_save)
    assert saved == [1, 2, 3, 1, 2]

    caplog.set_level(logging.INFO, logger="pipelines")
    caplog.clear()
    epochs_trained = []
    monkeypatch.setattr(trainer, "save_checkpoint",
                        lambda *a: epochs_trained.append(a[5].epoch) or real_save(*a))
    resumed = train.train_model(config, prepared, model="gnn", work_dir=tmp_path / "work")
    assert epochs_trained == [3]  # only fold 1's last epoch
    assert any("resuming: 1 of 2 fold jobs" in line for line in caplog.messages)
    ours = pl.read_parquet(resumed.path / train.PREDICTIONS_FILE)
    theirs = pl.read_parquet(reference.path / train.PREDICTIONS_FILE)
    assert ours.equals(theirs)
    assert np.array_equal(ours["score"].to_numpy(), theirs["score"].to_numpy())
    # the saved fold models too, byte for byte (weights, config, per-epoch losses and scores; no wall times),
    # and so every output file the stage manifest lists with its SHA-256
    models = sorted((reference.path / train.MODELS_DIR).iterdir())
    assert models and all((resumed.path / train.MODELS_DIR / m.name).read_bytes() == m.read_bytes() for m in models)
    assert resumed.manifest["outputs"] == reference.manifest["outputs"]


def test_predict_valid_split_needs_held_out_valid_graphs_and_then_score_scores_it(run, tiny_world, tmp_path, capsys):
    with pytest.raises(ConfigError, match="holdout_valid"):
        predict_run(run["result"].run_id, run["root"], submissions_dir=run["base"] / "subs", split="valid")

    subs = tmp_path / "subs"
    held_out = run_pipeline(load_config("smoke", ["folds.holdout_valid=true"]), tiny_world,
                            work_dir=tmp_path / "work", models=["feature"], submissions_dir=subs)
    assert main(["predict", "--run", held_out.run_id, "--data-root", str(tiny_world), "--split", "valid",
                 "--submissions-dir", str(subs)]) == 0
    path = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["score", "--data-root", str(tiny_world), "--split", "valid", str(path)]) == 0
    assert "combined" in capsys.readouterr().out.lower()

    # a test submission given to score: says why it cannot be scored and what to do instead
    assert main(["score", "--data-root", str(tiny_world), "--split", "valid",
                 str(held_out.submission)]) == 1
    err = capsys.readouterr().err
    assert "ranks another split" in err and "predict --run RUN_ID --split valid" in err
