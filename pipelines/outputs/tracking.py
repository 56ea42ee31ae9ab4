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
in ``mlflow-artifacts/`` beside it) or ``file:PATH``; no server. What was logged goes to the run
folder's ``tracking.json`` (URI, experiment, MLflow run id). ``mlflow`` (or ``mlflow-skinny``) is the
optional extra ``track``; without it the command says how to install it.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Any, Mapping

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


def track_run(run_id: str, *, submissions_dir: Path | str = paths.SUBMISSIONS_DIR, uri: str | None = None,
              experiment: str = EXPERIMENT) -> dict[str, Any]:
    """Log a published run to the MLflow store ``uri`` (see the module docstring); returns the
    ``tracking.json`` record written into its run folder."""
    import time

    import polars as pl

    from pipelines.core.engine import load_stage
    from pipelines.outputs.run_folders import SUBMISSION_FILE, read_run_manifest, resolve_run_id, training_stage_dir

    submissions_dir = Path(submissions_dir)
    run_id = resolve_run_id(submissions_dir, run_id)
    manifest = read_run_manifest(submissions_dir, run_id)
    run_dir = submissions_dir / run_id
    uri = uri or default_uri(submissions_dir)
    client_class = _mlflow()
    from mlflow.entities import Metric, Param, RunTag

    try:
        client = client_class(tracking_uri=uri)
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found is not None else client.create_experiment(
            experiment, artifact_location=_artifact_location(uri))
    except Exception as exc:
        raise PipelineError(f"MLflow store {uri}: cannot open experiment {experiment!r} ({exc})") from None
    tags = {"run_id": run_id, "kind": str(manifest.get("kind", "run")), "data_root": str(manifest.get("data_root")),
            "synthetic": str(bool((manifest.get("data_world") or {}).get("synthetic"))).lower(),
            "code_commit": str((manifest.get("code_version") or {}).get("commit", "?"))}
    if manifest.get("note"):
        tags["mlflow.note.content"] = str(manifest["note"])
    if manifest.get("name"):
        tags["name"] = str(manifest["name"])
    mlflow_run = client.create_run(experiment_id, run_name=str(manifest.get("name") or run_id), tags=tags)
    mlflow_id = mlflow_run.info.run_id
    now = int(time.time() * 1000)
    try:
        params = [Param(k, v) for k, v in run_params(manifest).items()]
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
                    points = curve_metrics(frame)
                    metrics += [Metric(k, v, now, step) for k, v, step in points]
                    curves_logged += 1
            try:
                ensemble = load_stage(Path(manifest["work_dir"]), "ensemble", entry["ensemble"])
                curve = ensemble.path / "curve.parquet"
                if curve.is_file():
                    client.log_artifact(mlflow_id, str(curve), f"ensemble/{_name(cname).replace(':', '_')}")
            except (PipelineError, KeyError, TypeError, OSError):
                pass
        for start in range(0, len(metrics), _BATCH):
            client.log_batch(mlflow_id, metrics=metrics[start:start + _BATCH])
        for name in ("manifest.json", SUBMISSION_FILE, "report.html"):
            if (run_dir / name).is_file():
                client.log_artifact(mlflow_id, str(run_dir / name))
        client.set_tag(mlflow_id, "curves", str(curves_logged))
        client.set_terminated(mlflow_id)
    except Exception as exc:
        client.set_terminated(mlflow_id, status="FAILED")
        raise PipelineError(f"MLflow store {uri}: logging run {run_id} failed ({exc})") from None
    record = {"tracker": "mlflow", "uri": uri, "experiment": experiment, "experiment_id": experiment_id,
              "mlflow_run_id": mlflow_id, "metrics": len(metrics), "curves": curves_logged,
              "tracked_at": _now()}
    write_json_atomic(run_dir / TRACKING_RECORD, record)
    logger.info(f"run {run_id}: logged to MLflow {uri} (experiment {experiment}, run {mlflow_id})")
    return record


def _now() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def check_tracker(name: str | None) -> str | None:
    if name is not None and name not in TRACKERS:
        raise ConfigError(f"--track {name!r}: choose one of {', '.join(TRACKERS)}")
    return name
