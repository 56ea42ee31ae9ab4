"""Program families of real stems; grouped, balanced, deterministic folds."""

from __future__ import annotations

import polars as pl
import pytest

from pipelines.core.errors import ConfigError
from pipelines.data.folds import assign_folds, program_family


@pytest.mark.parametrize(
    ("stem", "family"),
    [
        ("alexnet_train_batch_32_-1bae27a41d70f4dc", "alexnet"),
        ("resnet50_inference_batch_8_3f2a0b1c2d3e4f50", "resnet50"),
        ("resnet50.4x4.fp16", "resnet50"),
        ("resnet50.2x2.fp32", "resnet50"),
        ("inception_v3_batch_128_train", "inception_v3"),
        ("unet_3d.4x4.bf16", "unet_3d"),
        ("mlperf_bert_batch_24_2x2", "mlperf_bert"),
        ("bert_en_cased_L-12_H-768_A-12_batch_size_16_train", "bert_en_cased_L-12_H-768_A-12"),
        ("small_bert_bert_en_uncased_L-10_H-128_A-2_batch_size_32_test", "small_bert_bert_en_uncased_L-10_H-128_A-2"),
        ("albert_en_base_batch_size_16_test", "albert_en_base"),
        ("albert_en_base_batch_size_128_train", "albert_en_base"),
        ("talking-heads_large_batch_size_16_train", "talking-heads_large"),
        ("efficientnet_b7_eval_batch_1_4d6dfa4e3b57b10a", "efficientnet_b7"),
        ("e8a3a1401b5e79f66d7037e424f3b6df", "e8a3a1401b5e79f66d7037e424f3b6df"),  # anonymous test file
    ],
)
def test_program_family_of_real_stems(stem: str, family: str) -> None:
    assert program_family(stem) == family


STEMS = [
    "resnet50.4x4.fp16", "resnet50.2x2.fp32", "resnet50.2x2.bf16",
    "unet_3d.4x4.bf16", "unet_3d.2x2.fp32",
    "inception_v3_batch_128_train", "inception_v3_batch_8_train",
    "mlperf_bert_batch_24_2x2", "alexnet_train_batch_32", "bert_en_cased_L-12_H-768_A-12_batch_size_16_train",
]
SPLITS = ["train", "valid", "train", "train", "valid", "train", "train", "valid", "train", "train"]


def test_folds_are_grouped_balanced_and_deterministic() -> None:
    table = assign_folds(STEMS, SPLITS, k=3, seed=0)
    assert table.columns == ["graph", "split", "family", "fold"]
    assert table["graph"].to_list() == STEMS
    per_family = table.group_by("family").agg(pl.col("fold").n_unique().alias("n"))
    assert per_family["n"].max() == 1  # no family on two folds
    sizes = table.group_by("fold").len()["len"].to_list()
    assert sorted(sizes) == [3, 3, 4]  # families 3,2,2,1,1,1 placed largest first
    assert set(table["fold"].to_list()) == {0, 1, 2}
    assert assign_folds(STEMS, SPLITS, k=3, seed=0).equals(table)
    different = [assign_folds(STEMS, SPLITS, k=3, seed=s)["fold"].to_list() for s in range(1, 8)]
    assert any(f != table["fold"].to_list() for f in different)  # the seed matters


def test_holdout_valid_gets_fold_minus_one() -> None:
    table = assign_folds(STEMS, SPLITS, k=2, seed=0, holdout_valid=True)
    valid = table.filter(pl.col("split") == "valid")
    train = table.filter(pl.col("split") == "train")
    assert valid["fold"].to_list() == [-1, -1, -1]
    assert set(train["fold"].to_list()) == {0, 1}


def test_too_many_folds_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="folds.k = 7 .* only 6 program families"):
        assign_folds(STEMS, SPLITS, k=7, seed=0)
    # with the valid graphs held out, mlperf_bert (valid only) no longer counts
    with pytest.raises(ConfigError, match="only 5 program families"):
        assign_folds(STEMS, SPLITS, k=6, seed=0, holdout_valid=True)
    with pytest.raises(ConfigError, match="labelled graphs only"):
        assign_folds(["x", "y"], ["train", "test"], k=2, seed=0)
