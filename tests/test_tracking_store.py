"""MLflow stores (issue 78, item 5): checked before anything is logged, in seconds; ``file:`` stores work
as documented; a store that fails mid-way is a clean error; a second ``runs track`` of a run updates its
MLflow run instead of adding one. Run folders are hand-built (no training)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from pipelines.core.errors import PipelineError

pytest.importorskip("mlflow")

from pipelines.outputs.tracking import TRACKING_RECORD, track_run  # noqa: E402

try:  # the check is new (issue 78): before it, only track_run existed
    from pipelines.outputs.tracking import check_store
except ImportError:  # pragma: no cover
    def check_store(uri):
        raise AssertionError("no check_store")

RUN = "20261201T000000Z-aaaaaaaa"


@pytest.fixture
def subs(tmp_path: Path) -> Path:
    folder = tmp_path / "subs" / RUN
    folder.mkdir(parents=True)
    (folder / "submission.csv").write_text("ID,TopConfigs\n")
    (folder / "manifest.json").write_text(json.dumps({
        "run_id": RUN, "stages": {}, "name": "first", "work_dir": str(tmp_path / "work"),
        "config": {"folds": {"k": 2}}, "combined_oof": {"ensemble": {"value": 0.5, "complete": True}}}))
    return tmp_path / "subs"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_file_store_works_as_documented(subs, tmp_path, monkeypatch):
    uri = f"file:{tmp_path / 'mlruns'}"
    record = track_run(RUN, submissions_dir=subs, uri=uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # to read it back here
    from mlflow import MlflowClient

    got = MlflowClient(tracking_uri=uri).get_run(record["mlflow_run_id"])
    assert got.info.status == "FINISHED" and got.data.metrics["cv/combined/ensemble"] == 0.5


@pytest.mark.parametrize("make", [
    lambda tmp: f"http://127.0.0.1:{free_port()}",  # nothing listening
    lambda tmp: f"sqlite:///{(tmp / 'a-file').resolve()}/mlflow.db",  # its folder is a file
    lambda tmp: f"sqlite:///{tmp.resolve()}/garbage.db",  # not a database
    lambda tmp: f"sqlite:///{tmp.resolve()}",  # a directory
], ids=["http-nothing-listening", "sqlite-under-a-file", "sqlite-garbage", "sqlite-a-directory"])
def test_a_bad_store_is_a_clean_error_in_seconds(subs, tmp_path, make):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "garbage.db").write_bytes(b"not a database " * 100)
    uri = make(tmp_path)
    for attempt in (lambda: track_run(RUN, submissions_dir=subs, uri=uri), lambda: check_store(uri)):
        started = time.perf_counter()
        with pytest.raises(PipelineError, match="MLflow store"):
            attempt()
        assert time.perf_counter() - started < 15
    assert not (subs / RUN / TRACKING_RECORD).exists()


def test_a_store_that_refuses_writes_midway_is_a_clean_error(subs, tmp_path, monkeypatch):
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    def read_only(*args, **kwargs):
        raise MlflowException("(sqlite3.OperationalError) attempt to write a readonly database")

    monkeypatch.setattr(MlflowClient, "create_run", read_only)
    with pytest.raises(PipelineError, match="readonly database"):
        track_run(RUN, submissions_dir=subs, uri=f"sqlite:///{tmp_path / 'mlflow.db'}")


def test_a_second_track_of_a_run_updates_its_mlflow_run(subs, tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = track_run(RUN, submissions_dir=subs, uri=uri)
    (subs / RUN / "report.html").write_text("<html></html>")  # drawn meanwhile
    second = track_run(RUN, submissions_dir=subs, uri=uri)
    assert second["mlflow_run_id"] == first["mlflow_run_id"]
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([first["experiment_id"]])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    history = client.get_metric_history(first["mlflow_run_id"], "cv/combined/ensemble")
    assert [m.value for m in history] == [0.5]  # not logged twice
    assert "report.html" in {a.path for a in client.list_artifacts(first["mlflow_run_id"])}


def test_run_with_a_store_that_cannot_be_opened_stops_before_the_first_stage(tiny_world, tmp_path, capsys):
    from pipelines.cli import main

    started = time.perf_counter()
    assert main(["run", "--data-root", str(tiny_world), "--work-dir", str(tmp_path / "work"), "--submissions-dir",
                 str(tmp_path / "subs"), "--config", "smoke", "--models", "random", "--track", "mlflow",
                 "--track-uri", f"http://127.0.0.1:{free_port()}"]) == 1
    assert "MLflow store" in capsys.readouterr().err and time.perf_counter() - started < 30
    assert not (tmp_path / "work").exists() and not (tmp_path / "subs").exists()  # nothing trained or published
