"""The model registry: every model the training stage can train, by name.

Entries are ``"module:AdapterClass"`` strings, imported only when a model is used, so listing the
models (help texts, config checks) stays cheap and torch is imported only when the GNN is trained.
A new model is one module with its adapter and ranker (:mod:`pipelines.models.contract`) plus one
line here. The training stage's cache key includes the source of the model's module.
"""

from __future__ import annotations

import importlib
from typing import Any

from pipelines.core.errors import ConfigError

MODELS: dict[str, str] = {
    "gbdt": "pipelines.models.gbdt:GBDTAdapter",
    "gnn": "pipelines.models.gnn.adapter:GNNAdapter",
    "random": "pipelines.models.reference:RandomAdapter",
    "feature": "pipelines.models.reference:FeatureAdapter",
}


def adapter_module(model: str) -> str:
    """The module that holds ``model``'s adapter (and, by import, its ranker)."""
    return MODELS[_checked(model)[0]].partition(":")[0]


def get_adapter(model: str) -> Any:
    """The adapter registered as ``model``; ``feature:<column>`` ranks by that one column."""
    name, argument = _checked(model)
    module, _, cls = MODELS[name].partition(":")
    adapter_class = getattr(importlib.import_module(module), cls)
    return adapter_class(column=argument, name=model) if argument else adapter_class()


def _checked(model: str) -> tuple[str, str]:
    name, _, argument = model.partition(":")
    if name not in MODELS:
        raise ConfigError(f"unknown model {model!r}; registered: {', '.join(MODELS)} (or feature:<column>)")
    if argument and name != "feature":
        raise ConfigError(f"model {name!r} takes no argument, got {model!r}")
    if argument and not argument.startswith("f_"):
        raise ConfigError(f"feature:<column> needs an f_* column, got {argument!r}")
    return name, argument
