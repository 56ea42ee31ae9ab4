"""GBDT ranker: pure helpers on hand-computed cases, and the fit/predict contract on a synthetic frame."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from scipy.stats import kendalltau

from pipelines.core.errors import ConfigError
from pipelines.core.metric import tile_score, tile_top_k
from pipelines.models.gbdt import (
    GBDTRanker,
    group_rows,
    pair_accuracy,
    pairwise_costs,
    rank_pct,
    regression_targets,
    relevance_labels,
    sample_pairs,
    stratified_subsample,
    top5_score,
    within_graph_ranks,
)
from pipelines.config.gbdt import OBJECTIVES, GBDTConfig

FAST = dict(n_estimators=40, early_stopping_rounds=10, num_leaves=7, min_child_samples=5, learning_rate=0.2,
            pairs_per_graph=300, pairwise_references=16)


def gbdt(objective: str, collection: str = "layout:xla:random", **overrides) -> GBDTRanker:
    """A ranker built the way the training stage builds it: from its config section, for a collection."""
    return GBDTRanker(GBDTConfig(objective=objective, **{**FAST, **overrides}), collection=collection)


def make_frame(n_graphs: int, n_configs: int, seed: int, prefix: str = "g") -> pl.DataFrame:
    """Runtime = graph scale * exp(f_signal + noise); f_noise is irrelevant; g_scale is graph-constant."""
    rng = np.random.default_rng(seed)
    parts = []
    for g in range(n_graphs):
        signal = rng.normal(size=n_configs)
        scale = rng.uniform(1, 100)
        runtime = scale * np.exp(signal + 0.3 * rng.normal(size=n_configs))
        parts.append(pl.DataFrame({
            "graph": [f"{prefix}{g}"] * n_configs,
            "config_index": np.arange(n_configs, dtype=np.int32),
            "target": runtime,
            "f_signal": signal.astype(np.float32),
            "f_noise": rng.normal(size=n_configs).astype(np.float32),
            "g_scale": np.full(n_configs, scale, dtype=np.float32),
        }))
    return pl.concat(parts)


def mean_tau(frame: pl.DataFrame, costs: np.ndarray) -> float:
    frame = frame.with_columns(pl.Series("cost", costs))
    return float(np.mean([kendalltau(part["cost"], part["target"])[0]
                          for part in frame.partition_by("graph")]))


@pytest.fixture(scope="module")
def frames() -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    return make_frame(16, 60, 0, "train"), make_frame(6, 60, 1, "valid"), make_frame(6, 60, 2, "test")


# ----------------------------------------------------------------------------- pure helpers


def test_group_rows_groups_by_first_appearance_keeping_row_order():
    order, offsets = group_rows(pl.Series(["b", "a", "b", "c", "a"]))
    assert order.tolist() == [0, 2, 1, 4, 3]
    assert offsets.tolist() == [0, 2, 4, 5]


def test_rank_labels_and_targets_by_hand():
    y = np.array([3.0, 1.0, 2.0, 2.0, 7.0])
    offsets = np.array([0, 4, 5])
    assert rank_pct(y, offsets).tolist() == [1.0, 0.0, 0.5, 0.5, 0.0]  # ties share the average rank
    assert relevance_labels(y, offsets, bins=3).tolist() == [0, 2, 1, 1, 2]  # fastest = highest label
    centered = regression_targets(y, offsets, "log_centered")
    assert np.allclose(centered[:4], np.log(y[:4]) - np.log(y[:4]).mean()) and centered[4] == 0
    with pytest.raises(ValueError, match="positive"):
        regression_targets(np.array([1.0, 0.0]), np.array([0, 2]), "log_centered")


def test_stratified_subsample_takes_one_config_per_runtime_stratum():
    rng = np.random.default_rng(0)
    y = np.concatenate([rng.permutation(10).astype(float), [5.0, 6.0]])  # group of 10, then group of 2
    offsets = np.array([0, 10, 12])
    keep = stratified_subsample(y, offsets, 5, rng)
    assert np.all(np.diff(keep) > 0)
    first = keep[keep < 10]
    assert sorted(y[first] // 2) == [0, 1, 2, 3, 4]  # exactly one of each pair of runtime ranks
    assert keep[keep >= 10].tolist() == [10, 11]  # a small group is kept whole


def test_sample_pairs_stay_within_groups_and_drop_ties():
    y = np.array([1.0, 1.0, 2.0, 3.0, 3.0, 4.0, 9.0])
    offsets = np.array([0, 3, 6, 7])
    i, j = sample_pairs(y, offsets, 200, np.random.default_rng(0))
    group = np.searchsorted(offsets, np.arange(7), side="right") - 1
    assert len(i) > 0 and np.all(group[i] == group[j])
    assert np.all(y[i] != y[j])
    assert not np.any(i == 6)  # a group of one has no pairs


def test_pairwise_costs_count_predicted_wins_by_hand():
    x = np.array([[3.0], [1.0], [2.0]])  # one feature; smaller is faster
    # the "model": i beats j exactly when x_i < x_j, read from the difference column
    def wins(pairs):
        return (pairs[:, 1] < 0).astype(float)

    costs = pairwise_costs(x, np.array([0, 3]), np.array([True]), 8, [np.random.default_rng(0)], wins)
    assert costs.tolist() == [0.0, -1.0, -0.5]  # wins out of the 2 others: 0, 2, 1


def test_pairwise_costs_with_a_reference_sample_never_compare_a_config_with_itself():
    x = np.arange(6, dtype=float)[:, None]
    seen = []

    def wins(pairs):
        seen.append(pairs.copy())
        return (pairs[:, 1] < 0).astype(float)

    costs = pairwise_costs(x, np.array([0, 6]), np.array([True]), 3, [np.random.default_rng(1)], wins)
    pairs = np.concatenate(seen)
    assert len(pairs) == 6 * 3  # every config against the same 3 references
    references = np.unique(pairs[:, 0] - pairs[:, 1])  # x_i - (x_i - x_ref) = x_ref
    assert len(references) == 3
    for value, cost in zip(x[:, 0], costs):
        others = references[references != value]  # itself excluded
        assert cost == pytest.approx(-np.mean(value < others))


def test_top5_score_matches_the_metric_by_hand():
    y = np.array([5.0, 1.0, 3.0, 2.0, 4.0, 9.0, 7.0, 2.0, 4.0])
    cost = np.array([0.0, 10.0, 1.0, 2.0, 3.0, 4.0, 5.0, 1.0, 0.0])
    offsets = np.array([0, 7, 9])
    # group 1: the five cheapest miss the best (y=1); best listed is 2 -> 2 - 2/1 = 0; group 2 -> 1
    assert top5_score(cost, y, offsets) == pytest.approx(0.5)
    by_metric = [tile_score(tile_top_k(cost[a:b]), y[a:b]) for a, b in ((0, 7), (7, 9))]
    assert np.mean(by_metric) == pytest.approx(0.5)


def test_pair_accuracy_counts_cost_ties_half():
    y = np.array([1.0, 2.0, 3.0])
    cost = np.array([0.0, 1.0, 1.0])
    i, j = np.array([0, 1, 2]), np.array([1, 2, 0])
    assert pair_accuracy(cost, y, i, j) == pytest.approx((1 + 0.5 + 1) / 3)


# ----------------------------------------------------------------------------- the estimator contract


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_contract_and_learns_an_easy_signal(objective, frames, tmp_path):
    train, valid, test = frames
    model = gbdt(objective)
    with pytest.raises(RuntimeError, match="before"):
        model.predict(test)
    assert model.fit(train, valid, seed=3) is model
    costs = model.predict(test)
    assert costs.shape == (test.height,) and np.all(np.isfinite(costs))
    assert mean_tau(test, costs) > 0.5  # f_signal alone bounds tau near 0.8
    again = gbdt(objective).fit(train, valid, seed=3).predict(test)
    assert np.array_equal(costs, again)
    other = gbdt(objective).fit(train, valid, seed=4).predict(test)
    assert not np.array_equal(costs, other)  # bagging and feature sampling follow the seed
    assert 1 <= model.best_iteration_ <= FAST["n_estimators"]
    # the stopping metric per iteration, kept: its best is the iteration early stopping kept
    curve = model.stopping_curve_
    assert curve["metric"] == ("binary_logloss" if objective == "pairwise" else "opa")
    values = np.asarray(curve["values"]) * (1 if curve["higher_better"] else -1)
    assert len(values) <= FAST["n_estimators"] and int(np.argmax(values)) + 1 == model.best_iteration_
    model.save(tmp_path, "m")
    assert GBDTRanker.load(tmp_path, "m").stopping_curve_ == curve
    sidecar = tmp_path / "m.txt.json"  # a model saved before the curve was kept loads without it
    state = json.loads(sidecar.read_text())
    del state["stopping_curve"]
    sidecar.write_text(json.dumps(state))
    assert GBDTRanker.load(tmp_path, "m").stopping_curve_ is None


def test_predictions_do_not_depend_on_row_order_or_batching(frames):
    train, valid, test = frames
    model = gbdt("pairwise").fit(train, valid, seed=0)
    costs = model.predict(test)
    shuffled = np.random.default_rng(0).permutation(test.height)
    assert np.allclose(model.predict(test[shuffled]), costs[shuffled])
    one_graph = test.filter(pl.col("graph") == "test1")
    assert np.allclose(model.predict(one_graph), costs[(test["graph"] == "test1").to_numpy()])


def test_graph_features_switch_and_importance(frames):
    train, valid, _ = frames
    without = gbdt("regression").fit(train, valid, seed=0)
    assert without.feature_names_ == ["f_signal", "f_noise"]
    with_g = gbdt("regression", graph_features="always").fit(train, valid, seed=0)
    assert with_g.feature_names_ == ["f_signal", "f_noise", "g_scale"]
    importance = without.feature_importance()
    assert importance.columns == ["feature", "gain", "split"]
    gains = dict(zip(importance["feature"], importance["gain"]))
    assert gains["f_signal"] > gains["f_noise"]
    pairwise = gbdt("pairwise", graph_features="always").fit(train, valid, seed=0)
    assert pairwise.feature_importance()["feature"].to_list() == [
        "f_signal", "f_noise", "g_scale", "diff__f_signal", "diff__f_noise"]


def test_training_subsample_caps_configs_per_graph(frames):
    train, _, _ = frames
    model = gbdt("lambdarank", max_configs_per_graph=10).fit(train, seed=0)
    assert model.n_train_rows_ == 16 * 10
    assert model.best_iteration_ == FAST["n_estimators"]  # no validation frame: no early stopping
    assert model.stopping_curve_ is None


def test_bad_hyperparameters_raise_config_errors():
    with pytest.raises(ConfigError, match="objective"):
        gbdt("listnet")
    with pytest.raises(ConfigError, match="max_configs_per_graph"):  # a cross-field rule of the config
        gbdt("lambdarank", max_configs_per_graph=20_000)
    with pytest.raises(ConfigError, match="learning_rate"):
        gbdt("regression", learning_rate=0.0)
    with pytest.raises(ConfigError, match="finite"):
        GBDTRanker({"learning_rate": float("nan")}, collection="tile:xla")


def test_the_collection_resolves_what_the_config_leaves_to_it():
    config = GBDTConfig(objective="xendcg", num_threads=0,
                        collections={"tile:xla": {"num_leaves": 9}, "layout:nlp:default": {"num_leaves": 5}})
    tile = GBDTRanker(config, collection="tile:xla", num_threads=2)
    layout = GBDTRanker(config, collection="layout:xla:default", num_threads=1)
    assert (tile.graph_features, tile.stopping_metric, tile.num_threads, tile.config.num_leaves) == (True, "top5", 2, 9)
    assert (layout.graph_features, layout.stopping_metric, layout.num_threads, layout.config.num_leaves) == \
        (False, "opa", 1, 31)
    assert tile.config.collections == {}  # resolved: no other collection's overrides left
    fixed = GBDTRanker(GBDTConfig(graph_features="never", num_threads=3), collection="tile:xla", num_threads=2)
    assert (fixed.graph_features, fixed.num_threads) == (False, 3)


def test_the_training_stage_s_settings_are_not_resolved_twice(monkeypatch):
    """The adapter's settings come resolved (model_settings: no per-collection tables left): the ranker
    takes them as they are; a section with tables is resolved by the ranker itself (above)."""
    import pipelines.models.gbdt as gbdt_module
    from pipelines.config.settings import load_config, model_settings

    settings = model_settings(load_config("smoke"), "gbdt", "tile:xla")
    expected = GBDTRanker(settings, collection="tile:xla").config

    def refuse(*args, **kwargs):
        raise AssertionError("resolved again")

    monkeypatch.setattr(gbdt_module, "resolve_for_collection", refuse)
    assert GBDTRanker(settings, collection="tile:xla").config == expected
    assert expected.objective == "regression"  # smoke's tile:xla table, applied once by model_settings


def test_group_rows_can_sort_within_groups():
    order, offsets = group_rows(pl.Series(["b", "a", "b", "a"]), within=np.array([5, 2, 1, 0]))
    assert order.tolist() == [2, 0, 3, 1]
    assert offsets.tolist() == [0, 2, 4]


def test_within_graph_ranks_by_hand():
    x = np.array([[3.0, 1.0], [1.0, 1.0], [2.0, 5.0], [7.0, 0.0]])
    ranks = within_graph_ranks(x, np.array([0, 3, 4]))
    assert ranks.tolist() == [[1.0, 0.25], [0.0, 0.25], [0.5, 1.0], [0.0, 0.0]]


def test_graph_rank_features_are_added_and_batch_independent(frames):
    train, valid, test = frames
    model = gbdt("regression", graph_rank_features=True).fit(train, valid, seed=0)
    assert model.feature_names_ == ["f_signal", "f_noise", "rank__f_signal", "rank__f_noise"]
    costs = model.predict(test)
    one_graph = (test["graph"] == "test2").to_numpy()
    assert np.allclose(model.predict(test.filter(pl.col("graph") == "test2")), costs[one_graph])
    assert mean_tau(test, costs) > 0.5
