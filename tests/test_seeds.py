"""Issue 71, class 4: derived seeds never overflow nor alias. LightGBM's seeds are C int32: 2^31 and
2^32 trained the models of seed 0, and a run seed of 2^32 - 1 overflowed the int32 seed column."""

from __future__ import annotations

import itertools

import polars as pl
import pytest

from pipelines.cli import main
from pipelines.core.seeds import FIT_SEED_LIMIT, fit_seed
from pipelines.training.fit import PREDICTIONS_FILE

TOP = 2**32 - 1


def test_fit_seeds_are_the_sum_where_it_fits_and_mixed_into_31_bits_beyond():
    assert fit_seed(0) == 0 and fit_seed(1, 5) == 6 and fit_seed(FIT_SEED_LIMIT - 1) == FIT_SEED_LIMIT - 1
    pairs = [(FIT_SEED_LIMIT, 0), (0, FIT_SEED_LIMIT), (TOP, 0), (0, TOP), (TOP, 1), (1, TOP), (TOP, TOP),
             (2**32, 0), (FIT_SEED_LIMIT - 1, 1)]
    seeds = [fit_seed(a, b) for a, b in pairs]
    assert all(0 <= s < FIT_SEED_LIMIT for s in seeds)
    assert len(set(seeds) | {0, 1}) == len(pairs) + 2  # none aliases another pair, nor seed 0 or 1
    assert seeds == [fit_seed(a, b) for a, b in pairs]  # deterministic
    with pytest.raises(ValueError):
        fit_seed(-1)


def test_the_gbdt_never_hands_lightgbm_a_seed_that_aliases_a_smaller_one():
    from pipelines.config.gbdt import GBDTConfig
    from pipelines.models.gbdt import GBDTRanker

    ranker = GBDTRanker(GBDTConfig(), collection="tile:xla")
    lightgbm = [ranker._params(seed)["seed"] for seed in (0, 1, FIT_SEED_LIMIT, 2**32, TOP)]
    assert lightgbm[:2] == [0, 1] and all(0 <= s < FIT_SEED_LIMIT for s in lightgbm)
    assert len(set(lightgbm)) == len(lightgbm)
    assert all(a != b for a, b in itertools.combinations(lightgbm, 2))


def test_training_with_the_largest_seeds_runs_and_records_them(tiny_world, tmp_path, capsys):
    work = tmp_path / "work"
    assert main(["train", "--model", "gbdt", "--collections", "tile:xla", "--data-root", str(tiny_world),
                 "--work-dir", str(work), "--config", "smoke", "--set", "gbdt.n_estimators=5",
                 "--set", f"gbdt.seed={TOP}", "--set", f"run.seeds=[0, {TOP}]"]) == 0, capsys.readouterr().err
    [predictions] = work.glob(f"train-gbdt/*/{PREDICTIONS_FILE}")
    assert sorted(pl.read_parquet(predictions)["seed"].unique().to_list()) == [0, TOP]


def test_fold_seeds_give_each_fold_model_a_seed_of_its_own():
    from pipelines.core.seeds import model_fit_seed

    seeds = [fit_seed(run, 0, fold) for run in (0, 1, TOP) for fold in range(5)]
    assert all(0 <= s < FIT_SEED_LIMIT for s in seeds) and len(set(seeds)) == len(seeds)
    assert seeds == [fit_seed(run, 0, fold) for run in (0, 1, TOP) for fold in range(5)]  # deterministic
    assert fit_seed(0, 0, 0) != fit_seed(0) and fit_seed(0, 1, 0) != fit_seed(0, 0, 1)  # no fold aliases an offset
    assert [model_fit_seed(3, fold, {"seed": 2}) for fold in range(3)] == [5, 5, 5]  # off: the run seed's
    assert [model_fit_seed(3, fold, {"seed": 2, "fold_seeds": True}) for fold in range(3)] == \
        [fit_seed(3, 2, fold) for fold in range(3)]
    with pytest.raises(ValueError):
        fit_seed(0, 0, -1)


@pytest.mark.parametrize("fold_seeds", [False, True])
def test_the_training_stage_and_predict_use_each_fold_models_seed(fold_seeds, tiny_world, tmp_path, monkeypatch):
    import numpy as np

    import pipelines.training.fit as train
    from pipelines.config.settings import load_config
    from pipelines.core.collection import parse_collection
    from pipelines.core.seeds import model_fit_seed
    from pipelines.flows.predict import predict_test
    from pipelines.flows.prepare import prepare
    from pipelines.models.gnn.ranker import GNNRanker

    fitted = []
    fit = GNNRanker.fit

    def recording_fit(self, train_graphs, valid=None, *, seed, **kwargs):
        fitted.append(seed)
        return fit(self, train_graphs, valid, seed=seed, **kwargs)

    monkeypatch.setattr(GNNRanker, "fit", recording_fit)
    collection = parse_collection("layout:xla:random")
    config = load_config("smoke", ["folds.k=2", "run.n_jobs=1", "run.seeds=[4]", "gnn.epochs=1", "gnn.hidden=8",
                                   f"gnn.fold_seeds={str(fold_seeds).lower()}"])
    prepared = prepare(config, tiny_world, tmp_path / "work", [collection])[collection.name]
    output = train.train_model(config, prepared, model="gnn", work_dir=tmp_path / "work")
    expected = [model_fit_seed(4, fold, {"fold_seeds": fold_seeds}) for fold in range(2)]
    assert sorted(fitted) == sorted(expected) and (len(set(fitted)) == 2) is fold_seeds
    stage = pl.read_parquet(output.path / train.PREDICTIONS_FILE).filter(pl.col("split") == "test")
    assert np.array_equal(predict_test(output, prepared)["score"].to_numpy(), stage["score"].to_numpy())
