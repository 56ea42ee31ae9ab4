"""Submission CSVs: write (atomic, never overwriting), read, validate against a data root, and score.

The format (``shared/TPUGRAPHS_FORMAT.md``): header ``ID,TopConfigs``, one row per graph file of a
split in all five collections, ``TopConfigs`` = config indices joined by ``;``, fastest first: the
best ``min(5, c)`` distinct indices for tile, a full permutation of ``0..c-1`` for layout.
Validation collects every violation and raises one :class:`SubmissionError` listing them all.
"""

from __future__ import annotations

import operator
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from pipelines.collections import ALL_COLLECTIONS, SPLITS, Collection
from pipelines.errors import ConfigError, FormatError, PipelineError, SubmissionError
from pipelines.metric import (
    TILE_TOP_K,
    GraphScore,
    ScoreReport,
    kendall_tau_b,
    order_from_scores,
    ordered_pair_accuracy,
    ranks_from_order,
    summarize,
    tile_score,
    tile_top_k,
)
from pipelines.tpugraphs import GraphRef, count_configs, list_graphs, load_ref

HEADER = "ID,TopConfigs"
_INDEX = re.compile(r"[0-9]+")
_EXAMPLES = 5  # indices quoted per problem, so a broken 100k-config row yields a short message


# ----------------------------------------------------------------------------- rows (pure)


def submission_row(collection: Collection, scores: np.ndarray | Sequence[float]) -> list[int]:
    """The TopConfigs of one graph from predicted scores (lower = faster): tile top-5 or full order."""
    order = tile_top_k(scores) if collection.is_tile else order_from_scores(scores)
    return [int(i) for i in order]


def row_problems(rows: Mapping[str, Sequence[int]]) -> list[str]:
    """Problems that make rows unwritable as CSV (bad IDs, non-integer or negative indices, empty lists)."""
    problems = []
    for sid, indices in rows.items():
        if not isinstance(sid, str) or not sid or any(ch in sid for ch in ",;\r\n\"") or sid != sid.strip():
            problems.append(f"ID {sid!r}: not writable as a CSV field")
            continue
        if len(indices) == 0:
            problems.append(f"ID {sid}: empty TopConfigs")
        try:
            negative = [operator.index(i) for i in indices if operator.index(i) < 0]
        except TypeError:
            problems.append(f"ID {sid}: indices must be integers")
            continue
        if negative:
            problems.append(f"ID {sid}: negative index {_examples(negative)}")
    return problems


def format_submission(rows: Mapping[str, Sequence[int]]) -> str:
    """The CSV text: header, then rows sorted by ID (byte-reproducible), ``\\n`` line ends."""
    problems = row_problems(rows)
    if problems:
        raise ValueError("; ".join(problems))
    lines = [HEADER]
    lines += [f"{sid},{';'.join(str(operator.index(i)) for i in rows[sid])}" for sid in sorted(rows)]
    return "\n".join(lines) + "\n"


def _examples(values: Sequence[int]) -> str:
    shown = ", ".join(str(v) for v in values[:_EXAMPLES])
    return shown + (f" (and {len(values) - _EXAMPLES} more)" if len(values) > _EXAMPLES else "")


@dataclass(frozen=True)
class _ParsedRow:
    line: int
    id: str
    indices: list[int] | None  # None when the row's TopConfigs could not be parsed


def _parse(text: str) -> tuple[list[_ParsedRow], list[str]]:
    """Split CSV text into rows, collecting syntax problems (header, field count, non-integer tokens)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    if not lines:
        return [], [f"empty file: expected the header {HEADER!r}"]
    problems = [] if lines[0] == HEADER else [f"line 1: bad header {lines[0][:60]!r}, expected {HEADER!r}"]
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split(",")
        if len(fields) != 2:
            problems.append(f"line {number}: expected 2 fields (ID,TopConfigs), got {len(fields)}")
            continue
        sid, top = fields
        tokens = top.split(";")
        bad = [t for t in tokens if not _INDEX.fullmatch(t)]
        if not top:
            problems.append(f"ID {sid} (line {number}): empty TopConfigs")
        elif bad:
            shown = ", ".join(repr(t) for t in bad[:_EXAMPLES])
            problems.append(f"ID {sid} (line {number}): non-integer token(s) {shown}"
                            + (f" (and {len(bad) - _EXAMPLES} more)" if len(bad) > _EXAMPLES else ""))
        rows.append(_ParsedRow(number, sid, None if bad or not top else [int(t) for t in tokens]))
    return rows, problems


def index_problems(collection: Collection, indices: Sequence[int], num_configs: int) -> list[str]:
    """What is wrong with one row's indices for a graph of ``num_configs`` configs (empty if valid)."""
    problems = []
    if collection.is_tile:
        expected = min(TILE_TOP_K, num_configs)
        if len(indices) != expected:
            problems.append(f"tile list has {len(indices)} indices, expected {expected} (min(5, c), c = {num_configs})")
    elif len(indices) != num_configs:
        problems.append(f"layout order has {len(indices)} indices, expected a permutation of 0..{num_configs - 1}")
    out_of_range = [i for i in indices if i >= num_configs]
    if out_of_range:
        problems.append(f"index out of range [0, {num_configs}): {_examples(out_of_range)}")
    values, counts = np.unique(np.asarray([i for i in indices if i < num_configs], dtype=np.int64),
                               return_counts=True)
    if (counts > 1).any():
        problems.append(f"duplicate index {_examples(values[counts > 1].tolist())}")
    if collection.is_layout and values.shape[0] < num_configs and len(indices) >= num_configs:
        # Right length but not a permutation: name what is absent (a short list is reported above).
        absent = np.setdiff1d(np.arange(num_configs), values).tolist()
        problems.append(f"not a permutation of 0..{num_configs - 1}: missing index {_examples(absent)}")
    return problems


# ----------------------------------------------------------------------------- files


def write_submission(path: Path | str, rows: Mapping[str, Sequence[int]]) -> Path:
    """Write rows as a submission CSV at ``path``, atomically and never replacing an existing file.

    The text goes to a temporary file first; it is then hard-linked to ``path``, which fails if
    ``path`` exists (also when another process creates it meanwhile), so no file is ever
    overwritten and no reader ever sees a partial file.
    """
    path = Path(path)
    problems = row_problems(rows)
    if problems:
        raise SubmissionError(path, problems)
    text = format_submission(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="ascii", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, 0o644)  # mkstemp creates 0600; a submission is an ordinary shareable file
        _publish_exclusive(Path(tmp_name), path)
    finally:
        Path(tmp_name).unlink(missing_ok=True)
    return path


def _publish_exclusive(tmp: Path, path: Path) -> None:
    refusal = f"{path}: already exists; submissions are never overwritten (write to a new path)"
    try:
        os.link(tmp, path)
        return
    except FileExistsError:
        raise PipelineError(refusal) from None
    except OSError:
        pass  # hard links unsupported here (some network or FUSE filesystems)
    try:  # reserve the name exclusively, then move the finished file onto our own reservation
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        raise PipelineError(refusal) from None
    os.replace(tmp, path)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii")
    except FileNotFoundError:
        raise FormatError(path, "submission file not found") from None
    except UnicodeDecodeError as exc:
        raise SubmissionError(path, [f"not an ASCII text file (byte {exc.start})"]) from None
    except OSError as exc:
        raise FormatError(path, f"cannot read submission ({exc})") from None


def read_submission(path: Path | str) -> dict[str, list[int]]:
    """Read a submission CSV into ``{ID: indices}`` (file order); syntax errors and duplicate IDs raise."""
    path = Path(path)
    rows, problems = _parse(_read_text(path))
    out: dict[str, list[int]] = {}
    for row in rows:
        if row.id in out:
            problems.append(f"ID {row.id} (line {row.line}): duplicate ID")
        elif row.indices is not None:
            out[row.id] = row.indices
    if problems:
        raise SubmissionError(path, problems)
    return out


def _expected_graphs(data_root: Path | str, split: str) -> dict[str, GraphRef]:
    """Every graph of ``split`` in all five collections by submission ID; a missing directory raises."""
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    return {ref.submission_id: ref for c in ALL_COLLECTIONS for ref in list_graphs(data_root, c, split)}


def _checked_rows(path: Path, data_root: Path | str, split: str) -> tuple[dict[str, list[int]], dict[str, GraphRef],
                                                                           dict[str, int]]:
    """Parse and check a submission against a split; returns rows, their graphs and config counts."""
    expected = _expected_graphs(data_root, split)
    rows, problems = _parse(_read_text(path))
    first_line: dict[str, int] = {}
    accepted: dict[str, list[int]] = {}
    num_configs: dict[str, int] = {}
    for row in rows:
        where = f"ID {row.id} (line {row.line})"
        if row.id in first_line:
            problems.append(f"{where}: duplicate ID (first on line {first_line[row.id]})")
            continue
        first_line[row.id] = row.line
        ref = expected.get(row.id)
        if ref is None:
            problems.append(f"{where}: unknown ID (no such graph in the {split} split of {data_root})")
            continue
        if row.indices is None:
            continue
        num_configs[row.id] = count_configs(ref.path, ref.collection)
        problems += [f"{where}: {p}" for p in index_problems(ref.collection, row.indices, num_configs[row.id])]
        accepted[row.id] = row.indices
    problems += [f"ID {sid}: missing (no row for this {split} graph)" for sid in expected if sid not in first_line]
    if problems:
        raise SubmissionError(path, problems)
    return accepted, expected, num_configs


def validate_submission(path: Path | str, data_root: Path | str, split: str = "test") -> int:
    """Check a submission against every graph of ``split``; returns the row count or raises SubmissionError."""
    rows, _, _ = _checked_rows(Path(path), data_root, split)
    return len(rows)


def score_submission(path: Path | str, data_root: Path | str, split: str = "valid") -> ScoreReport:
    """Validate a submission written for a labelled split and score it with the competition metric.

    Graphs are loaded one at a time without their layout config arrays (only runtimes are needed).
    Layout graphs also get the OPA of the submitted order; tile rows list only the top configs, so
    their OPA is left empty.
    """
    if split == "test":
        raise ConfigError("the test split has no runtimes; score a submission written for train or valid")
    path = Path(path)
    rows, refs, num_configs = _checked_rows(path, data_root, split)
    results = []
    for sid, indices in rows.items():
        ref = refs[sid]
        graph = load_ref(ref, with_configs=False)
        if not graph.has_labels:
            raise FormatError(ref.path, f"no runtimes (all zero): the {split} split cannot be scored")
        truth = graph.target if ref.collection.is_tile else graph.config_runtime
        if truth.shape[0] != num_configs[sid]:
            raise FormatError(ref.path, f"{truth.shape[0]} runtimes for {num_configs[sid]} configs")
        if ref.collection.is_tile:
            results.append(GraphScore(ref.collection.name, ref.stem, truth.shape[0], tile_score(indices, truth)))
        else:
            ranks = ranks_from_order(indices)
            results.append(GraphScore(ref.collection.name, ref.stem, truth.shape[0], kendall_tau_b(ranks, truth),
                                      ordered_pair_accuracy(ranks, truth)))
    return summarize(results)
