"""Blending the predictions of several models, as pure functions over prediction frames (no I/O).

Every frame follows ``pipelines.core.predictions`` (score LOWER = predicted FASTER). The steps, in order:

1. :func:`normalise_scores` puts each (model, seed, fold model, graph) on a common [0, 1] scale, so
   models with different score scales (a predicted runtime, a negated logit) can be summed;
2. :func:`average_over_seeds_and_folds` averages seeds (out-of-fold rows) or seeds and fold models
   (test rows); :func:`prepare_model_scores` does 1 and 2 and normalises the means again, so each
   model spans [0, 1] per graph and a weight means the same for every model;
3. :func:`fit_blend_weights` chooses the weights on OUT-OF-FOLD predictions only, maximising the
   competition metric (tile top-5 score or mean Kendall tau-b per graph); ties go to the weights
   closest to equal (the robust choice when the OOF metric cannot tell candidates apart). With
   ``min_gain_se`` > 0 (``ensemble.min_gain_se``) the fitted blend is kept only if its OOF gain over
   the best single model exceeds that many standard errors of the per-graph gain; otherwise the best
   single model alone is used (a gain the OOF graphs cannot tell from noise is not taken). With
   ``gain_at="test-runs"`` (``ensemble.gain_at``) the gain tested is the one expected where the blend
   is applied (:func:`gain_at_runs`): test rows average every fold model of every seed, OOF rows one
   fold model per seed, and the part of a blend's gain that is variance reduction the test-time
   average already gives;
4. :func:`blend` applies the weights, giving a frame in the same schema with ``model="ensemble"``.

:func:`ensemble_collection` chains them for one collection and any number of models.

The ``ensemble`` stage (:func:`ensemble_stage`, ``<work_dir>/ensemble/<key>/``, key = collection,
method, grid, model names and the keys of the prune stage and of every training stage) writes
``predictions.parquet`` (blended ``oof`` and ``test`` rows, ``model="ensemble"``, averaged over folds
and seeds; read back with :func:`load_blended_test`) and ``curve.parquet`` (every weight vector tried
and its OOF score); its manifest holds the weights and the OOF score of each model alone and of the
blend (and the grid optimum, the best single model and the blend's OOF gain over it with its
standard error). With one model the blend is the identity (weight 1.0).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from dataclasses import dataclass
from types import SimpleNamespace
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, NamedTuple, Sequence

import numpy as np
import polars as pl

from pipelines.core.collection import Collection, parse_collection
from pipelines.core.engine import Code, StageOutput
from pipelines.core.errors import ConfigError, FormatError, PipelineError
from pipelines.core.metric import best_scoring, layout_kendall_tau, order_from_scores, tile_score, tile_top_k
from pipelines.core.predictions import validate_predictions
from pipelines.core.stages import Stage, StageCall, run_declared

NormaliseMethod = Literal["minmax", "rank"]
NORMALISE_METHODS: tuple[str, ...] = ("minmax", "rank")
GraphMetric = Callable[[np.ndarray, np.ndarray], float]
"""Per-graph metric ``(scores, truth) -> value`` (higher is better); scores: lower = faster."""

ENSEMBLE_MODEL = "ensemble"
AVERAGED = -1  # fold/seed value of rows that average several folds or seeds
DEFAULT_GRID_STEP = 0.05
# Where the blend's OOF gain is tested (``ensemble.gain_at``): as measured on the OOF rows, or
# extrapolated to the test's number of averaged runs per graph (:func:`gain_at_runs`).
GAIN_AT_CHOICES: tuple[str, ...] = ("oof", "test-runs")
# Above this many models the full simplex grid grows too fast (5 models at 0.05: 10,626 points);
# coordinate ascent is used instead.
MAX_MODELS_FULL_GRID = 3
_TIE_TOLERANCE = 1e-12
logger = logging.getLogger(__name__)

ENSEMBLE_STAGE = "ensemble"
ENSEMBLE_CODE = Code(("pipelines.training.ensemble",))
ENSEMBLE_PREDICTIONS = "predictions.parquet"
ENSEMBLE_CURVE = "curve.parquet"

# One prediction per (group, config): a graph's scores from one model, seed and fold model.
_RUN_KEYS = ["model", "seed", "fold", "split", "collection", "graph"]


# ----------------------------------------------------------------------------- normalisation


def normalise_scores(frame: pl.DataFrame, method: NormaliseMethod | str = "minmax") -> pl.DataFrame:
    """Rescale each graph's scores to [0, 1] per (model, seed, fold model, split, graph).

    ``"minmax"``: ``(s - min) / (max - min)``; ``"rank"``: the average rank of each score as a
    percentile, ``(rank - 1) / (n - 1)``. Both keep the order and the ties of the scores. A graph
    whose scores are all equal (or that has one config) gets 0.5 everywhere instead of NaN.
    """
    frame = validate_predictions(frame)
    if method == "minmax":
        low = pl.col("score").min().over(_RUN_KEYS)
        span = pl.col("score").max().over(_RUN_KEYS) - low
        scaled = pl.when(span > 0).then((pl.col("score") - low) / span).otherwise(0.5)
    elif method == "rank":
        count = pl.len().over(_RUN_KEYS)
        rank = pl.col("score").rank("average").over(_RUN_KEYS)
        scaled = pl.when(count > 1).then((rank - 1) / (count - 1)).otherwise(0.5)
    else:
        raise ConfigError(f"unknown normalisation {method!r}; expected one of: {', '.join(NORMALISE_METHODS)}")
    return frame.with_columns(scaled.cast(pl.Float64).alias("score"))


# ----------------------------------------------------------------------------- averaging


def average_over_seeds_and_folds(frame: pl.DataFrame) -> pl.DataFrame:
    """Mean score per (model, collection, graph, config): over seeds and fold models for test rows,
    over seeds for out-of-fold rows (each graph is held out by exactly one fold, which is kept).

    Averaged columns are set to ``AVERAGED`` (-1). A graph held out by several folds of one model,
    or whose configs were not all predicted by the same number of runs, is a FormatError.
    """
    frame = validate_predictions(frame)
    oof = frame.filter(pl.col("split") == "oof")
    folds = oof.group_by(["model", "collection", "graph"]).agg(pl.col("fold").n_unique().alias("folds"))
    several = folds.filter(pl.col("folds") > 1)
    if several.height:
        row = several.row(0, named=True)
        raise FormatError("<predictions>", f"out-of-fold graph {row['collection']}:{row['graph']} of model "
                                           f"{row['model']!r} appears in {row['folds']} folds; expected one")
    keys = ["model", "collection", "graph", "split", "config_index"]
    averaged = (
        frame.with_columns(pl.when(pl.col("split") == "oof").then(pl.col("fold")).otherwise(AVERAGED)
                           .cast(pl.Int16).alias("fold"))
        .group_by([*keys, "fold"])
        .agg(pl.col("score").mean(), pl.len().alias("_runs"))
    )
    uneven = (averaged.group_by(["model", "collection", "graph", "split"])
              .agg(pl.col("_runs").min().alias("low"), pl.col("_runs").max().alias("high"))
              .filter(pl.col("low") != pl.col("high")))
    if uneven.height:
        row = uneven.row(0, named=True)
        raise FormatError("<predictions>", f"{row['split']} graph {row['collection']}:{row['graph']} of model "
                                           f"{row['model']!r}: configs predicted by {row['low']} to {row['high']} "
                                           f"runs (fold models x seeds); every config needs the same runs")
    averaged = averaged.drop("_runs").with_columns(pl.lit(AVERAGED).alias("seed"))
    return validate_predictions(averaged).sort(["model", "split", "collection", "graph", "config_index"])


# ----------------------------------------------------------------------------- weight fitting


def competition_metric(collection: str) -> GraphMetric:
    """The per-graph competition metric of a collection, on scores where lower = faster.

    Same formulas as ``pipelines.core.metric.score_predictions``: the tile top-5 score of the five lowest
    scores, or the Kendall tau-b of the score order (score ties broken by config index).
    """
    if parse_collection(collection).is_tile:
        return lambda scores, truth: tile_score(tile_top_k(scores), truth)
    return lambda scores, truth: layout_kendall_tau(order_from_scores(scores), truth)


@dataclass(frozen=True)
class BlendFit:
    """Chosen blend weights, their out-of-fold score, each model's score alone, and every point tried.

    ``curve`` has one column ``w:<model>`` per model plus ``score`` (the OOF objective), one row per
    weight vector evaluated, in the order tried. ``fitted_weights`` is the grid optimum; ``weights``
    is it, or the best single model alone when its ``gain`` over that model (mean per-graph OOF
    gain, standard error ``gain_se``) did not pass the ``min_gain_se`` test.
    """

    weights: dict[str, float]
    score: float
    single_scores: dict[str, float]
    curve: pl.DataFrame
    fitted_weights: dict[str, float]
    fitted_score: float
    best_single: str
    gain: float
    gain_se: float
    tested_gain: float  # what the min_gain_se test compared: ``gain``, or it at the test's runs

    @property
    def best_alone(self) -> dict[str, float]:
        """The weights of the best single model alone."""
        return {m: float(m == self.best_single) for m in self.fitted_weights}

    def requiring(self, min_gain_se: float, tested_gain: float) -> BlendFit:
        """This fit with the fitted blend kept only if ``tested_gain`` exceeds ``min_gain_se``
        standard errors of the OOF gain (0: always kept), else the best single model alone (pure)."""
        if not math.isfinite(min_gain_se) or min_gain_se < 0:
            raise ConfigError(f"min_gain_se must be a finite number >= 0, got {min_gain_se}")
        keep = min_gain_se == 0 or tested_gain > min_gain_se * self.gain_se  # NaN: not passed
        weights = dict(self.fitted_weights) if keep else self.best_alone
        score = self.fitted_score if keep else self.single_scores[self.best_single]
        return dataclasses.replace(self, weights=weights, score=score, tested_gain=tested_gain)


@dataclass(frozen=True)
class _GraphStack:
    """One graph's scores from every model, aligned on config: ``scores[m, i]`` for config ``index[i]``."""

    collection: str
    graph: str
    index: np.ndarray
    scores: np.ndarray
    truth: np.ndarray


def _stack_models(frames: Mapping[str, pl.DataFrame], truths: Mapping[tuple[str, str], np.ndarray],
                  collection: str) -> list[_GraphStack]:
    """Align the OOF predictions of all models per graph; every model must cover the same configs."""
    models = list(frames)
    keys = ["collection", "graph", "config_index"]
    parts = []
    for model, frame in frames.items():
        frame = validate_predictions(frame, f"<oof predictions of {model}>")
        frame = frame.filter((pl.col("split") == "oof") & (pl.col("collection") == collection))
        if frame.height == 0:
            raise FormatError(f"<oof predictions of {model}>", f"no out-of-fold rows for {collection}")
        if frame.select(keys).is_duplicated().any():
            raise FormatError(f"<oof predictions of {model}>", "several rows per config: average over seeds first "
                                                                "(average_over_seeds_and_folds)")
        parts.append(frame.select(*keys, pl.col("score").alias(f"_model{len(parts)}")))
    columns = [f"_model{i}" for i in range(len(models))]  # model names may be any string
    joined = parts[0]
    for part in parts[1:]:
        joined = joined.join(part, on=keys, how="full", coalesce=True)
    incomplete = joined.filter(pl.any_horizontal(pl.col(columns).is_null()))
    if incomplete.height:
        row = incomplete.row(0, named=True)
        lacking = [m for m, c in zip(models, columns) if row[c] is None]
        raise FormatError("<oof predictions>", f"models cover different configs: {', '.join(map(repr, lacking))} "
                                               f"lack(s) config {row['config_index']} of {row['collection']}:"
                                               f"{row['graph']} ({incomplete.height} such rows)")
    stacks = []
    for (coll, graph), part in joined.sort(keys).partition_by(["collection", "graph"], as_dict=True,
                                                               maintain_order=True).items():
        if (coll, graph) not in truths:
            raise FormatError("<oof predictions>", f"no true runtimes given for {coll}:{graph}")
        truth = np.asarray(truths[(coll, graph)])
        index = part["config_index"].to_numpy().astype(np.int64)
        if index.min() < 0 or index.max() >= truth.shape[0]:
            raise FormatError("<oof predictions>", f"{coll}:{graph}: config_index out of range [0, {truth.shape[0]})")
        scores = part.select(columns).to_numpy().T.astype(np.float64)
        stacks.append(_GraphStack(coll, graph, index, scores, truth[index]))
    return stacks


def _graph_values(stacks: Sequence[_GraphStack], weights: np.ndarray, metric: GraphMetric) -> np.ndarray:
    """The metric of the blend on each graph (NaN where undefined)."""
    return np.array([metric(weights @ s.scores, s.truth) for s in stacks], dtype=np.float64)


def paired_gain(values: np.ndarray, baseline: np.ndarray) -> tuple[float, float]:
    """Mean and standard error of the per-graph gain ``values - baseline`` over the graphs where both are
    defined (the standard error is NaN below two such graphs)."""
    diff = np.asarray(values, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    diff = diff[~np.isnan(diff)]
    if diff.size < 2:
        return (float(diff.mean()) if diff.size else math.nan), math.nan
    return float(diff.mean()), float(diff.std(ddof=1) / math.sqrt(diff.size))


def _objective(stacks: Sequence[_GraphStack], weights: np.ndarray, metric: GraphMetric) -> float:
    """Mean per-graph metric of the blend; graphs where the metric is undefined (NaN) are left out."""
    values = _graph_values(stacks, weights, metric)
    defined = values[~np.isnan(values)]
    return float(defined.mean()) if defined.size else math.nan


def _grid_units(step: float) -> int:
    units = round(1.0 / step) if step > 0 else 0
    if units < 1 or not math.isclose(units * step, 1.0, rel_tol=0, abs_tol=1e-9):
        raise ConfigError(f"blend grid step must divide 1 (e.g. 0.05, 0.1, 0.25), got {step}")
    return units


def _simplex_points(models: int, units: int) -> list[tuple[int, ...]]:
    """All ways to give ``units`` grid units to ``models`` models (weights = units / total)."""
    points = []
    for cuts in itertools.combinations(range(units + models - 1), models - 1):
        bounds = (-1, *cuts, units + models - 1)
        points.append(tuple(bounds[i + 1] - bounds[i] - 1 for i in range(models)))
    return points


def _closest_to_equal(points: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """Of several tied weight vectors, the one nearest to equal weights (then the first tried)."""
    def distance(point: tuple[int, ...]) -> float:
        total = sum(point)
        return float(np.sum((np.asarray(point) / total - 1.0 / len(point)) ** 2))
    return min(points, key=distance)


def fit_blend_weights(
    oof_frames_by_model: Mapping[str, pl.DataFrame],
    truths: Mapping[tuple[str, str], np.ndarray],
    collection: str,
    metric: GraphMetric | None = None,
    grid: float = DEFAULT_GRID_STEP,
    min_gain_se: float = 0.0,
) -> BlendFit:
    """Choose blend weights (non-negative, summing to 1) that maximise ``metric`` on OOF predictions.

    ``oof_frames_by_model`` maps each model name to its out-of-fold rows (normalised and averaged over
    seeds: one row per config); ``truths[(collection, graph)]`` holds what the metric ranks (runtime /
    normaliser for tile, runtime for layout) for every config of the graph. ``metric`` defaults to the
    competition metric of ``collection``. With up to three models every point of the simplex grid of
    step ``grid`` is tried; with more, coordinate ascent moves one grid step of weight between two
    models at a time from the best of equal weights and the single models. Every single model (a
    vertex of the grid) is always tried, so the blend never scores below the best one on OOF.

    ``min_gain_se`` > 0: the fitted weights are kept only if the blend's mean per-graph gain over the
    best single model exceeds ``min_gain_se`` standard errors of that gain (paired over the OOF
    graphs), else that model alone is chosen; 0 keeps the grid optimum whatever its margin.
    """
    models = list(oof_frames_by_model)
    if not models:
        raise ConfigError("fit_blend_weights needs at least one model")
    parse_collection(collection)
    metric = metric or competition_metric(collection)
    units = _grid_units(grid)
    stacks = _stack_models(oof_frames_by_model, truths, collection)

    tried: dict[tuple[int, ...], float] = {}

    def evaluate(point: tuple[int, ...]) -> float:
        if point not in tried:
            tried[point] = _objective(stacks, np.asarray(point, dtype=np.float64) / units, metric)
        return tried[point]

    vertices = [tuple(units if i == m else 0 for i in range(len(models))) for m in range(len(models))]
    if len(models) <= MAX_MODELS_FULL_GRID:
        for point in _simplex_points(len(models), units):
            evaluate(point)
    else:
        even = tuple(units // len(models) + (1 if i < units % len(models) else 0) for i in range(len(models)))
        current = max([even, *vertices], key=lambda p: (evaluate(p), p == even))
        while True:
            moves = [tuple(c + (j == dst) - (j == src) for j, c in enumerate(current))
                     for src, dst in itertools.permutations(range(len(models)), 2) if current[src] > 0]
            best_move = max(moves, key=evaluate)
            if not evaluate(best_move) > evaluate(current) + _TIE_TOLERANCE:
                break
            current = best_move

    defined = {p: s for p, s in tried.items() if not math.isnan(s)}
    if not defined:
        raise FormatError("<oof predictions>", f"the metric is undefined on every {collection} graph "
                                               "(all true runtimes constant?)")
    best = max(defined.values())
    chosen = _closest_to_equal([p for p, s in defined.items() if s >= best - _TIE_TOLERANCE])
    curve = pl.DataFrame(
        {**{f"w:{m}": [p[i] / units for p in tried] for i, m in enumerate(models)},
         "score": list(tried.values())},
        schema={**{f"w:{m}": pl.Float64 for m in models}, "score": pl.Float64},
    )
    single_scores = {m: tried[v] for m, v in zip(models, vertices)}
    best_single = best_scoring(single_scores)
    alone = vertices[models.index(best_single)]
    gain, gain_se = paired_gain(_graph_values(stacks, np.asarray(chosen, dtype=np.float64) / units, metric),
                                _graph_values(stacks, np.asarray(alone, dtype=np.float64) / units, metric))
    fitted = {m: chosen[i] / units for i, m in enumerate(models)}
    fit = BlendFit(weights=fitted, score=tried[chosen], single_scores=single_scores, curve=curve,
                   fitted_weights=fitted, fitted_score=tried[chosen], best_single=best_single, gain=gain,
                   gain_se=gain_se, tested_gain=gain)
    return fit.requiring(min_gain_se, gain)


def gain_at_runs(seed_gains: Sequence[float], gain: float, runs: int) -> float:
    """The blend's gain expected with ``runs`` predictions averaged per graph (pure).

    ``seed_gains``: the gain with each seed's predictions alone (one run per graph); ``gain``: with all
    of them averaged. Fits ``a + b / n`` through ``(1, mean(seed_gains))`` and ``(len(seed_gains), gain)``
    (the variance part of a gain falls as ``1 / n``); with one seed there is no slope and ``gain`` is
    returned."""
    seeds = len(seed_gains)
    if seeds < 2:
        return gain
    slope = (float(np.mean(seed_gains)) - gain) / (1 - 1 / seeds)
    return gain - slope / seeds + slope / runs


def seed_gains(oof: pl.DataFrame, truths: Mapping[tuple[str, str], np.ndarray], collection: str,
               fit: BlendFit, method: NormaliseMethod | str = "minmax",
               metric: GraphMetric | None = None) -> list[float]:
    """The OOF gain of ``fit``'s fitted blend over its best single model with each seed's predictions
    alone, one value per seed every model has (``oof``: OOF rows before normalising and averaging)."""
    models = list(fit.fitted_weights)
    metric = metric or competition_metric(collection)
    fitted, alone = (np.array([w[m] for m in models], dtype=np.float64) for w in (fit.fitted_weights, fit.best_alone))
    seeds = set.intersection(*(set(oof.filter(pl.col("model") == m)["seed"].unique().to_list()) for m in models))
    gains = []
    for seed in sorted(seeds):
        scored = prepare_model_scores(oof.filter(pl.col("seed") == seed), method)
        stacks = _stack_models({m: scored.filter(pl.col("model") == m) for m in models}, truths, collection)
        gains.append(paired_gain(_graph_values(stacks, fitted, metric), _graph_values(stacks, alone, metric))[0])
    return gains


def runs_per_test_graph(test: pl.DataFrame, model: str) -> int:
    """How many runs (fold models x seeds) the test rows of ``model`` average per graph."""
    return test.filter(pl.col("model") == model).select("fold", "seed").unique().height


def blend_graph_scores(oof_frames_by_model: Mapping[str, pl.DataFrame], truths: Mapping[tuple[str, str], np.ndarray],
                       collection: str, weights: Mapping[str, float],
                       metric: GraphMetric | None = None) -> np.ndarray:
    """The OOF metric of the blend with ``weights`` on each graph (NaN where undefined), in graph order:
    the per-graph values whose mean :func:`fit_blend_weights` maximises (inputs as there)."""
    stacks = _stack_models(oof_frames_by_model, truths, collection)
    vector = np.array([weights[m] for m in oof_frames_by_model], dtype=np.float64)
    return _graph_values(stacks, vector, metric or competition_metric(collection))


# ----------------------------------------------------------------------------- blending


def blend(frame: pl.DataFrame, weights: Mapping[str, float]) -> pl.DataFrame:
    """Weighted sum of the models' scores per config, as rows of ``model="ensemble"``.

    ``frame`` must hold one row per (model, split, collection, graph, config) (average seeds and
    folds first) and exactly the models named in ``weights``, agreeing on each graph's fold.
    """
    frame = validate_predictions(frame)
    models = sorted(set(frame["model"].unique().to_list()))
    if sorted(weights) != models:
        raise ConfigError(f"blend weights name models {sorted(weights)} but the predictions hold {models}")
    values = np.array([weights[m] for m in models], dtype=np.float64)
    if not np.isfinite(values).all() or (values < 0).any() or values.sum() <= 0:
        raise ConfigError(f"blend weights must be finite, non-negative and not all zero, got {dict(weights)}")
    keys = ["split", "collection", "graph", "config_index", "fold"]
    if frame.select(["model", *keys]).is_duplicated().any():
        raise FormatError("<predictions>", "several rows per model and config: average over seeds and folds first")
    # Pivot on positional column names: a model may be called like a key column.
    columns = {m: f"_model{i}" for i, m in enumerate(models)}
    wide = frame.with_columns(pl.col("model").replace_strict(columns)).pivot(on="model", index=keys, values="score")
    incomplete = wide.filter(pl.any_horizontal(pl.col(list(columns.values())).is_null()))
    if incomplete.height:
        row = incomplete.row(0, named=True)
        raise FormatError("<predictions>", f"models disagree on {row['split']} config {row['config_index']} of "
                                           f"{row['collection']}:{row['graph']} (missing, or a different fold)")
    blended = pl.sum_horizontal([pl.col(columns[m]) * weights[m] for m in models])
    out = wide.select(*keys, blended.alias("score"), pl.lit(AVERAGED).alias("seed"),
                      pl.lit(ENSEMBLE_MODEL).alias("model"))
    return validate_predictions(out).sort(["split", "collection", "graph", "config_index"])


class EnsembleResult(NamedTuple):
    blended_oof: pl.DataFrame
    blended_test: pl.DataFrame
    scores: dict[str, float]  # OOF metric of each model alone and of ``"ensemble"``
    fit: BlendFit

    @property
    def weights(self) -> dict[str, float]:
        return self.fit.weights

    @property
    def curve(self) -> pl.DataFrame:
        return self.fit.curve


def prepare_model_scores(frame: pl.DataFrame, method: NormaliseMethod | str = "minmax") -> pl.DataFrame:
    """Normalise per run, average over seeds (and fold models for test), normalise again per graph."""
    return normalise_scores(average_over_seeds_and_folds(normalise_scores(frame, method)), method)


def ensemble_collection(
    oof: pl.DataFrame,
    test: pl.DataFrame,
    truths: Mapping[tuple[str, str], np.ndarray],
    models: Sequence[str],
    method: NormaliseMethod | str = "minmax",
    grid: float = DEFAULT_GRID_STEP,
    metric: GraphMetric | None = None,
    min_gain_se: float = 0.0,
    gain_at: str = "oof",
) -> EnsembleResult:
    """Blend ``models`` for the one collection that ``oof`` and ``test`` hold.

    Weights are fitted on ``oof`` (out-of-fold rows) only (:func:`fit_blend_weights`, with
    ``min_gain_se``; ``gain_at="test-runs"`` tests the gain expected at the test's averaged runs,
    :func:`gain_at_runs`, from each seed's OOF gain, :func:`seed_gains`) and applied to both frames;
    ``scores`` gives the OOF metric of every model alone and of the ensemble, on the same normalised
    and averaged predictions (so ``scores["ensemble"] >= max`` of the single models).
    """
    models = list(dict.fromkeys(models))
    if not models:
        raise ConfigError("ensemble_collection needs at least one model")
    if gain_at not in GAIN_AT_CHOICES:
        raise ConfigError(f"unknown gain_at {gain_at!r}; expected one of: {', '.join(GAIN_AT_CHOICES)}")
    oof, test = validate_predictions(oof, "<oof predictions>"), validate_predictions(test, "<test predictions>")
    collections = set(oof["collection"].unique().to_list()) | set(test["collection"].unique().to_list())
    if len(collections) != 1:
        raise ConfigError(f"ensemble_collection blends one collection at a time, got {sorted(collections)}")
    collection = collections.pop()
    for name, frame, split in (("oof", oof, "oof"), ("test", test, "test")):
        if (frame["split"] != split).any():
            raise FormatError(f"<{name} predictions>", f"holds rows whose split is not {split!r}")
        missing = [m for m in models if m not in set(frame["model"].unique().to_list())]
        if missing:
            raise FormatError(f"<{name} predictions>", f"no {name} rows for model(s) {', '.join(missing)}")
    raw_oof, raw_test = oof.filter(pl.col("model").is_in(models)), test.filter(pl.col("model").is_in(models))
    oof, test = prepare_model_scores(raw_oof, method), prepare_model_scores(raw_test, method)
    fit = fit_blend_weights({m: oof.filter(pl.col("model") == m) for m in models}, truths, collection,
                            metric=metric, grid=grid, min_gain_se=min_gain_se)
    if gain_at == "test-runs" and min_gain_se > 0 and fit.fitted_weights[fit.best_single] < 1:
        runs = runs_per_test_graph(raw_test, fit.best_single)
        expected = gain_at_runs(seed_gains(raw_oof, truths, collection, fit, method, metric), fit.gain, runs)
        fit = fit.requiring(min_gain_se, expected)
    scores = {**fit.single_scores, ENSEMBLE_MODEL: fit.score}
    return EnsembleResult(blend(oof, fit.weights), blend(test, fit.weights), scores, fit)


def common_oof(frame: pl.DataFrame, models: Sequence[str]) -> pl.DataFrame:
    """The OOF rows of the configs every model predicted: models may subsample a graph's labelled
    configs differently (feature tables cap them, the GNN may not), and weights compare like with like."""
    keys = ["collection", "graph", "config_index"]
    covered = (frame.select(*keys, "model").unique().group_by(keys).agg(pl.col("model").n_unique().alias("_n"))
               .filter(pl.col("_n") == len(models)).select(keys))
    return frame.join(covered, on=keys, how="semi")


# ----------------------------------------------------------------------------- the stage (I/O shell) and its reader


class BlendInputs(NamedTuple):
    table: pl.DataFrame  # every model's OOF and test rows, ``model`` = the model's name
    oof: pl.DataFrame  # the OOF rows of the configs every model predicted (:func:`common_oof`)
    oof_dropped: int  # OOF rows left out: a config some model did not predict
    truths: dict[tuple[str, str], np.ndarray]  # true runtimes of the OOF graphs


def load_blend_inputs(collection: Collection, prune: StageOutput, trained: Mapping[str, StageOutput]) -> BlendInputs:
    """What a blend of ``trained`` (model name -> training output) reads: their predictions (each of
    ``collection`` only), the OOF rows common to all of them, and the OOF graphs' true runtimes."""
    from pipelines.data.prepared import Prepared
    from pipelines.training.fit import load_predictions

    frames = []
    for name, output in trained.items():
        frame = load_predictions(output).with_columns(pl.lit(name).alias("model"))
        others = sorted(set(frame["collection"].unique().to_list()) - {collection.name})
        if others:
            raise PipelineError(f"{output.path}: predictions of {', '.join(others)}, expected {collection.name} only")
        frames.append(frame)
    table = pl.concat(frames)
    oof_all = table.filter(pl.col("split") == "oof")
    oof = common_oof(oof_all, list(trained))
    source = Prepared(collection, {"prune": prune})  # only true runtimes are read
    truths = {(collection.name, g): source.runtimes(g) for g in sorted(oof["graph"].unique().to_list())}
    return BlendInputs(table, oof, oof_all.height - oof.height, truths)


def ensemble_stage(collection: Collection, prune: StageOutput, trained: Mapping[str, StageOutput], *,
                   method: str, grid: float | None = None, min_gain_se: float = 0.0, gain_at: str = "oof",
                   work_dir: Path, force: bool = False) -> StageOutput:
    """Run (or reuse) the blend of ``trained`` (model name -> training output) for one collection, keyed by
    :func:`ensemble_spec` (``method``, ``min_gain_se`` and ``gain_at`` are its settings: the ``ensemble``
    section's, or those a re-blend of earlier runs takes from their manifests)."""
    grid = DEFAULT_GRID_STEP if grid is None else grid
    names = list(trained)
    if not names:
        raise ConfigError(f"{collection.name}: nothing to ensemble (no model)")
    settings = SimpleNamespace(ensemble=SimpleNamespace(method=method, min_gain_se=float(min_gain_se), gain_at=gain_at))
    call = StageCall(settings, collection, Path(work_dir), upstream={"prune": prune},
                     options={"trained": dict(trained), "grid": grid}, force=force)
    stage = ensemble_spec(("prune", *dict.fromkeys(output.stage for output in trained.values())))

    def compute(folder: Path) -> dict[str, Any]:
        table, oof, dropped, truths = load_blend_inputs(collection, prune, trained)
        if dropped:
            logger.info(f"[{collection.name}] ensemble: weights fitted on the "
                        f"{oof.select('graph', 'config_index').n_unique()} OOF configs every model predicted")
        result = ensemble_collection(oof, table.filter(pl.col("split") == "test"), truths, names, method, grid,
                                     min_gain_se=min_gain_se, gain_at=gain_at)
        pl.concat([result.blended_oof, result.blended_test]).write_parquet(folder / ENSEMBLE_PREDICTIONS)
        result.curve.write_parquet(folder / ENSEMBLE_CURVE)
        fit, best = result.fit, result.fit.best_single
        at_runs = "" if fit.tested_gain == fit.gain else f" ({fit.tested_gain:+.4f} expected at the test's runs)"
        note = "" if fit.weights == fit.fitted_weights else (
            f"; the fitted blend ({weights_text(fit.fitted_weights)}) gains "
            f"{fit.gain:+.4f} +- {fit.gain_se:.4f} over it{at_runs}, not above {min_gain_se:g} standard errors")
        logger.info(f"[{collection.name}] ensemble weights {weights_text(result.weights)}"
                    + f": OOF {result.scores['ensemble']:.4f} (best single: {best} {result.scores[best]:.4f}{note})")
        return {"collection": collection.name, "method": method, "weights": result.weights,
                "fitted_weights": fit.fitted_weights, "oof_gain": fit.gain, "oof_gain_se": fit.gain_se,
                "tested_gain": fit.tested_gain,
                "oof_scores": result.scores, "best_single_model": best, "oof_rows_used": oof.height,
                "oof_rows_dropped": dropped}

    return run_declared(stage, call, compute)


# The settings of the ensemble stage's key (key field -> setting).
ENSEMBLE_SETTINGS = {"method": "ensemble.method", "min_gain_se": "ensemble.min_gain_se", "gain_at": "ensemble.gain_at"}


def ensemble_spec(inputs: Sequence[str]) -> Stage:
    """The ensemble stage as data (:class:`pipelines.core.stages.Stage`) over the stages ``inputs``: the
    prune stage (true runtimes) and the training stages it blends. Its call carries the training outputs
    by model name (``options["trained"]``), which name the blend's weights."""
    return Stage(ENSEMBLE_STAGE, inputs=tuple(inputs), code=ENSEMBLE_CODE, settings=ENSEMBLE_SETTINGS,
                 run=_run_ensemble, input_keys=_ensemble_inputs, facts=_ensemble_facts, training_only=True)


def _ensemble_facts(call: StageCall) -> dict[str, Any]:
    trained, grid = call.options["trained"], call.options.get("grid")
    return {"collection": call.collection.name, "grid": DEFAULT_GRID_STEP if grid is None else grid,
            "models": {name: output.stage for name, output in trained.items()}}


def _ensemble_inputs(call: StageCall) -> dict[str, str]:
    return {"prune": call.upstream["prune"].key,
            **{f"model:{name}": output.key for name, output in call.options["trained"].items()}}


def _run_ensemble(call: StageCall) -> StageOutput:
    """The shell of a run's ensemble stage: the ``ensemble`` section of ``call.config``."""
    section = call.config.ensemble
    return ensemble_stage(call.collection, call.upstream["prune"], call.options["trained"], method=section.method,
                          grid=call.options.get("grid"), min_gain_se=section.min_gain_se, gain_at=section.gain_at,
                          work_dir=call.work_dir, force=call.force)


def weights_text(weights: Mapping[str, float]) -> str:
    """``gbdt 0.05, gnn 0.95``: blend weights for a log line or a table cell."""
    return ", ".join(f"{m} {w:.2f}" for m, w in weights.items())


def blend_rule(output: StageOutput) -> dict[str, Any]:
    """What the ensemble stage ``output`` chose and why, one table row: the grid optimum ("fitted"), the
    best single model, the optimum's OOF gain over it with its standard error, the gain tested (it, or
    it expected at the test's runs: ``gain_at``), the ``min_gain_se`` threshold and the weights used.
    Stages written before the threshold existed always used the optimum (threshold 0) and recorded no
    gain (None); stages before ``gain_at`` tested the OOF gain."""
    metrics, config = output.metrics, output.manifest["config"]
    return {"fitted": weights_text(metrics.get("fitted_weights", metrics["weights"])),
            "best single": metrics["best_single_model"], "OOF gain": metrics.get("oof_gain"),
            "standard error": metrics.get("oof_gain_se"), "gain_at": config.get("gain_at", "oof"),
            "gain tested": metrics.get("tested_gain", metrics.get("oof_gain")),
            "min_gain_se": float(config.get("min_gain_se", 0.0)),
            "used": weights_text(metrics["weights"])}


def load_blended_test(output: StageOutput) -> pl.DataFrame:
    from pipelines.core.predictions import read_predictions

    return read_predictions(output.file(ENSEMBLE_PREDICTIONS)).filter(pl.col("split") == "test")
