"""Optional MLflow tracking of published runs (``run --track mlflow``, ``runs track RUN_ID``).

The run folders (``manifest.json``) stay the record every command reads; MLflow is a second view for
those who want its UI or its query API. One published run becomes one MLflow run in a local store:

* tags: the run-id, kind, name, note, data root, whether it is a synthetic world, code commit;
* params: the resolved config, flattened (``folds.k``, ``gbdt.num_leaves``, ...), and the models;
* metrics: ``cv/<collection>/<model>`` (the seed-averaged blend input of every model and the
  ensemble, the numbers ``runs list`` shows), ``cv_oof/<collection>/<model>`` (mean over seeds) with
  ``cv_seed/<collection>/<model>`` at step = seed, and ``cv/combined/<model>``;
* curves: a training stage output may hold ``curves.parquet`` (columns ``collection, model, fold,
  seed, epoch, train_loss, valid_score``); each is logged as ``curve/<collection>/<model>/
  fold<f>_seed<s>/train_loss`` and ``.../valid_score`` at step = epoch, when present;
* artifacts: ``manifest.json``, ``submission.csv``, ``report.html`` (when drawn) and every
  ensemble stage's ``curve.parquet`` (the blend weights tried) under ``ensemble/<collection>/``.

The store is a tracking URI: ``sqlite:///PATH.db`` (default ``<submissions_dir>/mlflow.db``, artifacts
in ``mlflow-artifacts/`` beside it), ``file:PATH`` (a folder; MLflow keeps this backend in maintenance
mode, so SQLite is the one to choose for a new store) or a tracking server's ``http(s)://`` address.
The store is checked before anything is logged (``run --track`` checks it before its first stage): a
SQLite file must open and take a write, a folder must be writable, a server's port must answer within
seconds (requests then time out in seconds, not MLflow's minutes). What was logged goes to the run
folder's ``tracking.json`` (URI, experiment, MLflow run id); tracking a run again updates its MLflow
run (what it lacks is added), never a second one. ``mlflow`` (or ``mlflow-skinny``) is the
optional extra ``track``; without it the command says how to install it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import re
import socket
import sqlite3
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping

from pipelines.core import paths
from pipelines.core.engine import flatten, write_json_atomic
from pipelines.core.errors import ConfigError, PipelineError
from pipelines.core.stage_files import read_parquet

logger = logging.getLogger(__name__)

TRACKERS = ("mlflow",)
EXPERIMENT = "tpugraphs"
TRACKING_RECORD = "tracking.json"
CURVES_FILE = "curves.parquet"  # per-epoch curves of a training stage, when the stage writes them
CURVE_COLUMNS = ("collection", "model", "fold", "seed", "epoch", "train_loss", "valid_score")
PARAM_VALUE_LIMIT = 6000  # MLflow's limit on a param value
_BATCH = 900  # MLflow takes at most 1000 metrics, 100 params per batch
_PARAM_BATCH = 90
_UNSAFE = re.compile(r"[^\w./\- :]")


def default_uri(submissions_dir: Path | str) -> str:
    return f"sqlite:///{(Path(submissions_dir) / 'mlflow.db').resolve()}"


def _artifact_location(uri: str) -> str | None:
    """Where a new experiment of a SQLite store keeps artifacts: beside the database (MLflow's own
    default is ``./mlruns`` of the current directory)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).parent / "mlflow-artifacts").resolve().as_uri()
    return None


def _name(text: str) -> str:
    return _UNSAFE.sub("_", text)


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value) else None


def run_params(manifest: Mapping[str, Any]) -> dict[str, str]:
    """The config of a run as MLflow params (flattened, values as JSON text)."""
    params = {_name(k): json.dumps(v, default=str)[:PARAM_VALUE_LIMIT]
              for k, v in flatten(manifest.get("config") or {}).items()}
    params["models"] = ",".join(manifest.get("models") or [])
    return params


def run_metrics(manifest: Mapping[str, Any]) -> list[tuple[str, float, int]]:
    """``(key, value, step)`` of a run's CV scores (see the module docstring)."""
    out = []
    for cname, scores in (manifest.get("cv_scores") or {}).items():
        for model, value in ((scores or {}).get("blend") or {}).items():
            if _finite(value) is not None:
                out.append((_name(f"cv/{cname}/{model}"), float(value), 0))
        for model, m in ((scores or {}).get("training") or {}).items():
            if _finite((m or {}).get("oof_score")) is not None:
                out.append((_name(f"cv_oof/{cname}/{model}"), float(m["oof_score"]), 0))
            for seed, value in ((m or {}).get("oof_score_by_seed") or {}).items():
                if _finite(value) is not None:
                    out.append((_name(f"cv_seed/{cname}/{model}"), float(value), int(seed)))
    for model, combined in (manifest.get("combined_oof") or {}).items():
        if _finite((combined or {}).get("value")) is not None:
            out.append((_name(f"cv/combined/{model}"), float(combined["value"]), 0))
    return out


def curve_metrics(curves: Any) -> list[tuple[str, float, int]]:
    """``(key, value, epoch)`` of a ``curves.parquet`` frame (columns :data:`CURVE_COLUMNS`)."""
    out = []
    for row in curves.iter_rows(named=True):
        prefix = f"curve/{row['collection']}/{row['model']}/fold{row['fold']}_seed{row['seed']}"
        for column in ("train_loss", "valid_score"):
            if _finite(row.get(column)) is not None:
                out.append((_name(f"{prefix}/{column}"), float(row[column]), int(row["epoch"])))
    return out


def _mlflow() -> Any:
    try:
        import mlflow  # noqa: F401
        from mlflow import MlflowClient
    except ImportError:
        raise PipelineError("MLflow tracking needs the mlflow package: pip install -e '.[track]' "
                            "(or pip install mlflow-skinny)") from None
    return MlflowClient


# MLflow's own defaults retry a silent server for minutes (120 s a request, 7 retries); a store that does
# not answer should fail in seconds. A value the user set in the environment wins.
_SERVER_ENV = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
               "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0.5"}
CONNECT_TIMEOUT_S = 3.0  # the TCP probe of a tracking server before MLflow is asked anything


def _scheme(uri: str) -> str:
    return uri.split(":", 1)[0].lower() if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", uri) else "file"


@contextlib.contextmanager
def _store_environment(uri: str) -> Iterator[None]:
    """MLflow's settings while it uses ``uri``: timeouts of seconds for a server, and the file store
    allowed (MLflow 3 keeps it in maintenance mode and refuses it unless opted in; it is documented here)."""
    wanted = dict(_SERVER_ENV) if _scheme(uri) in ("http", "https") else {}
    if _scheme(uri) == "file":
        wanted["MLFLOW_ALLOW_FILE_STORE"] = "true"
    added = [key for key in wanted if key not in os.environ]
    for key in added:
        os.environ[key] = wanted[key]
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def _local_path(uri: str) -> Path | None:
    """The file a ``sqlite:///PATH`` store lives in, or the folder of a ``file:`` store (None: neither)."""
    scheme = _scheme(uri)
    if scheme == "sqlite":
        rest = uri[len("sqlite:"):].split("?", 1)[0]
        return Path(rest[3:]) if rest.startswith("///") and len(rest) > 3 else None  # sqlite:// is in memory
    if scheme == "file":
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(uri).path)) if uri.startswith("file:") else Path(uri)
    return None


def _check_location(uri: str) -> None:
    """What can be checked without MLflow, in seconds: a SQLite store's file opens as a database that can
    be written, a file store's folder can be written, a server's port answers. A PipelineError otherwise."""
    scheme, path = _scheme(uri), _local_path(uri)
    problem = None
    if scheme in ("http", "https"):
        from urllib.parse import urlparse

        parsed = urlparse(uri)
        port = parsed.port or (443 if scheme == "https" else 80)
        try:
            with socket.create_connection((parsed.hostname or "localhost", port), timeout=CONNECT_TIMEOUT_S):
                pass
        except OSError as exc:
            problem = (f"nothing answers at {parsed.hostname}:{port} ({exc.strerror or exc}); start the tracking "
                       "server, or log to a local store (sqlite:///PATH.db)")
    elif path is not None:
        folder = path.parent if scheme == "sqlite" else path
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if scheme == "sqlite":
                _check_sqlite(path)
            else:
                with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
                    pass
        except (OSError, sqlite3.Error) as exc:
            problem = f"{path}: {getattr(exc, 'strerror', None) or exc}"
    if problem:
        raise PipelineError(f"MLflow store {uri}: {problem}")


def _check_sqlite(path: Path) -> None:
    """Open ``path`` as SQLite and write in a transaction that is rolled back (a garbage file, a folder or
    a read-only database fail here at once, where MLflow would retry its engine for about two minutes)."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "a directory, not a database file")
    connection = sqlite3.connect(path, timeout=5, isolation_level=None)
    try:
        connection.execute("PRAGMA schema_version").fetchone()
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("CREATE TABLE pipelines_write_probe (x INTEGER)")
        connection.execute("ROLLBACK")
    finally:
        connection.close()


def _open_store(uri: str, experiment: str) -> tuple[Any, str]:
    """``(MlflowClient, experiment id)`` of ``uri`` (the experiment created when new); a PipelineError naming
    the store when it cannot be opened. Call within :func:`_store_environment`."""
    _check_location(uri)
    client_class = _mlflow()
    try:
        client = client_class(tracking_uri=uri)
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found is not None else client.create_experiment(
            experiment, artifact_location=_artifact_location(uri))
    except Exception as exc:
        raise PipelineError(f"MLflow store {uri}: cannot open experiment {experiment!r} ({_brief(exc)})") from None
    return client, experiment_id


def check_store(uri: str, experiment: str = EXPERIMENT) -> None:
    """Open the MLflow store ``uri`` and its experiment, in seconds, before anything is computed
    (``run --track`` calls it before its first stage): a PipelineError naming the store otherwise."""
    with _store_environment(uri):
        _open_store(uri, experiment)


def _brief(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 400 else text[:397] + "..."


def _tracked_run(client: Any, experiment_id: str, run_id: str, run_dir: Path, uri: str) -> Any:
    """The MLflow run that already holds ``run_id`` in this experiment (the one its ``tracking.json`` names,
    else one tagged with the run-id), or None."""
    try:
        record = json.loads((run_dir / TRACKING_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = None
    if isinstance(record, dict) and record.get("uri") == uri and isinstance(record.get("mlflow_run_id"), str):
        try:
            found = client.get_run(record["mlflow_run_id"])
            if found.info.lifecycle_stage == "active" and found.info.experiment_id == experiment_id:
                return found
        except Exception:  # deleted from the store meanwhile: look it up by tag
            pass
    found = client.search_runs([experiment_id], filter_string=f"tags.run_id = '{run_id}'", max_results=1)
    return found[0] if found else None


def track_run(run_id: str, *, submissions_dir: Path | str = paths.SUBMISSIONS_DIR, uri: str | None = None,
              experiment: str = EXPERIMENT) -> dict[str, Any]:
    """Log a published run to the MLflow store ``uri`` (see the module docstring); returns the
    ``tracking.json`` record written into its run folder. A run tracked before in this store is updated
    (its MLflow run gains what it lacks: new metrics, artifacts such as a report drawn since), never
    duplicated. The store is checked first (:func:`check_store`); any failure is a PipelineError."""
    from pipelines.outputs.run_folders import read_run_manifest, resolve_run_id

    submissions_dir = Path(submissions_dir)
    run_id = resolve_run_id(submissions_dir, run_id)
    manifest = read_run_manifest(submissions_dir, run_id)
    run_dir = submissions_dir / run_id
    uri = uri or default_uri(submissions_dir)
    with _store_environment(uri):
        client, experiment_id = _open_store(uri, experiment)
        mlflow_id = None
        try:
            mlflow_id, logged = _log_run(client, experiment_id, run_id, run_dir, manifest, uri)
        except Exception as exc:
            if mlflow_id is not None:
                with contextlib.suppress(Exception):
                    client.set_terminated(mlflow_id, status="FAILED")
            raise PipelineError(f"MLflow store {uri}: logging run {run_id} failed ({_brief(exc)})") from None
    record = {"tracker": "mlflow", "uri": uri, "experiment": experiment, "experiment_id": experiment_id,
              "mlflow_run_id": mlflow_id, **logged, "tracked_at": _now()}
    try:
        write_json_atomic(run_dir / TRACKING_RECORD, record)
    except OSError as exc:
        raise PipelineError(f"{run_dir / TRACKING_RECORD}: run {run_id} was logged to MLflow {uri} (run "
                            f"{mlflow_id}) but this record cannot be written ({exc.strerror or exc})") from None
    logger.info(f"run {run_id}: logged to MLflow {uri} (experiment {experiment}, run {mlflow_id})")
    return record


def _log_run(client: Any, experiment_id: str, run_id: str, run_dir: Path, manifest: Mapping[str, Any],
             uri: str) -> tuple[str, dict[str, int]]:
    """Create (or update) the MLflow run of ``run_id`` and log it; ``(its MLflow id, counts logged)``."""
    import time

    import polars as pl
    from mlflow.entities import Metric, Param, RunTag

    from pipelines.core.engine import load_stage
    from pipelines.outputs.run_folders import SUBMISSION_FILE, training_stage_dir

    tags = {"run_id": run_id, "kind": str(manifest.get("kind", "run")), "data_root": str(manifest.get("data_root")),
            "synthetic": str(bool((manifest.get("data_world") or {}).get("synthetic"))).lower(),
            "code_commit": str((manifest.get("code_version") or {}).get("commit", "?"))}
    if manifest.get("note"):
        tags["mlflow.note.content"] = str(manifest["note"])
    if manifest.get("name"):
        tags["name"] = str(manifest["name"])
    existing = _tracked_run(client, experiment_id, run_id, run_dir, uri)
    if existing is None:
        mlflow_run = client.create_run(experiment_id, run_name=str(manifest.get("name") or run_id), tags=tags)
        mlflow_id, have_params, have_metrics = mlflow_run.info.run_id, set(), set()
    else:  # update: what it lacks (params cannot change in MLflow; a run's config never does)
        mlflow_id = existing.info.run_id
        have_params, have_metrics = set(existing.data.params), set(existing.data.metrics)
        client.update_run(mlflow_id, status="RUNNING")
        client.log_batch(mlflow_id, tags=[RunTag(k, v) for k, v in tags.items()])
    now = int(time.time() * 1000)
    params = [Param(k, v) for k, v in run_params(manifest).items() if k not in have_params]
    for start in range(0, len(params), _PARAM_BATCH):
        client.log_batch(mlflow_id, params=params[start:start + _PARAM_BATCH])
    metrics = [Metric(k, v, now, step) for k, v, step in run_metrics(manifest)]
    curves_logged = 0
    for cname, entry in (manifest.get("stages") or {}).items():
        for model, ref in ((entry or {}).get("train") or {}).items():
            folder = training_stage_dir(ref, manifest) / ref["stage"] / ref["key"]
            if (folder / CURVES_FILE).is_file():
                frame = read_parquet(folder / CURVES_FILE)
                if "collection" not in frame.columns:
                    frame = frame.with_columns(pl.lit(cname).alias("collection"))
                if "model" not in frame.columns:
                    frame = frame.with_columns(pl.lit(model).alias("model"))
                metrics += [Metric(k, v, now, step) for k, v, step in curve_metrics(frame)]
                curves_logged += 1
        try:
            ensemble = load_stage(Path(manifest["work_dir"]), "ensemble", entry["ensemble"])
            curve = ensemble.path / "curve.parquet"
            if curve.is_file():
                client.log_artifact(mlflow_id, str(curve), f"ensemble/{_name(cname).replace(':', '_')}")
        except (PipelineError, KeyError, TypeError, OSError):
            pass
    metrics = [m for m in metrics if m.key not in have_metrics]  # an update logs no history twice
    for start in range(0, len(metrics), _BATCH):
        client.log_batch(mlflow_id, metrics=metrics[start:start + _BATCH])
    for name in ("manifest.json", SUBMISSION_FILE, "report.html"):
        if (run_dir / name).is_file():
            client.log_artifact(mlflow_id, str(run_dir / name))
    client.set_tag(mlflow_id, "curves", str(curves_logged))
    client.set_terminated(mlflow_id)
    return mlflow_id, {"metrics": len(metrics) + len(have_metrics), "curves": curves_logged,
                       "updated": existing is not None}


def _now() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def check_tracker(name: str | None) -> str | None:
    if name is not None and name not in TRACKERS:
        raise ConfigError(f"--track {name!r}: choose one of {', '.join(TRACKERS)}")
    return name
