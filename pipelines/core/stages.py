"""A stage declared as data: its name, the stages it reads, its code roots, the settings in its key and
its I/O shell, and the check that a sequence of them is a valid DAG.

Each stage module declares its :class:`Stage` next to its shell (``PRUNE`` in
:mod:`pipelines.data.prune`, ``model_stage(name)`` in :mod:`pipelines.training.fit`, ...), and the shell
computes its key from that declaration alone (:meth:`Stage.key_config`, :meth:`Stage.key_inputs`,
:func:`run_declared`): the code roots and settings that a listing of the stage shows (``status
--explain``) are the ones its key is built from, never a second list. :mod:`pipelines.flows.dag`
orders the declarations into the pipeline's DAG, and ``prepare``, ``run`` and ``predict`` take their
stage sequences from it.

Settings are named as dotted config names (``prune.hops``; :func:`section_fields` names every field
of a section), or, where a value is resolved from the config by other code (a model adapter's
``settings(config, collection)``, which applies per-collection overrides), as that function.

Only the standard library and the engine are imported here: every stage module imports this one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Union

from pipelines.core.engine import Code, StageOutput, run_stage, stage_key, to_jsonable
from pipelines.core.errors import PipelineError

# A setting in a stage's key: a dotted config name, or a function of (config, collection) giving its value.
Source = Union[str, Callable[[Any, Any], Any]]
# A stage's settings: key field -> source, or a function of (config, collection) giving that mapping
# (the prune stage of a tile collection keys fewer settings than a layout one's).
Settings = Union[Mapping[str, Source], Callable[[Any, Any], Mapping[str, Source]]]
# A section field holding per-collection overrides: a dotted name cannot resolve them (see config_value).
PER_COLLECTION_FIELD = "collections"


class DagError(PipelineError):
    """A sequence of stages that is not a valid DAG (an unknown input, a cycle, a stage before its input)."""


class RawFiles(NamedTuple):
    """The raw files a data stage reads: graph references by split, and their cheap key."""

    refs: Mapping[str, Sequence[Any]]
    data_key: str


@dataclass(frozen=True)
class StageCall:
    """What one call of a stage is computed from: its key (:meth:`Stage.key`) and its shell's work."""

    config: Any  # the resolved pipeline config, or any object holding the sections its settings name
    collection: Any  # a pipelines.core.collection.Collection
    work_dir: Path | None = None
    upstream: Mapping[str, StageOutput] = field(default_factory=dict)  # outputs of its input stages, by name
    raw: RawFiles | None = None  # data stages: the collection's raw files
    prepared: Any = None  # model stages: the collection's Prepared handle (with its companions)
    # shell arguments that are neither settings nor upstream outputs (a shared pool, the ensemble's grid
    # and its models by name)
    options: Mapping[str, Any] = field(default_factory=dict)
    force: bool = False


def _no_inputs(call: StageCall) -> dict[str, str]:
    return {}


def _collection_only(call: StageCall) -> dict[str, Any]:
    return {"collection": call.collection.name}


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline, declared as data (see the module docstring).

    ``inputs``: the stages whose outputs it reads (raw files are not a stage). ``code``: its code roots.
    ``settings``: the config settings in its key. ``facts``: the other entries of its key's config (the
    collection's name, a model's name: not settings). ``input_keys``: the keys of what it reads, as
    its key records them. ``run``: its I/O shell, ``run(call) -> StageOutput``. ``training_only``:
    ``predict`` skips it (it ranks new graphs with saved models: no folds, no fits, no blend fitted).
    """

    name: str
    inputs: tuple[str, ...]
    code: Code
    settings: Settings
    run: Callable[[StageCall], StageOutput]
    input_keys: Callable[[StageCall], dict[str, str]] = _no_inputs
    facts: Callable[[StageCall], dict[str, Any]] = _collection_only
    training_only: bool = False

    def setting_sources(self, config: Any, collection: Any) -> dict[str, Source]:
        """Key field -> where its value comes from, for this collection."""
        settings = self.settings(config, collection) if callable(self.settings) else self.settings
        return dict(settings)

    def setting_values(self, config: Any, collection: Any) -> dict[str, Any]:
        """Key field -> the value of its setting in ``config`` for ``collection`` (JSON-able)."""
        return {name: setting_value(config, source, collection)
                for name, source in self.setting_sources(config, collection).items()}

    def key_config(self, call: StageCall) -> dict[str, Any]:
        """The config part of the stage's key (and its manifest's ``config``): facts, then settings."""
        return {**self.facts(call), **self.setting_values(call.config, call.collection)}

    def key_inputs(self, call: StageCall) -> dict[str, str]:
        return dict(self.input_keys(call))

    def key(self, call: StageCall) -> str:
        """The key :func:`run_declared` gives this call (nothing is read but what ``input_keys`` reads)."""
        return stage_key(self.name, self.key_config(call), self.key_inputs(call), self.code)


def run_declared(stage: Stage, call: StageCall, compute: Callable[[Path], Mapping[str, Any] | None], *,
                 seeds: Mapping[str, int] | None = None) -> StageOutput:
    """:func:`pipelines.core.engine.run_stage` of ``stage`` for ``call``, keyed by its declaration alone."""
    if call.work_dir is None:
        raise ValueError(f"stage {stage.name!r}: a call without a work dir cannot run")
    return run_stage(work_dir=Path(call.work_dir), stage=stage.name, config=stage.key_config(call),
                     inputs=stage.key_inputs(call), code=stage.code, compute=compute, seeds=seeds, force=call.force)


# ----------------------------------------------------------------------------- settings


def config_value(config: Any, dotted: str) -> Any:
    """The JSON-able value of the config setting ``dotted`` (``prune.hops``; a section name alone: the
    whole section). A section with per-collection overrides cannot be read so: its value depends on the
    collection (declare a function of (config, collection) that resolves them instead)."""
    value = config
    walked: list[str] = []
    for part in dotted.split("."):
        if dataclasses.is_dataclass(value) and any(f.name == PER_COLLECTION_FIELD for f in dataclasses.fields(value)):
            raise DagError(f"setting {dotted!r}: section {'.'.join(walked)} has per-collection overrides; "
                           "declare a function of (config, collection) that resolves them")
        try:
            value = getattr(value, part)
        except AttributeError:
            raise DagError(f"setting {dotted!r}: the config has no {'.'.join([*walked, part])}") from None
        walked.append(part)
    return to_jsonable(value)


def setting_value(config: Any, source: Source, collection: Any) -> Any:
    return config_value(config, source) if isinstance(source, str) else to_jsonable(source(config, collection))


def section_fields(config: Any, section: str) -> dict[str, str]:
    """``{field: "section.field"}`` for every field of a config section: a stage keyed by all of them."""
    return {f.name: f"{section}.{f.name}" for f in dataclasses.fields(getattr(config, section))}


def source_name(source: Source) -> str:
    """How a listing names a setting: its dotted name, or the function that resolves it."""
    if isinstance(source, str):
        return source
    owner = getattr(source, "__self__", None)
    name = getattr(source, "__qualname__", None) or type(source).__name__
    return f"{type(owner).__name__}.{source.__name__}" if owner is not None else name


# ----------------------------------------------------------------------------- the DAG check


def check_dag(stages: Sequence[Stage]) -> tuple[Stage, ...]:
    """``stages`` if every name is unique, every input is a stage of the sequence and each stage comes
    after its inputs (so the sequence is a topological order, and the graph has no cycle); else a
    DagError naming the problem (a cycle is named as such)."""
    stages = tuple(stages)
    names = [s.name for s in stages]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DagError(f"stage DAG: stage(s) declared twice: {', '.join(twice)}")
    by_name = {s.name: s for s in stages}
    for stage in stages:
        unknown = [i for i in stage.inputs if i not in by_name]
        if unknown:
            raise DagError(f"stage DAG: stage {stage.name!r} reads {', '.join(map(repr, unknown))}, which no stage "
                           f"of the DAG is (stages: {', '.join(names)})")
    cycle = _find_cycle(by_name)
    if cycle:
        raise DagError(f"stage DAG: cycle {' -> '.join(cycle)}")
    seen: set[str] = set()
    for stage in stages:
        late = [i for i in stage.inputs if i not in seen]
        if late:
            raise DagError(f"stage DAG: stage {stage.name!r} is declared before its input(s) "
                           f"{', '.join(map(repr, late))}: the order is not a topological order")
        seen.add(stage.name)
    return stages


def _find_cycle(by_name: Mapping[str, Stage]) -> list[str] | None:
    """A cycle of the input graph as ``[a, b, ..., a]`` (a reads b ...), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for upstream in by_name[name].inputs:
            if state.get(upstream) == 1:
                return path[path.index(upstream):] + [upstream]
            if upstream not in state:
                found = visit(upstream)
                if found:
                    return found
        path.pop()
        state[name] = 2
        return None

    for name in by_name:
        if name not in state:
            found = visit(name)
            if found:
                return found
    return None
