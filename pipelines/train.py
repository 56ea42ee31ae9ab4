"""The training stage: grouped k-fold fit and predict of any registered model on one collection.

For one collection, one model and the resolved config, every (fold, seed) pair of the saved folds
and ``run.seeds`` fits a ranker on the graphs of the other CV folds, early-stops on the held-out
fold, and predicts every config of the held-out graphs (out-of-fold), of the holdout graphs (fold
-1, present when ``folds.holdout_valid``) and of every test graph. Pairs run in parallel with
joblib (loky processes, or the backend of an enclosing ``joblib.parallel_config``, e.g. Dask):
``run.n_jobs`` workers, fewer when the adapter's estimate of one job's memory
times the jobs exceeds ``MEMORY_SHARE`` of the available memory; each model gets ``cores // jobs``
threads. A worker loads only its own fold's data and predicts a few graphs at a time, so memory
stays at about one fold's training table per job.

Output folder ``<work_dir>/train-<model>/<key>/`` (key = model settings resolved for the
collection + seeds + upstream stage keys):

* ``predictions.parquet`` -- the :mod:`pipelines.predictions` schema: ``oof`` rows (fold = the fold
  that held the graph out, one row per config and seed) and ``test`` rows (one per fold model);
* ``scores.parquet`` -- per-graph metric (tile: top-5 slowdown score; layout: Kendall tau-b) and
  OPA, with ``split`` "oof" (every CV graph, per seed) or "holdout" (per fold model);
* ``importance.parquet`` -- feature importances per fold model, for models that have them;
* ``manifest.json`` metrics -- OOF score (mean over graphs) per seed, its mean and spread over
  seeds, per fold, the holdout score, and per-model facts (best iteration, wall time).

Model registry
--------------
A model plugs in with one :class:`ModelAdapter` in :data:`MODELS` (``name -> adapter``); the loop
above never changes. An adapter says which upstream outputs the model reads and how to load them,
builds the model from the config, and reports on it::

    settings(config, collection) -> dict    # resolved hyperparameters, JSON-able (part of the key)
    inputs(prepared) -> dict[str, str]      # upstream stage keys the model reads (part of the key)
    load(prepared, graphs, *, settings, fit, seed) -> data
                                            # fit=True: for fitting (may subsample configs);
                                            # fit=False: every config, for prediction
    index(data) -> (graphs, config_index)   # the rows predict() scores, in its order
    make(settings, collection, *, num_threads) -> Ranker
    describe(ranker) -> (facts dict, importance frame or None)
    job_memory(prepared, graphs, settings) -> bytes   # optional: peak of fitting on graphs, which
                                                      # caps the parallel jobs to fit in memory

Entries are zero-argument factories, so a model whose module imports torch can register
``lambda: importlib.import_module("pipelines.models.gnn").GNNAdapter()`` and stay lazy. A ranker
has ``fit(train, valid, *, seed) -> self`` and ``predict(data) -> costs`` (LOWER =
faster, aligned with ``index(data)``). A model's settings may carry ``seed``: an offset added to
every run seed (``gbdt.seed``, ``gnn.seed``). Besides ``gbdt`` the registry holds two references
that every model should beat: ``random`` and ``feature`` (rank by the one ``f_*`` column, and sign,
that scores best on the training folds; ``feature:<column>`` fixes the column).
"""

from __future__ import annotations

import importlib
import math
import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import polars as pl

from pipelines.collections import Collection
from pipelines.config import PipelineConfig, config_to_dict, resolve_for_collection
from pipelines.engine import Code, StageOutput, run_stage
from pipelines.errors import ConfigError, PipelineError
from pipelines.predictions import PREDICTION_SCHEMA, prediction_frame

PREDICTIONS_FILE = "predictions.parquet"
SCORES_FILE = "scores.parquet"
IMPORTANCE_FILE = "importance.parquet"
# Copies of a fold's training table alive at once (polars frame, float32 matrix, its row-gathered
# copy, LightGBM's dataset), and the share of available memory the parallel jobs may take together.
MEMORY_COPIES = 4
MEMORY_SHARE = 0.6
# Graphs loaded at once for prediction: tile graphs are small and many, layout graphs large and few.
PREDICT_BATCH_GRAPHS = {"tile": 512, "layout": 8}
SCORES_SCHEMA: dict[str, pl.DataType] = {
    "collection": pl.Utf8,
    "graph": pl.Utf8,
    "split": pl.Utf8,  # "oof" or "holdout"
    "fold": pl.Int16,  # oof: the fold holding the graph out; holdout: the fold of the model
    "seed": pl.Int32,
    "num_configs": pl.Int64,
    "score": pl.Float64,  # tile: 2 - best of top 5 / best; layout: Kendall tau-b; NaN: undefined
    "opa": pl.Float64,
}


# ----------------------------------------------------------------------------- model protocol


class Ranker(Protocol):
    def fit(self, train: Any, valid: Any | None = None, *, seed: int) -> Ranker: ...

    def predict(self, data: Any) -> np.ndarray: ...


class ModelAdapter(Protocol):
    """How the training stage drives one kind of model (see the module docstring)."""

    name: str

    def settings(self, config: PipelineConfig, collection: Collection) -> dict[str, Any]: ...

    def inputs(self, prepared: Any) -> dict[str, str]: ...

    def load(self, prepared: Any, graphs: list[str], *, settings: dict[str, Any], fit: bool, seed: int) -> Any: ...

    def index(self, data: Any) -> tuple[np.ndarray, np.ndarray]: ...

    def make(self, settings: dict[str, Any], collection: Collection, *, num_threads: int) -> Ranker: ...

    def describe(self, ranker: Any) -> tuple[dict[str, Any], pl.DataFrame | None]: ...


# ----------------------------------------------------------------------------- feature-table models


class _FeatureTableAdapter:
    """Shared loading for models that read the GBDT feature tables (one row per graph and config)."""

    name = "feature-table"

    def inputs(self, prepared: Any) -> dict[str, str]:
        return {"features": prepared.stages["features"].key, "folds": prepared.stages["folds"].key}

    def load(self, prepared: Any, graphs: list[str], *, settings: dict[str, Any], fit: bool,
             seed: int) -> pl.DataFrame:
        cap = settings["load_max_configs"] if fit else None
        return prepared.load_features(graphs, max_configs=cap, seed=seed)

    def index(self, data: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        return data["graph"].to_numpy(), data["config_index"].to_numpy()

    def job_memory(self, prepared: Any, graphs: list[str], settings: dict[str, Any]) -> int:
        """Rough peak bytes of fitting on ``graphs``: capped rows x columns x copies in flight."""
        configs = prepared.graph_table.filter(pl.col("graph").is_in(graphs))["configs_after"].to_numpy()
        rows = int(np.minimum(configs, settings["load_max_configs"]).sum())
        columns = prepared.load_features(graphs[:1], max_configs=1).width
        return rows * columns * 4 * MEMORY_COPIES

    def describe(self, ranker: Any) -> tuple[dict[str, Any], pl.DataFrame | None]:
        return {}, None


class GBDTAdapter(_FeatureTableAdapter):
    name = "gbdt"

    def settings(self, config: PipelineConfig, collection: Collection) -> dict[str, Any]:
        resolved = config_to_dict(resolve_for_collection(config.gbdt, collection))
        resolved.pop("collections", None)
        return resolved

    def make(self, settings: dict[str, Any], collection: Collection, *, num_threads: int) -> Ranker:
        from pipelines.models.gbdt import GBDTRanker
        from pipelines.models.gbdt_config import GBDTConfig

        return GBDTRanker.from_config(GBDTConfig(**settings), is_tile=collection.is_tile, num_threads=num_threads)

    def load(self, prepared: Any, graphs: list[str], *, settings: dict[str, Any], fit: bool,
             seed: int) -> pl.DataFrame:
        """The feature rows without the ``f_*`` columns that ``exclude_features`` names by prefix."""
        frame = super().load(prepared, graphs, settings=settings, fit=fit, seed=seed)
        prefixes = tuple(settings.get("exclude_features") or ())
        if not prefixes:
            return frame
        return frame.drop([c for c in frame.columns if c.startswith("f_") and c.startswith(prefixes)])

    def describe(self, ranker: Any) -> tuple[dict[str, Any], pl.DataFrame | None]:
        facts = {"best_iteration": ranker.best_iteration_, "train_rows": ranker.n_train_rows_}
        return facts, ranker.feature_importance()


class RandomAdapter(_FeatureTableAdapter):
    """Uniformly random costs: the floor every model must clear."""

    name = "random"

    def settings(self, config: PipelineConfig, collection: Collection) -> dict[str, Any]:
        return {"load_max_configs": 1}  # fitting reads nothing useful; keep the load minimal

    def make(self, settings: dict[str, Any], collection: Collection, *, num_threads: int) -> Ranker:
        return RandomRanker()


@dataclass
class FeatureAdapter(_FeatureTableAdapter):
    """One hand-made feature used as the ranking (``column=None``: the best one on the training folds)."""

    column: str | None = None
    name: str = "feature"

    def settings(self, config: PipelineConfig, collection: Collection) -> dict[str, Any]:
        return {"column": self.column,
                "load_max_configs": resolve_for_collection(config.gbdt, collection).load_max_configs}

    def make(self, settings: dict[str, Any], collection: Collection, *, num_threads: int) -> Ranker:
        return FeatureRanker(settings["column"], metric="top5" if collection.is_tile else "opa")

    def describe(self, ranker: Any) -> tuple[dict[str, Any], pl.DataFrame | None]:
        return {"column": ranker.column_, "sign": ranker.sign_, "train_score": ranker.train_score_}, None


MODELS: dict[str, Callable[[], ModelAdapter]] = {
    "gbdt": GBDTAdapter,
    "random": RandomAdapter,
    "feature": FeatureAdapter,
    # torch is imported only when the GNN is actually used
    "gnn": lambda: importlib.import_module("pipelines.models.gnn").GNNAdapter(),
}


# Modules a model runs beyond this one (which holds the registry and the feature-table models): part of
# the training stage's key, named as strings so the registry stays lazy.
MODEL_CODE: dict[str, tuple[str, ...]] = {"gnn": ("pipelines.models.gnn",)}


def adapter_modules(model: str) -> tuple[str, ...]:
    return MODEL_CODE.get(model.partition(":")[0], ())


def get_adapter(model: str) -> ModelAdapter:
    """The adapter registered as ``model``; ``feature:<column>`` ranks by that one column."""
    name, _, argument = model.partition(":")
    if name not in MODELS:
        raise ConfigError(f"unknown model {model!r}; registered: {', '.join(MODELS)} (or feature:<column>)")
    if argument and name != "feature":
        raise ConfigError(f"model {name!r} takes no argument, got {model!r}")
    if name == "feature" and argument:
        if not argument.startswith("f_"):
            raise ConfigError(f"feature:<column> needs an f_* column, got {argument!r}")
        return FeatureAdapter(column=argument, name=model)
    return MODELS[name]()


def stage_name(model: str) -> str:
    """Stage folder of a model's training: ``train-gbdt``, ``train-feature.f_padding`` ..."""
    return "train-" + model.replace(":", ".")


# ----------------------------------------------------------------------------- reference rankers


class RandomRanker:
    """Costs drawn uniformly per graph from the fit seed and the graph name (independent of batching)."""

    def fit(self, train: Any, valid: Any | None = None, *, seed: int) -> RandomRanker:
        self.seed_ = int(seed)
        return self

    def predict(self, frame: pl.DataFrame) -> np.ndarray:
        if not hasattr(self, "seed_"):
            raise RuntimeError("RandomRanker.predict called before fit")
        from pipelines.models.gbdt import group_rows

        order, offsets = group_rows(frame["graph"])
        graphs = frame["graph"].to_numpy()[order]
        costs = np.empty(frame.height, dtype=np.float64)
        for start, stop in zip(offsets[:-1], offsets[1:]):
            rng = np.random.default_rng([self.seed_, zlib.crc32(str(graphs[start]).encode())])
            costs[order[start:stop]] = rng.random(stop - start)
        return costs


class FeatureRanker:
    """Rank by one feature column times a sign. ``fit`` picks the sign (and, when ``column`` is None,
    the ``f_*`` column) with the best training score: ``top5`` (tile metric) or ``opa`` (pair accuracy
    on a seeded sample of pairs per graph, the layout proxy)."""

    def __init__(self, column: str | None = None, *, metric: str = "opa", pairs_per_graph: int = 2000):
        if metric not in ("opa", "top5"):
            raise ConfigError(f"FeatureRanker metric must be 'opa' or 'top5', got {metric!r}")
        self.column = column
        self.metric = metric
        self.pairs_per_graph = pairs_per_graph

    def fit(self, train: pl.DataFrame, valid: pl.DataFrame | None = None, *, seed: int) -> FeatureRanker:
        from pipelines.models.gbdt import group_rows, pair_accuracy, sample_pairs, top5_score

        candidates = [self.column] if self.column else [c for c in train.columns if c.startswith("f_")]
        missing = [c for c in candidates if c not in train.columns]
        if missing or not candidates:
            raise ValueError(f"feature frame lacks column(s) {', '.join(missing) or 'f_*'}")
        order, offsets = group_rows(train["graph"])
        y = train["target"].to_numpy().astype(np.float64)[order]
        i, j = sample_pairs(y, offsets, self.pairs_per_graph, np.random.default_rng(seed))
        best = (-math.inf, candidates[0], 1.0)
        for column in candidates:
            values = train[column].to_numpy().astype(np.float64)[order]
            if not np.all(np.isfinite(values)):
                continue
            for sign in (1.0, -1.0):
                cost = sign * values
                score = top5_score(cost, y, offsets) if self.metric == "top5" else pair_accuracy(cost, y, i, j)
                if score > best[0]:
                    best = (score, column, sign)
        self.train_score_, self.column_, self.sign_ = best
        return self

    def predict(self, frame: pl.DataFrame) -> np.ndarray:
        if not hasattr(self, "column_"):
            raise RuntimeError("FeatureRanker.predict called before fit")
        values = frame[self.column_].to_numpy().astype(np.float64)
        return self.sign_ * np.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)


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
    from pipelines.metric import score_predictions

    if not predicted:
        return pl.DataFrame(schema={k: SCORES_SCHEMA[k] for k in ("graph", "num_configs", "score", "opa")})
    frame = pl.concat([prediction_frame(collection=collection.name, graph=g, split="oof", scores=c, fold=0,
                                        seed=0, model="-", config_index=i) for g, i, c in predicted])
    truths = {(collection.name, g): truth(g) for g, _, _ in predicted}
    report = score_predictions(frame, truths)
    return report.per_graph.select("graph", "num_configs", "score", pl.col("opa").cast(pl.Float64))


def fit_predict_fold(adapter: ModelAdapter, prepared: Any, collection: Collection, settings: dict[str, Any],
                     plan: FoldPlan, fold: int, seed: int, num_threads: int) -> FoldResult:
    """Fit one fold model and predict its held-out, holdout and test graphs (runs in a worker)."""
    started = time.perf_counter()
    fit_seed = seed + int(settings.get("seed", 0))
    held_out = plan.graphs_by_fold[fold]
    ranker = adapter.make(settings, collection, num_threads=num_threads)
    train = adapter.load(prepared, plan.train_graphs(fold), settings=settings, fit=True, seed=fit_seed)
    valid = adapter.load(prepared, held_out, settings=settings, fit=True, seed=fit_seed)
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
        importance = importance.with_columns(pl.lit(fold, pl.Int16).alias("fold"), pl.lit(seed, pl.Int32).alias("seed"))
    return FoldResult(fold, seed, predictions, scores, importance, facts, time.perf_counter() - started)


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


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """Bytes of memory available to new work (Linux ``MemAvailable``); None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _job_memory(adapter: ModelAdapter, prepared: Any, plan: FoldPlan, settings: dict[str, Any]) -> int | None:
    """The largest fold's memory estimate, for adapters that offer ``job_memory`` (optional)."""
    estimate = getattr(adapter, "job_memory", None)
    if estimate is None:
        return None
    return max(estimate(prepared, plan.train_graphs(fold), settings) for fold in plan.folds)


def train_model(config: PipelineConfig, prepared: Any, *, model: str, work_dir: Path | str, force: bool = False,
                log: Callable[[str], None] = print) -> StageOutput:
    """Run (or reuse) the training stage of ``model`` on the collection of ``prepared``."""
    adapter = get_adapter(model)
    collection: Collection = prepared.collection
    settings = adapter.settings(config, collection)
    seeds = [int(s) for s in config.run.seeds]
    stage_config = {"collection": collection.name, "model": model, "settings": settings, "seeds": seeds}

    def compute(folder: Path) -> dict[str, Any]:
        return _run_folds(adapter, prepared, collection, settings, seeds, n_jobs=config.run.n_jobs,
                          folder=folder, log=log)

    return run_stage(work_dir=Path(work_dir), stage=stage_name(model), config=stage_config,
                     code=Code(("pipelines.train", *adapter_modules(model))),
                     inputs=adapter.inputs(prepared), compute=compute,
                     seeds={f"run_{i}": s for i, s in enumerate(seeds)}, force=force, log=log)


def _run_folds(adapter: ModelAdapter, prepared: Any, collection: Collection, settings: dict[str, Any],
               seeds: list[int], *, n_jobs: int, folder: Path, log: Callable[[str], None]) -> dict[str, Any]:
    plan = fold_plan(prepared.folds(), list(prepared.graphs("test")))
    tasks = [(fold, seed) for seed in seeds for fold in plan.folds]
    jobs = max(1, min(n_jobs, len(tasks)))
    per_job = _job_memory(adapter, prepared, plan, settings)
    budget = available_memory()
    if per_job and budget and jobs > 1:
        jobs = max(1, min(jobs, int(budget * MEMORY_SHARE // per_job)))
    threads = max(1, available_cores() // jobs)
    log(f"[{collection.name}] {adapter.name}: {len(plan.folds)} folds x {len(seeds)} seeds, "
        f"{jobs} job(s) x {threads} thread(s), ~{(per_job or 0) / 2**30:.2f} GiB per job")
    args = [(adapter, prepared, collection, settings, plan, fold, seed, threads) for fold, seed in tasks]
    if jobs == 1:
        results_iter = (fit_predict_fold(*a) for a in args)
    else:
        from joblib import Parallel, delayed

        # No explicit backend: loky processes unless the caller chose one with joblib.parallel_config
        # (``run --scheduler ADDRESS`` sends the jobs to a Dask cluster).
        results_iter = Parallel(n_jobs=jobs, return_as="generator_unordered")(
            delayed(fit_predict_fold)(*a) for a in args)
    results: list[FoldResult] = []
    for result in results_iter:
        oof = result.scores.filter((pl.col("split") == "oof") & pl.col("score").is_not_nan())["score"]
        log(f"[{collection.name}] {adapter.name} fold {result.fold} seed {result.seed}: "
            f"held-out score {oof.mean() if len(oof) else float('nan'):.4f} ({result.wall_s:.1f}s)")
        results.append(result)
    results.sort(key=lambda r: (r.seed, r.fold))

    _write_parquet(pl.concat([r.predictions for r in results]), folder / PREDICTIONS_FILE)
    scores = pl.concat([r.scores for r in results])
    _write_parquet(scores, folder / SCORES_FILE)
    importances = [r.importance for r in results if r.importance is not None]
    if importances:
        _write_parquet(pl.concat(importances), folder / IMPORTANCE_FILE)
    metrics = summarize_scores(scores)
    metrics |= {
        "collection": collection.name,
        "model": adapter.name,
        "metric": "top5 slowdown" if collection.is_tile else "kendall tau-b",
        "folds": list(plan.folds),
        "seeds": seeds,
        "test_graphs": len(plan.test),
        "jobs": jobs,
        "threads_per_job": threads,
        "models": [{"fold": r.fold, "seed": r.seed, "wall_s": round(r.wall_s, 3), **r.facts} for r in results],
    }
    return metrics


def _write_parquet(frame: pl.DataFrame, path: Path) -> None:
    # The stage folder is private until the engine renames it into place, so a direct write is atomic.
    frame.write_parquet(path)


def format_summary(output: StageOutput) -> str:
    """Two lines for the command line: OOF score (mean +- std over seeds, per fold) and the keys."""
    m = output.metrics

    def num(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    folds = " ".join(f"{f}:{num(v)}" for f, v in m.get("oof_score_by_fold", {}).items())
    holdout = f"  holdout {num(m.get('holdout_score'))}" if m.get("holdout_graphs") else ""
    inputs = " ".join(f"{k}={v}" for k, v in output.manifest.get("inputs", {}).items())
    return (f"{m.get('collection', '?'):<20} {m.get('model', '?'):<8} {m.get('metric', '?')}: "
            f"OOF {num(m.get('oof_score'))} +- {num(m.get('oof_score_std'))} over {len(m.get('seeds', []))} seed(s)"
            f"  folds {folds}{holdout}\n"
            f"{'':<20} {output.stage}/{output.key}  inputs {inputs}  ({output.manifest.get('wall_time_s', 0):.1f}s)")


def load_predictions(output: StageOutput) -> pl.DataFrame:
    """The prediction table of a training stage output (validated against the shared schema)."""
    from pipelines.predictions import read_predictions

    return read_predictions(output.file(PREDICTIONS_FILE))

