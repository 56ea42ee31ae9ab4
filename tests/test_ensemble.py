import math

import numpy as np
import polars as pl
import pytest

from pipelines.training.ensemble import (
    common_oof,
    AVERAGED, average_over_seeds_and_folds, blend, blend_graph_scores, ensemble_collection, fit_blend_weights,
    gain_at_runs, normalise_scores, paired_gain, prepare_model_scores, runs_per_test_graph, seed_gains,
)
from pipelines.core.collection import parse_collection
from pipelines.core.errors import ConfigError, FormatError
from pipelines.core.metric import score_predictions
from pipelines.core.predictions import PREDICTION_SCHEMA, prediction_frame

LAYOUT = "layout:xla:random"
TILE = "tile:xla"


def frame_of(rows: list[dict]) -> pl.DataFrame:
    """Concatenate prediction_frame(**row) for each row spec."""
    return pl.concat([prediction_frame(**row) for row in rows])


def scores_of(frame: pl.DataFrame, **where) -> list[float]:
    for column, value in where.items():
        frame = frame.filter(pl.col(column) == value)
    return frame.sort("config_index")["score"].to_list()


def make_world(collection: str, graphs: int, configs: int, seed: int = 0) -> dict[tuple[str, str], np.ndarray]:
    rng = np.random.default_rng(seed)
    if parse_collection(collection).is_tile:
        return {(collection, f"g{g}"): rng.uniform(1.0, 3.0, configs) for g in range(graphs)}
    return {(collection, f"g{g}"): rng.integers(10**6, 10**9, configs).astype(np.int64) for g in range(graphs)}


def oof_frame(truths, model: str, noise: float, seed: int, signal: float = 1.0, seeds: int = 1) -> pl.DataFrame:
    """OOF predictions: ``signal * standardised truth + noise * N(0, 1)`` per graph (lower = faster)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, ((collection, graph), truth) in enumerate(sorted(truths.items())):
        z = (truth - truth.mean()) / truth.std()
        for s in range(seeds):
            rows.append(dict(collection=collection, graph=graph, split="oof", fold=i % 3, seed=s, model=model,
                             scores=signal * z + noise * rng.standard_normal(truth.shape[0])))
    return frame_of(rows)


def oof_score(frame: pl.DataFrame, truths) -> float:
    return score_predictions(frame, truths).per_collection["score"][0]


# ----------------------------------------------------------------------------- normalisation


def test_minmax_hand_cases():
    frame = frame_of([
        dict(collection=LAYOUT, graph="a", split="oof", fold=0, seed=0, model="m", scores=[3.0, 1.0, 2.0]),
        dict(collection=LAYOUT, graph="a", split="oof", fold=0, seed=1, model="m", scores=[10.0, 30.0, 20.0]),
        dict(collection=LAYOUT, graph="b", split="oof", fold=1, seed=0, model="m", scores=[5.0, 5.0]),
        dict(collection=LAYOUT, graph="c", split="oof", fold=1, seed=0, model="m", scores=[-7.0]),
    ])
    out = normalise_scores(frame, "minmax")
    assert scores_of(out, graph="a", seed=0) == [1.0, 0.0, 0.5]
    assert scores_of(out, graph="a", seed=1) == [0.0, 1.0, 0.5]  # each seed is scaled on its own
    assert scores_of(out, graph="b") == [0.5, 0.5]  # constant: 0.5, not NaN
    assert scores_of(out, graph="c") == [0.5]
    assert out.schema == pl.Schema(PREDICTION_SCHEMA)


def test_rank_percentiles_with_ties():
    frame = frame_of([
        dict(collection=LAYOUT, graph="a", split="test", fold=0, seed=0, model="m", scores=[30.0, 10.0, 20.0, 20.0]),
        dict(collection=LAYOUT, graph="a", split="test", fold=1, seed=0, model="m", scores=[1.0, 1.0, 1.0, 1.0]),
        dict(collection=LAYOUT, graph="a", split="test", fold=0, seed=0, model="other", scores=[4.0, 3.0, 2.0, 1.0]),
    ])
    out = normalise_scores(frame, "rank")
    assert scores_of(out, fold=0, model="m") == [1.0, 0.0, 0.5, 0.5]  # average ranks 4, 1, 2.5, 2.5
    assert scores_of(out, fold=1, model="m") == [0.5] * 4
    assert scores_of(out, model="other") == pytest.approx([1.0, 2 / 3, 1 / 3, 0.0])
    with pytest.raises(ConfigError, match="unknown normalisation 'zscore'"):
        normalise_scores(frame, "zscore")


# ----------------------------------------------------------------------------- averaging


def test_average_test_over_folds_and_seeds_and_oof_over_seeds():
    rows = []
    for fold in range(2):
        for seed in range(2):
            rows.append(dict(collection=LAYOUT, graph="t", split="test", fold=fold, seed=seed, model="m",
                             scores=[fold * 10 + seed, 100.0 + fold]))
    rows += [dict(collection=LAYOUT, graph="o", split="oof", fold=2, seed=s, model="m", scores=[s, 2.0 * s])
             for s in range(3)]
    out = average_over_seeds_and_folds(frame_of(rows))
    test = out.filter(pl.col("split") == "test")
    assert test.height == 2
    assert scores_of(test) == [(0 + 1 + 10 + 11) / 4, 100.5]
    assert set(test["fold"]) == {AVERAGED} and set(test["seed"]) == {AVERAGED}
    oof = out.filter(pl.col("split") == "oof")
    assert scores_of(oof) == [1.0, 2.0]
    assert set(oof["fold"]) == {2} and set(oof["seed"]) == {AVERAGED}
    assert out.schema == pl.Schema(PREDICTION_SCHEMA)


def test_average_refuses_oof_graph_in_two_folds_and_uneven_runs():
    two_folds = frame_of([dict(collection=LAYOUT, graph="o", split="oof", fold=f, seed=0, model="m", scores=[1.0])
                          for f in range(2)])
    with pytest.raises(FormatError, match="appears in 2 folds"):
        average_over_seeds_and_folds(two_folds)
    uneven = frame_of([
        dict(collection=LAYOUT, graph="t", split="test", fold=0, seed=0, model="m", scores=[1.0, 2.0]),
        dict(collection=LAYOUT, graph="t", split="test", fold=1, seed=0, model="m", scores=[1.0],
             config_index=np.array([1])),
    ])
    with pytest.raises(FormatError, match="predicted by 1 to 2 runs"):
        average_over_seeds_and_folds(uneven)


# ----------------------------------------------------------------------------- weight fitting


def test_weights_recover_the_informative_model():
    truths = make_world(LAYOUT, graphs=20, configs=40)
    good = prepare_model_scores(oof_frame(truths, "A", noise=0.3, seed=1, seeds=2))
    noise = prepare_model_scores(oof_frame(truths, "B", noise=1.0, seed=2, signal=0.0))
    fit = fit_blend_weights({"A": good, "B": noise}, truths, LAYOUT)
    assert fit.weights["A"] >= 0.9 and fit.weights["A"] + fit.weights["B"] == pytest.approx(1.0)
    assert fit.single_scores["A"] > 0.5 > abs(fit.single_scores["B"])
    assert fit.score >= fit.single_scores["A"]
    # The single-model scores are the metric module's scores of the same predictions.
    assert fit.single_scores["A"] == pytest.approx(oof_score(good, truths))
    assert fit.curve.columns == ["w:A", "w:B", "score"] and fit.curve.height == 21
    assert fit.curve["score"].max() == pytest.approx(fit.score)


def test_two_independent_equally_good_models_blend_better():
    truths = make_world(LAYOUT, graphs=30, configs=40, seed=3)
    frames = {m: prepare_model_scores(oof_frame(truths, m, noise=1.5, seed=s)) for m, s in (("A", 4), ("B", 5))}
    fit = fit_blend_weights(frames, truths, LAYOUT)
    assert fit.score >= max(fit.single_scores.values())
    assert fit.score > max(fit.single_scores.values()) + 0.02  # averaging independent noise helps
    assert 0.2 <= fit.weights["A"] <= 0.8


def test_ties_go_to_equal_weights():
    truths = make_world(LAYOUT, graphs=5, configs=10)
    same = prepare_model_scores(oof_frame(truths, "A", noise=0.5, seed=1))
    fit = fit_blend_weights({"A": same, "B": same.with_columns(pl.lit("B").alias("model"))}, truths, LAYOUT)
    assert fit.curve["score"].n_unique() == 1
    assert fit.weights == {"A": 0.5, "B": 0.5}


@pytest.mark.parametrize("collection", [LAYOUT, TILE])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_blend_never_below_best_single_model(collection, seed):
    truths = make_world(collection, graphs=12, configs=25, seed=seed)
    frames = {m: prepare_model_scores(oof_frame(truths, m, noise=noise, seed=seed * 10 + i))
              for i, (m, noise) in enumerate((("gnn", 0.8), ("gbdt", 1.2), ("mlp", 3.0)))}
    fit = fit_blend_weights(frames, truths, collection, grid=0.1)
    assert fit.curve.height == 66  # every point of the 3-model simplex at step 0.1
    weight_sums = fit.curve.select(pl.sum_horizontal(pl.col("^w:.*$"))).to_series()
    assert weight_sums.to_numpy() == pytest.approx(1.0)
    assert fit.score >= max(fit.single_scores.values())
    for model, frame in frames.items():
        assert fit.single_scores[model] == pytest.approx(oof_score(frame, truths))


@pytest.mark.parametrize("collection", [LAYOUT, TILE])
def test_blend_graph_scores_are_the_per_graph_values_the_fit_averages(collection):
    truths = make_world(collection, graphs=9, configs=20, seed=4)
    frames = {m: prepare_model_scores(oof_frame(truths, m, noise=noise, seed=i))
              for i, (m, noise) in enumerate((("A", 0.7), ("B", 1.3)))}
    fit = fit_blend_weights(frames, truths, collection)
    values = blend_graph_scores(frames, truths, collection, fit.weights)
    assert values.shape == (9,) and values.mean() == pytest.approx(fit.score)
    alone = blend_graph_scores(frames, truths, collection, {"A": 0.0, "B": 1.0})
    per_graph = score_predictions(frames["B"], truths).per_graph.sort("graph")["score"].to_numpy()
    np.testing.assert_allclose(alone, per_graph)  # in graph order, as the metric module scores each graph


def test_paired_gain_is_the_mean_and_standard_error_of_per_graph_differences():
    values = np.array([0.5, 0.7, np.nan, 0.9])
    baseline = np.array([0.4, 0.7, 0.2, 0.6])
    gain, se = paired_gain(values, baseline)
    diffs = np.array([0.1, 0.0, 0.3])  # the undefined graph is left out
    assert gain == pytest.approx(diffs.mean())
    assert se == pytest.approx(diffs.std(ddof=1) / math.sqrt(3))
    assert math.isnan(paired_gain(np.array([0.5]), np.array([0.4]))[1])  # one graph: no error estimate


@pytest.mark.parametrize("collection", [LAYOUT, TILE])
def test_the_fitted_blend_is_kept_only_when_its_oof_gain_passes_the_standard_error_test(collection):
    truths = make_world(collection, graphs=30, configs=40, seed=3)
    frames = {m: prepare_model_scores(oof_frame(truths, m, noise=1.5, seed=s)) for m, s in (("A", 4), ("B", 5))}
    plain = fit_blend_weights(frames, truths, collection)
    assert plain.weights == plain.fitted_weights and plain.best_single in ("A", "B")
    alone = {m: float(m == plain.best_single) for m in frames}
    assert plain.fitted_weights != alone  # two independent, equally good models: a blend
    # The gain and its standard error are those of the per-graph values the fit averages.
    expected = paired_gain(blend_graph_scores(frames, truths, collection, plain.fitted_weights),
                           blend_graph_scores(frames, truths, collection, alone))
    assert (plain.gain, plain.gain_se) == pytest.approx(expected) and plain.gain > 0
    passed = fit_blend_weights(frames, truths, collection, min_gain_se=plain.gain / plain.gain_se * 0.99)
    assert passed.weights == plain.fitted_weights and passed.score == plain.score
    failed = fit_blend_weights(frames, truths, collection, min_gain_se=plain.gain / plain.gain_se * 1.01)
    assert failed.weights == alone and failed.fitted_weights == plain.fitted_weights
    assert failed.score == failed.single_scores[plain.best_single]
    assert failed.curve.equals(plain.curve)  # the same points tried
    with pytest.raises(ConfigError, match="min_gain_se"):
        fit_blend_weights(frames, truths, collection, min_gain_se=-1.0)


def test_without_a_standard_error_the_best_single_model_is_kept():
    truths = make_world(LAYOUT, graphs=1, configs=40, seed=2)
    frames = {m: prepare_model_scores(oof_frame(truths, m, noise=1.5, seed=s)) for m, s in (("A", 4), ("B", 5))}
    fit = fit_blend_weights(frames, truths, LAYOUT, min_gain_se=2.0)
    assert math.isnan(fit.gain_se) and fit.weights == {m: float(m == fit.best_single) for m in frames}


def test_coordinate_ascent_for_many_models():
    truths = make_world(LAYOUT, graphs=20, configs=30, seed=7)
    # Two equally good independent models and two pure-noise ones: the optimum is inside the simplex.
    frames = {m: prepare_model_scores(oof_frame(truths, m, noise=1.5, seed=s)) for m, s in (("A", 1), ("B", 2))}
    for i in range(2):
        frames[f"noise{i}"] = prepare_model_scores(oof_frame(truths, f"noise{i}", noise=1.0, seed=3 + i, signal=0.0))
    fit = fit_blend_weights(frames, truths, LAYOUT, grid=0.25)
    assert fit.weights["A"] > 0 and fit.weights["B"] > 0 and fit.weights["A"] + fit.weights["B"] >= 0.75
    assert sum(fit.weights.values()) == pytest.approx(1.0)
    assert fit.score > max(fit.single_scores.values())
    assert fit.curve.height < 35  # not the whole simplex (35 points at step 0.25)


def test_fit_refuses_bad_grid_and_mismatched_coverage():
    truths = make_world(LAYOUT, graphs=3, configs=5)
    a = prepare_model_scores(oof_frame(truths, "A", noise=0.5, seed=1))
    with pytest.raises(ConfigError, match="grid step must divide 1"):
        fit_blend_weights({"A": a}, truths, LAYOUT, grid=0.3)
    b = a.with_columns(pl.lit("B").alias("model")).filter(pl.col("config_index") != 2)
    with pytest.raises(FormatError, match="'B' lack"):
        fit_blend_weights({"A": a, "B": b}, truths, LAYOUT)
    with pytest.raises(FormatError, match="average over seeds first"):
        fit_blend_weights({"A": pl.concat([a, a])}, truths, LAYOUT)


# ----------------------------------------------------------------------------- blending


def test_blend_hand_case_and_names_like_columns():
    frame = frame_of([
        dict(collection=LAYOUT, graph="a", split="oof", fold=1, seed=AVERAGED, model="graph", scores=[0.0, 1.0]),
        dict(collection=LAYOUT, graph="a", split="oof", fold=1, seed=AVERAGED, model="score", scores=[1.0, 0.5]),
    ])
    out = blend(frame, {"graph": 0.25, "score": 0.75})
    assert scores_of(out) == [0.75, 0.25 + 0.375]
    assert out.schema == pl.Schema(PREDICTION_SCHEMA)
    assert set(out["model"]) == {"ensemble"} and set(out["fold"]) == {1}
    with pytest.raises(ConfigError, match="weights name models"):
        blend(frame, {"graph": 1.0})
    other_fold = frame.with_columns(pl.when(pl.col("model") == "score").then(2).otherwise(pl.col("fold"))
                                    .cast(pl.Int16).alias("fold"))
    with pytest.raises(FormatError, match="models disagree"):
        blend(other_fold, {"graph": 0.5, "score": 0.5})


def test_ensemble_collection_end_to_end():
    truths = make_world(TILE, graphs=15, configs=20, seed=4)
    oof = pl.concat([oof_frame(truths, "A", noise=0.4, seed=1, seeds=2), oof_frame(truths, "B", noise=0.8, seed=2)])
    rng = np.random.default_rng(9)
    test = frame_of([dict(collection=TILE, graph=f"t{g}", split="test", fold=f, seed=s, model=m,
                          scores=rng.standard_normal(7) * (10 if m == "B" else 1))
                     for g in range(3) for f in range(3) for s in range(2) for m in ("A", "B")])
    result = ensemble_collection(oof, test, truths, ["A", "B"], method="rank")
    assert set(result.scores) == {"A", "B", "ensemble"}
    assert result.scores["ensemble"] >= max(result.scores["A"], result.scores["B"])
    assert result.scores["ensemble"] == pytest.approx(oof_score(result.blended_oof, truths))
    for blended in (result.blended_oof, result.blended_test):
        assert blended.schema == pl.Schema(PREDICTION_SCHEMA)
        assert set(blended["model"]) == {"ensemble"}
        assert not blended.select("collection", "graph", "config_index").is_duplicated().any()
    assert result.blended_test.height == 3 * 7 and set(result.blended_test["fold"]) == {AVERAGED}
    assert result.blended_oof.height == 15 * 20
    # OOF folds survive the blend, so later stages can still split by fold.
    folds = dict(oof.select("graph", "fold").unique().iter_rows())
    assert dict(result.blended_oof.select("graph", "fold").unique().iter_rows()) == folds
    assert sum(result.weights.values()) == pytest.approx(1.0)
    assert result.curve.height == 21
    with pytest.raises(FormatError, match="no test rows for model"):
        ensemble_collection(oof, test.filter(pl.col("model") == "A"), truths, ["A", "B"])


def test_gain_at_runs_extrapolates_a_plus_b_over_n():
    # gain(n) = a + b / n through (1, 0.007) and (2, 0.004): b = 0.006, a = 0.001
    assert gain_at_runs([0.008, 0.006], 0.004, runs=10) == pytest.approx(0.0016)
    assert gain_at_runs([0.008, 0.006], 0.004, runs=2) == pytest.approx(0.004)  # the all-seeds gain itself
    # three seeds: through (1, 0.007) and (3, 0.003): b = 0.006, a = 0.001
    assert gain_at_runs([0.006, 0.007, 0.008], 0.003, runs=15) == pytest.approx(0.0014)
    assert gain_at_runs([0.004, 0.004], 0.004, runs=10) == pytest.approx(0.004)  # no shrinkage: unchanged
    assert gain_at_runs([0.005], 0.005, runs=5) == 0.005  # one seed: no slope to fit


def test_requiring_keeps_the_fitted_blend_only_above_the_threshold():
    truths = make_world(LAYOUT, graphs=30, configs=40, seed=3)
    frames = {m: prepare_model_scores(oof_frame(truths, m, noise=1.5, seed=s)) for m, s in (("A", 4), ("B", 5))}
    fit = fit_blend_weights(frames, truths, LAYOUT)
    alone = {m: float(m == fit.best_single) for m in frames}
    assert fit.fitted_weights != alone and fit.tested_gain == fit.gain
    kept = fit.requiring(2.0, 2.01 * fit.gain_se)
    assert kept.weights == fit.fitted_weights and kept.score == fit.fitted_score
    assert kept.tested_gain == 2.01 * fit.gain_se
    dropped = fit.requiring(2.0, 1.99 * fit.gain_se)
    assert dropped.weights == alone and dropped.score == fit.single_scores[fit.best_single]
    assert dropped.requiring(0.0, -1.0).weights == fit.fitted_weights  # 0: always the fitted blend
    assert fit.requiring(2.0, math.nan).weights == alone
    with pytest.raises(ConfigError, match="min_gain_se"):
        fit.requiring(-1.0, fit.gain)


def _two_seed_test_rows(graphs: int = 3, folds: int = 3, seeds: int = 2) -> pl.DataFrame:
    rng = np.random.default_rng(9)
    return frame_of([dict(collection=LAYOUT, graph=f"t{g}", split="test", fold=f, seed=s, model=m,
                          scores=rng.standard_normal(7))
                     for g in range(graphs) for f in range(folds) for s in range(seeds) for m in ("A", "B")])


def test_gain_at_test_runs_drops_a_blend_whose_gain_is_seed_noise():
    # Two seeds of two equally good models, with independent noise per seed: averaging the seeds already
    # removes part of the noise the blend removes, so the blend's OOF gain shrinks with the runs averaged.
    truths = make_world(LAYOUT, graphs=40, configs=40, seed=3)
    oof = pl.concat([oof_frame(truths, m, noise=1.5, seed=s, seeds=2) for m, s in (("A", 4), ("B", 5))])
    test = _two_seed_test_rows()
    assert runs_per_test_graph(test, "A") == 6  # 3 fold models x 2 seeds
    plain = ensemble_collection(oof, test, truths, ["A", "B"]).fit
    per_seed = seed_gains(oof, truths, LAYOUT, plain)
    assert len(per_seed) == 2 and np.mean(per_seed) > plain.gain > 0  # the gain shrinks with averaging
    expected = gain_at_runs(per_seed, plain.gain, 6)
    assert expected < plain.gain
    threshold = (expected + plain.gain) / 2 / plain.gain_se  # the measured OOF gain passes it, the expected not
    on_oof = ensemble_collection(oof, test, truths, ["A", "B"], min_gain_se=threshold).fit
    assert on_oof.weights == plain.fitted_weights and on_oof.tested_gain == plain.gain
    at_runs = ensemble_collection(oof, test, truths, ["A", "B"], min_gain_se=threshold, gain_at="test-runs").fit
    assert at_runs.tested_gain == pytest.approx(expected)
    assert at_runs.weights == {m: float(m == plain.best_single) for m in ("A", "B")}
    with pytest.raises(ConfigError, match="gain_at"):
        ensemble_collection(oof, test, truths, ["A", "B"], gain_at="test")


def test_gain_at_test_runs_changes_nothing_when_seeds_agree():
    # Identical seeds: each seed's gain is the all-seeds gain, so the gain expected at any runs is that gain.
    truths = make_world(LAYOUT, graphs=40, configs=40, seed=3)
    one = pl.concat([oof_frame(truths, "A", noise=1.5, seed=4), oof_frame(truths, "B", noise=1.5, seed=5)])
    oof = pl.concat([one, one.with_columns(pl.lit(1).cast(one.schema["seed"]).alias("seed"))])
    test = _two_seed_test_rows()
    plain = ensemble_collection(oof, test, truths, ["A", "B"]).fit
    threshold = 0.99 * plain.gain / plain.gain_se
    at_runs = ensemble_collection(oof, test, truths, ["A", "B"], min_gain_se=threshold, gain_at="test-runs").fit
    assert seed_gains(oof, truths, LAYOUT, plain) == pytest.approx([plain.gain, plain.gain])
    assert at_runs.tested_gain == pytest.approx(plain.gain) and at_runs.weights == plain.fitted_weights


def test_common_oof_keeps_the_configs_every_model_predicted():
    def oof(model: str, index: list[int]) -> pl.DataFrame:
        return prediction_frame(collection="tile:xla", graph="g", split="oof", fold=0, seed=0, model=model,
                                scores=np.arange(len(index), dtype=float), config_index=np.array(index))

    frame = pl.concat([oof("a", [0, 1, 2, 3]), oof("b", [1, 3, 4])])
    kept = common_oof(frame, ["a", "b"])
    assert sorted(kept.filter(pl.col("model") == "a")["config_index"].to_list()) == [1, 3]
    assert sorted(kept.filter(pl.col("model") == "b")["config_index"].to_list()) == [1, 3]
