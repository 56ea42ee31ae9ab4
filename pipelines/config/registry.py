"""The model registry: every model the pipeline can train, by name, and everything that names it.

One :class:`ModelSpec` per model: where its adapter lives (``"module:AdapterClass"``, imported only
when the model is used, so help texts and config checks stay cheap and torch is imported only when
the GNN trains), its typed config section (the ``[name]`` table of a config file), the search space
``tune`` draws from, and whether ``run.models`` / ``ensemble.models`` list it by default. Config
sections, the models a config may name, the CLI's choices and ``tune``'s search spaces all derive
from this table, so a new model is its module plus one entry here (or one :func:`register_model`
call, for a model that lives outside the package).

The registry sits in the config layer because the config's sections come from it; it refers to the
models above it by import string only.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pipelines.config.gbdt import SEARCH_SPACE as GBDT_SEARCH_SPACE
from pipelines.config.gbdt import GBDTConfig
from pipelines.config.gnn import SEARCH_SPACE as GNN_SEARCH_SPACE
from pipelines.config.gnn import GNNConfig
from pipelines.core.errors import ConfigError


@dataclass(frozen=True)
class ModelSpec:
    adapter: str  # "module:AdapterClass" (see pipelines.models.contract)
    section: type | None = None  # its config section, a dataclass; None: a model without settings
    search_space: Mapping[str, tuple] = field(default_factory=dict)  # what `tune` varies; empty: not tunable
    default: bool = False  # in the default run.models and ensemble.models
    configurable: bool = True  # may be named in run.models / ensemble.models (the reference models may not)
    takes_column: bool = False  # `name:<f_* column>` fixes the column it ranks by
    # Trains on a device its section's `device` setting names (cpu, cuda, auto): `run` resolves it before
    # any stage, checks torch only where such a model trains, and picks the machine's config for it.
    uses_device: bool = False


MODELS: dict[str, ModelSpec] = {
    "gbdt": ModelSpec("pipelines.models.gbdt:GBDTAdapter", GBDTConfig, GBDT_SEARCH_SPACE, default=True),
    "gnn": ModelSpec("pipelines.models.gnn.adapter:GNNAdapter", GNNConfig, GNN_SEARCH_SPACE, default=True,
                     uses_device=True),
    "random": ModelSpec("pipelines.models.reference:RandomAdapter", configurable=False),
    "feature": ModelSpec("pipelines.models.reference:FeatureAdapter", configurable=False, takes_column=True),
}


def register_model(name: str, spec: ModelSpec) -> None:
    """Add a model (a plugin's, or a test's); its section joins the config from the next load on."""
    if not name.isidentifier() or name in MODELS:
        raise ConfigError(f"cannot register model {name!r}: " + ("taken" if name in MODELS else "not an identifier"))
    MODELS[name] = spec


def unregister_model(name: str) -> None:
    MODELS.pop(name, None)


@contextmanager
def registered(name: str, spec: ModelSpec) -> Iterator[ModelSpec]:
    """``with registered("toy", spec):`` the model exists inside the block only."""
    register_model(name, spec)
    try:
        yield spec
    finally:
        unregister_model(name)


def model_sections() -> tuple[tuple[str, type], ...]:
    """``(name, section class)`` of every model with settings, in registry order."""
    return tuple((name, spec.section) for name, spec in MODELS.items() if spec.section is not None)


def configurable_models() -> tuple[str, ...]:
    """The models a config's ``run.models`` / ``ensemble.models`` may name."""
    return tuple(name for name, spec in MODELS.items() if spec.configurable)


def default_models() -> list[str]:
    return [name for name, spec in MODELS.items() if spec.default]


def device_models(models: Iterable[str]) -> list[str]:
    """The models among ``models`` (``feature:<column>`` counts as ``feature``) that train on a device."""
    names = dict.fromkeys(model.partition(":")[0] for model in models)
    return [name for name in names if name in MODELS and MODELS[name].uses_device]


def tunable_models() -> tuple[str, ...]:
    return tuple(name for name, spec in MODELS.items() if spec.search_space)


def search_space(model: str) -> dict[str, tuple]:
    """The declared search space of ``model`` (``(kind, ...)`` per field, see pipelines.flows.tune)."""
    name, _ = _checked(model)
    if not MODELS[name].search_space:
        raise ConfigError(f"no search space for model {model!r}; tunable models: {', '.join(tunable_models())}")
    return dict(MODELS[name].search_space)


def adapter_module(model: str) -> str:
    """The module that holds ``model``'s adapter (and, by import, its ranker)."""
    return MODELS[_checked(model)[0]].adapter.partition(":")[0]


def get_adapter(model: str) -> Any:
    """The adapter registered as ``model``; ``feature:<column>`` ranks by that one column."""
    name, argument = _checked(model)
    module, _, cls = MODELS[name].adapter.partition(":")
    adapter_class = getattr(importlib.import_module(module), cls)
    return adapter_class(column=argument, name=model) if argument else adapter_class()


def _checked(model: str) -> tuple[str, str]:
    name, _, argument = model.partition(":")
    if name not in MODELS:
        with_column = [n for n, spec in MODELS.items() if spec.takes_column]
        extra = f" (or {', '.join(f'{n}:<column>' for n in with_column)})" if with_column else ""
        raise ConfigError(f"unknown model {model!r}; registered: {', '.join(MODELS)}{extra}")
    if argument and not MODELS[name].takes_column:
        raise ConfigError(f"model {name!r} takes no argument, got {model!r}")
    if argument and not argument.startswith("f_"):
        raise ConfigError(f"{name}:<column> needs an f_* column, got {argument!r}")
    return name, argument
