"""Cross-validation folds grouped by program family (pure functions; the folds stage saves them).

Graphs of one program differ only in batch size, precision, topology or phase
(``resnet50.4x4.fp16`` vs ``resnet50.2x2.fp32``, ``albert_en_base_batch_size_16_test`` vs
``albert_en_base_batch_size_32_train``); the xla valid graphs are the same programs in the default
and random collections. Splitting by file would leak, so every graph of one family lands in the
same fold. Model-size tags (``L-12_H-768_A-12``, ``base``, ``large``) name different programs (other
depth and width) and stay in the family: stripping them would put all 24 small-BERT models in one
family, about half of the nlp graphs, and leave no balanced folds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from pipelines.core.collection import LABELLED, Collection
from pipelines.core.engine import Code, StageOutput, fingerprint
from pipelines.core.errors import ConfigError
from pipelines.core.stages import Stage, StageCall, run_declared, section_fields
from pipelines.core.stage_files import read_parquet

if TYPE_CHECKING:  # type hints only: the config reaches the key as resolved values
    from pipelines.config.settings import PipelineConfig

# Tokens removed wherever they stand between separators ("_" or "."): batch sizes, phases,
# TPU topologies and precisions.
_TOKEN_PATTERNS = (
    r"batch_size_\d+",
    r"batch_?\d+",
    r"bs_?\d+",
    r"\d+x\d+(?:x\d+)?",
    r"(?:fp|bf|f|int)(?:8|16|32|64)",
    r"train(?:ing)?",
    r"test(?:ing)?",
    r"inference",
    r"eval",
)
_TOKENS = re.compile("|".join(rf"(?<![^._])(?:{p})(?![^._])" for p in _TOKEN_PATTERNS), re.IGNORECASE)
# A trailing hash: "_" or "." then an optionally signed run of >= 12 hex digits (tile stems).
_HASH = re.compile(r"[._]-?[0-9a-f]{12,}$", re.IGNORECASE)
_SEPARATORS = re.compile(r"[._]{2,}")


def program_family(stem: str) -> str:
    """The program a graph file belongs to: its stem without hash, batch (size), precision,
    topology and train/test/inference parts (``alexnet_train_batch_32_-1bae...`` -> ``alexnet``).

    A stem with nothing left after removal (e.g. an anonymous test hash) is its own family.
    """
    name = _HASH.sub("", stem)
    name = _TOKENS.sub("", name)
    name = _SEPARATORS.sub(lambda m: m.group(0)[0], name).strip("._")
    return name or stem


def assign_folds(stems: Sequence[str], splits: Sequence[str], k: int, seed: int,
                 holdout_valid: bool = False) -> pl.DataFrame:
    """Grouped k-fold: columns ``graph``, ``split``, ``family``, ``fold`` (int32), in input order.

    Families are shuffled with ``seed``, then placed largest first into the fold holding the fewest
    graphs so far (ties: lowest fold), which balances folds by graph count and is deterministic.
    With ``holdout_valid`` the valid graphs get fold -1 and the folds cover train only.
    """
    stems, splits = list(stems), list(splits)
    if len(stems) != len(splits):
        raise ValueError(f"{len(stems)} stems but {len(splits)} splits")
    unknown = sorted(set(splits) - {"train", "valid"})
    if unknown:
        raise ConfigError(f"folds cover labelled graphs only (train, valid); got split(s) {unknown}")
    if k < 2:
        raise ConfigError(f"folds.k must be at least 2, got {k}")
    families = [program_family(s) for s in stems]
    in_cv = [not (holdout_valid and split == "valid") for split in splits]
    sizes: dict[str, int] = {}
    for family, used in zip(families, in_cv):
        if used:
            sizes[family] = sizes.get(family, 0) + 1
    if len(sizes) < k:
        scope = "train graphs" if holdout_valid else "train and valid graphs"
        noun = "program family" if len(sizes) == 1 else "program families"
        raise ConfigError(f"folds.k = {k} but the {scope} form only {len(sizes)} {noun}; "
                          f"use fewer folds (folds.k <= {len(sizes)}) or more graphs")
    names = sorted(sizes)
    shuffled = [names[i] for i in np.random.default_rng(seed).permutation(len(names))]
    shuffled.sort(key=lambda f: -sizes[f])  # stable: the shuffle breaks ties between equal sizes
    load = np.zeros(k, dtype=np.int64)
    fold_of: dict[str, int] = {}
    for family in shuffled:
        fold = int(np.argmin(load))
        fold_of[family] = fold
        load[fold] += sizes[family]
    folds = [fold_of[f] if used else -1 for f, used in zip(families, in_cv)]
    return pl.DataFrame({
        "graph": pl.Series(stems, dtype=pl.String),
        "split": pl.Series(splits, dtype=pl.String),
        "family": pl.Series(families, dtype=pl.String),
        "fold": pl.Series(folds, dtype=pl.Int32),
    })


# ----------------------------------------------------------------------------- stage: folds (I/O shell)

# The code the stage runs (part of its key): this module and what it imports.
FOLDS_CODE = Code(("pipelines.data.folds",))
FOLDS_TABLE = "folds.parquet"


def labelled_graphs(refs: Mapping[str, Sequence[Any]]) -> list[tuple[str, str]]:
    """(stem, split) of every train then valid graph of ``refs`` (split -> graph references)."""
    return [(ref.stem, split) for split in LABELLED for ref in refs.get(split, ())]


def folds_table(config: PipelineConfig, labelled: Sequence[tuple[str, str]]) -> pl.DataFrame:
    """:func:`assign_folds` of the (stem, split) pairs with the ``folds`` settings of ``config``."""
    return assign_folds([stem for stem, _ in labelled], [split for _, split in labelled], config.folds.k,
                        config.folds.seed, config.folds.holdout_valid)


def run_folds(call: StageCall) -> StageOutput:
    """The folds stage: the labelled (stem, split) pairs of ``call.raw`` (the graphs the prune stage
    kept) -> ``folds.parquet`` (read back with :func:`read_folds`)."""
    config, labelled = call.config, _labelled(call)

    def compute(folder: Path) -> dict[str, Any]:
        table = folds_table(config, labelled)
        table.write_parquet(folder / FOLDS_TABLE)
        counts = table.group_by("fold").len().sort("fold")
        return {"families": table["family"].n_unique(),
                "graphs_per_fold": {str(f): int(n) for f, n in counts.iter_rows()}}

    return run_declared(FOLDS, call, compute, seeds={"folds": config.folds.seed})


def _labelled(call: StageCall) -> list[tuple[str, str]]:
    return labelled_graphs(call.raw.refs)


def _folds_inputs(call: StageCall) -> dict[str, str]:
    return {"graphs": fingerprint(_labelled(call))}


def _folds_settings(config: PipelineConfig, collection: Collection) -> dict[str, str]:
    return section_fields(config, "folds")


# The folds stage as data (pipelines.core.stages): keyed by the labelled graphs prune kept, not by prune's key.
FOLDS = Stage("folds", inputs=("prune",), code=FOLDS_CODE, settings=_folds_settings, run=run_folds,
              input_keys=_folds_inputs, training_only=True)


def read_folds(folds: StageOutput) -> pl.DataFrame:
    """``graph``, ``split``, ``family``, ``fold`` of every train/valid graph (fold -1: holdout)."""
    return read_parquet(folds.file(FOLDS_TABLE))
