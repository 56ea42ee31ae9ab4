"""The five TpuGraphs collections and how their names map to directories and submission IDs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from pipelines.core.errors import ConfigError

SPLITS = ("train", "valid", "test")
LABELLED = ("train", "valid")  # the splits with runtimes


@dataclass(frozen=True, order=True)
class Collection:
    """One collection, e.g. ``tile:xla`` or ``layout:nlp:random``."""

    kind: str  # "tile" or "layout"
    source: str  # "xla" or "nlp"
    search: str | None = None  # "default" or "random" for layout, None for tile

    @property
    def name(self) -> str:
        return ":".join(p for p in (self.kind, self.source, self.search) if p)

    @property
    def is_tile(self) -> bool:
        return self.kind == "tile"

    @property
    def is_layout(self) -> bool:
        return self.kind == "layout"

    @property
    def relative_dir(self) -> PurePosixPath:
        """Directory under ``npz/``: ``tile/xla`` or ``layout/<source>/<search>``."""
        return PurePosixPath(*(p for p in (self.kind, self.source, self.search) if p))

    def submission_id(self, stem: str) -> str:
        return f"{self.name}:{stem}"

    def __str__(self) -> str:
        return self.name


TILE_XLA = Collection("tile", "xla")
LAYOUT_XLA_DEFAULT = Collection("layout", "xla", "default")
LAYOUT_XLA_RANDOM = Collection("layout", "xla", "random")
LAYOUT_NLP_DEFAULT = Collection("layout", "nlp", "default")
LAYOUT_NLP_RANDOM = Collection("layout", "nlp", "random")

ALL_COLLECTIONS: tuple[Collection, ...] = (
    TILE_XLA,
    LAYOUT_XLA_DEFAULT,
    LAYOUT_XLA_RANDOM,
    LAYOUT_NLP_DEFAULT,
    LAYOUT_NLP_RANDOM,
)
_BY_NAME = {c.name: c for c in ALL_COLLECTIONS}


def parse_collection(name: str) -> Collection:
    """Return the collection called ``name``; unknown names raise a ConfigError listing the valid ones."""
    try:
        return _BY_NAME[name.strip()]
    except KeyError:
        valid = ", ".join(_BY_NAME)
        raise ConfigError(f"unknown collection {name!r}; expected one of: {valid}") from None


def parse_collections(names: str | list[str] | None) -> tuple[Collection, ...]:
    """Parse a comma-separated list (or list) of collection names; None or "all" means every collection."""
    if names is None:
        return ALL_COLLECTIONS
    if isinstance(names, str):
        names = [n for n in names.split(",") if n.strip()]
    if not names or list(names) == ["all"]:
        return ALL_COLLECTIONS
    parsed = [parse_collection(n) for n in names]
    return tuple(dict.fromkeys(parsed))


# What the stem of a submission ID (``<collection>:<stem>``) cannot carry: the CSV's field separator and
# quote, the TopConfigs list separator, the ID's own separator, whitespace (CSV readers strip it) and
# anything outside printable ASCII (a submission is ASCII). Real stems are model names and hex.
_ID_UNSAFE = re.compile(r'[^\x21-\x7e]|[,;:"]')


def stem_problem(stem: str) -> str | None:
    """Why a graph file named ``stem`` cannot have a submission ID, or None."""
    if not stem:
        return "an empty name"
    bad = sorted(set(_ID_UNSAFE.findall(stem)))
    if bad:
        return (f"its name holds {', '.join(repr(c) for c in bad)}, which a submission ID (<collection>:<name>) "
                "cannot carry; rename the file")
    return None


def split_submission_id(submission_id: str) -> tuple[Collection, str]:
    """Split ``layout:xla:default:<stem>`` into its collection and stem."""
    parts = submission_id.split(":")
    for n_prefix in (3, 2):
        prefix = ":".join(parts[:n_prefix])
        if prefix in _BY_NAME and len(parts) == n_prefix + 1 and parts[-1]:
            return _BY_NAME[prefix], parts[-1]
    raise ValueError(f"not a submission ID of a known collection: {submission_id!r}")
