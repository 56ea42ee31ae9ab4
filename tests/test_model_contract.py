"""One contract test over every registered model (pipelines.models.contract), as scikit-learn's
estimator checks run over every estimator: a new model passes it or is not registered."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipelines.core.collection import parse_collection
from pipelines.config.settings import load_config
from pipelines.config.registry import MODELS, get_adapter
from pipelines.core.predictions import prediction_frame, validate_predictions
from pipelines.flows.prepare import prepare

COLLECTIONS = ("tile:xla", "layout:xla:random")
# On top of the smoke config: the GNN a little smaller still, so every check stays in seconds.
OVERRIDES = ["gnn.epochs=2", "gnn.patience=0", "gnn.hidden=8", "gnn.free_layers=1", "gnn.configs_per_graph=4",
             "gnn.eval_max_configs=16"]


@pytest.fixture(scope="module")
def prepared(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory):
    config = load_config("smoke", OVERRIDES)
    work = tmp_path_factory.mktemp("contract") / "work"
    return config, prepare(config, tiny_world, work, list(COLLECTIONS))


def _data(adapter, item, settings):
    train_graphs = item.graphs("train")
    test_graphs = item.graphs("test")
    train = adapter.load(item, train_graphs[1:], settings=settings, fit=True, seed=0)
    valid = adapter.load(item, train_graphs[:1], settings=settings, fit=True, seed=0)
    test = adapter.load(item, test_graphs, settings=settings, fit=False, seed=0)
    return train, valid, test


@pytest.mark.parametrize("collection", COLLECTIONS)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_registered_model_keeps_the_contract(model, collection, prepared, tmp_path):
    config, items = prepared
    item = items[collection]
    adapter = get_adapter(model)
    settings = adapter.settings(config, item.collection)
    # the stages it reads: its training stage's inputs in the DAG, and the keys its stage records
    assert set(adapter.inputs(item)) == set(adapter.input_stages) <= set(item.stages)
    train, valid, test = _data(adapter, item, settings)
    graphs, config_index = adapter.index(test)

    ranker = adapter.make(settings, item.collection, num_threads=1)
    with pytest.raises(RuntimeError, match="before"):  # predict before fit fails loudly
        ranker.predict(test)
    assert ranker.fit(train, valid, seed=3) is ranker
    costs = ranker.predict(test)
    # one finite float64 cost per row the adapter indexes, in the shared prediction schema
    assert isinstance(costs, np.ndarray) and costs.dtype == np.float64 and costs.shape == (len(graphs),)
    assert np.all(np.isfinite(costs))
    frames = [prediction_frame(collection=collection, graph=g, split="test", scores=costs[graphs == g], fold=0, seed=3,
                               model=model, config_index=config_index[graphs == g]) for g in np.unique(graphs)]
    for frame in frames:
        validate_predictions(frame)

    # the same seed gives the same predictions, from a fresh ranker
    again = adapter.make(settings, item.collection, num_threads=1).fit(train, valid, seed=3).predict(test)
    np.testing.assert_array_equal(again, costs)

    # save/load round-trips to the same predictions
    files = ranker.save(tmp_path, "m")
    assert files and all((tmp_path / f).is_file() for f in files)
    loaded = adapter.ranker_class.load(tmp_path, "m", num_threads=1)
    np.testing.assert_array_equal(loaded.predict(test), costs)

    facts, importance = adapter.describe(ranker)
    assert isinstance(facts, dict)


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
