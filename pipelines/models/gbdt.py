"""LightGBM ranker over the per-config feature tables: one model per collection, fold and seed.

Input frames follow the feature-table contract of :mod:`pipelines.flows.prepare`: one row per (graph,
config) with ``graph``, ``config_index``, ``target`` (runtime, or runtime/normalizer for tile; 0 on
test), per-config features ``f_*`` and graph aggregates ``g_*``. Rows of one graph need not be
contiguous; the ranker groups them itself and returns costs aligned with the input rows
(LOWER = predicted FASTER, the convention of :mod:`pipelines.core.predictions`).

Objectives (``objective=``):

- ``lambdarank`` / ``xendcg``: one LightGBM query per graph; the label is the graded relevance of the
  config's runtime rank within its graph, ``relevance_bins`` levels with the fastest highest. Ties
  share their average rank. ``label_gain`` sets lambdarank's gain per level (exponential emphasises the
  top, which is what the tile metric rewards; linear spreads the effort over the whole order, which is
  what Kendall tau rewards).
- ``regression``: pointwise squared error on a per-graph normalised target, ``log y - mean(log y)`` of
  the graph or the rank percentile in [0, 1]; the prediction itself is the cost.
- ``pairwise``: binary classification of sampled pairs (i, j) of one graph, "is i faster than j", from
  the features of i plus the differences ``f_i - f_j``. A config's cost is minus its predicted share
  of wins against ``pairwise_references`` configs of the same graph (all others when the graph has
  fewer), as in the 11th-place public solution.

Inputs: every ``f_*`` column; the ``g_*`` columns only with ``graph_features`` (they are constant
within a graph, so they can only modulate how per-config features act, useful for tile); with
``graph_rank_features`` also each ``f_*`` column's rank within its graph scaled to [0, 1]
(``rank__<name>``), whose split thresholds mean the same thing in every graph. Rows are grouped by
graph in ``config_index`` order before anything graph-wise is computed, so predictions depend
neither on the row order nor on which graphs are predicted together.

Training subsample: graphs with more than ``max_configs_per_graph`` configs are cut down by rank
stratification: sort by runtime, split into that many equal-width rank strata, draw one config from
each. The subsample keeps the graph's runtime distribution (test files are uniform samples) with less
variance than a uniform draw and always keeps one of the fastest few configs. The validation graphs
(early stopping) are subsampled the same way.

Early stopping watches the validation graphs with ``stopping_metric``: ``opa`` (ordered-pair accuracy
on a fixed sample of pairs per graph, a linear proxy of Kendall tau; layout) or ``top5`` (the tile
metric, ``2 - best runtime among the 5 cheapest predicted / best runtime``; tile). Both are
vectorised over graphs because they run every boosting round. The pairwise objective stops on its
own log loss over sampled validation pairs.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import polars as pl

from pipelines.core.atomic import write_text_atomic
from pipelines.core.collection import Collection, parse_collection
from pipelines.config.settings import config_from_dict, config_to_dict, model_settings, resolve_for_collection
from pipelines.core.errors import FormatError
from pipelines.models.feature_table import FeatureTableAdapter
from pipelines.config.gbdt import GBDTConfig
from pipelines.core.seeds import fit_seed

# Pair-feature rows built at once when scoring pairwise (bounds memory on graphs with 10k configs).
PAIR_ROWS_PER_BLOCK = 1 << 16
DIFF_PREFIX = "diff__"  # LightGBM rejects ':' and other JSON characters in feature names
RANK_PREFIX = "rank__"
MODEL_FORMAT = 1  # GBDTRanker.save / load


# ----------------------------------------------------------------------------- grouping


def group_rows(graphs: pl.Series | np.ndarray, within: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(order, offsets)``: ``order`` permutes rows so each graph's rows are contiguous (graphs
    in first-appearance order; rows in input order within a graph, or ascending ``within`` when
    given); graph g then spans ``offsets[g]:offsets[g + 1]`` of the permuted rows."""
    series = graphs if isinstance(graphs, pl.Series) else pl.Series(np.asarray(graphs, dtype=object))
    table = pl.DataFrame({"graph": series.cast(pl.Utf8)}).with_row_index("row")
    row = pl.col("row")
    if within is not None:
        table = table.with_columns(pl.Series("within", np.asarray(within)))
        row = row.sort_by("within", maintain_order=True)
    rows = table.group_by("graph", maintain_order=True).agg(row)["row"]
    order = rows.explode().to_numpy().astype(np.int64) if len(rows) else np.zeros(0, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(rows.list.len().to_numpy())]).astype(np.int64)
    return order, offsets


def _group_slices(offsets: np.ndarray):
    return (slice(int(a), int(b)) for a, b in zip(offsets[:-1], offsets[1:]))


# ----------------------------------------------------------------------------- targets


def rank_pct(y: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Rank of each row's ``y`` within its group scaled to [0, 1] (0 = smallest = fastest); ties share
    their average rank; a group of one gets 0."""
    from scipy.stats import rankdata

    out = np.zeros(len(y), dtype=np.float64)
    for s in _group_slices(offsets):
        n = s.stop - s.start
        if n > 1:
            out[s] = (rankdata(y[s], method="average") - 1.0) / (n - 1)
    return out


def relevance_labels(y: np.ndarray, offsets: np.ndarray, bins: int) -> np.ndarray:
    """Graded relevance 0..bins-1 from the rank within the group: the fastest config gets bins-1."""
    return np.rint((1.0 - rank_pct(y, offsets)) * (bins - 1)).astype(np.int32)


def within_graph_ranks(x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """float32 rank of each value within its group and column, scaled to [0, 1] (ties share their
    average rank; a group of one gets 0): features made comparable across graphs of any size."""
    from scipy.stats import rankdata

    out = np.zeros(x.shape, dtype=np.float32)
    for s in _group_slices(offsets):
        n = s.stop - s.start
        if n > 1:
            out[s] = (rankdata(x[s], method="average", axis=0) - 1.0) / (n - 1)
    return out


def regression_targets(y: np.ndarray, offsets: np.ndarray, kind: str) -> np.ndarray:
    """Per-group normalised regression target (lower = faster), comparable across graphs."""
    if kind == "rank_pct":
        return rank_pct(y, offsets)
    if np.any(y <= 0):
        raise ValueError("log_centered regression needs positive targets (runtimes); got a value <= 0")
    logs = np.log(y)
    out = np.empty_like(logs)
    for s in _group_slices(offsets):
        out[s] = logs[s] - logs[s].mean()
    return out


# ----------------------------------------------------------------------------- sampling


def stratified_subsample(y: np.ndarray, offsets: np.ndarray, max_per_group: int,
                         rng: np.random.Generator) -> np.ndarray:
    """Sorted row indices keeping at most ``max_per_group`` rows per group: a group with more rows is
    split into ``max_per_group`` equal-width strata of its runtime order and one row is drawn from
    each (see the module docstring)."""
    keep: list[np.ndarray] = []
    for s in _group_slices(offsets):
        n = s.stop - s.start
        if n <= max_per_group:
            keep.append(np.arange(s.start, s.stop))
            continue
        by_runtime = np.argsort(y[s], kind="stable")
        edges = np.linspace(0, n, max_per_group + 1).astype(np.int64)  # every stratum is non-empty
        picks = rng.integers(edges[:-1], edges[1:])
        keep.append(s.start + np.sort(by_runtime[picks]))
    return np.concatenate(keep) if keep else np.zeros(0, dtype=np.int64)


def sample_pairs(y: np.ndarray, offsets: np.ndarray, per_group: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (i, j) of ``per_group`` uniformly drawn pairs within each group, pairs with tied
    ``y`` (including i == j) dropped; both orders of a pair are equally likely."""
    firsts, seconds = [], []
    for s in _group_slices(offsets):
        n = s.stop - s.start
        if n < 2:
            continue
        i = s.start + rng.integers(0, n, per_group)
        j = s.start + rng.integers(0, n, per_group)
        untied = y[i] != y[j]
        firsts.append(i[untied])
        seconds.append(j[untied])
    if not firsts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(firsts), np.concatenate(seconds)


def pair_features(x: np.ndarray, i: np.ndarray, j: np.ndarray, diff_columns: np.ndarray) -> np.ndarray:
    """Features of the pair (i, j): all columns of row i, then row i minus row j on ``diff_columns``
    (graph-constant columns would only contribute zeros)."""
    return np.hstack([x[i], x[i][:, diff_columns] - x[j][:, diff_columns]])


def pairwise_costs(x: np.ndarray, offsets: np.ndarray, diff_columns: np.ndarray, n_references: int,
                   group_rngs: list[np.random.Generator],
                   win_probability: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Cost of each row = minus its mean predicted probability of being faster than the reference
    configs of its group (``n_references`` drawn without replacement by the group's generator, or the
    whole group when smaller); a row is never compared with itself. Rows are grouped by ``offsets``."""
    costs = np.zeros(x.shape[0], dtype=np.float64)
    for s, rng in zip(_group_slices(offsets), group_rngs):
        n = s.stop - s.start
        if n < 2:
            continue  # nothing to compare with: every single config ties
        refs = np.arange(n) if n <= n_references else np.sort(rng.choice(n, n_references, replace=False))
        rows_per_block = max(1, PAIR_ROWS_PER_BLOCK // len(refs))
        for lo in range(0, n, rows_per_block):
            rows = np.arange(lo, min(n, lo + rows_per_block))
            i = np.repeat(rows, len(refs))
            j = np.tile(refs, len(rows))
            prob = np.asarray(win_probability(pair_features(x[s], i, j, diff_columns)), dtype=np.float64)
            prob = prob.reshape(len(rows), len(refs))
            valid = rows[:, None] != refs[None, :]
            costs[s.start + rows] = -(prob * valid).sum(axis=1) / valid.sum(axis=1)
    return costs


# ----------------------------------------------------------------------------- stopping metrics


def top5_score(cost: np.ndarray, y: np.ndarray, offsets: np.ndarray) -> float:
    """Mean over groups of the tile metric ``2 - min(y of the 5 lowest-cost rows) / min(y)``; ties in
    cost are broken by row order (as :func:`pipelines.core.metric.tile_top_k` breaks them by index)."""
    sizes = np.diff(offsets)
    gid = np.repeat(np.arange(len(sizes)), sizes)
    order = np.lexsort((cost, gid))  # groups stay in place, rows sorted by cost within each
    position = np.arange(len(y)) - offsets[gid]
    y_sorted = y[order]
    best_top = np.minimum.reduceat(np.where(position < 5, y_sorted, np.inf), offsets[:-1])
    best = np.minimum.reduceat(y, offsets[:-1])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(best > 0, best_top / best, 1.0)
    return float(np.mean(2.0 - ratio))


def pair_accuracy(cost: np.ndarray, y: np.ndarray, i: np.ndarray, j: np.ndarray) -> float:
    """Share of untied pairs (i, j) whose cost order matches the runtime order; cost ties count half."""
    truth = np.sign(y[i] - y[j])
    guess = np.sign(cost[i] - cost[j])
    return float(np.mean(np.where(guess == 0, 0.5, guess == truth))) if len(i) else 0.5


# ----------------------------------------------------------------------------- the ranker


class GBDTRanker:
    """LightGBM ranker in the shape every model shares (:mod:`pipelines.models.contract`): built from its
    config section for one collection, data in :meth:`fit`, learned state in attributes ending in
    ``_``, :meth:`save`/:meth:`load`. See the module docstring for the objectives. ``stopping_curve_``
    keeps the early-stopping metric on the validation graphs per iteration (``None`` without them):
    what ``benchmarks.early_stopping`` reads to measure how much stopping on the held-out fold
    inflates the held-out score.

    The collection decides what the config leaves to it: ``graph_features="auto"`` keeps the g_*
    columns for tile only, and early stopping watches the tile metric (tile) or pair accuracy (layout).
    ``gbdt.num_threads = 0`` takes ``num_threads`` (the training stage's share of the cores).
    """

    def __init__(self, config: GBDTConfig | Mapping[str, Any] | None = None, *, collection: Collection | str,
                 num_threads: int = 1):
        self.collection = parse_collection(collection) if isinstance(collection, str) else collection
        # checked like a loaded config (also when built by hand or from settings), then resolved for the
        # collection unless it comes resolved (the training stage's settings: model_settings, no tables left)
        plain = config if isinstance(config, Mapping) else config_to_dict(config or GBDTConfig())
        checked = config_from_dict(GBDTConfig, plain, "gbdt")
        self.config = resolve_for_collection(checked, self.collection) if checked.collections else checked
        is_tile = self.collection.is_tile
        self.graph_features = {"auto": is_tile, "always": True, "never": False}[self.config.graph_features]
        self.stopping_metric = "top5" if is_tile else "opa"
        self.num_threads = self.config.num_threads if self.config.num_threads > 0 else int(num_threads)

    # ------------------------------------------------------------------ data preparation

    def _columns(self, frame: pl.DataFrame) -> list[str]:
        columns = [c for c in frame.columns if c.startswith("f_")]
        if not columns:
            raise ValueError("feature frame has no f_* feature columns")
        if self.graph_features:
            columns += [c for c in frame.columns if c.startswith("g_")]
        return columns

    def _check_columns(self, frame: pl.DataFrame, *extra: str) -> None:
        missing = [c for c in (*extra, *self.columns_) if c not in frame.columns]
        if missing:
            raise ValueError(f"feature frame lacks column(s) {', '.join(missing)}")

    def _matrix(self, frame: pl.DataFrame, order: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """float32 model inputs of the rows ``order`` (grouped by ``offsets``): the input columns, then
        the within-graph ranks of the f_* columns when ``graph_rank_features``."""
        x = frame.select(self.columns_).to_numpy().astype(np.float32, copy=False)[order]
        if self.config.graph_rank_features:
            per_config = np.array([c.startswith("f_") for c in self.columns_])
            x = np.hstack([x, within_graph_ranks(x[:, per_config], offsets)])
        return x

    def _grouped(self, frame: pl.DataFrame, seed: int, subsample: bool):
        """Rows grouped by graph (and rank-stratified subsample): features, targets, offsets."""
        self._check_columns(frame, "graph", "target")
        order, offsets = group_rows(frame["graph"])
        y = frame["target"].to_numpy().astype(np.float64)[order]
        if not np.all(np.isfinite(y)):
            raise ValueError("training frame has non-finite targets")
        if subsample:
            keep = stratified_subsample(y, offsets, self.config.max_configs_per_graph, np.random.default_rng([seed, 1]))
            offsets = np.searchsorted(keep, offsets).astype(np.int64)  # keep is sorted
            order, y = order[keep], y[keep]
        return self._matrix(frame, order, offsets), y, offsets

    def _dataset(self, x: np.ndarray, y: np.ndarray, offsets: np.ndarray, seed: int, reference=None):
        import lightgbm as lgb

        names = list(self.feature_names_)
        if self.config.objective == "pairwise":
            i, j = sample_pairs(y, offsets, self.config.pairs_per_graph, np.random.default_rng([seed, 2]))
            if len(i) == 0:
                raise ValueError("pairwise objective: no untied pairs of configs to train on")
            data = lgb.Dataset(pair_features(x, i, j, self.diff_columns_), label=(y[i] < y[j]).astype(np.float32),
                               feature_name=names + [DIFF_PREFIX + n for n, d in zip(names, self.diff_columns_) if d],
                               reference=reference, free_raw_data=True)
            return data
        if self.config.objective == "regression":
            label = regression_targets(y, offsets, self.config.regression_target)
            return lgb.Dataset(x, label=label, feature_name=names, reference=reference, free_raw_data=True)
        label = relevance_labels(y, offsets, self.config.relevance_bins)
        return lgb.Dataset(x, label=label, group=np.diff(offsets), feature_name=names, reference=reference,
                           free_raw_data=True)

    def _params(self, seed: int) -> dict:
        params = {
            "learning_rate": self.config.learning_rate,
            "num_leaves": self.config.num_leaves,
            "min_data_in_leaf": self.config.min_child_samples,
            "feature_fraction": self.config.feature_fraction,
            "bagging_fraction": self.config.bagging_fraction,
            "bagging_freq": self.config.bagging_freq if self.config.bagging_fraction < 1 else 0,
            "lambda_l2": self.config.lambda_l2,
            "num_threads": self.num_threads,
            "seed": fit_seed(seed),  # LightGBM's int32: a seed past 2^31 would alias a smaller one
            "deterministic": True,
            "force_col_wise": True,
            "verbosity": -1,
        }
        if self.config.objective == "lambdarank":
            gains = np.arange(self.config.relevance_bins, dtype=np.float64)
            gains = 2.0 ** gains - 1 if self.config.label_gain == "exponential" else gains
            params |= {"objective": "lambdarank", "label_gain": gains.tolist(),
                       "lambdarank_truncation_level": self.config.truncation_level, "metric": "None"}
        elif self.config.objective == "xendcg":
            params |= {"objective": "rank_xendcg", "metric": "None"}
        elif self.config.objective == "regression":
            params |= {"objective": "regression", "metric": "None"}
        else:
            params |= {"objective": "binary", "metric": "binary_logloss"}
        return params

    # ------------------------------------------------------------------ fit / predict

    def fit(self, train: pl.DataFrame, valid: pl.DataFrame | None = None, *, seed: int) -> GBDTRanker:
        """Fit on ``train`` (early stopping on ``valid`` when given); returns ``self``."""
        import lightgbm as lgb

        self.columns_ = self._columns(train)
        ranked = [RANK_PREFIX + c for c in self.columns_ if c.startswith("f_")] if self.config.graph_rank_features else []
        self.feature_names_ = self.columns_ + ranked
        # per-config inputs (f_* and their ranks) get a difference column in pairwise mode
        self.diff_columns_ = np.array([not c.startswith("g_") for c in self.feature_names_])
        x, y, offsets = self._grouped(train, seed, subsample=True)
        train_set = self._dataset(x, y, offsets, seed)
        callbacks, valid_sets, feval, evaluated = [], [], None, {}
        if valid is not None and valid.height:
            vx, vy, voffsets = self._grouped(valid, seed, subsample=True)
            valid_sets = [self._dataset(vx, vy, voffsets, seed + 1, reference=train_set)]
            feval = None if self.config.objective == "pairwise" else self._stopping_eval(vy, voffsets, seed)
            callbacks = [lgb.early_stopping(self.config.early_stopping_rounds, verbose=False),
                         lgb.record_evaluation(evaluated)]
        booster = lgb.train(self._params(seed), train_set, num_boost_round=self.config.n_estimators,
                            valid_sets=valid_sets, feval=feval, callbacks=callbacks)
        self.best_iteration_ = int(booster.best_iteration or booster.current_iteration())
        self.stopping_curve_ = None
        if evaluated:  # {"valid_0": {metric: [value per iteration]}}; the one metric early stopping watched
            ((metric, values),) = next(iter(evaluated.values())).items()
            self.stopping_curve_ = {"metric": metric, "higher_better": metric != "binary_logloss",
                                    "values": [float(v) for v in values]}
        self.booster_ = booster
        self.seed_ = int(seed)
        self.n_train_rows_ = int(len(y))
        return self

    def _stopping_eval(self, y: np.ndarray, offsets: np.ndarray, seed: int):
        sign = -1.0 if self.config.objective in ("lambdarank", "xendcg") else 1.0  # relevance -> cost
        if self.stopping_metric == "top5":
            def evaluate(preds, _data):
                return "top5", top5_score(sign * preds, y, offsets), True
        else:
            i, j = sample_pairs(y, offsets, self.config.stopping_pairs_per_graph, np.random.default_rng([seed, 3]))

            def evaluate(preds, _data):
                return "opa", pair_accuracy(sign * preds, y, i, j), True
        return evaluate

    def predict(self, frame: pl.DataFrame) -> np.ndarray:
        """Costs (lower = predicted faster) aligned with the rows of ``frame``."""
        if not hasattr(self, "booster_"):
            raise RuntimeError("GBDTRanker.predict called before fit")
        self._check_columns(frame, "graph", "config_index")
        if frame.height == 0:
            return np.zeros(0, dtype=np.float64)
        # rows grouped by graph in config order: rank features and pairwise references then depend
        # neither on the row order nor on which graphs are predicted together
        order, offsets = group_rows(frame["graph"], within=frame["config_index"].to_numpy())
        x = self._matrix(frame, order, offsets)
        iteration = self.best_iteration_
        if self.config.objective != "pairwise":
            raw = np.asarray(self.booster_.predict(x, num_iteration=iteration, num_threads=self.num_threads),
                             dtype=np.float64)
            costs = -raw if self.config.objective in ("lambdarank", "xendcg") else raw
        else:
            graphs = frame["graph"].to_numpy()[order][offsets[:-1]]
            rngs = [np.random.default_rng([self.seed_, zlib.crc32(str(g).encode())]) for g in graphs]
            costs = pairwise_costs(x, offsets, self.diff_columns_, self.config.pairwise_references, rngs,
                                   lambda pairs: self.booster_.predict(pairs, num_iteration=iteration,
                                                                       num_threads=self.num_threads))
        out = np.empty_like(costs)
        out[order] = costs
        return out

    # ------------------------------------------------------------------ persistence

    def save(self, folder: Path | str, name: str) -> list[str]:
        """Write the fitted ranker into ``folder``: the booster as a LightGBM text model ``<name>.txt``
        and the config, collection and learned columns beside it (``<name>.txt.json``). Returns the
        file names."""
        if not hasattr(self, "booster_"):
            raise RuntimeError("GBDTRanker.save called before fit")
        path = Path(folder) / f"{name}.txt"
        sidecar = path.with_name(path.name + ".json")
        state = {"format": MODEL_FORMAT, "config": config_to_dict(self.config), "collection": self.collection.name,
                 "num_threads": self.num_threads, "columns": self.columns_, "feature_names": self.feature_names_,
                 "diff_columns": self.diff_columns_.tolist(), "best_iteration": self.best_iteration_,
                 "seed": self.seed_, "train_rows": self.n_train_rows_, "stopping_curve": self.stopping_curve_}
        write_text_atomic(path, self.booster_.model_to_string())
        write_text_atomic(sidecar, json.dumps(state, sort_keys=True, indent=1))
        return [path.name, sidecar.name]

    @classmethod
    def load(cls, folder: Path | str, name: str, *, num_threads: int | None = None) -> GBDTRanker:
        """A ranker written by :meth:`save` (``num_threads`` overrides the saved thread count)."""
        import lightgbm as lgb

        path = Path(folder) / f"{name}.txt"
        sidecar = path.with_name(path.name + ".json")
        try:
            state = json.loads(sidecar.read_text(encoding="utf-8"))
            booster = lgb.Booster(model_str=path.read_text(encoding="utf-8"))
        except (OSError, ValueError, lgb.basic.LightGBMError) as exc:
            raise FormatError(path, f"cannot read GBDT model ({exc})") from None
        if not isinstance(state, dict) or state.get("format") != MODEL_FORMAT:
            raise FormatError(sidecar, "not a GBDT model file of this version")
        ranker = cls(config_from_dict(GBDTConfig, state["config"], str(sidecar)), collection=state["collection"],
                     num_threads=state["num_threads"])
        if num_threads is not None:
            ranker.num_threads = int(num_threads)
        ranker.columns_, ranker.feature_names_ = list(state["columns"]), list(state["feature_names"])
        ranker.diff_columns_ = np.array(state["diff_columns"], dtype=bool)
        ranker.best_iteration_, ranker.seed_ = int(state["best_iteration"]), int(state["seed"])
        ranker.n_train_rows_ = int(state["train_rows"])
        ranker.stopping_curve_ = state.get("stopping_curve")  # absent from models saved before it was kept
        ranker.booster_ = booster
        return ranker

    def feature_importance(self) -> pl.DataFrame:
        """Total gain and split count per model feature (pairwise: ``diff__`` columns are differences)."""
        if not hasattr(self, "booster_"):
            raise RuntimeError("GBDTRanker.feature_importance called before fit")
        booster = self.booster_
        return pl.DataFrame({
            "feature": booster.feature_name(),
            "gain": booster.feature_importance("gain", iteration=self.best_iteration_).astype(np.float64),
            "split": booster.feature_importance("split", iteration=self.best_iteration_).astype(np.int64),
        })


# ----------------------------------------------------------------------------- the adapter


class GBDTAdapter(FeatureTableAdapter):
    """Drives :class:`GBDTRanker` in the training stage (see :mod:`pipelines.models.contract`)."""

    name = "gbdt"
    ranker_class = GBDTRanker

    def settings(self, config: Any, collection: Collection) -> dict[str, Any]:
        # resolved, with its empty `collections` kept: the ranker must not apply its defaults' tables again
        return model_settings(config, "gbdt", collection)

    def load(self, prepared: Any, graphs: list[str], *, settings: dict[str, Any], fit: bool,
             seed: int) -> pl.DataFrame:
        """The feature rows without the ``f_*`` columns that ``exclude_features`` names by prefix."""
        frame = super().load(prepared, graphs, settings=settings, fit=fit, seed=seed)
        prefixes = tuple(settings.get("exclude_features") or ())
        if not prefixes:
            return frame
        return frame.drop([c for c in frame.columns if c.startswith("f_") and c.startswith(prefixes)])

    def describe(self, ranker: GBDTRanker) -> tuple[dict[str, Any], pl.DataFrame | None]:
        facts = {"best_iteration": ranker.best_iteration_, "train_rows": ranker.n_train_rows_}
        return facts, ranker.feature_importance()
