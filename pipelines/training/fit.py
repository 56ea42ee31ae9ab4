"""The training stage: grouped k-fold fit and predict of any registered model on one collection.

For one collection, one model and the resolved config, every (fold, seed) pair of the saved folds
and ``run.seeds`` fits a ranker on the graphs of the other CV folds, early-stops on the held-out
fold, and predicts every config of the held-out graphs (out-of-fold), of the holdout graphs (fold
-1, present when ``folds.holdout_valid``) and of every test graph. Pairs run in parallel with
joblib (loky processes, or the backend of an enclosing ``joblib.parallel_config``, e.g. Dask):
``run.n_jobs`` workers, fewer when the adapter's estimate of one job's memory
times the jobs exceeds ``MEMORY_SHARE`` of the available memory; each model gets ``cores // jobs``
threads. A run's stages share one ``pipelines.core.parallel.JobPool`` instead (``run.train_models``).
A worker loads only its own fold's data and predicts a few graphs at a time, so memory stays at
about one fold's training table per job.

Output folder ``<work_dir>/train-<model>/<key>/`` (key = model settings resolved for the
collection + seeds + upstream stage keys):

* ``predictions.parquet`` -- the :mod:`pipelines.core.predictions` schema: ``oof`` rows (fold = the fold
  that held the graph out, one row per config and seed) and ``test`` rows (one per fold model);
* ``scores.parquet`` -- per-graph metric (tile: top-5 slowdown score; layout: Kendall tau-b) and
  OPA, with ``split`` "oof" (every CV graph, per seed) or "holdout" (per fold model);
* ``importance.parquet`` -- feature importances per fold model, for models that have them;
* ``curves.parquet`` -- per-epoch training curves of models trained in epochs (the GNN): collection,
  model, fold, seed, epoch, train_loss (mean loss of the epoch's steps), valid_score (held-out fold's
  score; NaN on epochs that did not validate), :data:`CURVES_SCHEMA`;
* ``manifest.json`` metrics -- OOF score (mean over graphs) per seed, its mean and spread over
  seeds, per fold, the holdout score, and per-model facts (best iteration, wall time).

Models
------
Every registered model (:mod:`pipelines.config.registry`) follows :mod:`pipelines.models.contract`:
an adapter says which upstream outputs the model reads and how to load them, builds the ranker from
the config and reports on it; the loop above never changes. A model's settings may carry ``seed``:
an offset added to every run seed (``gbdt.seed``, ``gnn.seed``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import polars as pl

from pipelines.core.atomic import make_folder
from pipelines.core.collection import LABELLED, Collection
from pipelines.config.settings import PipelineConfig
from pipelines.core.engine import Code, StageOutput, file_sha256, rename_if_free, write_json_atomic
from pipelines.core.logs import tagged
from pipelines.core.errors import PipelineError
from pipelines.core.machine import available_cores, available_memory
from pipelines.models.contract import ModelAdapter, Ranker
from pipelines.config.registry import adapter_module, get_adapter
from pipelines.core.parallel import JobPool, quiet_worker_replacement
from pipelines.core.predictions import PREDICTION_SCHEMA, prediction_frame
from pipelines.core.progress import format_duration
from pipelines.core.stages import Stage, StageCall, run_declared
from pipelines.core.seeds import model_fit_seed

logger = logging.getLogger(__name__)

PREDICTIONS_FILE = "predictions.parquet"
SCORES_FILE = "scores.parquet"
IMPORTANCE_FILE = "importance.parquet"
CURVES_FILE = "curves.parquet"
CURVES_SCHEMA: dict[str, pl.DataType] = {"collection": pl.Utf8, "model": pl.Utf8, "fold": pl.Int64, "seed": pl.Int64,
                                         "epoch": pl.Int64, "train_loss": pl.Float64, "valid_score": pl.Float64}
MODELS_DIR = "models"  # fold models in the stage output: <model>-f<fold>-s<seed>.<ext>
# Finished fold jobs of a training stage that has not completed yet live in
# ``<work_dir>/<stage>/.folds-<key>/`` (one folder per fold x seed, renamed into place when complete,
# GNN epoch checkpoints alongside), so a killed stage resumes at fold (and epoch) granularity.
PARTIAL_PREFIX = ".folds-"
FOLD_RESULT = "fold.json"
# The share of available memory the parallel jobs may take together.
MEMORY_SHARE = 0.6
# Graphs loaded at once for prediction: tile graphs are small and many, layout graphs large and few.
PREDICT_BATCH_GRAPHS = {"tile": 512, "layout": 8}
SCORES_SCHEMA: dict[str, pl.DataType] = {
    "collection": pl.Utf8,
    "graph": pl.Utf8,
    "split": pl.Utf8,  # "oof" or "holdout"
    "fold": pl.Int16,  # oof: the fold holding the graph out; holdout: the fold of the model
    "seed": pl.Int64,  # a run seed, [0, 2^32)
    "num_configs": pl.Int64,
    "score": pl.Float64,  # tile: 2 - best of top 5 / best; layout: Kendall tau-b; NaN: undefined
    "opa": pl.Float64,
}


def stage_name(model: str) -> str:
    """Stage folder of a model's training: ``train-gbdt``, ``train-feature.f_padding`` ..."""
    return "train-" + model.replace(":", ".")


def check_models(models: list[str], collections: list[Collection]) -> None:
    """Each model's own check of the collections it will train on (the optional ``check`` of its
    adapter, :mod:`pipelines.models.contract`): a ConfigError before any stage runs."""
    for model in models:
        check = getattr(get_adapter(model), "check", None)
        if check is not None:
            check(list(collections))


def model_file_name(model: str, fold: int, seed: int) -> str:
    """The name a fold model is saved under (``Ranker.save(folder, name)``): ``gbdt-f0-s1`` ..."""
    return f"{model.replace(':', '.')}-{fold_job_name(fold, seed)}"


# ----------------------------------------------------------------------------- fold plan (pure)


@dataclass(frozen=True)
class FoldPlan:
    """Which graphs each fold model trains on and predicts."""

    folds: tuple[int, ...]  # CV folds, ascending
    graphs_by_fold: dict[int, list[str]]
    holdout: list[str]  # fold -1 graphs (not in CV)
    test: list[str]

    def train_graphs(self, fold: int) -> list[str]:
        return [g for f in self.folds if f != fold for g in self.graphs_by_fold[f]]


def fold_plan(folds: pl.DataFrame, test_graphs: list[str]) -> FoldPlan:
    """Plan from a folds table (``graph``, ``fold``; fold -1 = holdout) and the test graphs."""
    missing = [c for c in ("graph", "fold") if c not in folds.columns]
    if missing:
        raise PipelineError(f"folds table lacks column(s) {', '.join(missing)}")
    by_fold: dict[int, list[str]] = {}
    for graph, fold in zip(folds["graph"].to_list(), folds["fold"].to_list()):
        by_fold.setdefault(int(fold), []).append(graph)
    holdout = by_fold.pop(-1, [])
    if any(f < -1 for f in by_fold):
        raise PipelineError(f"folds table has invalid fold numbers {sorted(f for f in by_fold if f < -1)}")
    if len(by_fold) < 2:
        raise PipelineError(f"cross-validation needs at least 2 folds, the folds table has {len(by_fold)}")
    return FoldPlan(tuple(sorted(by_fold)), by_fold, holdout, list(test_graphs))


# ----------------------------------------------------------------------------- one fold model


@dataclass
class FoldResult:
    fold: int
    seed: int
    predictions: pl.DataFrame  # oof + test rows
    scores: pl.DataFrame  # SCORES_SCHEMA rows for the held-out and holdout graphs
    importance: pl.DataFrame | None
    facts: dict[str, Any]
    wall_s: float
    # The fitted model as saved by the adapter (file name -> bytes), carried in memory so the stage
    # output never depends on the folder of finished fold jobs, which a concurrent run may remove.
    model_files: dict[str, bytes] = dataclasses.field(default_factory=dict)
    curves: pl.DataFrame | None = None  # CURVES_SCHEMA rows of a model trained in epochs (its ``history_``)


def fold_curves(ranker: Any, collection: str, model: str, fold: int, seed: int) -> pl.DataFrame | None:
    """The per-epoch training loss and held-out score a ranker trained in epochs records in its
    ``history_`` (one dict per epoch: ``epoch``, ``loss``, ``valid``), as CURVES_SCHEMA rows; None for
    models fitted in one go."""
    history = getattr(ranker, "history_", None)
    if not history:
        return None
    return pl.DataFrame({"collection": [collection] * len(history), "model": [model] * len(history),
                         "fold": [fold] * len(history), "seed": [seed] * len(history),
                         "epoch": [int(h["epoch"]) for h in history],
                         "train_loss": [float(h["loss"]) for h in history],
                         "valid_score": [float(h["valid"]) for h in history]}, schema=CURVES_SCHEMA)


def _batches(graphs: list[str], size: int):
    for start in range(0, len(graphs), size):
        yield graphs[start:start + size]


def _predict_graphs(adapter: ModelAdapter, ranker: Ranker, prepared: Any, graphs: list[str], *,
                    settings: dict[str, Any], batch: int, seed: int) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """``(graph, config_index, costs)`` for every config of ``graphs``, a few graphs loaded at a time."""
    out = []
    for chunk in _batches(graphs, batch):
        data = adapter.load(prepared, chunk, settings=settings, fit=False, seed=seed)
        costs = np.asarray(ranker.predict(data), dtype=np.float64)
        names, index = adapter.index(data)
        if costs.shape != (len(names),):
            raise PipelineError(f"model {adapter.name!r} returned {costs.shape} costs for {len(names)} rows")
        frame = pl.DataFrame({"graph": pl.Series(names, dtype=pl.Utf8), "config_index": index, "cost": costs})
        for (graph,), part in frame.partition_by("graph", as_dict=True, maintain_order=True).items():
            out.append((graph, part["config_index"].to_numpy(), part["cost"].to_numpy()))
    return out


def score_graphs(collection: Collection, predicted: list[tuple[str, np.ndarray, np.ndarray]],
                 truth: Callable[[str], np.ndarray]) -> pl.DataFrame:
    """Per-graph metric and OPA of predicted costs (``truth(graph)`` = runtimes by config index)."""
    from pipelines.core.metric import score_predictions

    if not predicted:
        return pl.DataFrame(schema={k: SCORES_SCHEMA[k] for k in ("graph", "num_configs", "score", "opa")})
    frame = pl.concat([prediction_frame(collection=collection.name, graph=g, split="oof", scores=c, fold=0,
                                        seed=0, model="-", config_index=i) for g, i, c in predicted])
    truths = {(collection.name, g): truth(g) for g, _, _ in predicted}
    report = score_predictions(frame, truths)
    return report.per_graph.select("graph", "num_configs", "score", pl.col("opa").cast(pl.Float64))


def fit_predict_fold(adapter: ModelAdapter, prepared: Any, collection: Collection, settings: dict[str, Any],
                     plan: FoldPlan, fold: int, seed: int, num_threads: int, partial: Path | None = None) -> FoldResult:
    """Fit one fold model and predict its held-out, holdout and test graphs (runs in a worker).

    With ``partial`` (the stage's folder of finished fold jobs) the result and the fitted model are
    saved there as ``f<fold>-s<seed>/`` before returning, and a model with epoch checkpoints
    checkpoints into (and resumes from) ``partial/f<fold>-s<seed>.ckpt/``.
    """
    started = time.perf_counter()
    fit_seed = model_fit_seed(seed, fold, settings)  # within LightGBM's int32
    held_out = plan.graphs_by_fold[fold]
    ranker = adapter.make(settings, collection, num_threads=num_threads)
    train = adapter.load(prepared, plan.train_graphs(fold), settings=settings, fit=True, seed=fit_seed)
    for companion in companions(prepared, settings):
        train = train + adapter.load(companion, labelled(companion), settings=settings, fit=True, seed=fit_seed)
    valid = adapter.load(prepared, held_out, settings=settings, fit=True, seed=fit_seed)
    checkpoint_dir = None
    if partial is not None and getattr(adapter, "checkpoints", False):
        checkpoint_dir = partial / f"{fold_job_name(fold, seed)}.ckpt"
        ranker = ranker.fit(train, valid, seed=fit_seed, checkpoint_dir=checkpoint_dir)
    else:
        ranker = ranker.fit(train, valid, seed=fit_seed)
    del train, valid
    batch = PREDICT_BATCH_GRAPHS[collection.kind]
    predict = dict(settings=settings, batch=batch, seed=fit_seed)
    oof = _predict_graphs(adapter, ranker, prepared, held_out, **predict)
    holdout = _predict_graphs(adapter, ranker, prepared, plan.holdout, **predict)
    test = _predict_graphs(adapter, ranker, prepared, plan.test, **predict)

    def rows(split: str, predicted):
        return [prediction_frame(collection=collection.name, graph=g, split=split, scores=c, fold=fold, seed=seed,
                                 model=adapter.name, config_index=i) for g, i, c in predicted]

    frames = rows("oof", oof) + rows("test", test)
    predictions = pl.concat(frames) if frames else pl.DataFrame(schema=PREDICTION_SCHEMA)
    scores = pl.concat([
        score_graphs(collection, predicted, prepared.runtimes).with_columns(
            pl.lit(collection.name).alias("collection"), pl.lit(split).alias("split"),
            pl.lit(fold).alias("fold"), pl.lit(seed).alias("seed"))
        for split, predicted in (("oof", oof), ("holdout", holdout))
    ]).select(list(SCORES_SCHEMA)).cast(SCORES_SCHEMA)
    facts, importance = adapter.describe(ranker)
    if importance is not None:
        importance = importance.with_columns(pl.lit(fold, pl.Int16).alias("fold"), pl.lit(seed, pl.Int64).alias("seed"))
    result = FoldResult(fold, seed, predictions, scores, importance, facts, time.perf_counter() - started,
                        model_bytes(ranker, model_file_name(adapter.name, fold, seed)),
                        fold_curves(ranker, collection.name, adapter.name, fold, seed))
    if partial is not None:
        save_fold_result(result, partial)
        if checkpoint_dir is not None:
            shutil.rmtree(checkpoint_dir, ignore_errors=True)  # the saved model supersedes its checkpoints
    return result


# ----------------------------------------------------------------------------- finished fold jobs


def fold_job_name(fold: int, seed: int) -> str:
    return f"f{fold}-s{seed}"


def partial_dir(work_dir: Path, stage: str, key: str) -> Path:
    """Where the finished fold jobs of an unfinished training stage are kept (see ``PARTIAL_PREFIX``)."""
    return Path(work_dir) / stage / f"{PARTIAL_PREFIX}{key}"


def model_bytes(ranker: Ranker, name: str) -> dict[str, bytes]:
    """The files ``ranker.save`` writes, read back as bytes."""
    with tempfile.TemporaryDirectory(prefix="tpugraphs-model-") as tmp:
        files = ranker.save(Path(tmp), name)
        return {f: (Path(tmp) / f).read_bytes() for f in files}


def save_fold_result(result: FoldResult, partial: Path) -> bool:
    """Write one finished fold job (predictions, scores, importances, the fitted model, facts) into
    ``partial/f<fold>-s<seed>/``: built in a private folder and renamed into place, ``fold.json`` last,
    so a folder with that name is always complete. A twin finished by another process is kept.

    Returns False when ``partial`` vanished meanwhile (a concurrent run of the same stage finished
    and removed it): the result is still returned by the job, it only cannot be resumed from.
    """
    name = fold_job_name(result.fold, result.seed)
    try:
        make_folder(partial)  # made again if a concurrent run removes it meanwhile
        work = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=partial))
    except FileNotFoundError:
        return False
    try:
        result.predictions.write_parquet(work / PREDICTIONS_FILE)
        result.scores.write_parquet(work / SCORES_FILE)
        if result.importance is not None:
            result.importance.write_parquet(work / IMPORTANCE_FILE)
        if result.curves is not None:
            result.curves.write_parquet(work / CURVES_FILE)
        for file, data in result.model_files.items():
            (work / file).write_bytes(data)
        hashes = {f.name: file_sha256(f) for f in sorted(work.iterdir()) if f.is_file()}
        write_json_atomic(work / FOLD_RESULT, {"fold": result.fold, "seed": result.seed, "facts": result.facts,
                                              "wall_s": result.wall_s, "model_files": list(result.model_files),
                                              "sha256": hashes})
        if not rename_if_free(work, partial / name):
            shutil.rmtree(work, ignore_errors=True)
            # the twin another process finished is kept; a half-removed one (a concurrent run finished
            # the stage and is removing ``partial``) cannot be resumed from
            return (partial / name / FOLD_RESULT).is_file()
    except FileNotFoundError:
        shutil.rmtree(work, ignore_errors=True)
        return False
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
        if not (partial / name / FOLD_RESULT).is_file():
            raise
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return True


def load_fold_result(folder: Path) -> FoldResult | None:
    """A fold job saved by :func:`save_fold_result`, or None when the folder is not a complete one (a
    file missing, or not matching the SHA-256 recorded in ``fold.json``)."""
    try:
        info = json.loads((folder / FOLD_RESULT).read_text(encoding="utf-8"))
        # every file is checked against the hash recorded when it was written: an altered one is retrained
        needed = {PREDICTIONS_FILE, SCORES_FILE, *info["model_files"]}
        if not needed <= set(info["sha256"]):
            return None
        for name, digest in info["sha256"].items():
            if file_sha256(folder / name) != digest:
                logger.warning(f"{folder / name}: does not match the hash recorded when the fold was saved; "
                               "the fold is trained again")
                return None
        predictions = pl.read_parquet(folder / PREDICTIONS_FILE)
        scores = pl.read_parquet(folder / SCORES_FILE)
        importance = pl.read_parquet(folder / IMPORTANCE_FILE) if (folder / IMPORTANCE_FILE).exists() else None
        models = {name: (folder / name).read_bytes() for name in info["model_files"]}
        curves = pl.read_parquet(folder / CURVES_FILE) if (folder / CURVES_FILE).exists() else None
        return FoldResult(int(info["fold"]), int(info["seed"]), predictions, scores, importance, info["facts"],
                          float(info["wall_s"]), models, curves)
    except (OSError, ValueError, KeyError, TypeError, pl.exceptions.PolarsError):
        return None




# ----------------------------------------------------------------------------- summaries (pure)


def _mean(values) -> float | None:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(values)) if values else None


def summarize_scores(scores: pl.DataFrame) -> dict[str, Any]:
    """Manifest metrics from the per-graph scores: the OOF score of a seed is the mean over every CV
    graph (each scored by the model that did not see it); the headline is the mean over seeds, with
    the standard deviation over seeds as its spread. Undefined (NaN) graph scores are left out."""
    defined = scores.filter(pl.col("score").is_not_nan())
    oof = defined.filter(pl.col("split") == "oof")
    by_seed = {int(s): float(v) for s, v in oof.group_by("seed").agg(pl.col("score").mean()).iter_rows()}
    opa_by_seed = oof.filter(pl.col("opa").is_not_nan()).group_by("seed").agg(pl.col("opa").mean())
    by_fold = (oof.group_by("fold", "seed").agg(pl.col("score").mean())
               .group_by("fold").agg(pl.col("score").mean()).sort("fold"))
    holdout = defined.filter(pl.col("split") == "holdout")
    holdout_by_seed = holdout.group_by("seed", "fold").agg(pl.col("score").mean()).group_by("seed").agg(
        pl.col("score").mean())
    seeds = sorted(by_seed)
    return {
        "oof_score": _mean(by_seed.values()),
        "oof_score_std": float(np.std([by_seed[s] for s in seeds])) if seeds else None,
        "oof_score_by_seed": {str(s): by_seed[s] for s in seeds},
        "oof_score_by_fold": {str(f): float(v) for f, v in by_fold.iter_rows()},
        "oof_opa": _mean(opa_by_seed["opa"].to_list()),
        "oof_graphs": int(oof["graph"].n_unique()),
        "undefined_graph_scores": int(scores.height - defined.height),
        "holdout_score": _mean(holdout_by_seed["score"].to_list()),
        "holdout_graphs": int(holdout["graph"].n_unique()),
    }


# ----------------------------------------------------------------------------- the stage


def companions(prepared: Any, settings: dict[str, Any]) -> list[Any]:
    """The prepared collections whose labelled graphs join every fold's training set: those the model's
    settings name in ``extra_train_collections`` (:func:`pipelines.flows.prepare.companion_collections`)."""
    names = settings.get("extra_train_collections") or []
    attached = getattr(prepared, "companions", {})
    missing = [name for name in names if name not in attached]
    if missing:
        raise PipelineError(f"{prepared.collection.name}: extra_train_collections names {', '.join(missing)}, "
                            "which was not prepared with it (prepare it through pipelines.flows.prepare.prepare)")
    return [attached[name] for name in names]


def labelled(prepared: Any) -> list[str]:
    """Every train and valid graph of a prepared collection."""
    return [graph for split in LABELLED for graph in prepared.graphs(split)]


def _job_memory(adapter: ModelAdapter, prepared: Any, plan: FoldPlan, settings: dict[str, Any]) -> int | None:
    """The largest fold's memory estimate, for adapters that offer ``job_memory`` (optional)."""
    estimate = getattr(adapter, "job_memory", None)
    if estimate is None:
        return None
    extra = sum(estimate(c, labelled(c), settings) for c in companions(prepared, settings))
    return max(estimate(prepared, plan.train_graphs(fold), settings) for fold in plan.folds) + extra


def fold_job_threads(jobs: int) -> int:
    """Threads of each fold job when ``jobs`` of them run at once: the available cores shared out."""
    return max(1, available_cores() // jobs)


def stage_job_threads(workers: int, fold_jobs: int) -> int:
    """Threads of every fold job of a stage of ``fold_jobs`` jobs on ``workers`` workers.

    A GNN fit's floats depend on its thread count, so it depends only on the machine and the config:
    not on how many jobs a resumed stage has left, nor on how many the free memory admits at once,
    nor on whether the stage runs alone or in a run's shared pool. Otherwise a resumed or
    memory-bound stage would not give the bytes of an uninterrupted one.
    """
    return fold_job_threads(max(1, min(workers, fold_jobs)))


def shared_fold_pool(workers: int) -> JobPool:
    """The pool a run's training stages share (``run.train_models``): ``workers`` fold jobs at once, each
    with the threads a stage of that many jobs gives it, within ``MEMORY_SHARE`` of the available memory."""
    memory = available_memory()
    return JobPool(workers, threads_per_job=fold_job_threads(workers),
                   memory_budget=memory * MEMORY_SHARE if memory else None)


def model_stage(model: str) -> Stage:
    """The training stage of ``model`` as data (:class:`pipelines.core.stages.Stage`), derived from its
    registry entry: it reads the stages its adapter declares (``input_stages``), runs this module and the
    adapter's, and is keyed by the adapter's ``settings(config, collection)`` and ``run.seeds``."""
    adapter = get_adapter(model)
    inputs = getattr(adapter, "input_stages", None)
    if not inputs:
        raise PipelineError(f"model {model!r}: its adapter declares no input_stages, the stages it reads "
                            "(see pipelines.models.contract)")

    def run(call: StageCall) -> StageOutput:
        return _train(stage, adapter, call)

    def input_keys(call: StageCall) -> dict[str, str]:
        prepared = call.prepared
        keys = adapter.inputs(prepared)
        for companion in companions(prepared, adapter.settings(call.config, prepared.collection)):
            # their data shapes the fits too
            keys |= {f"{companion.collection.name}:{name}": key for name, key in adapter.inputs(companion).items()}
        return keys

    def facts(call: StageCall) -> dict[str, Any]:
        return {"collection": call.collection.name, "model": model}

    stage = Stage(stage_name(model), inputs=tuple(inputs), code=Code(("pipelines.training.fit", adapter_module(model))),
                  settings={"settings": adapter.settings, "seeds": "run.seeds"}, run=run, input_keys=input_keys,
                  facts=facts, training_only=True)
    return stage


def train_model(config: PipelineConfig, prepared: Any, *, model: str, work_dir: Path | str,
                force: bool = False, pool: JobPool | None = None) -> StageOutput:
    """Run (or reuse) the training stage of ``model`` on the collection of ``prepared``.

    Fold jobs finished by an earlier, interrupted call with the same key are reused (and a GNN fold
    resumes from its last epoch checkpoint); ``force`` discards them and trains every fold again.
    With ``pool`` the fold jobs run in those shared workers (see ``run.train_models``), else in
    ``run.n_jobs`` workers of the stage's own.
    """
    return model_stage(model).run(StageCall(config, prepared.collection, Path(work_dir), prepared=prepared,
                                            options={"pool": pool}, force=force))


def _train(stage: Stage, adapter: ModelAdapter, call: StageCall) -> StageOutput:
    """The training stage's shell (:func:`model_stage`): ``call.prepared`` is the collection's data and
    ``call.options["pool"]`` the shared workers, if any."""
    config, prepared, collection = call.config, call.prepared, call.collection
    stage_config = stage.key_config(call)
    settings, seeds = stage_config["settings"], [int(s) for s in stage_config["seeds"]]
    partial = partial_dir(Path(call.work_dir), stage.name, stage.key(call))
    if call.force:
        shutil.rmtree(partial, ignore_errors=True)

    def compute(folder: Path) -> dict[str, Any]:
        return _run_folds(adapter, prepared, collection, settings, seeds, n_jobs=config.run.n_jobs,
                          folder=folder, partial=partial, pool=call.options.get("pool"))

    with tagged(collection.name):  # the stage's cached / computing / done lines name the collection
        output = run_declared(stage, call, compute, seeds={f"run_{i}": s for i, s in enumerate(seeds)})
    shutil.rmtree(partial, ignore_errors=True)  # the stage output holds everything now
    return output


def _run_folds(adapter: ModelAdapter, prepared: Any, collection: Collection, settings: dict[str, Any],
               seeds: list[int], *, n_jobs: int, folder: Path, partial: Path | None = None,
               pool: JobPool | None = None) -> dict[str, Any]:
    plan = fold_plan(prepared.folds(), list(prepared.graphs("test")))
    tasks = [(fold, seed) for seed in seeds for fold in plan.folds]
    finished: dict[tuple[int, int], FoldResult] = {}
    if partial is not None and partial.is_dir():
        for fold, seed in tasks:
            saved = load_fold_result(partial / fold_job_name(fold, seed))
            if saved is not None:
                finished[(fold, seed)] = saved
    todo = [task for task in tasks if task not in finished]
    per_job = _job_memory(adapter, prepared, plan, settings)
    workers = n_jobs if pool is None else pool.workers
    # the model's own setting (num_threads > 0), else the stage's share of the cores
    threads = int(settings.get("num_threads") or 0) or stage_job_threads(workers, len(tasks))
    if pool is not None:  # the pool admits jobs by their memory estimate
        jobs = pool.workers
    else:
        jobs = max(1, min(n_jobs, len(todo)))
        budget = available_memory()
        if per_job and budget and jobs > 1:
            jobs = max(1, min(jobs, int(budget * MEMORY_SHARE // per_job)))
    tag = f"[{collection.name}] {adapter.name}"
    shared = " (workers shared with the run's other training stages)" if pool is not None else ""
    logger.info(f"{tag}: {len(plan.folds)} folds x {len(seeds)} seeds = {len(tasks)} fold jobs, "
                f"{jobs} job(s) x {threads} thread(s){shared}, ~{(per_job or 0) / 2**30:.2f} GiB per job")
    for companion in companions(prepared, settings):
        logger.info(f"{tag}: every fold model also trains on the {len(labelled(companion))} labelled graphs "
                    f"of {companion.collection.name}")
    if finished:
        logger.info(f"{tag}: resuming: {len(finished)} of {len(tasks)} fold jobs already done "
                    f"({', '.join(fold_job_name(f, s) for f, s in sorted(finished))}), training {len(todo)}")
    args = [(adapter, prepared, collection, settings, plan, fold, seed, threads, partial) for fold, seed in todo]
    if pool is not None:
        results_iter = pool.map_unordered(fit_predict_fold, args, job_memory=per_job)
    elif jobs == 1:
        results_iter = (fit_predict_fold(*a) for a in args)
    else:
        from joblib import Parallel, delayed

        _quiet_loky()
        # No explicit backend: loky processes unless the caller chose one with joblib.parallel_config
        # (``run --scheduler ADDRESS`` sends the jobs to a Dask cluster).
        results_iter = Parallel(n_jobs=jobs, return_as="generator_unordered")(
            delayed(fit_predict_fold)(*a) for a in args)
    results: list[FoldResult] = list(finished.values())
    started = time.perf_counter()
    for count, result in enumerate(results_iter, start=1):
        oof = result.scores.filter((pl.col("split") == "oof") & pl.col("score").is_not_nan())["score"]
        elapsed = time.perf_counter() - started
        left = len(todo) - count
        eta = f", ETA {format_duration(elapsed / count * left)}" if left else ""
        logger.info(f"{tag} fold job {len(finished) + count}/{len(tasks)} done (fold {result.fold} "
                    f"seed {result.seed}): held-out score {oof.mean() if len(oof) else float('nan'):.4f} "
                    f"({result.wall_s:.1f}s){eta}")
        results.append(result)
    results.sort(key=lambda r: (r.seed, r.fold))

    _write_parquet(pl.concat([r.predictions for r in results]), folder / PREDICTIONS_FILE)
    scores = pl.concat([r.scores for r in results])
    _write_parquet(scores, folder / SCORES_FILE)
    importances = [r.importance for r in results if r.importance is not None]
    if importances:
        _write_parquet(pl.concat(importances), folder / IMPORTANCE_FILE)
    curves = [r.curves for r in results if r.curves is not None]
    if curves:
        _write_parquet(pl.concat(curves).cast(CURVES_SCHEMA), folder / CURVES_FILE)
    # fold models that stopped at the epoch cap: the run says so once, for all stages (epoch_cap_notes)
    capped = [bool(r.facts["stopped_at_cap"]) for r in results if "stopped_at_cap" in r.facts]
    saved_models = {}
    for r in results:
        (folder / MODELS_DIR).mkdir(exist_ok=True)
        for name, data in r.model_files.items():
            (folder / MODELS_DIR / name).write_bytes(data)  # the stage folder is private until published
        saved_models[(r.fold, r.seed)] = {
            "files": [f"{MODELS_DIR}/{name}" for name in r.model_files],
            "sha256": {f"{MODELS_DIR}/{name}": hashlib.sha256(data).hexdigest()
                       for name, data in r.model_files.items()}}
    metrics = summarize_scores(scores)
    metrics |= {
        "collection": collection.name,
        "model": adapter.name,
        "metric": "top5 slowdown" if collection.is_tile else "kendall tau-b",
        "folds": list(plan.folds),
        "seeds": seeds,
        "test_graphs": len(plan.test),
        "extra_train_graphs": {c.collection.name: len(labelled(c)) for c in companions(prepared, settings)},
        "jobs": jobs,
        "threads_per_job": threads,
        "shared_workers": pool is not None,
        "resumed_fold_jobs": len(finished),
        **({"epoch_cap": {"epochs": settings.get("epochs"), "fold_models": len(capped), "at_cap": sum(capped)}}
           if capped else {}),
        "models": [{"fold": r.fold, "seed": r.seed, "wall_s": round(r.wall_s, 3), **r.facts,
                    **saved_models.get((r.fold, r.seed), {})} for r in results],
    }
    return metrics


def _quiet_loky() -> None:
    """Keep loky's routine notices out of the log: it replaces a worker that its memory-leak check
    retired between two fold jobs (the jobs are resubmitted, nothing is lost) and, without ``lscpu``,
    warns that it counts logical cores, which is what ``available_cores`` gives it anyway."""
    quiet_worker_replacement()  # also a LOKY_MAX_CPU_COUNT loky cannot read: replaced, with a warning
    os.environ.setdefault("LOKY_MAX_CPU_COUNT", str(available_cores()))


def _write_parquet(frame: pl.DataFrame, path: Path) -> None:
    # The stage folder is private until the engine renames it into place, so a direct write is atomic.
    frame.write_parquet(path)


def epoch_cap_notes(outputs: Sequence[StageOutput], base_epochs: Callable[[str, str], int | None]) -> list[tuple[int, str]]:
    """What the training stages ``outputs`` of one run say about fold models that stopped at their epoch
    cap, once for the run: ``(logging level, message)`` per model. ``base_epochs(model, collection)`` is
    the base config's cap. Under a config whose cap is below base's (demo, quick) running every epoch is
    the shortened schedule doing what it was chosen for (an INFO note); at base's cap or above, early
    stopping never ended those fits and they may not have converged (a WARNING)."""
    groups: dict[tuple[str, bool], list[tuple[str, dict]]] = {}
    for output in outputs:
        cap, m = output.metrics.get("epoch_cap"), output.metrics
        if not cap or not cap.get("at_cap"):
            continue
        base = base_epochs(m["model"], m["collection"])
        shortened = base is not None and cap["epochs"] < base
        groups.setdefault((m["model"], shortened), []).append((m["collection"], cap | {"base": base}))
    notes = []
    for (model, shortened), stages in groups.items():
        at_cap, total = sum(c["at_cap"] for _, c in stages), sum(c["fold_models"] for _, c in stages)
        where = f"{len(stages)} collection{'s' if len(stages) > 1 else ''} ({', '.join(n for n, _ in stages)})"
        epochs = sorted({c["epochs"] for _, c in stages})
        cap_text = f"{model}.epochs = {epochs[0]}" + (f" to {epochs[-1]}" if len(epochs) > 1 else "")
        if shortened:
            bases = sorted({c["base"] for _, c in stages})
            notes.append((logging.INFO, f"{model}: {at_cap} of {total} fold models in {where} trained every epoch "
                                        f"this config allows ({cap_text}; base: {'/'.join(map(str, bases))}): "
                                        "expected of a shortened schedule; their scores are a short fit's"))
        else:
            notes.append((logging.WARNING, f"warning: {model}: {at_cap} of {total} fold models in {where} stopped at "
                                           f"the epoch cap ({cap_text}) before early stopping ended them: they may "
                                           f"not have converged; the training curves (report.html) show whether "
                                           f"a larger {model}.epochs would help"))
    return notes


def format_summary(output: StageOutput) -> str:
    """Two lines for the command line: OOF score (mean +- std over seeds, per fold) and the keys."""
    m = output.metrics

    def num(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    folds = " ".join(f"{f}:{num(v)}" for f, v in m.get("oof_score_by_fold", {}).items())
    holdout = f"  holdout {num(m.get('holdout_score'))}" if m.get("holdout_graphs") else ""
    cap = m.get("epoch_cap")
    if cap:
        holdout += f"  {cap['at_cap']} of {cap['fold_models']} fold models stopped at the epoch cap ({cap['epochs']})"
    inputs = " ".join(f"{k}={v}" for k, v in output.manifest.get("inputs", {}).items())
    return (f"{m.get('collection', '?'):<20} {m.get('model', '?'):<8} {m.get('metric', '?')}: "
            f"OOF {num(m.get('oof_score'))} +- {num(m.get('oof_score_std'))} over {len(m.get('seeds', []))} seed(s)"
            f"  folds {folds}{holdout}\n"
            f"{'':<20} {output.stage}/{output.key}  inputs {inputs}  ({output.manifest.get('wall_time_s', 0):.1f}s)")


def load_predictions(output: StageOutput) -> pl.DataFrame:
    """The prediction table of a training stage output (validated against the shared schema)."""
    from pipelines.core.predictions import read_predictions

    return read_predictions(output.file(PREDICTIONS_FILE))

