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
