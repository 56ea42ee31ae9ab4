"""One-command runs: submission rows, run folders, the ensemble stage, byte-identical reruns, cache
reuse, re-ensembling saved runs without training, and the demo, on the tiny synthetic world."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import pipelines.training.fit as train
from pipelines.cli import main
from pipelines.core.collection import TILE_XLA
from pipelines.config.settings import load_config
from pipelines.core.errors import ConfigError, FormatError, PipelineError, SubmissionError
from pipelines.core.predictions import prediction_frame, read_predictions
from pipelines.flows.run import (ensemble_runs, indexed_stage_count, resolve_models, run_pipeline, stage_index,
                                 stages_wall_time, train_and_blend)
from pipelines.flows.scores import submission_rows
from pipelines.outputs.run_folders import SUBMISSION_FILE, new_run_id, publish_submission
from pipelines.data.submission import read_submission, validate_submission
from tests.conftest import logged_messages


def fast_config(*extra: str):
    return load_config("smoke", extra)


# ----------------------------------------------------------------------------- pure parts


def test_submission_rows_take_top5_for_tile_and_full_order_for_layout_with_ties_by_index():
    tile = prediction_frame(collection="tile:xla", graph="t", split="test", fold=-1, seed=-1, model="ensemble",
                            scores=np.array([0.5, 0.1, 0.9, 0.1, 0.3, 0.2, 0.8]))
    layout = prediction_frame(collection="layout:nlp:random", graph="l", split="test", fold=-1, seed=-1,
                              model="ensemble", scores=np.array([0.2, 0.0, 0.2]))
    rows = submission_rows(pl.concat([layout, tile[::-1]]))  # row order must not matter
    assert rows == {"tile:xla:t": [1, 3, 5, 4, 0], "layout:nlp:random:l": [1, 0, 2]}

    with pytest.raises(FormatError, match="0..c-1"):
        submission_rows(tile.filter(pl.col("config_index") != 2))


def test_resolve_models_prefers_the_argument_and_checks_the_config():
    config = load_config("quick")
    assert resolve_models(config, ["gbdt", " random ", "gbdt"]) == ["gbdt", "random"]
    assert resolve_models(config, None) == list(config.ensemble.models)
    with pytest.raises(ConfigError, match="which run.models does not train"):
        resolve_models(load_config("quick", ["run.models=['gbdt']", "ensemble.models=['gbdt', 'gnn']"]), None)
    with pytest.raises(ConfigError):
        resolve_models(config, [" "])


def test_run_id_is_time_plus_payload_hash():
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    first = new_run_id({"config": 1}, now)
    assert first.startswith("20260102T030405Z-") and len(first) == len("20260102T030405Z-") + 8
    assert new_run_id({"config": 1}, now) == first != new_run_id({"config": 2}, now)


# ----------------------------------------------------------------------------- end to end (shared runs)


@pytest.fixture(scope="module")
def runs(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two runs of one config from scratch in separate work dirs, and a third reusing the first's."""
    base = tmp_path_factory.mktemp("runs")
    subs = base / "submissions"
    config = fast_config()
    out = {"root": tiny_world, "subs": subs, "work": base / "work-a"}
    out["a"] = run_pipeline(config, tiny_world, work_dir=base / "work-a", models=["gbdt", "random"],
                            submissions_dir=subs)
    out["b"] = run_pipeline(config, tiny_world, work_dir=base / "work-b", models=["gbdt", "random"],
                            submissions_dir=subs)
    with logged_messages() as lines:
        out["again"] = run_pipeline(config, tiny_world, work_dir=base / "work-a", models=["gbdt", "random"],
                                    submissions_dir=subs)
    out["again_log"] = lines
    return out


@pytest.mark.slow
def test_same_config_from_scratch_gives_byte_identical_valid_submissions(runs):
    a, b = runs["a"], runs["b"]
    assert a.run_id != b.run_id and a.submission != b.submission
    assert a.submission.read_bytes() == b.submission.read_bytes()
    assert validate_submission(a.submission, runs["root"]) == len(read_submission(a.submission)) > 0
    assert not list(a.run_dir.glob(".*"))  # the draft used for validation is gone
    assert a.computed and b.computed  # both really computed everything from scratch


@pytest.mark.slow
def test_second_run_in_the_same_work_dir_reuses_every_stage(runs):
    again = runs["again"]
    assert again.computed == ()
    assert not [line for line in runs["again_log"] if "computing" in line]
    numbered = [line.split(":", 1)[0] for line in runs["again_log"] if line.startswith("stage ")]
    assert numbered == [f"stage {i}/35" for i in range(1, 36)]  # 5 collections x (4 prepare + 2 models + ensemble)
    assert again.manifest["stages"] == runs["a"].manifest["stages"]
    assert again.submission.read_bytes() == runs["a"].submission.read_bytes()
    assert again.run_dir != runs["a"].run_dir  # a new folder, the old one untouched


@pytest.mark.slow
def test_a_cached_run_still_tells_the_compute_time_of_its_stages(runs):
    a, again, work = runs["a"], runs["again"], runs["work"]
    # Run a computed every stage of its own (a fresh work dir), each written once with its wall time.
    by_hand = sum(json.loads((work / ref / "manifest.json").read_text())["wall_time_s"] for ref in a.computed)
    assert len(set(a.computed)) == len(a.computed) > 0
    assert stages_wall_time(a.manifest["stages"], work) == pytest.approx(by_hand)
    # The rerun computed nothing; its stages are the same ones, so their time is the same.
    assert again.computed == ()
    assert stages_wall_time(again.manifest["stages"], work) == pytest.approx(by_hand)


@pytest.mark.slow
def test_a_cached_run_and_its_report_read_each_output_through_once(runs, monkeypatch):
    """Issue 71, class 2 (the check's cost): a cached run read every output of the work dir through twice
    (the ETA's listing of earlier stages hashed them all, then the reuse), and its report a third time
    for the stages it loads. Now the listing reads manifests and sizes, and a file verified unchanged
    in this process (inode, size, modification time) is not read again."""
    import pipelines.core.engine as engine
    from pipelines.reports.report import write_report

    work = runs["work"]
    outputs = {str(m.parent / item["path"]) for m in work.glob("*/*/manifest.json")
               for item in json.loads(m.read_text())["outputs"]}
    hashed: list[str] = []
    real = engine.file_sha256
    monkeypatch.setattr(engine, "file_sha256", lambda path: (hashed.append(str(path)), real(path))[1])
    engine._sha256_of_version.cache_clear()  # what a fresh process starts with
    again = run_pipeline(fast_config(), runs["root"], work_dir=work, models=["gbdt", "random"],
                         submissions_dir=runs["subs"])
    write_report(again.run_id, submissions_dir=runs["subs"], out=again.run_dir / "again.html")
    assert again.computed == () and hashed and set(hashed) <= outputs
    assert max(hashed.count(h) for h in set(hashed)) == 1
    before = len(hashed)
    assert engine.list_stages(work, verify_content=False) and len(hashed) == before  # manifests and sizes only
    victim = Path(next(p for p in sorted(outputs) if p.endswith(".parquet")))
    stage, key = victim.relative_to(work).parts[:2]
    original = victim.read_bytes()
    data = bytearray(original)
    data[len(data) // 2] ^= 1  # same size, a new modification time: read through again, and refused
    victim.write_bytes(bytes(data))
    try:
        assert engine._check_complete(work / stage / key, stage, key)[0] is None
    finally:
        victim.write_bytes(original)
    assert engine._check_complete(work / stage / key, stage, key)[0] is not None


def test_the_stage_index_counts_the_data_stages_of_collections_a_model_also_trains_on(tiny_world, tmp_path):
    # xla:random's GNN also trains on nlp:random's graphs: nlp:random is prepared but not scored
    config = fast_config("run.seeds=[0]", 'gnn.collections."layout:xla:random".passes_per_epoch=1',
                         'gnn.collections."layout:xla:random".extra_train_collections=["layout:nlp:random"]')
    runs, computed = train_and_blend(config, tiny_world, work_dir=tmp_path, models=["gnn"],
                                     collections=["layout:xla:random"])
    index = stage_index(runs)
    assert list(index) == ["layout:xla:random"]
    companion = index["layout:xla:random"]["companions"]["layout:nlp:random"]
    assert set(companion) == {"prune", "features", "node_arrays", "folds"}
    assert {f"{stage}/{key}" for stage, key in companion.items()} <= set(computed)
    # every computed stage is indexed once, so the index's compute time is the computed stages' time
    assert indexed_stage_count(index) == len(computed) == len(set(computed))
    by_hand = sum(json.loads((tmp_path / ref / "manifest.json").read_text())["wall_time_s"] for ref in computed)
    assert stages_wall_time(index, tmp_path) == pytest.approx(by_hand)


@pytest.mark.slow
def test_manifest_records_stages_scores_and_weights(runs):
    a = runs["a"]
    manifest = json.loads((a.run_dir / "manifest.json").read_text())
    assert manifest["run_id"] == a.run_id and manifest["data_root"] == str(runs["root"].resolve())
    assert manifest["config"]["folds"]["k"] == 2 and manifest["models"] == ["gbdt", "random"]
    assert len(manifest["collections"]) == 5 and "commit" in manifest["code_version"]
    for name, stages in manifest["stages"].items():
        for stage, key in stages["prepare"].items():
            assert (runs["work"] / stage / key / "manifest.json").is_file()
        for model, ref in stages["train"].items():
            assert (runs["work"] / ref["stage"] / ref["key"] / "manifest.json").is_file()
        weights = manifest["ensemble_weights"][name]
        assert set(weights) == {"gbdt", "random"} and sum(weights.values()) == pytest.approx(1.0)
        blend = manifest["cv_scores"][name]["blend"]
        # weights are fitted on OOF predictions and every single model is a candidate
        assert blend["ensemble"] >= max(blend["gbdt"], blend["random"]) - 1e-12
        assert manifest["cv_scores"][name]["training"]["gbdt"]["oof_score"] is not None
    combined = manifest["combined_oof"]
    assert combined["ensemble"]["complete"] and combined["ensemble"]["value"] >= combined["gbdt"]["value"] - 1e-12
    table = a.scores
    assert table.filter(pl.col("model") == "ensemble").height == 5 and table.height == 15


@pytest.mark.slow
def test_one_model_is_submitted_as_its_fold_averaged_normalised_test_scores(runs, tmp_path):
    root = runs["root"]
    result = run_pipeline(fast_config(), root, work_dir=runs["work"], models=["gbdt"],
                          submissions_dir=tmp_path / "subs")
    assert set(result.computed) == {f"ensemble/{s['ensemble']}" for s in result.manifest["stages"].values()}
    assert all(w == {"gbdt": 1.0} for w in result.manifest["ensemble_weights"].values())
    # By hand: min-max scale each fold model's scores per graph, average the fold models, order.
    expected = {}
    for name, stages in result.manifest["stages"].items():
        ref = stages["train"]["gbdt"]
        test = read_predictions(runs["work"] / ref["stage"] / ref["key"] / train.PREDICTIONS_FILE)
        for graph, part in test.filter(pl.col("split") == "test").partition_by("graph", as_dict=True).items():
            by_fold = [p.sort("config_index")["score"].to_numpy() for p in part.partition_by("fold")]
            scaled = [(s - s.min()) / (s.max() - s.min()) if s.max() > s.min() else np.full_like(s, 0.5)
                      for s in by_fold]
            frame = prediction_frame(collection=name, graph=graph[0], split="test", fold=-1, seed=-1,
                                     model="ensemble", scores=np.mean(scaled, axis=0))
            expected.update(submission_rows(frame))
    assert read_submission(result.submission) == expected


@pytest.mark.slow
def test_invalid_rows_are_refused_and_leave_no_run_folder(runs, tmp_path):
    rows = read_submission(runs["a"].submission)
    rows.pop(sorted(rows)[0])
    with pytest.raises(SubmissionError, match="missing"):
        publish_submission(rows, {"config": {}, "stages": {}}, data_root=runs["root"],
                           submissions_dir=tmp_path / "subs")
    assert list((tmp_path / "subs").iterdir()) == []


@pytest.mark.slow
def test_a_taken_run_id_gets_a_new_folder_never_the_old_one(runs, tmp_path, monkeypatch):
    import pipelines.outputs.run_folders as run_folders

    monkeypatch.setattr(run_folders, "new_run_id", lambda payload, now: "20260101T000000Z-deadbeef")
    taken = tmp_path / "subs" / "20260101T000000Z-deadbeef"
    taken.mkdir(parents=True)
    (taken / SUBMISSION_FILE).write_text("theirs")
    rows = read_submission(runs["a"].submission)
    run_id, path, _ = publish_submission(rows, {"config": {}, "stages": {}}, data_root=runs["root"],
                                         submissions_dir=tmp_path / "subs")
    assert run_id == "20260101T000000Z-deadbeef-2" and path.read_bytes() == runs["a"].submission.read_bytes()
    assert (taken / SUBMISSION_FILE).read_text() == "theirs"


# ----------------------------------------------------------------------------- re-ensembling


@pytest.mark.slow
def test_ensemble_command_reblends_saved_runs_without_training(runs, monkeypatch, capsys):
    root, subs = runs["root"], runs["subs"]
    other = run_pipeline(fast_config(), root, work_dir=runs["work"], models=["feature"], submissions_dir=subs)

    def no_training(*args, **kwargs):
        raise AssertionError("the ensemble command must not train")

    monkeypatch.setattr(train, "train_model", no_training)
    monkeypatch.setattr(train, "fit_predict_fold", no_training)
    first = runs["a"].run_id
    code = main(["ensemble", "--runs", first, other.run_id, "--submissions-dir", str(subs), "--method", "rank"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    path = Path(out[-1])
    assert path.name == SUBMISSION_FILE and validate_submission(path, root) > 0
    manifest = json.loads((path.parent / "manifest.json").read_text())
    assert manifest["kind"] == "ensemble" and manifest["source_runs"] == [first, other.run_id]
    assert manifest["config"]["ensemble"]["method"] == "rank"
    assert manifest["config"]["ensemble"]["min_gain_se"] == runs["a"].manifest["config"]["ensemble"]["min_gain_se"]
    assert manifest["config"]["ensemble"]["gain_at"] == runs["a"].manifest["config"]["ensemble"]["gain_at"]
    for weights in manifest["ensemble_weights"].values():
        assert set(weights) == {f"gbdt@{first}", f"random@{first}", f"feature@{other.run_id}"}
    tile = manifest["stages"]["tile:xla"]["train"]
    assert tile[f"gbdt@{first}"] == runs["a"].manifest["stages"]["tile:xla"]["train"]["gbdt"]

    # --models keeps models by base name
    code = main(["ensemble", "--runs", first, other.run_id, "--submissions-dir", str(subs), "--models", "gbdt",
                 "--min-gain-se", "0", "--gain-at", "test-runs"])
    path = Path(capsys.readouterr().out.strip().splitlines()[-1])
    manifest = json.loads((path.parent / "manifest.json").read_text())
    assert code == 0 and all(w == {f"gbdt@{first}": 1.0} for w in manifest["ensemble_weights"].values())
    assert manifest["config"]["ensemble"]["min_gain_se"] == 0.0
    assert manifest["config"]["ensemble"]["gain_at"] == "test-runs"
    with pytest.raises(ConfigError, match="gain_at"):
        ensemble_runs([first], submissions_dir=subs, gain_at="test")


@pytest.mark.slow
def test_ensemble_names_the_missing_stage_folder_when_the_cache_is_gone(runs, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(runs["work"], work)
    ref = runs["a"].manifest["stages"]["tile:xla"]["train"]["random"]
    shutil.rmtree(work / ref["stage"] / ref["key"])
    with pytest.raises(PipelineError, match=f"{ref['stage']}/{ref['key']}"):
        ensemble_runs([runs["a"].run_id], submissions_dir=runs["subs"], work_dir=work)


# ----------------------------------------------------------------------------- determinism, CLI, demo


def test_lightgbm_predictions_do_not_depend_on_the_thread_count(tiny_world, tmp_path):
    from pipelines.flows.prepare import prepare

    frames = []
    for threads in (1, 2):
        config = fast_config(f"gbdt.num_threads={threads}")
        work = tmp_path / f"work-{threads}"
        prepared = prepare(config, tiny_world, work, [TILE_XLA])[TILE_XLA.name]
        output = train.train_model(config, prepared, model="gbdt", work_dir=work)
        frames.append(read_predictions(output.file(train.PREDICTIONS_FILE)))
    assert frames[0].equals(frames[1])


@pytest.mark.slow
def test_training_stages_sharing_workers_give_the_results_of_stages_run_alone(tiny_world, tmp_path):
    from pipelines.core.collection import parse_collection
    from pipelines.flows.prepare import prepare
    from pipelines.flows.schedule import train_models

    config = fast_config("run.n_jobs=2", "gbdt.num_threads=0", "gnn.num_threads=0")  # smoke fixes 1 thread
    prepared = prepare(config, tiny_world, tmp_path / "work", [parse_collection("layout:xla:default")])  # fast fits
    models = ["gbdt", "gnn"]  # two stages, the GNN's result sensitive to its thread count
    with logged_messages() as lines:
        shared = train_models(config, prepared, models, work_dir=tmp_path / "shared")
    starts = [line.split("]")[1].split(":")[0].strip() for line in lines if "workers shared with" in line]
    assert starts == ["gnn", "gbdt"]  # long fold jobs first: the short ones fill the idle workers at the end
    for cname, item in prepared.items():
        for model in models:
            ours = shared[cname][model]
            alone = train.train_model(config, item, model=model, work_dir=tmp_path / "alone")
            assert ours.metrics["shared_workers"] and not alone.metrics["shared_workers"]
            assert ours.key == alone.key and not alone.cached
            assert ours.metrics["threads_per_job"] == alone.metrics["threads_per_job"]
            assert read_predictions(ours.file(train.PREDICTIONS_FILE)).equals(
                read_predictions(alone.file(train.PREDICTIONS_FILE)))


@pytest.mark.slow
def test_run_command_prints_the_table_and_the_submission_path_last(runs, tmp_path, capsys):
    code = main(["run", "--data-root", str(runs["root"]), "--work-dir", str(runs["work"]), "--config", "smoke",
                 "--models", "gbdt,random",
                 "--submissions-dir", str(tmp_path / "subs")])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and Path(out[-1]).read_bytes() == runs["a"].submission.read_bytes()
    assert out[-2].startswith("combined OOF score (mean of the 5 collections)")
    assert main(["run", "--data-root", str(runs["root"]), "--work-dir", str(tmp_path / "w"),
                 "--models", "nosuch", "--submissions-dir", str(tmp_path / "subs")]) == 2


@pytest.mark.slow
def test_demo_runs_the_pipeline_on_a_generated_world(runs, tmp_path, capsys):
    subs = tmp_path / "subs"
    code = main(["demo", "--data-root", str(runs["root"]), "--scale", "tiny", "--seed", "0", "--submissions-dir",
                 str(subs), "--work-dir", str(runs["work"]), "--config", "smoke",
                 "--set", "run.models=['gbdt']", "--set", "ensemble.models=['gbdt']"])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()  # the result is printed (also with --quiet), not logged
    path = Path(lines[-1])
    assert validate_submission(path, runs["root"]) > 0
    assert any("stages reused" in line for line in lines)
    assert lines[-2].startswith("combined OOF score")
    assert (path.parent / "report.html").is_file()  # the command draws the report after the flow


# ----------------------------------------------------------------------------- CLI papercuts


def test_demo_data_root_follows_the_scale(monkeypatch, tmp_path):
    import pipelines.flows.demo as demo
    import pipelines.reports.report as report

    seen = {}
    class Published:  # what the command reads of the demo's result
        run_id, submission, manifest, computed = "r", Path("s.csv"), {"stages": {}}, ()

        def describe(self) -> str:
            return ""

    monkeypatch.setattr(demo, "run_demo", lambda **kwargs: seen.update(kwargs) or Published())
    monkeypatch.setattr(demo, "demo_summary", lambda *args: "")
    monkeypatch.setattr(report, "write_run_report", lambda *args: None)
    with logged_messages() as lines:
        assert main(["demo", "--scale", "tiny"]) == 0
    assert seen["data_root"] == Path("data/synthetic-tiny") and seen["scale"] == "tiny"
    # the demo config's 5 folds do not fit the tiny world's 3 program families: smoke, and the line says why
    assert seen["config"] == "smoke" and lines[0].startswith("config: smoke (no --config given; the tiny world")
    assert main(["demo", "--scale", "tiny", "--data-root", str(tmp_path / "w")]) == 0
    assert seen["data_root"] == tmp_path / "w"
    with logged_messages() as lines:
        assert main(["demo"]) == 0 and main(["demo", "--scale", "tiny", "--config", "quick"]) == 0
    assert lines == ["config: demo (no --config given; the demo's config: base with a lighter GNN schedule and one "
                     "seed)", "config: quick (--config)"]
    assert seen["config"] == "quick"


def test_help_lists_every_model_carries_an_example_and_the_exit_codes(monkeypatch, capsys):
    import sys

    from pipelines.cli import build_parser
    from pipelines.config.registry import MODELS
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/tpugraphs", "train", "--help"])
    parser = build_parser()
    for command in ("train", "run", "runs", "predict", "submit", "demo", "score"):
        with pytest.raises(SystemExit) as raised:
            parser.parse_args([command, "--help"])
        assert raised.value.code == 0
        text = capsys.readouterr().out
        assert "example:\n  tpugraphs " + command in text, command
        assert "exit codes: 0 success, 1 data or pipeline error, 2 usage error" in text
        assert "``" not in text and "python -m pipelines" not in text
        if command == "train":
            assert all(model in text for model in MODELS)


def test_exit_codes_tell_usage_errors_from_pipeline_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as raised:
        main(["run", "--no-such-option"])
    assert raised.value.code == 2
    assert main(["config", "--set", "folds.k=1"]) == 2  # a bad config value: usage
    assert main(["runs", "list", "--submissions-dir", str(tmp_path / "missing")]) == 1  # a missing folder: data
    capsys.readouterr()


def test_stage_counter_adds_a_whole_run_eta_refined_as_stages_finish():
    import logging

    from pipelines.flows.schedule import StageCounter

    fresh = StageCounter(3, {"prune": 2, "ensemble": 1})
    record = logging.LogRecord("pipelines.core.engine", logging.INFO, "", 0, "a [prune] done 0123456789abcdef in 10.0s",
                               (), None)
    fresh.filter(record)
    # no ensemble timed anywhere: the ETA is a lower bound that says what it leaves out
    assert record.getMessage().endswith("(run ETA at least 10s, 1 stage not timed yet: ensemble)")
    first = StageCounter(3, {"prune": 1, "train-gnn": 2})
    record = logging.LogRecord("pipelines.core.engine", logging.INFO, "", 0, "a [prune] done 0123456789abcdef in 0.1s",
                               (), None)
    first.filter(record)  # nothing left is timed: no "~0s" that grows tenfold as the stages run
    assert record.getMessage().endswith("(run ETA not known yet, 2 stages not timed yet: train-gnn)")

    counter = StageCounter(4, {"prune": 2, "train-gbdt": 2}, history={"train-gbdt": [100.0]})

    def log(message: str) -> str:
        record = logging.LogRecord("pipelines.core.engine", logging.INFO, "", 0, message, (), None)
        counter.filter(record)
        return record.getMessage()

    assert log("a [prune] computing 0123456789abcdef") == "stage 1/4: a [prune] computing 0123456789abcdef"
    # one prune left (10 s as this one), two trainings (100 s each, from the work dir's history)
    assert log("a [prune] done 0123456789abcdef in 10.0s").endswith("(run ETA ~3m30s)")
    assert log("b [prune] cached 0123456789abcdee").startswith("stage 2/4:")  # cached: 0 s, one fewer
    log("a [train-gbdt] computing 0123456789abcded")
    assert log("a [train-gbdt] done 0123456789abcded in 40.0s").endswith("(run ETA ~40s)")  # this run's own time
    log("b [train-gbdt] computing 0123456789abcdec")
    assert "ETA" not in log("b [train-gbdt] done 0123456789abcdec in 40.0s")  # the last one
