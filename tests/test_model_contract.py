"""The contract checks (pipelines.models.checks) over every registered model, as scikit-learn's
estimator checks run over every estimator: a new model passes them or is not registered."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.core.collection import parse_collection
from pipelines.config.settings import load_config
from pipelines.config.registry import MODELS, get_adapter
from pipelines.flows.prepare import prepare
from pipelines.models.checks import CHECKS, CheckCase, check_case

COLLECTIONS = ("tile:xla", "layout:xla:random")
# On top of the smoke config: the GNN a little smaller still, so every check stays in seconds.
OVERRIDES = ["gnn.epochs=2", "gnn.patience=0", "gnn.hidden=8", "gnn.free_layers=1", "gnn.configs_per_graph=4",
             "gnn.eval_max_configs=16"]


@pytest.fixture(scope="module")
def prepared(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory):
    config = load_config("smoke", OVERRIDES)
    work = tmp_path_factory.mktemp("contract") / "work"
    return config, prepare(config, tiny_world, work, list(COLLECTIONS))


@pytest.fixture(scope="module")
def cases(prepared, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], CheckCase]:
    """One case per (model, collection), built on first use and shared by its checks (one fit each)."""
    config, items = prepared
    made: dict[tuple[str, str], CheckCase] = {}

    def case(model: str, collection: str) -> CheckCase:
        if (model, collection) not in made:
            folder = tmp_path_factory.mktemp(f"{model}-{collection.replace(':', '-')}")
            made[model, collection] = check_case(model, items[collection], config, folder)
        return made[model, collection]

    return case


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
@pytest.mark.parametrize("collection", COLLECTIONS)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_registered_model_keeps_the_contract(model, collection, check, cases):
    check(cases(model, collection))


@pytest.mark.parametrize("collection", COLLECTIONS)
@pytest.mark.parametrize("model", ["gbdt", "gnn"])
def test_the_ranker_trains_with_the_settings_its_stage_records(model, collection):
    """A section value set later replaces the defaults' per-collection values (tile's objective,
    passes and steps; xla's passes): the stage's settings, which key it, are what the ranker uses."""
    import dataclasses

    config = load_config("smoke", ['gbdt.objective="pairwise"', "gbdt.graph_rank_features=false",
                                   "gnn.passes_per_epoch=2", "gnn.graphs_per_step=3"])
    adapter = get_adapter(model)
    settings = adapter.settings(config, parse_collection(collection))
    ranker = adapter.make(settings, parse_collection(collection), num_threads=1)
    used = {k: v for k, v in dataclasses.asdict(ranker.config).items() if k in settings and k != "num_threads"}
    assert used == {k: settings[k] for k in used}
    assert (settings["objective"], settings["graph_rank_features"]) == ("pairwise", False) if model == "gbdt" else \
        (settings["passes_per_epoch"], settings["graphs_per_step"]) == (2, 3)
