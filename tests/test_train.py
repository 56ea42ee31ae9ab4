"""Training stage: fold plan, summaries, reference rankers, the stage on an in-memory prepared
collection (fast, every path incl. parallel jobs), and end to end on a tiny synthetic world."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest

from pipelines.core.collection import LAYOUT_XLA_RANDOM, TILE_XLA, Collection
from pipelines.config.settings import PipelineConfig, load_config
from pipelines.core.errors import ConfigError, PipelineError
from pipelines.core.metric import score_predictions
from pipelines.models.reference import FeatureRanker, RandomRanker
from pipelines.config.registry import get_adapter
from pipelines.core.predictions import read_predictions
from pipelines.data.tpugraphs import LayoutGraph, save_graph
from pipelines.training.fit import (
    IMPORTANCE_FILE,
    PREDICTIONS_FILE,
    SCORES_FILE,
    fold_plan,
    stage_name,
    summarize_scores,
    train_model,
)

# On top of the smoke config: a few more, faster-learning trees, so the GBDT clearly beats chance.
QUICK_GBDT = ["gbdt.n_estimators=30", "gbdt.early_stopping_rounds=10", "gbdt.learning_rate=0.2"]


def feature_frame(graphs: list[str], n_configs: int, seed: int) -> pl.DataFrame:
    """Runtime = scale * exp(f_signal + noise), f_noise irrelevant, g_scale graph-constant."""
    rng = np.random.default_rng(seed)
    parts = []
    for graph in graphs:
        signal = rng.normal(size=n_configs)
        scale = rng.uniform(1, 100)
        parts.append(pl.DataFrame({
            "graph": [graph] * n_configs,
            "config_index": np.arange(n_configs, dtype=np.int32),
            "target": scale * np.exp(signal + 0.3 * rng.normal(size=n_configs)),
            "f_signal": signal.astype(np.float32),
            "f_noise": rng.normal(size=n_configs).astype(np.float32),
            "g_scale": np.full(n_configs, scale, dtype=np.float32),
        }))
    return pl.concat(parts)


@dataclass
class MemoryPrepared:
    """The part of pipelines.data.prepared.Prepared the training stage uses, held in memory."""

    collection: Collection
    table: pl.DataFrame
    fold_table: pl.DataFrame
    test: list[str]
    stages: dict = field(default_factory=lambda: {"features": SimpleNamespace(key="features-key"),
                                                  "folds": SimpleNamespace(key="folds-key")})

    def graphs(self, split: str) -> list[str]:
        return self.test if split == "test" else sorted(self.fold_table.filter(pl.col("split") == split)["graph"])

    def load_features(self, graphs, max_configs=None, seed=0) -> pl.DataFrame:
        part = self.table.filter(pl.col("graph").is_in(list(graphs)))
        if self.collection.is_tile is False and max_configs is not None:
            part = part.filter(pl.col("config_index") < max_configs)
        return part

    def folds(self) -> pl.DataFrame:
        return self.fold_table

    @property
    def graph_table(self) -> pl.DataFrame:
        return self.table.group_by("graph").agg(pl.len().alias("configs_after"))

    def runtimes(self, graph: str) -> np.ndarray:
        return self.table.filter(pl.col("graph") == graph).sort("config_index")["target"].to_numpy()


def memory_prepared(collection: Collection = LAYOUT_XLA_RANDOM, holdout: int = 2) -> MemoryPrepared:
    cv = [f"net{i}" for i in range(9)]
    held = [f"valid{i}" for i in range(holdout)]
    test = ["t0", "t1"]
    table = feature_frame(cv + held, 50, 0)
    table = pl.concat([table, feature_frame(test, 50, 1).with_columns(pl.lit(0.0).alias("target"))])
    folds = pl.DataFrame({"graph": cv + held, "split": ["train"] * 9 + ["valid"] * holdout,
                          "family": cv + held, "fold": [i % 3 for i in range(9)] + [-1] * holdout},
                         schema_overrides={"fold": pl.Int32})
    return MemoryPrepared(collection, table, folds, test)


def quick_config(*extra: str) -> PipelineConfig:
    return load_config("smoke", ["folds.k=5", "run.seeds=[0, 1]", *QUICK_GBDT, *extra])


# ----------------------------------------------------------------------------- pure parts


def test_fold_plan_splits_cv_holdout_and_test():
    folds = pl.DataFrame({"graph": ["a", "b", "c", "d", "e"], "fold": [0, 1, 0, -1, 2]})
    plan = fold_plan(folds, ["t"])
    assert plan.folds == (0, 1, 2)
    assert plan.train_graphs(0) == ["b", "e"] and plan.graphs_by_fold[0] == ["a", "c"]
    assert plan.holdout == ["d"] and plan.test == ["t"]
    with pytest.raises(PipelineError, match="at least 2 folds"):
        fold_plan(pl.DataFrame({"graph": ["a"], "fold": [0]}), [])


def test_summarize_scores_by_hand():
    scores = pl.DataFrame({
        "graph": ["a", "b", "c", "a", "b", "c", "h", "h"],
        "split": ["oof"] * 6 + ["holdout"] * 2,
        "fold": [0, 0, 1, 0, 0, 1, 0, 1],
        "seed": [0, 0, 0, 1, 1, 1, 0, 0],
        "score": [0.2, 0.4, float("nan"), 0.4, 0.6, 0.8, 0.1, 0.3],
        "opa": [0.6, 0.7, 0.5, 0.7, 0.8, 0.9, 0.5, 0.6],
    })
    m = summarize_scores(scores)
    assert m["oof_score_by_seed"] == pytest.approx({"0": 0.3, "1": 0.6})  # NaN graph left out
    assert m["oof_score"] == pytest.approx(0.45) and m["oof_score_std"] == pytest.approx(0.15)
    assert m["oof_score_by_fold"] == pytest.approx({"0": 0.4, "1": 0.8})
    assert m["undefined_graph_scores"] == 1 and m["oof_graphs"] == 3
    assert m["holdout_score"] == pytest.approx(0.2) and m["holdout_graphs"] == 1


def test_random_ranker_is_seeded_and_batch_independent():
    frame = feature_frame(["a", "b"], 20, 0)
    ranker = partial(RandomRanker, collection="layout:xla:random")
    costs = ranker().fit(None, seed=5).predict(frame)
    assert np.array_equal(costs[20:], ranker().fit(None, seed=5).predict(frame[20:]))
    assert not np.array_equal(costs, ranker().fit(None, seed=6).predict(frame))
    with pytest.raises(RuntimeError, match="before predict"):
        ranker().predict(frame)


def test_feature_ranker_picks_column_and_sign_on_training_data():
    frame = feature_frame(["a", "b", "c"], 40, 0).with_columns((-pl.col("f_signal")).alias("f_negated"))
    frame = frame.drop("f_signal")
    ranker = FeatureRanker(collection="layout:xla:random").fit(frame, seed=0)
    assert (ranker.column_, ranker.sign_) == ("f_negated", -1.0)  # faster when f_negated is larger
    assert np.array_equal(ranker.predict(frame), frame["f_negated"].to_numpy() * -1.0)
    fixed = FeatureRanker({"column": "f_noise"}, collection="tile:xla").fit(frame, seed=0)
    assert fixed.metric == "top5"
    assert fixed.column_ == "f_noise"


def test_registry_names_and_errors():
    assert get_adapter("gbdt").name == "gbdt"
    assert get_adapter("feature:f_signal").column == "f_signal"
    assert stage_name("feature:f_signal") == "train-feature.f_signal"
    with pytest.raises(ConfigError, match="unknown model"):
        get_adapter("xgboost")
    with pytest.raises(ConfigError, match="no argument"):
        get_adapter("gbdt:fast")


def test_a_feature_model_on_an_unknown_column_is_refused_before_any_stage_listing_the_columns(tiny_world, tmp_path,
                                                                                              capsys):
    """Issue 71, class 3: ``feature:<unknown>`` was a ValueError traceback after every data stage ran."""
    from pipelines.cli import main
    from pipelines.core.collection import LAYOUT_XLA_DEFAULT
    from pipelines.training.fit import check_models

    with pytest.raises(ConfigError, match=r"tile:xla has no feature column 'f_nope'.*f_cfg_0, f_cfg_1"):
        check_models(["feature:f_nope"], [TILE_XLA])
    check_models(["feature:f_freq_mean", "feature", "random"], [LAYOUT_XLA_DEFAULT])
    with pytest.raises(ConfigError, match="only layout:xla:default, layout:nlp:default have it"):
        check_models(["feature:f_freq_mean"], [LAYOUT_XLA_DEFAULT, TILE_XLA])
    for command in (["run", "--models"], ["train", "--model"]):
        work = tmp_path / command[0]
        assert main([*command, "feature:f_nope", "--data-root", str(tiny_world), "--work-dir", str(work),
                     "--config", "smoke"]) == 2
        assert "has no feature column 'f_nope'" in capsys.readouterr().err and not work.exists()


# ----------------------------------------------------------------------------- the stage, in memory


def test_stage_writes_predictions_scores_and_metrics(tmp_path: Path):
    prepared = memory_prepared()
    config = quick_config()
    out = train_model(config, prepared, model="gbdt", work_dir=tmp_path)
    predictions = read_predictions(out.file(PREDICTIONS_FILE))
    oof = predictions.filter(pl.col("split") == "oof")
    # every CV config once per seed, from the fold that held its graph out
    assert oof.height == 9 * 50 * 2
    assert oof.select("graph", "config_index", "seed").is_duplicated().sum() == 0
    fold_of = dict(prepared.fold_table.select("graph", "fold").iter_rows())
    assert all(fold_of[g] == f for g, f in oof.select("graph", "fold").unique().iter_rows())
    test = predictions.filter(pl.col("split") == "test")
    assert test.height == 2 * 50 * 3 * 2  # test graphs x configs x fold models x seeds
    assert set(predictions["model"]) == {"gbdt"} and set(predictions["collection"]) == {"layout:xla:random"}

    scores = pl.read_parquet(out.file(SCORES_FILE))
    seed0 = oof.filter(pl.col("seed") == 0)
    truths = {("layout:xla:random", g): prepared.runtimes(g) for g in seed0["graph"].unique()}
    expected = score_predictions(seed0, truths).per_graph.sort("graph")
    got = scores.filter((pl.col("split") == "oof") & (pl.col("seed") == 0)).sort("graph")
    assert np.allclose(got["score"], expected["score"])
    m = out.metrics
    assert m["oof_score"] == pytest.approx(np.mean(list(m["oof_score_by_seed"].values())))
    assert m["oof_score"] > 0.5 and m["holdout_graphs"] == 2 and m["holdout_score"] > 0.5
    assert len(m["models"]) == 6 and all(r["best_iteration"] >= 1 for r in m["models"])
    importance = pl.read_parquet(out.file(IMPORTANCE_FILE))
    assert importance.select("fold", "seed").unique().height == 6
    manifest = json.loads((out.path / "manifest.json").read_text())
    assert manifest["inputs"] == {"features": "features-key", "folds": "folds-key"}
    assert manifest["config"]["settings"]["objective"] == "pairwise"  # the base objective of layout collections


def test_stage_is_cached_and_keyed_by_model_settings(tmp_path: Path, caplog):
    caplog.set_level(logging.INFO, logger="pipelines")
    prepared = memory_prepared()
    one_seed = "run.seeds=[0]"
    first = train_model(quick_config(one_seed), prepared, model="gbdt", work_dir=tmp_path)
    again = train_model(quick_config(one_seed), prepared, model="gbdt", work_dir=tmp_path)
    assert again.key == first.key
    assert caplog.messages[-1] == f"{prepared.collection.name} [train-gbdt] cached {first.key}"
    other = quick_config(one_seed, 'gbdt.collections."tile:xla".num_leaves=15')  # another collection's override
    assert train_model(other, prepared, model="gbdt", work_dir=tmp_path).key == first.key
    changed = quick_config(one_seed, 'gbdt.collections."layout:xla:random".num_leaves=15')
    assert train_model(changed, prepared, model="gbdt", work_dir=tmp_path).key != first.key


@pytest.mark.slow
def test_models_beat_random_and_parallel_jobs_match_serial(tmp_path: Path):
    prepared = memory_prepared(TILE_XLA, holdout=0)
    silent = dict(work_dir=tmp_path)
    one_seed = "run.seeds=[0]"
    random = train_model(quick_config(), prepared, model="random", **silent).metrics
    feature = train_model(quick_config(one_seed), prepared, model="feature", **silent).metrics
    serial = train_model(quick_config(one_seed, "gbdt.objective=regression"), prepared, model="gbdt", **silent)
    parallel = train_model(quick_config(one_seed, "gbdt.objective=regression", "run.n_jobs=2"), prepared,
                           model="gbdt", work_dir=tmp_path / "parallel")
    assert random["metric"] == "top5 slowdown" and random["holdout_graphs"] == 0
    assert all(m["column"] == "f_signal" and m["sign"] == 1.0 for m in feature["models"])
    assert feature["oof_score"] > random["oof_score"] + 0.1
    assert serial.metrics["oof_score"] > random["oof_score"] + 0.1
    assert parallel.metrics["jobs"] == 2
    assert parallel.metrics["oof_score_by_seed"] == pytest.approx(serial.metrics["oof_score_by_seed"])


# ----------------------------------------------------------------------------- end to end (files on disk)

LAYOUT_STEMS = {"train": ["resnet50.4x4.fp16", "resnet50.2x2.fp32", "unet_3d.4x4.bf16", "bert_tiny.2x2.fp32",
                          "inception_v3_batch_128_train"],
                "valid": ["mlperf_bert_batch_24_2x2"],
                "test": ["0123456789abcdef0123456789abcdef"]}


def tiny_layout_graph(rng: np.random.Generator, stem: str, labelled: bool) -> LayoutGraph:
    """A 12-node chain with three configurable nodes; runtime grows with the layouts left to the
    compiler (-1), so a model has something to learn."""
    n, configs = 12, 30
    node_feat = np.zeros((n, 140), dtype=np.float32)
    node_feat[:, 13] = 1
    node_feat[:, 21:23] = rng.integers(1, 300, size=(n, 2))
    node_feat[:, 28] = node_feat[:, 21] * node_feat[:, 22]
    node_feat[:, 134:136] = (1, 0)
    opcode = rng.integers(1, 100, n).astype(np.uint8)
    config_ids = np.array([3, 6, 9])
    opcode[config_ids] = (26, 34, 75)
    edges = np.array([[u, u - 1] for u in range(1, n)])
    feat = np.full((configs, 3, 18), -1, dtype=np.int8)
    feat[:, :, :2] = rng.permuted(np.tile([0, 1], (configs, 3, 1)), axis=2)
    feat[rng.random((configs, 3)) < 0.4, :2] = -1
    cost = (feat[:, :, 0] == -1).sum(axis=1) + 0.1 * rng.random(configs)
    runtime = (1e6 * (1 + cost)).astype(np.int64) if labelled else np.zeros(configs, dtype=np.int64)
    return LayoutGraph(stem, node_feat, opcode, edges, config_ids, feat, runtime, np.array([[0, n]]))


def test_cli_train_end_to_end_on_a_tiny_world(tmp_path: Path, capsys):
    from pipelines.cli import main

    rng = np.random.default_rng(0)
    for split, stems in LAYOUT_STEMS.items():
        directory = tmp_path / "data" / "npz_all" / "npz" / LAYOUT_XLA_RANDOM.relative_dir / split
        directory.mkdir(parents=True)
        for stem in stems:
            save_graph(directory / f"{stem}.npz", tiny_layout_graph(rng, stem, split != "test"))
    args = ["train", "--model", "gbdt", "--collection", "layout:xla:random", "--data-root", str(tmp_path / "data"),
            "--work-dir", str(tmp_path / "work"), "--config", "smoke", "--set", "run.seeds=[0]",
            *[arg for setting in QUICK_GBDT for arg in ("--set", setting)]]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "layout:xla:random" in printed and "kendall tau-b: OOF" in printed and "train-gbdt/" in printed
    (output,) = [p for p in (tmp_path / "work" / "train-gbdt").iterdir() if not p.name.startswith(".")]
    predictions = read_predictions(output / PREDICTIONS_FILE)
    test = predictions.filter(pl.col("split") == "test")
    assert sorted(test["config_index"].unique()) == list(range(30))  # every test config, per fold model
    assert test.height == 30 * 2  # quick config: 2 folds
    oof = predictions.filter(pl.col("split") == "oof")
    assert set(oof["graph"]) == set(LAYOUT_STEMS["train"]) | set(LAYOUT_STEMS["valid"])
    manifest = json.loads((output / "manifest.json").read_text())
    assert set(manifest["inputs"]) == {"features", "folds"} and manifest["metrics"]["oof_graphs"] == 6
    assert main(args) == 0
    assert f"[train-gbdt] cached {output.name}" in capsys.readouterr().out  # the second run reuses the stage
    assert manifest["metrics"]["oof_score"] > 0.3  # runtime follows the compiler-chosen layouts


def test_a_gnn_trains_on_another_collections_graphs_when_the_config_names_it(tiny_world: Path, tmp_path: Path):
    from pipelines.flows.prepare import prepare

    one_pass = ["run.seeds=[0]", 'gnn.collections."layout:xla:random".passes_per_epoch=1']
    extra = ['gnn.collections."layout:xla:random".extra_train_collections=["layout:nlp:random"]']
    config = load_config("smoke", [*one_pass, *extra])
    prepared = prepare(config, tiny_world, tmp_path / "work", ["layout:xla:random"])
    assert list(prepared) == ["layout:xla:random"]  # only what was asked is returned, with its companion
    companion = prepared["layout:xla:random"].companions["layout:nlp:random"]
    assert (tmp_path / "work" / "node_arrays" / companion.stages["node_arrays"].key).is_dir()
    labelled = companion.graphs("train") + companion.graphs("valid")

    output = train_model(config, prepared["layout:xla:random"], model="gnn", work_dir=tmp_path / "work")
    assert output.metrics["extra_train_graphs"] == {"layout:nlp:random": len(labelled)}
    assert output.manifest["inputs"]["layout:nlp:random:node_arrays"] == companion.stages["node_arrays"].key
    predictions = read_predictions(output.file(PREDICTIONS_FILE))
    own = set(prepared["layout:xla:random"].graphs("train") + prepared["layout:xla:random"].graphs("valid"))
    assert set(predictions.filter(pl.col("split") == "oof")["graph"]) == own  # never scored on the others

    plain = load_config("smoke", one_pass)
    alone = train_model(plain, prepare(plain, tiny_world, tmp_path / "work", ["layout:xla:random"])["layout:xla:random"],
                        model="gnn", work_dir=tmp_path / "work")
    assert alone.key != output.key and alone.metrics["extra_train_graphs"] == {}
    with_extra = predictions.sort("graph", "config_index", "fold")["score"].to_numpy()
    without = read_predictions(alone.file(PREDICTIONS_FILE)).sort("graph", "config_index", "fold")["score"].to_numpy()
    assert with_extra.shape == without.shape and not np.allclose(with_extra, without)  # the extra graphs were fitted

    for wrong in ("tile:xla", "layout:xla:random"):
        bad = load_config("smoke", [f'gnn.collections."layout:xla:random".extra_train_collections=["{wrong}"]'])
        with pytest.raises(ConfigError, match=f"names {wrong}: it must be another layout collection"):
            prepare(bad, tiny_world, tmp_path / "work", ["layout:xla:random"])


def test_a_malformed_loky_cpu_count_is_replaced_with_a_warning(monkeypatch, caplog):
    """Issue 71, class 3: LOKY_MAX_CPU_COUNT=abc ended in loky's ValueError traceback."""
    import os
    from pipelines.training import fit as fit_module
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", "abc")
    with caplog.at_level("WARNING"):
        fit_module._quiet_loky()
    assert os.environ["LOKY_MAX_CPU_COUNT"].isdigit() and int(os.environ["LOKY_MAX_CPU_COUNT"]) > 0
    assert any("LOKY_MAX_CPU_COUNT" in m for m in caplog.messages)
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", "3")
    fit_module._quiet_loky()
    assert os.environ["LOKY_MAX_CPU_COUNT"] == "3"


def test_epoch_cap_notes_say_once_per_model_what_the_cap_means_under_the_config(caplog):
    """Issue 79: the first `make demo` printed five "may not have converged" warnings, one per stage,
    although the demo config caps the GNN at 8 epochs on purpose."""
    from pipelines.flows.run import log_epoch_caps
    from pipelines.training.fit import epoch_cap_notes

    def stage(collection: str, epochs: int, at_cap: int, model: str = "gnn") -> SimpleNamespace:
        return SimpleNamespace(metrics={"collection": collection, "model": model,
                                        "epoch_cap": {"epochs": epochs, "fold_models": 5, "at_cap": at_cap}})

    base = {"tile:xla": 20, "layout:xla:default": 20}
    short = epoch_cap_notes([stage("tile:xla", 8, 5), stage("layout:xla:default", 8, 4)],
                            lambda model, collection: base[collection])
    assert short == [(logging.INFO, "gnn: 9 of 10 fold models in 2 collections (tile:xla, layout:xla:default) trained "
                                    "every epoch this config allows (gnn.epochs = 8; base: 20): expected of a "
                                    "shortened schedule; their scores are a short fit's")]
    full = epoch_cap_notes([stage("tile:xla", 20, 2), stage("layout:xla:default", 8, 0)],
                           lambda model, collection: base[collection])
    assert [level for level, _ in full] == [logging.WARNING]
    assert "2 of 5 fold models in 1 collection (tile:xla) stopped at the epoch cap (gnn.epochs = 20) before early " \
           "stopping ended them: they may not have converged" in full[0][1]
    assert epoch_cap_notes([stage("tile:xla", 20, 0)], lambda model, collection: 20) == []

    with caplog.at_level(logging.INFO, logger="pipelines"):  # against the shipped base config
        log_epoch_caps([stage("tile:xla", 8, 5), stage("layout:nlp:random", 8, 5)])
    assert [r.levelno for r in caplog.records] == [logging.INFO] and "base: 20" in caplog.records[0].getMessage()


def test_epoch_cap_notes_do_not_fail_a_finished_run_whose_base_config_no_longer_reads(caplog, monkeypatch):
    """The notes read base.toml when training is done: a key added to it since the run started (a newer
    checkout) made a finished run fail before it published."""
    import pipelines.config.settings as settings
    from pipelines.core.errors import ConfigError
    from pipelines.flows.run import log_epoch_caps

    def unreadable(name):
        raise ConfigError("configs/base.toml: unknown key 'gnn.newer_option'")

    monkeypatch.setattr(settings, "load_config", unreadable)
    at_cap = SimpleNamespace(metrics={"collection": "tile:xla", "model": "gnn",
                                      "epoch_cap": {"epochs": 8, "fold_models": 5, "at_cap": 5}})
    with caplog.at_level(logging.INFO, logger="pipelines"):
        log_epoch_caps([at_cap])
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "epoch-cap notes skipped" in caplog.text and "gnn.newer_option" in caplog.text
