"""The stage DAG, declared as data: every stage of the pipeline, in a topological order.

::

    prune ─┬─ features ────┬─ train-<model>, one per registered model ─┬─ ensemble
           ├─ node_arrays ─┤   (each reads what its adapter declares)   │
           └─ folds ───────┘                                            │
    prune ──────────────────────────────────────────────────────────────┘

Each stage is a :class:`pipelines.core.stages.Stage` (name, input stages, code roots, the settings in
its key, its I/O shell, whether it is training-only), declared next to its shell so that the shell
builds its key from that declaration and nothing else: :data:`pipelines.data.prune.PRUNE`,
``FEATURES``, ``NODE_ARRAYS``, ``FOLDS``, :func:`pipelines.training.fit.model_stage` (derived from
the model registry: a model registered anywhere gets its stage) and
:func:`pipelines.training.ensemble.ensemble_spec`. This module orders them and checks the order
(:func:`pipelines.core.stages.check_dag`); ``prepare``, ``run`` and ``predict`` take their sequences
from it, and ``status --explain`` lists it (:mod:`pipelines.flows.explain`):

* :func:`data_stages` -- run per collection by ``prepare`` (:func:`run_data_stages`), also for the
  collections whose graphs a model trains on besides its own; ``training=False``: the ones ``predict``
  runs over new graphs (no folds);
* :func:`model_stages` -- one training stage per model (``run`` fans their fold jobs out together);
* :func:`blend_stage` -- the ensemble of those models;
* :func:`pipeline` -- all of them, checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipelines.config.registry import MODELS
from pipelines.core.engine import StageOutput
from pipelines.core.logs import tagged
from pipelines.core.stages import RawFiles, Stage, StageCall, check_dag
from pipelines.data.features import FEATURES
from pipelines.data.folds import FOLDS
from pipelines.data.node_arrays import NODE_ARRAYS
from pipelines.data.prune import PRUNE, kept_refs
from pipelines.training.ensemble import ensemble_spec
from pipelines.training.fit import model_stage

# The data stages, per collection, in their order.
DATA_STAGES: tuple[Stage, ...] = check_dag((PRUNE, FEATURES, NODE_ARRAYS, FOLDS))


def data_stages(*, training: bool = True) -> tuple[Stage, ...]:
    """The data stages in order; ``training=False``: without the training-only ones (what ``predict`` runs)."""
    return tuple(stage for stage in DATA_STAGES if training or not stage.training_only)


def model_stages(models: Sequence[str] | None = None) -> tuple[Stage, ...]:
    """One training stage per model (``None``: every registered model, in registry order)."""
    return tuple(model_stage(name) for name in (list(MODELS) if models is None else models))


def blend_stage(models: Sequence[str] | None = None) -> Stage:
    """The ensemble stage over the training stages of ``models`` (``None``: every registered model)."""
    return ensemble_spec((PRUNE.name, *(stage.name for stage in model_stages(models))))


def pipeline(models: Sequence[str] | None = None) -> tuple[Stage, ...]:
    """Every stage of a run of ``models`` (``None``: every registered model), in a checked topological order."""
    return check_dag((*DATA_STAGES, *model_stages(models), blend_stage(models)))


def data_stage_call(stage: Stage, config: Any, collection: Any, work_dir: Path | None, raw: RawFiles,
                    upstream: Mapping[str, StageOutput], force: bool = False) -> StageCall:
    """The call of data stage ``stage``: its inputs' outputs and the raw files, less the graphs the prune
    stage left out where its output is among the inputs (what runs it and what lists its key agree)."""
    if PRUNE.name in stage.inputs:
        raw = RawFiles(kept_refs(raw.refs, upstream[PRUNE.name]), raw.data_key)
    return StageCall(config, collection, work_dir, upstream={name: upstream[name] for name in stage.inputs}, raw=raw,
                     force=force)


def run_data_stages(config: Any, collection: Any, work_dir: Path, raw: RawFiles, *, force: bool = False,
                    training: bool = True) -> dict[str, StageOutput]:
    """Run (or reuse) :func:`data_stages` of one collection in order; their messages carry its name."""
    outputs: dict[str, StageOutput] = {}
    with tagged(collection.name):
        for stage in data_stages(training=training):
            outputs[stage.name] = stage.run(data_stage_call(stage, config, collection, work_dir, raw, outputs, force))
    return outputs
