"""A data root: the one place that knows where a TpuGraphs collection's files live under a folder.

The Kaggle download unpacks to ``<root>/npz_all/npz/{tile/xla,layout/{xla,nlp}/{default,random}}/{train,valid,test}``
next to ``<root>/sample_submission.csv``; a plain ``<root>/npz/...`` (what ``rank`` and ``records`` build)
is read the same way. Nothing here writes: writers ask :meth:`DataRoot.new_split_dir` where a file
goes, readers ask :attr:`DataRoot.npz`, :meth:`split_dir`, :meth:`graphs` and :meth:`collections`.

A ``DataRoot`` is a path (``os.fspath`` gives it), so it goes wherever a path is taken.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pipelines.core.collection import ALL_COLLECTIONS, SPLITS, Collection
from pipelines.core.errors import FormatError
from pipelines.data.tpugraphs import GraphRef

KAGGLE_NPZ = ("npz_all", "npz")  # the download's layout
PLAIN_NPZ = ("npz",)  # a root built from one's own programs or records
SAMPLE_SUBMISSION = "sample_submission.csv"
# Each graph's compiler-default config, where known: {collection: {stem: config index}}. Written by
# `records` (the run marked is_default); a world's generator may keep it beside its hidden labels.
DEFAULTS_FILE = "defaults.json"
DEFAULTS_PLACES = (DEFAULTS_FILE, f"labels/{DEFAULTS_FILE}")


@dataclass(frozen=True)
class DataRoot:
    """A data root folder (``DataRoot(path)``; a DataRoot given again stays itself)."""

    path: Path

    def __init__(self, path: DataRoot | Path | str):
        object.__setattr__(self, "path", path.path if isinstance(path, DataRoot) else Path(path))

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)

    @property
    def npz(self) -> Path:
        """The ``npz`` folder of an existing root (``npz_all/npz`` or ``npz``); a FormatError naming the
        root when it does not exist or holds no TpuGraphs data."""
        for parts in (KAGGLE_NPZ, PLAIN_NPZ):
            candidate = self.path.joinpath(*parts)
            if candidate.is_dir():
                return candidate
        if not self.path.exists():
            raise FormatError(self.path, "data root does not exist")
        raise FormatError(self.path, "no TpuGraphs data here: expected npz_all/npz/{tile,layout}/... (the Kaggle "
                                     "download) or npz/...; run `python -m pipelines download` or `python -m "
                                     "pipelines synth`")

    def split_dir(self, collection: Collection, split: str) -> Path:
        """Where one collection's split lives in this (existing) root."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        return self.npz.joinpath(*collection.relative_dir.parts, split)

    def new_split_dir(self, collection: Collection, split: str, *, kaggle: bool = True) -> Path:
        """Where a writer puts one collection's split, also before the root exists: the Kaggle layout
        (``npz_all/npz/...``, what ``synth`` writes) or the plain one (``npz/...``)."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        return self.path.joinpath(*(KAGGLE_NPZ if kaggle else PLAIN_NPZ), *collection.relative_dir.parts, split)

    def graphs(self, collection: Collection, split: str) -> list[GraphRef]:
        """All graph files of one collection and split, sorted by stem. A missing folder is an error.

        Every entry named ``*.npz`` is listed, also one that cannot be read (a dangling link, a
        folder, a FIFO): loading it raises a FormatError naming it, never a silent skip
        (:func:`pipelines.data.tpugraphs.unreadable_reason` finds such entries without opening them).
        """
        directory = self.split_dir(collection, split)
        if not directory.is_dir():
            raise FormatError(directory, f"missing directory for {collection.name} {split}")
        return [GraphRef(collection, split, p.name[: -len(".npz")], p)
                for p in sorted(directory.iterdir()) if p.name.endswith(".npz") and p.name != ".npz"]

    def collections(self) -> list[Collection]:
        """The collections that have a train folder here."""
        npz = self.npz
        return [c for c in ALL_COLLECTIONS if npz.joinpath(*c.relative_dir.parts, "train").is_dir()]

    @property
    def sample_submission(self) -> Path:
        return self.path / SAMPLE_SUBMISSION

    def defaults(self) -> dict[str, dict[str, int]]:
        """Each graph's compiler-default config index, ``{collection name: {stem: index}}``, from the root's
        ``defaults.json`` (or ``labels/defaults.json``); empty where the root says nothing (the Kaggle data).
        A FormatError names a file that is not such a mapping."""
        path = next((self.path / p for p in DEFAULTS_PLACES if (self.path / p).is_file()), None)
        if path is None:
            return {}
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise FormatError(path, f"unreadable ({type(exc).__name__}: {exc})") from None
        names = {c.name for c in ALL_COLLECTIONS}
        if not isinstance(found, dict) or not all(
                name in names and isinstance(graphs, dict) and all(
                    isinstance(stem, str) and isinstance(i, int) and not isinstance(i, bool) and i >= 0
                    for stem, i in graphs.items()) for name, graphs in found.items()):
            raise FormatError(path, "expected {collection name: {graph stem: config index >= 0}}")
        return found
