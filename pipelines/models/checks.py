"""The model contract's checks (:mod:`pipelines.models.contract`), importable by a plugin's own tests, as
scikit-learn ships ``check_estimator``.

Each check takes a :class:`CheckCase` (one model's adapter, its resolved settings and the data its
training stage would give it) and raises ``AssertionError`` naming the model and the broken rule::

    from pipelines.models.checks import CHECKS, check_case, check_model

    case = check_case("mymodel", prepared, config, tmp_path)     # prepared: one collection's prepare output
    check_model(case)                                             # every check, in order
    # or one test per check:  @pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)

The project's own contract test runs them over every registered model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.config.registry import get_adapter
from pipelines.core.predictions import prediction_frame, validate_predictions
from pipelines.data.prepared import Prepared

CHECK_SEED = 3  # any seed: the checks compare two fits of one seed


@dataclass
class CheckCase:
    """One model's adapter, settings and data, as its training stage would see them."""

    model: str
    adapter: Any
    settings: dict[str, Any]
    prepared: Prepared
    train: Any  # adapter.load(..., fit=True) of all train graphs but the first
    valid: Any  # the first train graph, as early-stopping data
    test: Any  # every test graph, fit=False
    folder: Path  # an empty folder the save/load check may write into
    fitted: Any = field(default=None, repr=False)  # the first fit (seed CHECK_SEED), shared by the checks


def check_case(model: str, prepared: Prepared, config: Any, folder: Path) -> CheckCase:
    """The data of ``model`` on ``prepared`` (a collection with >= 2 train and >= 1 test graph), with its
    settings resolved from ``config`` for that collection."""
    adapter = get_adapter(model)
    settings = adapter.settings(config, prepared.collection)
    train_graphs, test_graphs = prepared.graphs("train"), prepared.graphs("test")
    assert len(train_graphs) >= 2 and test_graphs, f"{model}: the checks need 2 train graphs and 1 test graph"

    def load(graphs: list[str], fit: bool) -> Any:
        return adapter.load(prepared, graphs, settings=settings, fit=fit, seed=0)

    return CheckCase(model, adapter, settings, prepared, load(train_graphs[1:], True), load(train_graphs[:1], True),
                     load(test_graphs, False), Path(folder))


def _fit(case: CheckCase) -> Any:
    ranker = case.adapter.make(case.settings, case.prepared.collection, num_threads=1)
    assert ranker.fit(case.train, case.valid, seed=CHECK_SEED) is ranker, f"{case.model}: fit must return self"
    return ranker


def _fitted(case: CheckCase) -> Any:
    if case.fitted is None:
        case.fitted = _fit(case)
    return case.fitted


def check_inputs(case: CheckCase) -> None:
    """The stages the model reads are its training stage's inputs in the DAG, and their keys are recorded."""
    inputs, declared = set(case.adapter.inputs(case.prepared)), set(case.adapter.input_stages)
    assert inputs == declared, f"{case.model}: inputs() names {sorted(inputs)}, input_stages {sorted(declared)}"
    assert declared <= set(case.prepared.stages), \
        f"{case.model}: reads stages {sorted(declared - set(case.prepared.stages))} that were not prepared"


def check_predict_before_fit(case: CheckCase) -> None:
    """``predict`` before ``fit`` fails loudly (a RuntimeError saying so), never returns guesses."""
    ranker = case.adapter.make(case.settings, case.prepared.collection, num_threads=1)
    try:
        ranker.predict(case.test)
    except RuntimeError as exc:
        assert "before" in str(exc), f"{case.model}: predict before fit raised {exc!r}, which does not say why"
        return
    raise AssertionError(f"{case.model}: predict before fit did not raise RuntimeError")


def check_fit_and_predict(case: CheckCase) -> None:
    """``fit`` returns the ranker; ``predict`` gives one finite float64 cost per indexed row, which make
    valid rows of the one prediction schema."""
    ranker = _fitted(case)
    graphs, config_index = case.adapter.index(case.test)
    costs = ranker.predict(case.test)
    assert isinstance(costs, np.ndarray) and costs.dtype == np.float64, \
        f"{case.model}: predict must return a float64 array, got {type(costs).__name__} {getattr(costs, 'dtype', '')}"
    assert costs.shape == (len(graphs),), f"{case.model}: {costs.shape} costs for {len(graphs)} indexed rows"
    assert np.all(np.isfinite(costs)), f"{case.model}: {int((~np.isfinite(costs)).sum())} costs are not finite"
    for graph in np.unique(graphs):
        rows = graphs == graph
        validate_predictions(prediction_frame(collection=case.prepared.collection.name, graph=str(graph), split="test",
                                              scores=costs[rows], fold=0, seed=CHECK_SEED, model=case.model,
                                              config_index=config_index[rows]))


def check_seeded(case: CheckCase) -> None:
    """The same seed gives the same predictions from a fresh ranker (no global random state)."""
    first, second = _fitted(case).predict(case.test), _fit(case).predict(case.test)
    assert np.array_equal(first, second), f"{case.model}: two fits with one seed predict differently"


def check_save_load(case: CheckCase) -> None:
    """What ``save`` writes, ``ranker_class.load`` reads back into a ranker with the same predictions."""
    ranker = _fitted(case)
    case.folder.mkdir(parents=True, exist_ok=True)
    files = ranker.save(case.folder, "m")
    assert files and all((case.folder / f).is_file() for f in files), f"{case.model}: save listed {files}"
    loaded = case.adapter.ranker_class.load(case.folder, "m", num_threads=1)
    assert np.array_equal(loaded.predict(case.test), ranker.predict(case.test)), \
        f"{case.model}: a loaded ranker predicts differently from the one saved"


def check_describe(case: CheckCase) -> None:
    """``describe`` gives JSON-able facts (a dict) and an importance frame or None."""
    facts, importance = case.adapter.describe(_fitted(case))
    assert isinstance(facts, dict), f"{case.model}: describe must return a dict of facts, got {type(facts).__name__}"
    assert importance is None or hasattr(importance, "columns"), f"{case.model}: importance is not a frame"


CHECKS: tuple[Callable[[CheckCase], None], ...] = (
    check_inputs, check_predict_before_fit, check_fit_and_predict, check_seeded, check_save_load, check_describe)


def check_model(case: CheckCase) -> None:
    """Every contract check on one case, in order; the first broken rule raises."""
    for check in CHECKS:
        check(case)
