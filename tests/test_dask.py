"""Fan-out to a real local Dask cluster: same predictions and same data-stage bytes as local processes."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from pipelines.core.collection import TILE_XLA
from pipelines.config.settings import load_config
from pipelines.core.errors import PipelineError
from pipelines.core.predictions import read_predictions
from pipelines.flows.prepare import prepare
from pipelines.flows.run import fan_out, run_pipeline
from pipelines.flows.schedule import train_models
from tests.test_prepare import stage_bytes
from pipelines.training.fit import PREDICTIONS_FILE

pytestmark = pytest.mark.slow  # end-to-end: left out of make test-quick

distributed = pytest.importorskip("distributed")

FAST = ["run.n_jobs=2"]  # on top of the smoke config: two local jobs, as the cluster has two workers


def test_training_through_a_dask_cluster_matches_local_processes(tiny_world: Path, tmp_path: Path, caplog):
    config = load_config("smoke", FAST)
    prepared = prepare(config, tiny_world, tmp_path / "work", [TILE_XLA])
    models = ["gbdt", "random"]
    local = train_models(config, prepared, models, work_dir=tmp_path / "local")

    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=50) as cluster:
        caplog.set_level(logging.INFO, logger="pipelines.core.parallel")
        with fan_out(cluster.scheduler_address) as backend:
            remote = train_models(config, prepared, models, work_dir=tmp_path / "dask", backend=backend)
        with distributed.Client(cluster.scheduler_address) as client:
            executed = client.run(_executed_count)

    assert backend == "dask" and any("2 worker(s)" in m for m in caplog.messages)
    # every fold job (2 folds x 1 seed x 2 models) ran on the cluster's workers
    assert sum(executed.values()) >= 4
    for model in models:
        ours, theirs = remote[TILE_XLA.name][model], local[TILE_XLA.name][model]
        assert not ours.cached and ours.key == theirs.key
        assert read_predictions(ours.file(PREDICTIONS_FILE)).equals(read_predictions(theirs.file(PREDICTIONS_FILE)))


def _executed_count(dask_worker=None) -> int:
    """Tasks a worker has executed (runs on each worker)."""
    return dask_worker.state.executed_count


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_scheduler_is_a_pipeline_error(tiny_world: Path, tmp_path: Path):
    address = f"tcp://127.0.0.1:{_free_port()}"
    with pytest.raises(PipelineError, match="cannot reach the Dask scheduler"):
        with fan_out(address):
            pass
    config = load_config("smoke", [*FAST, f"run.scheduler={address}"])
    with pytest.raises(PipelineError, match=address):
        run_pipeline(config, tiny_world, work_dir=tmp_path / "work", models=["random"],
                     submissions_dir=tmp_path / "subs")


def test_local_scheduler_changes_nothing():
    with fan_out("local"):
        pass
    with fan_out(None):
        pass


def test_data_stages_on_a_dask_cluster_write_the_same_bytes(tiny_world: Path, tmp_path: Path):
    config = load_config("smoke", FAST)
    collections = [TILE_XLA.name, "layout:nlp:random"]
    local = prepare(config, tiny_world, tmp_path / "local", collections)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=50) as cluster:
        with fan_out(cluster.scheduler_address):
            remote = prepare(config, tiny_world, tmp_path / "dask", collections)
        with distributed.Client(cluster.scheduler_address) as client:
            executed = client.run(_executed_count)
    files = stage_bytes(local)
    # the per-file jobs ran on the cluster (joblib batches them: fewer tasks than files), on both workers
    assert len(executed) == 2 and all(count > 0 for count in executed.values())
    assert not any(remote[TILE_XLA.name].cached.values())
    assert stage_bytes(remote) == files
