"""A new model is its module plus one registry entry: a toy model registered here (its adapter, ranker
and config section live in this file) gets a config section, config choices, CLI choices and a tune
search space, keeps the model contract and runs through a tiny `run`, with no other file edited."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from pipelines.cli import build_parser
from pipelines.config import registry
from pipelines.config.fields import bounded
from pipelines.config.registry import ModelSpec, registered
from pipelines.config.settings import load_config, model_settings
from pipelines.core.collection import parse_collection
from pipelines.core.errors import ConfigError
from pipelines.models.checks import check_case, check_model
from pipelines.models.feature_table import FeatureTableAdapter


@dataclass
class ToyConfig:
    # Weight of the first f_* column in the toy's cost (the rest: config index order).
    weight: float = bounded(1.0, 0.0, 10.0)
    load_max_configs: int = bounded(50, 1)
    collections: dict[str, dict] = field(default_factory=dict)


class ToyRanker:
    """cost = weight * (first f_* column), centred per fit: enough state to save and load."""

    def __init__(self, settings: dict[str, Any], *, collection: Any, num_threads: int = 1):
        self.settings = dict(settings)
        self.collection = collection

    def fit(self, train: pl.DataFrame, valid: pl.DataFrame | None = None, *, seed: int) -> ToyRanker:
        self.column_ = next(c for c in train.columns if c.startswith("f_"))
        self.offset_ = float(train[self.column_].mean() or 0.0) + seed * 0.0
        return self

    def predict(self, frame: pl.DataFrame) -> np.ndarray:
        if not hasattr(self, "column_"):
            raise RuntimeError("ToyRanker: fit before predict")
        values = frame[self.column_].to_numpy().astype(np.float64)
        return self.settings["weight"] * (np.nan_to_num(values) - self.offset_)

    def save(self, folder: Path, name: str) -> list[str]:
        (Path(folder) / f"{name}.txt").write_text(f"{self.column_}\n{self.offset_!r}\n{self.settings['weight']!r}\n")
        return [f"{name}.txt"]

    @classmethod
    def load(cls, folder: Path, name: str, *, num_threads: int | None = None) -> ToyRanker:
        column, offset, weight = (Path(folder) / f"{name}.txt").read_text().split()
        ranker = cls({"weight": float(weight)}, collection=None)
        ranker.column_, ranker.offset_ = column, float(offset)
        return ranker


class ToyAdapter(FeatureTableAdapter):
    name = "toy"
    ranker_class = ToyRanker

    def settings(self, config: Any, collection: Any) -> dict[str, Any]:
        return model_settings(config, "toy", collection)


TOY = ModelSpec(f"{__name__}:ToyAdapter", ToyConfig, {"weight": ("float", 0.5, 2.0, False)}, configurable=True)


@pytest.fixture
def toy():
    with registered("toy", TOY) as spec:
        yield spec
    assert "toy" not in registry.MODELS


def test_a_registered_model_gets_its_config_section(toy, tmp_path):
    config = load_config("smoke", ["toy.weight=2.5", 'toy.collections."tile:xla".weight=0.5'])
    assert config.toy.weight == 2.5 and config.gbdt == load_config("smoke").gbdt
    assert model_settings(config, "toy", "tile:xla")["weight"] == 0.5
    assert model_settings(config, "toy", "layout:xla:random")["weight"] == 2.5
    with pytest.raises(ConfigError, match="must be <= 10.0"):
        load_config("smoke", ["toy.weight=11"])
    extra = tmp_path / "toy.toml"
    extra.write_text('extends = "smoke"\n[toy]\nweight = 3.0\n[run]\nmodels = ["toy"]\n')
    assert load_config(extra).toy.weight == 3.0 and load_config(extra).run.models == ["toy"]


def test_without_the_entry_the_section_and_the_name_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown section \[toy\]"):
        load_config("smoke", ["toy.weight=2.5"])
    with pytest.raises(ConfigError, match="'toy' is not one of"):
        load_config("smoke", ["run.models=['toy']"])


def test_cli_choices_and_search_space_come_from_the_registry(toy, capsys):
    assert registry.search_space("toy") == {"weight": ("float", 0.5, 2.0, False)}
    assert "toy" in registry.tunable_models()
    args = build_parser().parse_args(["tune", "--model", "toy", "--collection", "tile:xla", "--trials", "1",
                                      "--data-root", "x"])
    assert args.model == "toy"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["tune", "--model", "random", "--collection", "tile:xla", "--trials", "1",
                                   "--data-root", "x"])
    assert "invalid choice: 'random'" in capsys.readouterr().err


@pytest.mark.slow
def test_the_toy_keeps_the_contract_and_runs(toy, tiny_world, tmp_path):
    from pipelines.flows.prepare import prepare
    from pipelines.flows.run import run_pipeline

    config = load_config("smoke", ["run.models=['toy']", "ensemble.models=['toy']", "run.seeds=[0]", "run.n_jobs=1"])
    collection = parse_collection("tile:xla")
    item = prepare(config, tiny_world, tmp_path / "work", [collection])["tile:xla"]
    check_model(check_case("toy", item, config, tmp_path / "checks"))  # the contract checks a plugin runs

    result = run_pipeline(config, tiny_world, work_dir=tmp_path / "work", submissions_dir=tmp_path / "subs")
    assert result.submission.is_file()
    assert set(result.manifest["cv_scores"]["tile:xla"]["training"]) == {"toy"}


@dataclass
class DeviceToyConfig(ToyConfig):
    device: str = "cpu"  # where the toy would train, as the GNN's section says it
    extra_train_collections: list[str] = field(default_factory=list)


def test_device_and_companion_rules_follow_the_registry_not_a_model_name(tmp_path, caplog):
    """`run` decides by the registry's ``uses_device`` whether to resolve a model's device, and reads any
    model section's ``extra_train_collections``: a plugin model gets both without a name check."""
    import logging

    from pipelines.config.registry import device_models
    from pipelines.flows.prepare import companion_collections
    from pipelines.flows.schedule import check_devices

    spec = ModelSpec(f"{__name__}:ToyAdapter", DeviceToyConfig, configurable=True, uses_device=True)
    with registered("toy", spec):
        assert device_models(["gbdt", "toy", "feature:f_x"]) == ["toy"]
        assert device_models(["gbdt", "random"]) == []
        tile = parse_collection("tile:xla")
        config = load_config("smoke", ["toy.device='cuda'"])
        import torch

        if not torch.cuda.is_available():
            with pytest.raises(ConfigError, match="CUDA"):
                check_devices(config, ["toy"], [tile])
        check_devices(config, ["gbdt"], [tile])  # the toy does not train: its device is not resolved
        with caplog.at_level(logging.INFO):
            check_devices(load_config("smoke"), ["toy"], [tile])
        assert "TOY device: cpu (toy.device)" in caplog.text

        layout = parse_collection("layout:xla:random")
        config = load_config("smoke", ['toy.extra_train_collections=["layout:nlp:random"]',
                                       "gnn.extra_train_collections=[]"])
        assert companion_collections(config, layout) == [parse_collection("layout:nlp:random")]
        with pytest.raises(ConfigError, match="toy.extra_train_collections"):
            companion_collections(load_config("smoke", ['toy.extra_train_collections=["tile:xla"]']), layout)
