"""Field helpers for the typed config sections: the metadata the config checker enforces on load.

Plain dataclasses stay the one config mechanism (pipelines.config.settings checks every section with one
generic checker); these helpers only spell the metadata once. Importing this module must stay cheap.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any


def choice(default: str, choices: tuple[str, ...]) -> Any:
    """A string field that must be one of ``choices``."""
    return field(default=default, metadata={"choices": choices})


def bounded(default: int | float, low: int | float | None = None, high: int | float | None = None, *,
            below: int | float | None = None) -> Any:
    """A number field with inclusive bounds ``low``/``high`` and an exclusive upper bound ``below``."""
    metadata = {key: value for key, value in (("min", low), ("max", high), ("below", below)) if value is not None}
    return field(default=default, metadata=metadata)
