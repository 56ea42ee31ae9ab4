"""The loop around runs: ``runs compare``'s tests on real tiny runs, names, notes, reruns, prefixes,
``runs rm``, train/tune rows, ``submissions sync`` (the kaggle package faked), the synthetic-world
refusal, ``evaluate``'s intervals and the MLflow round trip (a real local store)."""

from __future__ import annotations

import enum
import os
import json
import shutil
import types
from datetime import datetime, timezone
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.config.settings import load_config
from pipelines.flows.run import run_pipeline
from pipelines.outputs import runs_table as runs
from pipelines.outputs.kaggle_io import COMPETITION
from tests.test_kaggle_io import fake, no_credentials  # noqa: F401  (fixtures: a fake kaggle package)

pytestmark = pytest.mark.slow  # end-to-end: left out of make test-quick


@pytest.fixture(scope="module")
def loop_runs(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Five runs under one submissions folder: A (random+feature, seed 0), its cached rerun, A with
    seed 1, and random alone vs feature alone (a real change)."""
    base = tmp_path_factory.mktemp("loop")
    smoke = load_config("smoke")
    seed1 = load_config("smoke", ["run.seeds=[1]"])
    kw = {"work_dir": base / "work", "submissions_dir": base / "subs"}
    made = {
        "a": run_pipeline(smoke, tiny_world, models=["random", "feature"], extra={"name": "first", "note": "opening"},
                          **kw),
        "rerun": run_pipeline(smoke, tiny_world, models=["random", "feature"], **kw),
        "seed1": run_pipeline(seed1, tiny_world, models=["random", "feature"], extra={"name": "seed1"}, **kw),
        "random": run_pipeline(smoke, tiny_world, models=["random"], **kw),
        "feature": run_pipeline(smoke, tiny_world, models=["feature"], **kw),
    }
    return {"runs": made, "subs": base / "subs", "work": base / "work"}


def test_runs_compare_says_no_detectable_difference_for_a_seed_and_b_better_for_a_real_change(loop_runs, capsys):
    made, subs = loop_runs["runs"], str(loop_runs["subs"])
    # names and unique prefixes of the hex part are run-ids too
    assert main(["runs", "compare", "first", made["seed1"].run_id.split("-")[1][:6], "--submissions-dir", subs]) == 0
    out = capsys.readouterr().out
    assert "config differences (1):" in out and "run.seeds  A [0]  B [1]" in out
    tests = out[out.index("is B - A real?"):].splitlines()
    ensemble = [line for line in tests if " ensemble " in line and not line.startswith("rule:")]
    # another seed of the random model: no difference; where the blend kept the (seedless) feature model
    # alone, the same score on every graph, reported as identical and not tested
    assert len(ensemble) == 6 and all("no detectable difference" in line or "identical: the same score on each "
                                      "of the" in line for line in ensemble)
    assert ensemble[-1].startswith("combined") and ensemble[-1].endswith("no detectable difference")
    assert all(line.split()[2] == "=" for line in tests if " feature " in line and line.startswith(("tile", "layout")))

    assert main(["runs", "compare", made["random"].run_id, made["feature"].run_id, "--submissions-dir", subs]) == 0
    out = capsys.readouterr().out
    combined = next(line for line in out.splitlines() if line.startswith("combined") and " ensemble " in line
                    and "[" in line)
    assert combined.endswith("B better")
    assert "tile:xla" in out and any(line.startswith("tile:xla") and line.endswith("B better")
                                     for line in out.splitlines())


def test_the_tests_of_runs_compare_are_the_pure_function_on_per_graph_scores(loop_runs):
    from pipelines.outputs import graph_scores as gs
    from pipelines.outputs.run_folders import read_run_manifest

    a = read_run_manifest(loop_runs["subs"], loop_runs["runs"]["a"].run_id)
    scores, missing = gs.graph_scores_of_run(a)
    assert not missing
    ensemble = scores.filter(scores["model"] == "ensemble")
    for cname, cv in a["cv_scores"].items():  # the per-graph scores average to the run's CV score
        part = ensemble.filter(ensemble["collection"] == cname)["score"]
        assert part.drop_nans().mean() == pytest.approx(cv["blend"]["ensemble"], abs=1e-9)
    same = gs.compare_scores(scores, scores)
    assert all(d.mean == 0 and d.verdict == "no detectable difference" for d in same["graphs"].values())


def test_runs_list_names_notes_differences_reruns_and_seed_counts(loop_runs, capsys):
    made, subs = loop_runs["runs"], str(loop_runs["subs"])
    assert main(["runs", "list", "--wide", "--submissions-dir", subs]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0]
    assert "NAME" in header and "DIFFERS FROM BASE" in header and "PUBLIC LB" in header and "NOTE" in header
    listed = [line.split()[0] for line in lines[1:] if line.startswith("20")]
    assert made["rerun"].run_id not in listed and len(listed) == 4  # a cached rerun is the same result
    first = next(line for line in lines if line.startswith(made["a"].run_id))
    assert " first " in first and "opening" in first and "+1 rerun(s)" in first and "1 (0)" in first
    assert "models=random,feature +2" in first  # --models, then the smoke settings that differ from base
    assert main(["runs", "list", "--wide", "--submissions-dir", subs, "--all"]) == 0
    rerun = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(made["rerun"].run_id))
    assert f"= {made['a'].run_id}" in rerun


def test_unique_prefixes_and_ambiguous_ones(loop_runs, capsys):
    made, subs = loop_runs["runs"], str(loop_runs["subs"])
    assert main(["report", made["feature"].run_id[:-2], "--submissions-dir", subs,
                 "--out", str(loop_runs["work"] / "r.html")]) == 0
    assert main(["runs", "compare", "2", "first", "--submissions-dir", subs]) == 1  # every run-id starts with 2
    assert "names 5 runs" in capsys.readouterr().err


def test_a_mistyped_run_name_or_id_gets_the_closest_runs_suggested(loop_runs, capsys):
    """Issue 79: config keys, commands and flags got a "did you mean"; run names and ids did not."""
    made, subs = loop_runs["runs"], str(loop_runs["subs"])
    seed1 = made["seed1"].run_id
    assert main(["runs", "compare", "first", "sead1", "--submissions-dir", subs, "--no-test"]) == 1
    assert f"did you mean {seed1} (name 'seed1')?" in capsys.readouterr().err
    typo = seed1[:-1] + ("0" if seed1[-1] != "0" else "1")  # the last hex digit mistyped: no prefix matches
    assert main(["runs", "rm", typo, "--yes", "--submissions-dir", subs]) == 1
    assert f"did you mean {seed1}" in capsys.readouterr().err and (loop_runs["subs"] / seed1).is_dir()
    assert main(["report", "nothing-like-it", "--submissions-dir", subs]) == 1
    assert "did you mean" not in capsys.readouterr().err


def test_runs_rm_asks_and_keeps_submitted_runs(loop_runs, tmp_path, capsys):
    made = loop_runs["runs"]
    subs = tmp_path / "subs"
    for key in ("random", "feature"):
        shutil.copytree(made[key].run_dir, subs / made[key].run_id)
    (subs / made["feature"].run_id / runs.SUBMITTED_RECORD).write_text(json.dumps({"submissions": [{}]}))
    assert main(["runs", "rm", made["random"].run_id, "--submissions-dir", str(subs)]) == 2  # no tty: no answer
    assert (subs / made["random"].run_id).is_dir()
    assert main(["runs", "rm", made["random"].run_id, "--submissions-dir", str(subs), "--yes"]) == 0
    assert not (subs / made["random"].run_id).exists()
    assert main(["runs", "rm", made["feature"].run_id, "--submissions-dir", str(subs), "--yes"]) == 1
    assert "was submitted" in capsys.readouterr().err and (subs / made["feature"].run_id).is_dir()
    assert main(["runs", "rm", made["feature"].run_id, "--submissions-dir", str(subs), "--yes", "--force"]) == 0
    assert list(subs.iterdir()) == []


def test_train_and_tune_results_are_listed_as_their_own_kinds(loop_runs, tiny_world, capsys):
    work, subs = loop_runs["work"], str(loop_runs["subs"])
    assert main(["train", "--model", "random", "--collection", "tile:xla", "--data-root", str(tiny_world),
                 "--work-dir", str(work), "--config", "smoke", "--set", "run.seeds=[7]", "-q"]) == 0
    (work / "tune").mkdir(exist_ok=True)
    (work / "tune" / "gbdt_tile_xla_x.toml.json").write_text(json.dumps({
        "generator": "pipelines.flows.tune", "study_name": "gbdt:tile:xla:x", "model": "gbdt",
        "collection": "tile:xla", "best_value": 0.91, "trials_complete": 3, "created": "2026-01-01T00:00:00+00:00"}))
    capsys.readouterr()
    assert main(["runs", "list", "--wide", "--submissions-dir", subs, "--work-dir", str(work)]) == 0
    lines = capsys.readouterr().out.splitlines()
    train = [line for line in lines if line.startswith("train-random/")]
    assert len(train) == 1 and " train " in train[0] and "1 (7)" in train[0]  # only the stage no run used
    tune = next(line for line in lines if line.startswith("gbdt:tile:xla:x"))
    assert " tune " in tune and "0.9100" in tune and "best of 3 trials" in tune


class Status(enum.Enum):  # the shape of kagglesdk's SubmissionStatus
    PENDING = 0
    COMPLETE = 1


def kaggle_submission(description: str, score: str | None, status: Status = Status.COMPLETE, ref: int = 1):
    return types.SimpleNamespace(ref=ref, date=datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc),
                                 description=description, file_name="submission.csv", public_score=score,
                                 private_score=None, status=status, error_description=None)


def test_submissions_sync_files_public_scores_beside_the_cv(loop_runs, fake, tmp_path, capsys):  # noqa: F811
    made = loop_runs["runs"]
    subs = tmp_path / "subs"
    for key in ("feature", "random"):
        shutil.copytree(made[key].run_dir, subs / made[key].run_id)
    assert main(["submit", made["feature"].run_id, "--submissions-dir", str(subs), "-m", "feature only",
                 "--allow-synthetic"]) == 0
    fake.listed = [kaggle_submission("feature only", "0.4321", ref=2),
                   kaggle_submission(f"{made['random'].run_id} CV 0.1", None, Status.PENDING, ref=3),
                   kaggle_submission("made by hand", "0.5", ref=4)]
    capsys.readouterr()
    assert main(["submissions", "sync", "--submissions-dir", str(subs)]) == 0
    out = capsys.readouterr().out
    assert "3 Kaggle submission(s) fetched; 2 filed with 2 run(s)" in out and "not from a run here: 'made by hand'" in out
    assert ("list", COMPETITION, 1, 100) in fake.calls
    record = json.loads((subs / made["feature"].run_id / runs.LEADERBOARD_RECORD).read_text())
    assert record["submissions"][0]["public_score"] == 0.4321 and record["submissions"][0]["status"] == "complete"
    assert main(["runs", "list", "--wide", "--submissions-dir", str(subs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    feature = next(line for line in lines if line.startswith(made["feature"].run_id))
    cv = f"{made['feature'].manifest['combined_oof']['ensemble']['value']:.4f}"
    assert f"{cv}     0.4321" in feature
    assert "pending" in next(line for line in lines if line.startswith(made["random"].run_id))


def test_submit_refuses_a_synthetic_world_unless_allowed(loop_runs, fake, tiny_world, capsys):  # noqa: F811
    made = loop_runs["runs"]
    assert made["a"].manifest["data_world"]["synthetic"] is True
    assert main(["submit", str(made["a"].submission), "-m", "x", "--data-root", str(tiny_world)]) == 1
    assert "synthetic world" in capsys.readouterr().err and not [c for c in fake.calls if c[0] == "submit"]


def test_evaluate_gives_intervals(loop_runs, tiny_world, capsys):
    made = loop_runs["runs"]
    assert main(["evaluate", made["feature"].run_id, "--data-root", str(tiny_world), "--no-models",
                 "--submissions-dir", str(loop_runs["subs"])]) == 0
    out = capsys.readouterr().out
    assert "submission - floor on the test graphs (paired sign-flip test, 95% interval):" in out
    record = json.loads((made["feature"].run_dir / "evaluation.json").read_text())
    combined = record["intervals"]["submission-floor"]["combined"]
    assert combined["low"] <= combined["mean"] <= combined["high"] and combined["verdict"]


def test_mlflow_round_trip_through_a_real_local_store(loop_runs, tmp_path):
    pytest.importorskip("mlflow")
    import polars as pl
    from mlflow import MlflowClient

    from pipelines.outputs.tracking import TRACKING_RECORD, track_run

    made = loop_runs["runs"]
    subs = tmp_path / "subs"
    shutil.copytree(made["a"].run_dir, subs / made["a"].run_id)
    manifest = made["a"].manifest
    ref = manifest["stages"]["tile:xla"]["train"]["random"]
    curves = Path(ref["work_dir"]) / ref["stage"] / ref["key"] / "curves.parquet"
    pl.DataFrame({"collection": ["tile:xla"] * 3, "model": ["random"] * 3, "fold": [0] * 3, "seed": [0] * 3,
                  "epoch": [0, 1, 2], "train_loss": [1.0, 0.5, 0.25], "valid_score": [0.1, 0.2, 0.3]}
                 ).write_parquet(curves)
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    try:
        assert main(["runs", "track", "first", "--submissions-dir", str(subs), "--uri", uri]) == 0
    finally:
        curves.unlink()
    record = json.loads((subs / made["a"].run_id / TRACKING_RECORD).read_text())
    client = MlflowClient(tracking_uri=uri)
    got = client.get_run(record["mlflow_run_id"])
    assert got.info.status == "FINISHED" and got.info.run_name == "first"
    assert got.data.tags["run_id"] == made["a"].run_id and got.data.tags["synthetic"] == "true"
    assert got.data.params["folds.k"] == json.dumps(manifest["config"]["folds"]["k"])
    assert got.data.metrics["cv/combined/ensemble"] == pytest.approx(manifest["combined_oof"]["ensemble"]["value"])
    assert got.data.metrics["cv/tile:xla/ensemble"] == pytest.approx(manifest["cv_scores"]["tile:xla"]["blend"]["ensemble"])
    history = client.get_metric_history(record["mlflow_run_id"], "curve/tile:xla/random/fold0_seed0/train_loss")
    assert [(m.step, m.value) for m in history] == [(0, 1.0), (1, 0.5), (2, 0.25)]
    artifacts = {a.path for a in client.list_artifacts(record["mlflow_run_id"])}
    assert {"manifest.json", "submission.csv", "ensemble"} <= artifacts  # report.html too once the CLI drew it
    assert any(a.path.endswith("curve.parquet") for a in client.list_artifacts(record["mlflow_run_id"],
                                                                               "ensemble/tile_xla"))
    local = client.download_artifacts(record["mlflow_run_id"], "submission.csv", str(tmp_path / "back"))
    assert Path(local).read_bytes() == made["a"].submission.read_bytes()


def test_run_flags_name_note_and_track_reach_the_manifest_and_the_store(loop_runs, tiny_world, tmp_path, capsys):
    pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    subs = tmp_path / "subs"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["run", "--data-root", str(tiny_world), "--work-dir", str(loop_runs["work"]), "--config", "smoke",
                 "--models", "random,feature", "--submissions-dir", str(subs), "--name", "by-cli", "--note",
                 "from the command line", "--track", "mlflow", "--track-uri", uri, "-q"]) == 0
    (run_dir,) = [p for p in subs.iterdir() if p.is_dir()]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["name"] == "by-cli" and manifest["note"] == "from the command line"
    record = json.loads((run_dir / "tracking.json").read_text())
    got = MlflowClient(tracking_uri=uri).get_run(record["mlflow_run_id"])
    assert got.info.run_name == "by-cli" and got.data.tags["mlflow.note.content"] == "from the command line"
    assert "report.html" in {a.path for a in MlflowClient(tracking_uri=uri).list_artifacts(record["mlflow_run_id"])}


def test_the_documented_mlflow_ui_command_shows_a_tracked_run(loop_runs, tmp_path, monkeypatch, capsys):
    """Issue 79: `runs track` wrote the store but `mlflow ui` failed (only mlflow-skinny was installed)
    and no page said how to open it. The command of the daily-loop guide, run from a folder as the
    repository root, serves the run `runs track` logged (the UI's own API answers with it)."""
    pytest.importorskip("flask")  # the UI's: the full mlflow package of the track extra
    import re
    import shlex
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    guide = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "daily-loop.md").read_text(encoding="utf-8")
    (command,) = re.findall(r"^mlflow ui .*$", guide, re.M)
    run_id = loop_runs["runs"]["a"].run_id
    shutil.copytree(loop_runs["subs"] / run_id, tmp_path / "submissions" / run_id)
    monkeypatch.chdir(tmp_path)
    assert main(["runs", "track", run_id]) == 0  # into the default store, submissions/mlflow.db
    capsys.readouterr()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mlflow = Path(sys.executable).with_name("mlflow")
    server = subprocess.Popen([str(mlflow), *shlex.split(command)[1:], "--port", str(port)], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        found, deadline = "", time.monotonic() + 120
        while run_id not in found and time.monotonic() < deadline and server.poll() is None:
            time.sleep(1)
            request = urllib.request.Request(f"http://127.0.0.1:{port}/api/2.0/mlflow/runs/search", method="POST",
                                             data=json.dumps({"experiment_ids": ["1"]}).encode(),
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=5) as answer:
                    found = answer.read().decode()
            except OSError:
                continue
        assert run_id in found, f"mlflow ui did not serve the run: exit {server.poll()}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its workers, which it started
        server.wait(timeout=30)
