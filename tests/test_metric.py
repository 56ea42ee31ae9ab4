"""The competition metric: hand-computed cases, brute-force pair counts and scipy's kendalltau."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from scipy.stats import kendalltau

from pipelines.core.errors import FormatError
from pipelines.core.metric import (
    COLLECTION_NAMES,
    GraphScore,
    combine_collection_scores,
    kendall_tau_b,
    layout_kendall_tau,
    order_from_scores,
    ordered_pair_accuracy,
    pair_counts,
    ranks_from_order,
    score_predictions,
    summarize,
    tile_score,
    tile_top_k,
)
from pipelines.core.predictions import prediction_frame


def brute_pairs(x: np.ndarray, y: np.ndarray) -> tuple[int, int, int, int, int]:
    """(concordant, discordant, tied_x, tied_y, tied_both) by looking at every pair."""
    con = dis = tx = ty = tb = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
            tx += dx == 0
            ty += dy == 0
            tb += dx == 0 and dy == 0
            con += dx * dy > 0
            dis += dx * dy < 0
    return con, dis, tx, ty, tb


# ----------------------------------------------------------------------------- Kendall tau-b


@pytest.mark.parametrize("seed", range(40))
def test_pair_counts_match_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 30))
    x = rng.integers(0, 1 + seed % 6, n).astype(np.float64)  # seed % 6 == 0: all predictions tied
    y = rng.integers(0, 1 + seed % 7, n).astype(np.int64)
    counts = pair_counts(x, y)
    assert (counts.concordant, counts.discordant, counts.tied_x, counts.tied_y, counts.tied_both) == brute_pairs(x, y)
    assert counts.pairs == n * (n - 1) // 2


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("ties", [False, True])
def test_tau_matches_scipy_on_random_orders(seed: int, ties: bool) -> None:
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(2, 300))
    runtimes = rng.integers(1, 6 if ties else 10**12, n).astype(np.int64)
    order = rng.permutation(n)
    expected = kendalltau(ranks_from_order(order), runtimes).statistic
    assert layout_kendall_tau(order, runtimes) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_tau_b_matches_scipy_with_ties_on_both_sides(seed: int) -> None:
    rng = np.random.default_rng(2000 + seed)
    n = int(rng.integers(2, 200))
    x, y = rng.integers(0, 4, n).astype(np.float64), rng.integers(0, 4, n)
    expected = kendalltau(x, y).statistic
    got = kendall_tau_b(x, y)
    assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected, abs=1e-12)


def test_tau_matches_scipy_on_large_runtimes_beyond_float32() -> None:
    rng = np.random.default_rng(7)
    runtimes = 2**40 + rng.integers(0, 64, 5000)  # distinct int64 values that collide as float32
    order = rng.permutation(5000)
    assert layout_kendall_tau(order, runtimes) == pytest.approx(
        kendalltau(ranks_from_order(order), runtimes).statistic, abs=1e-12)
    with pytest.raises(ValueError, match="float32"):
        layout_kendall_tau(order, runtimes.astype(np.float32))


def test_perfect_and_reversed_orders() -> None:
    runtimes = np.array([30, 10, 20, 40], dtype=np.int64)
    fastest_first = [1, 2, 0, 3]
    assert layout_kendall_tau(fastest_first, runtimes) == 1.0
    assert layout_kendall_tau(fastest_first[::-1], runtimes) == -1.0


def test_three_configs_with_a_tie_by_hand() -> None:
    # runtimes 5, 5, 9; submitted order [2, 0, 1] -> ranks: config0 = 1, config1 = 2, config2 = 0.
    # pairs (0,1): runtime tie -> neither; (0,2): rank 1 > 0 but runtime 5 < 9 -> discordant;
    # (1,2): discordant. tau_b = (0 - 2) / sqrt(3 * (3 - 1)) = -2 / sqrt(6).
    assert layout_kendall_tau([2, 0, 1], np.array([5, 5, 9])) == pytest.approx(-2 / math.sqrt(6), abs=1e-15)
    # The best possible order still scores below 1 because the runtimes tie: 2 / sqrt(6).
    assert layout_kendall_tau([0, 1, 2], np.array([5, 5, 9])) == pytest.approx(2 / math.sqrt(6), abs=1e-15)


def test_tau_undefined_for_constant_runtimes_or_single_config() -> None:
    assert math.isnan(layout_kendall_tau([1, 0, 2], np.array([7, 7, 7])))
    assert math.isnan(layout_kendall_tau([0], np.array([7])))


@pytest.mark.parametrize("order", [[0, 0, 1], [0, 1, 3], [0, 1]])
def test_layout_tau_rejects_non_permutations(order: list[int]) -> None:
    with pytest.raises(ValueError):
        layout_kendall_tau(order, np.array([1, 2, 3]))


# ----------------------------------------------------------------------------- OPA


def test_opa_by_hand() -> None:
    runtimes = np.array([10, 20, 30, 40])
    assert ordered_pair_accuracy([1.0, 2.0, 3.0, 4.0], runtimes) == 1.0
    assert ordered_pair_accuracy([4.0, 3.0, 2.0, 1.0], runtimes) == 0.0
    # Swapping the first two gets 5 of 6 pairs right.
    assert ordered_pair_accuracy([2.0, 1.0, 3.0, 4.0], runtimes) == pytest.approx(5 / 6)
    # All predictions tied: every pair counts half.
    assert ordered_pair_accuracy([0.0, 0.0, 0.0, 0.0], runtimes) == 0.5


def test_opa_ignores_runtime_ties_and_halves_prediction_ties() -> None:
    # Pairs with different runtimes: (0,2), (0,3), (1,2), (1,3), (2,3); the runtime tie (0,1) is skipped.
    runtimes = np.array([1, 1, 2, 3])
    scores = np.array([0.0, 2.0, 2.0, 3.0])  # (0,2) right, (0,3) right, (1,2) tie, (1,3) right, (2,3) right
    assert ordered_pair_accuracy(scores, runtimes) == pytest.approx(4.5 / 5)
    scores = np.array([0.0, 2.0, 2.0, 1.0])  # (1,3) wrong, (2,3) wrong
    assert ordered_pair_accuracy(scores, runtimes) == pytest.approx(2.5 / 5)
    assert math.isnan(ordered_pair_accuracy([1.0, 2.0], np.array([4, 4])))


# ----------------------------------------------------------------------------- tile


def test_tile_score_by_hand() -> None:
    target = np.array([4.0, 2.0, 8.0, 5.0, 6.0, 7.0, 3.0])
    assert tile_score([1, 0, 2, 3, 4], target) == 1.0  # best (index 1) listed
    assert tile_score([6, 0, 2, 3, 4], target) == pytest.approx(2 - 3 / 2)  # best listed is 3.0
    # Only the first five count: the best config in sixth place does not help.
    assert tile_score([6, 0, 2, 3, 4, 1], target) == pytest.approx(0.5)


def test_tile_score_with_fewer_than_five_configs() -> None:
    target = np.array([3.0, 1.5, 2.0])
    assert tile_score([2, 0, 1], target) == 1.0  # c = 3: all three listed, the best among them
    assert tile_score([0, 2, 1], target) == 1.0
    assert tile_score([0], np.array([9.0])) == 1.0


def test_tile_score_with_ties_at_the_minimum() -> None:
    target = np.array([2.0, 5.0, 2.0, 9.0, 9.0, 9.0, 9.0])
    assert tile_score([2, 1, 3, 4, 5], target) == 1.0  # either tied best config is perfect
    assert tile_score([1, 3, 4, 5, 6], target) == pytest.approx(2 - 5 / 2)


def test_tile_score_rejects_unlabelled_and_bad_indices() -> None:
    with pytest.raises(ValueError, match="not positive"):
        tile_score([0], np.zeros(3))
    with pytest.raises(ValueError, match="out of range"):
        tile_score([0, 3], np.ones(3))


# ----------------------------------------------------------------------------- scores -> orders


def test_order_from_scores_breaks_ties_by_index() -> None:
    scores = np.array([0.5, 0.1, 0.5, 0.1, -1.0])
    assert order_from_scores(scores).tolist() == [4, 1, 3, 0, 2]
    assert tile_top_k(scores, k=3).tolist() == [4, 1, 3]
    assert tile_top_k(np.array([2.0, 1.0]), k=5).tolist() == [1, 0]
    with pytest.raises(ValueError, match="NaN"):
        order_from_scores([0.0, math.nan])


def test_ranks_from_order_inverts_the_order() -> None:
    order = np.array([3, 0, 2, 1])
    ranks = ranks_from_order(order)
    assert ranks.tolist() == [1, 3, 2, 0]
    assert np.array_equal(order_from_scores(ranks), order)


# ----------------------------------------------------------------------------- aggregation


def test_combined_score_is_the_unweighted_mean_of_five_collections() -> None:
    scores = dict(zip(COLLECTION_NAMES, [0.9, 0.2, 0.4, 0.6, 0.8]))
    combined = combine_collection_scores(scores)
    assert combined.complete and combined.missing == ()
    assert combined.value == pytest.approx(0.58)
    assert "0.5800" in combined.describe() and "UNDEFINED" not in combined.describe()


def test_combined_score_with_a_missing_collection_is_flagged() -> None:
    scores = {"tile:xla": 0.9, "layout:xla:default": 0.3, "layout:nlp:random": math.nan}
    combined = combine_collection_scores(scores)
    assert not combined.complete
    assert combined.missing == ("layout:xla:random", "layout:nlp:default", "layout:nlp:random")
    assert combined.value == pytest.approx(0.6)
    assert "UNDEFINED" in combined.describe() and "layout:nlp:default" in combined.describe()
    with pytest.raises(ValueError, match="unknown collection"):
        combine_collection_scores({"tile:nlp": 1.0})


def test_summarize_means_skip_undefined_graphs() -> None:
    report = summarize([
        GraphScore("layout:xla:random", "b", 3, 0.5, 0.75),
        GraphScore("layout:xla:random", "a", 3, math.nan, math.nan),
        GraphScore("tile:xla", "t", 4, 0.9),
        GraphScore("layout:xla:random", "c", 3, -0.1, 0.25),
    ])
    assert report.per_graph["collection"].to_list() == ["tile:xla"] + ["layout:xla:random"] * 3
    assert report.per_graph["graph"].to_list() == ["t", "a", "b", "c"]
    layout = report.per_collection.filter(pl.col("collection") == "layout:xla:random").row(0, named=True)
    assert (layout["graphs"], layout["undefined"]) == (3, 1)
    assert layout["score"] == pytest.approx(0.2) and layout["opa"] == pytest.approx(0.5)
    assert report.collection_score("layout:xla:random") == pytest.approx(0.2)
    assert report.collection_score("tile:xla") == pytest.approx(0.9)
    assert math.isnan(report.collection_score("layout:nlp:random"))  # no graph of it: no row
    text = report.to_text()
    assert "kendall tau-b" in text and "top5 slowdown" in text and "UNDEFINED" in text


# ----------------------------------------------------------------------------- prediction tables


def test_score_predictions_on_a_prediction_table() -> None:
    tile_target = np.array([3.0, 1.0, 2.0, 5.0, 4.0, 6.0, 0.5])
    layout_runtime = np.array([400, 100, 300, 200], dtype=np.int64)
    frame = pl.concat([
        # Predicts config 6 (the best) sixth: top five best = 1.0 -> 2 - 1.0 / 0.5 = 0.
        prediction_frame(collection="tile:xla", graph="t", split="oof", scores=tile_target[:6].tolist() + [10.0],
                         fold=0, seed=1, model="m"),
        prediction_frame(collection="layout:nlp:default", graph="g", split="oof", scores=layout_runtime * 1.0,
                         fold=1, seed=1, model="m"),
        # A subset of configs is scored on that subset alone: 3 reversed configs -> tau -1.
        prediction_frame(collection="layout:nlp:default", graph="h", split="oof", scores=[1.0, 2.0, 3.0],
                         fold=2, seed=1, model="m", config_index=np.array([0, 2, 3])),
    ])
    truths = {("tile:xla", "t"): tile_target, ("layout:nlp:default", "g"): layout_runtime,
              ("layout:nlp:default", "h"): np.array([9, 5, 7, 3], dtype=np.int64)}
    report = score_predictions(frame, truths)
    rows = {r["graph"]: r for r in report.per_graph.iter_rows(named=True)}
    assert rows["t"]["score"] == pytest.approx(0.0)
    assert rows["t"]["opa"] == pytest.approx(15 / 21)  # only the 6 pairs with config 6 are wrong
    assert rows["g"]["score"] == 1.0 and rows["g"]["opa"] == 1.0
    assert rows["h"]["score"] == -1.0 and rows["h"]["num_configs"] == 3
    assert report.per_collection["collection"].to_list() == ["tile:xla", "layout:nlp:default"]
    assert not report.combined.complete


def test_score_predictions_refuses_duplicates_and_unknown_graphs() -> None:
    one = prediction_frame(collection="tile:xla", graph="t", split="oof", scores=[1.0, 2.0], fold=0, seed=0, model="m")
    two = prediction_frame(collection="tile:xla", graph="t", split="oof", scores=[1.0, 2.0], fold=0, seed=1, model="m")
    with pytest.raises(FormatError, match="one fold/seed/model"):
        score_predictions(pl.concat([one, two]), {("tile:xla", "t"): np.array([1.0, 2.0])})
    with pytest.raises(FormatError, match="no true runtimes"):
        score_predictions(one, {})
    with pytest.raises(FormatError, match="out of range"):
        score_predictions(one, {("tile:xla", "t"): np.array([1.0])})
