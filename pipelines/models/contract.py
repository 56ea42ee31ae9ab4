"""The one model contract: what every registered model (:mod:`pipelines.config.registry`) provides.

A model is two small classes. The **ranker** holds the learning (scikit-learn shape):

    Ranker(config, *, collection, num_threads=1)   # its config section (or settings) for one collection
    .fit(train, valid=None, *, seed) -> self       # valid: early stopping; seed: every random choice
    .predict(data) -> np.ndarray                   # float64, one cost per row of adapter.index(data),
                                                   # LOWER = predicted FASTER; before fit: RuntimeError
    .save(folder, name) -> [file names]            # the fitted state, written into folder
    Ranker.load(folder, name, *, num_threads=None) -> Ranker   # what save wrote, ready to predict

Learned state lives in attributes ending in ``_``. The **adapter** tells the training stage
(:mod:`pipelines.training.fit`) how to feed it, and never changes the stage's loop::

    name: str; ranker_class: type[Ranker]
    input_stages: tuple[str, ...]           # the data stages the model reads ("features", "folds"): its
                                            # stage's inputs in the DAG (pipelines.flows.dag)
    settings(config, collection) -> dict    # resolved hyperparameters, JSON-able (part of the stage key)
    inputs(prepared) -> dict[str, str]      # upstream stage keys the model reads, one per input stage
                                            # (part of the stage key)
    load(prepared, graphs, *, settings, fit, seed) -> data
                                            # fit=True: for fitting (may subsample configs);
                                            # fit=False: every config, for prediction
    index(data) -> (graphs, config_index)   # the rows predict() scores, in its order
    make(settings, collection, *, num_threads) -> Ranker
    describe(ranker) -> (facts dict, importance frame or None)
    job_memory(prepared, graphs, settings) -> bytes   # optional: peak of fitting on graphs, which
                                                      # caps the parallel jobs to fit in memory
    check(collections) -> None              # optional: a ConfigError when this model cannot train on
                                            # these collections (run and train call it before any stage)
    checkpoints = True                      # optional: fit(..., checkpoint_dir=) resumes epochs
    long_jobs = True                        # optional: fold jobs much longer than other models'; a run
                                            # trains these stages first, the short jobs fill in at the end

A model whose settings name ``extra_train_collections`` (the GNN's) also fits on those collections'
labelled graphs: the training stage appends ``load(companion, its train + valid graphs, fit=True)``
to each fold's training data, so its ``load`` returns a list.

``pipelines.models.checks`` holds the contract's checks; ``tests/test_model_contract.py`` runs them over every
registered model, and a plugin's own tests can run them on its model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np


class Ranker(Protocol):
    def fit(self, train: Any, valid: Any | None = None, *, seed: int) -> Ranker: ...

    def predict(self, data: Any) -> np.ndarray: ...

    def save(self, folder: Path, name: str) -> list[str]: ...

    @classmethod
    def load(cls, folder: Path, name: str, *, num_threads: int | None = None) -> Ranker: ...


class ModelAdapter(Protocol):
    """How the training stage drives one kind of model (see the module docstring)."""

    name: str
    ranker_class: type
    input_stages: tuple[str, ...]

    def settings(self, config: Any, collection: Any) -> dict[str, Any]: ...

    def inputs(self, prepared: Any) -> dict[str, str]: ...

    def load(self, prepared: Any, graphs: list[str], *, settings: dict[str, Any], fit: bool, seed: int) -> Any: ...

    def index(self, data: Any) -> tuple[np.ndarray, np.ndarray]: ...

    def make(self, settings: dict[str, Any], collection: Any, *, num_threads: int) -> Ranker: ...

    def describe(self, ranker: Any) -> tuple[dict[str, Any], Any]: ...
