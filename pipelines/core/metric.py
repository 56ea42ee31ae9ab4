"""The competition metric and its training-time proxy, as pure functions (no I/O).

* tile:xla, per graph: ``2 - min(y[top]) / min(y)`` where ``top`` is the first ``min(5, c)``
  submitted configs and ``y = runtime / normalizer`` (1.0 is perfect).
* layout:*, per graph: Kendall tau-b between the submitted order and the true runtimes, with the
  semantics of ``scipy.stats.kendalltau`` (ties in the runtimes are handled as tau-b does, so a
  perfect order scores below 1.0 when runtimes tie).
* Ordered-pair accuracy (OPA): the share of config pairs with different runtimes that the
  prediction orders correctly; a pair the prediction ties counts half.
* The final score is the unweighted mean of the five collection means. It is only defined when
  all five collections are present; otherwise :class:`CombinedScore` carries the mean of those
  present with ``complete=False``, and every report says so.

Predictions follow the project-wide convention of ``pipelines.core.predictions``: a LOWER score means
the config is predicted FASTER. Runtimes are compared as int64/float64 only (float32 would turn
distinct runtimes above 2^24 ns into false ties), and pair statistics are exact integer counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import polars as pl

from pipelines.core.collection import ALL_COLLECTIONS, parse_collection
from pipelines.core.errors import FormatError
from pipelines.core.predictions import validate_predictions

TILE_TOP_K = 5
COLLECTION_NAMES: tuple[str, ...] = tuple(c.name for c in ALL_COLLECTIONS)


# ----------------------------------------------------------------------------- input checks


def _truth_array(values: np.ndarray | Sequence[float], name: str = "runtimes") -> np.ndarray:
    """A 1-D int or float64 array of true runtimes; float32 (false ties) and NaN are refused."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {array.shape}")
    if array.dtype.kind == "f":
        if array.dtype.itemsize < 8:
            raise ValueError(f"{name}: {array.dtype} cannot hold runtimes above 2^24 exactly; pass int64 or float64")
        if not np.isfinite(array).all():
            raise ValueError(f"{name}: NaN or infinite value")
    elif array.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected an integer or float64 array, got dtype {array.dtype}")
    return array


def _score_array(values: np.ndarray | Sequence[float], name: str = "scores") -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {array.shape}")
    if array.dtype.kind not in "iuf":
        raise ValueError(f"{name}: expected a numeric array, got dtype {array.dtype}")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise ValueError(f"{name}: NaN or infinite value")
    return array


# ----------------------------------------------------------------------------- scores -> orders


def order_from_scores(scores: np.ndarray | Sequence[float]) -> np.ndarray:
    """Config indices from predicted fastest to slowest (lowest score first); ties keep index order."""
    return np.argsort(_score_array(scores), kind="stable").astype(np.int64)


def tile_top_k(scores: np.ndarray | Sequence[float], k: int = TILE_TOP_K) -> np.ndarray:
    """The ``min(k, c)`` configs a tile submission lists: the lowest scores, ties broken by index."""
    order = order_from_scores(scores)
    return order[: min(k, order.shape[0])]


def ranks_from_order(order: np.ndarray | Sequence[int]) -> np.ndarray:
    """Predicted rank of each config (0 = fastest) from a full order; the order must be a permutation."""
    order = np.asarray(order)
    if order.ndim != 1 or (order.size and order.dtype.kind not in "iu"):
        raise ValueError(f"order: expected a 1-D integer array, got {order.dtype} with shape {order.shape}")
    count = order.shape[0]
    if count and (order.min() < 0 or order.max() >= count or np.unique(order).shape[0] != count):
        raise ValueError(f"order is not a permutation of 0..{count - 1}")
    ranks = np.empty(count, dtype=np.int64)
    ranks[order] = np.arange(count, dtype=np.int64)
    return ranks


# ----------------------------------------------------------------------------- exact pair counts


@dataclass(frozen=True)
class PairCounts:
    """Counts over the ``n(n-1)/2`` unordered pairs of configs, x = prediction, y = truth.

    ``tied_x`` and ``tied_y`` include the ``tied_both`` pairs; concordant and discordant pairs are
    the pairs tied in neither.
    """

    pairs: int
    concordant: int
    discordant: int
    tied_x: int
    tied_y: int
    tied_both: int


def _dense_ranks(values: np.ndarray) -> np.ndarray:
    """0-based ranks with equal values sharing a rank (exact for int64: no float cast)."""
    return np.unique(values, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _tied_pairs(keys: np.ndarray) -> int:
    counts = np.unique(keys, return_counts=True)[1].astype(np.int64)
    return int((counts * (counts - 1) // 2).sum())


def _count_inversions(values: np.ndarray) -> int:
    """Number of pairs ``i < j`` with ``values[i] > values[j]`` (strictly), in O(n log^2 n).

    Every pair of positions is split exactly once by a bottom-up merge: at width ``w`` the left
    block ``[2pw, 2pw + w)`` meets the right block ``[2pw + w, 2pw + 2w)``. Sorting each level by
    (block pair, value, left before right) makes the left elements preceding a right element
    exactly those ``<=`` it, so ``w`` minus that count is its number of strict inversions.
    """
    n = values.shape[0]
    if n < 2:
        return 0
    values = values.astype(np.int64)
    span = int(values.max()) + 1  # values are dense ranks in [0, n)
    position = np.arange(n, dtype=np.int64)
    total = 0
    width = 1
    while width < n:
        block = position // width
        is_right = (block % 2).astype(bool)
        pair = block // 2
        order = np.argsort((pair * span + values) * 2 + is_right)
        right_sorted = is_right[order]
        lefts_seen = np.concatenate(([0], np.cumsum(~right_sorted)))
        # A pair's elements keep the same contiguous positions after sorting by pair first.
        pair_start = pair * (2 * width)
        lefts_le = lefts_seen[1:] - lefts_seen[pair_start]
        total += int((width - lefts_le[right_sorted]).sum())
        width *= 2
    return total


def pair_counts(predicted: np.ndarray | Sequence[float], truth: np.ndarray | Sequence[float]) -> PairCounts:
    """Exact concordance counts between a prediction (any numeric scale) and true runtimes."""
    x = _score_array(predicted, "predicted")
    y = _truth_array(truth)
    if x.shape != y.shape:
        raise ValueError(f"predicted has {x.shape[0]} entries but truth has {y.shape[0]}")
    n = x.shape[0]
    if n < 2:
        return PairCounts(0, 0, 0, 0, 0, 0)
    x_rank, y_rank = _dense_ranks(x), _dense_ranks(y)
    tied_x, tied_y = _tied_pairs(x_rank), _tied_pairs(y_rank)
    tied_both = _tied_pairs(x_rank * (int(y_rank.max()) + 1) + y_rank)
    # Sorted by x, then y: pairs tied in x are never inversions, so inversions of y are the discordant pairs.
    discordant = _count_inversions(y_rank[np.lexsort((y_rank, x_rank))])
    pairs = n * (n - 1) // 2
    concordant = pairs - tied_x - tied_y + tied_both - discordant
    return PairCounts(pairs, concordant, discordant, tied_x, tied_y, tied_both)


# ----------------------------------------------------------------------------- per-graph metrics


def kendall_tau_b(predicted: np.ndarray | Sequence[float], truth: np.ndarray | Sequence[float]) -> float:
    """Kendall tau-b as ``scipy.stats.kendalltau`` computes it; NaN when either side is constant."""
    counts = pair_counts(predicted, truth)
    if counts.pairs == counts.tied_x or counts.pairs == counts.tied_y:
        return math.nan
    # One square root of the exact integer product: a perfect (reversed) order gives exactly 1.0 (-1.0).
    tau = (counts.concordant - counts.discordant) / math.sqrt((counts.pairs - counts.tied_x)
                                                              * (counts.pairs - counts.tied_y))
    return min(1.0, max(-1.0, tau))


def layout_kendall_tau(order: np.ndarray | Sequence[int], runtimes: np.ndarray | Sequence[float]) -> float:
    """The layout metric for one graph: tau-b between a submitted order (fastest first) and runtimes."""
    ranks = ranks_from_order(order)
    if ranks.shape[0] != len(runtimes):
        raise ValueError(f"order lists {ranks.shape[0]} configs but there are {len(runtimes)} runtimes")
    return kendall_tau_b(ranks, runtimes)


def ordered_pair_accuracy(scores: np.ndarray | Sequence[float], runtimes: np.ndarray | Sequence[float]) -> float:
    """Share of pairs with different runtimes ordered correctly by ``scores`` (lower = faster).

    A pair the scores tie counts half. NaN when all runtimes are equal (no pair to order).
    """
    counts = pair_counts(scores, runtimes)
    comparable = counts.pairs - counts.tied_y
    if comparable == 0:
        return math.nan
    return (counts.concordant + 0.5 * (counts.tied_x - counts.tied_both)) / comparable


def tile_score(top: np.ndarray | Sequence[int], target: np.ndarray | Sequence[float]) -> float:
    """The tile metric for one graph: ``2 - min(target[top[:min(5, c)]]) / min(target)``.

    ``target`` is runtime / normalizer (float64). Only the first ``min(5, c)`` listed configs count.
    """
    y = _truth_array(target, "target")
    count = y.shape[0]
    top = np.asarray(top)
    if count == 0:
        raise ValueError("target is empty")
    if top.ndim != 1 or top.size == 0 or top.dtype.kind not in "iu":
        raise ValueError(f"top: expected a non-empty 1-D integer array, got {top.dtype} with shape {top.shape}")
    top = top[: min(TILE_TOP_K, count)]
    if top.min() < 0 or top.max() >= count:
        raise ValueError(f"top: index out of range [0, {count})")
    best = float(y.min())
    if best <= 0:
        raise ValueError("target: the best runtime is not positive (an unlabelled graph cannot be scored)")
    return 2.0 - float(y[top].min()) / best


# ----------------------------------------------------------------------------- aggregation


@dataclass(frozen=True)
class GraphScore:
    """The metric of one graph (``score``: tile slowdown score or layout tau) and its OPA if known."""

    collection: str
    graph: str
    num_configs: int
    score: float
    opa: float | None = None


def score_submission_row(collection: str, graph: str, indices: Sequence[int] | np.ndarray,
                         truth: np.ndarray) -> GraphScore:
    """The competition metric of one submission row: the slowdown score of the listed top configs
    (tile) or Kendall tau-b, with OPA, of the full order (layout)."""
    indices = np.asarray(indices, dtype=np.int64)
    if parse_collection(collection).is_tile:
        return GraphScore(collection, graph, truth.shape[0], tile_score(indices, truth))
    ranks = ranks_from_order(indices)
    return GraphScore(collection, graph, truth.shape[0], kendall_tau_b(ranks, truth), ordered_pair_accuracy(ranks, truth))


@dataclass(frozen=True)
class CombinedScore:
    """The final score: the unweighted mean of the five collection means.

    ``complete`` is False when a collection is missing; ``value`` is then the mean of the collections
    present, which is NOT the competition score and is flagged as such wherever it is printed.
    """

    collection_scores: dict[str, float]
    value: float
    complete: bool
    missing: tuple[str, ...]

    def describe(self) -> str:
        present = len(self.collection_scores)
        if self.complete:
            return f"combined score (unweighted mean of {present} collections): {self.value:.4f}"
        if not present:
            return "combined score: UNDEFINED (no collection scored)"
        return (f"combined score: UNDEFINED, missing {', '.join(self.missing)}; "
                f"mean of the {present} collection(s) present: {self.value:.4f}")


def combine_collection_scores(scores: Mapping[str, float]) -> CombinedScore:
    """Combine per-collection means; NaN entries count as missing (no graph could be scored)."""
    unknown = [name for name in scores if name not in COLLECTION_NAMES]
    if unknown:
        raise ValueError(f"unknown collection(s) {unknown}; expected names from {COLLECTION_NAMES}")
    present = {name: float(scores[name]) for name in COLLECTION_NAMES
               if name in scores and not math.isnan(scores[name])}
    missing = tuple(name for name in COLLECTION_NAMES if name not in present)
    value = float(np.mean(list(present.values()))) if present else math.nan
    return CombinedScore(present, value, not missing, missing)


PER_GRAPH_SCHEMA: dict[str, pl.DataType] = {
    "collection": pl.Utf8,
    "graph": pl.Utf8,
    "num_configs": pl.Int64,
    "score": pl.Float64,  # tile: 2 - best-of-top-5 / best; layout: Kendall tau-b; NaN: undefined
    "opa": pl.Float64,  # null where the prediction does not rank every config (tile submissions)
}


def metric_name(collection: str) -> str:
    return "top5 slowdown" if parse_collection(collection).is_tile else "kendall tau-b"


@dataclass(frozen=True)
class ScoreReport:
    """Per-graph scores, per-collection means and the combined score, printable with ``to_text``."""

    per_graph: pl.DataFrame
    per_collection: pl.DataFrame
    combined: CombinedScore

    def collection_score(self, collection: str) -> float:
        """The mean score of one collection; NaN when the report has no row for it."""
        part = self.per_collection.filter(self.per_collection["collection"] == collection)
        return float(part["score"][0]) if part.height else math.nan

    def to_text(self) -> str:
        lines = [f"{'collection':<20} {'metric':<14} {'graphs':>6} {'undefined':>9} {'score':>8} {'mean OPA':>9}"]
        for row in self.per_collection.iter_rows(named=True):
            score = "-" if row["score"] is None or math.isnan(row["score"]) else f"{row['score']:.4f}"
            opa = "-" if row["opa"] is None or math.isnan(row["opa"]) else f"{row['opa']:.4f}"
            lines.append(f"{row['collection']:<20} {row['metric']:<14} {row['graphs']:>6} "
                         f"{row['undefined']:>9} {score:>8} {opa:>9}")
        lines.append(self.combined.describe())
        return "\n".join(lines)


def best_scoring(scores: Mapping[str, float]) -> str:
    """The name with the highest score (NaN, an undefined score, counts as lowest; ties: the first)."""
    return max(scores, key=lambda name: -math.inf if math.isnan(scores[name]) else scores[name])


def summarize(graph_scores: Sequence[GraphScore]) -> ScoreReport:
    """Collection means (over graphs with a defined score) and the combined score of per-graph scores."""
    per_graph = pl.DataFrame(
        {
            "collection": [g.collection for g in graph_scores],
            "graph": [g.graph for g in graph_scores],
            "num_configs": [g.num_configs for g in graph_scores],
            "score": [float(g.score) for g in graph_scores],
            "opa": [None if g.opa is None else float(g.opa) for g in graph_scores],
        },
        schema=PER_GRAPH_SCHEMA,
    )
    rank = {name: i for i, name in enumerate(COLLECTION_NAMES)}
    per_graph = per_graph.with_columns(pl.col("collection").replace_strict(rank, return_dtype=pl.Int64)
                                       .alias("_order")).sort("_order", "graph").drop("_order")
    rows = []
    for name in COLLECTION_NAMES:
        part = per_graph.filter(pl.col("collection") == name)
        if part.height == 0:
            continue
        scores = part["score"].to_numpy()
        defined = scores[~np.isnan(scores)]
        opa = part["opa"].drop_nulls().to_numpy()
        opa = opa[~np.isnan(opa)]
        rows.append({
            "collection": name,
            "metric": metric_name(name),
            "graphs": part.height,
            "undefined": int(np.isnan(scores).sum()),
            "score": float(defined.mean()) if defined.size else math.nan,
            "opa": float(opa.mean()) if opa.size else math.nan,
        })
    per_collection = pl.DataFrame(
        rows,
        schema={"collection": pl.Utf8, "metric": pl.Utf8, "graphs": pl.Int64, "undefined": pl.Int64,
                "score": pl.Float64, "opa": pl.Float64},
    )
    combined = combine_collection_scores(dict(zip(per_collection["collection"], per_collection["score"])))
    return ScoreReport(per_graph, per_collection, combined)


def score_predictions(
    frame: pl.DataFrame,
    truths: Mapping[tuple[str, str], np.ndarray],
    source: str = "<predictions>",
) -> ScoreReport:
    """Score a prediction table (``pipelines.core.predictions`` schema) against true runtimes.

    ``truths[(collection, graph)]`` holds what the metric ranks for every config of that graph:
    runtime / normalizer (float64) for tile, ``config_runtime`` (int64) for layout. The frame must
    hold at most one row per (collection, graph, config_index) — one fold, seed and model per graph
    (out-of-fold tables qualify) — and may cover a subset of a graph's configs, which is then
    scored on that subset alone. Tile graphs get the top-5 slowdown score, layout graphs the tau-b
    of the score order; both also get the OPA of the raw scores (score ties count half).
    """
    frame = validate_predictions(frame, source)
    keys = ["collection", "graph", "config_index"]
    duplicated = frame.select(keys).is_duplicated()
    if duplicated.any():
        first = frame.filter(duplicated).row(0, named=True)
        raise FormatError(source, f"several predictions for config {first['config_index']} of "
                                  f"{first['collection']}:{first['graph']}; score one fold/seed/model at a time")
    results = []
    for (collection, graph), part in frame.sort(keys).partition_by(["collection", "graph"], as_dict=True).items():
        kind = parse_collection(collection)
        if (collection, graph) not in truths:
            raise FormatError(source, f"no true runtimes given for {collection}:{graph}")
        truth = _truth_array(truths[(collection, graph)], f"truth of {collection}:{graph}")
        index = part["config_index"].to_numpy().astype(np.int64)
        if index.min() < 0 or index.max() >= truth.shape[0]:
            raise FormatError(source, f"{collection}:{graph}: config_index out of range [0, {truth.shape[0]})")
        target, scores = truth[index], part["score"].to_numpy()
        if kind.is_tile:
            score = tile_score(tile_top_k(scores), target)
        else:
            score = layout_kendall_tau(order_from_scores(scores), target)
        results.append(GraphScore(collection, graph, index.shape[0], score, ordered_pair_accuracy(scores, target)))
    return summarize(results)
