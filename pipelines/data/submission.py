"""Submission CSVs: write (atomic, never overwriting), read, validate against a data root, and score.

The format (``shared/TPUGRAPHS_FORMAT.md``): header ``ID,TopConfigs``, one row per graph file of a
split in all five collections, ``TopConfigs`` = config indices joined by ``;``, fastest first: the
best ``min(5, c)`` distinct indices for tile, a full permutation of ``0..c-1`` for layout.
Validation collects every violation and raises one :class:`SubmissionError` listing them all.
"""

from __future__ import annotations

import errno
import operator
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from pipelines.data.root import DataRoot
from pipelines.core.collection import ALL_COLLECTIONS, SPLITS, Collection, split_submission_id, stem_problem
from pipelines.core.errors import ConfigError, FormatError, PipelineError, SubmissionError
from pipelines.core.metric import (
    TILE_TOP_K,
    ScoreReport,
    order_from_scores,
    score_submission_row,
    summarize,
    tile_top_k,
)
from pipelines.data.tpugraphs import (
    GraphRef,
    count_configs,
    load_ref,
    probe_problem,
    unreadable_reason,
)

HEADER = "ID,TopConfigs"
_INDEX = re.compile(r"[0-9]+")
# More digits than any config index can have (a graph has at most ~10^5 configs): such a token is out
# of range without converting it (int() of a 5,000-digit string is refused by Python, and costs time
# quadratic in its length below that limit).
MAX_INDEX_DIGITS = 12
_EXAMPLES = 5  # indices quoted per problem, so a broken 100k-config row yields a short message
_BOM = b"\xef\xbb\xbf"
# sample_submission.csv of the real data is ~4 MB (894 rows, 1000-config layout permutations).
MAX_SAMPLE_BYTES = 64 * 1024 * 1024
# A submission may exceed its largest well-formed size (every index written in full) by this much:
# leading zeros, CRLF line ends. Anything bigger is refused before it is read.
SIZE_SLACK_FACTOR, SIZE_SLACK_BYTES = 2, 1 << 20
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EACCES,
                          errno.EPERM})


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
        negative = [t for t in bad if t.startswith("-") and _INDEX.fullmatch(t[1:])]
        bad = [t for t in bad if t not in negative]
        huge = [t for t in tokens if len(t.lstrip("-0")) > MAX_INDEX_DIGITS and _INDEX.fullmatch(t.lstrip("-"))]
        if huge:
            problems.append(f"ID {sid} (line {number}): index of {len(huge[0].lstrip('-0'))} digits "
                            f"({huge[0][:12]}...) is out of range for any graph"
                            + (f" (and {len(huge) - 1} more)" if len(huge) > 1 else ""))
            negative = [t for t in negative if t not in huge]
        if not top:
            problems.append(f"ID {sid} (line {number}): empty TopConfigs")
        if negative:
            problems.append(f"ID {sid} (line {number}): negative index {', '.join(negative[:_EXAMPLES])}"
                            + (f" (and {len(negative) - _EXAMPLES} more)" if len(negative) > _EXAMPLES else "")
                            + " (config indices start at 0)")
        if bad and top:
            shown = ", ".join(repr(t) for t in bad[:_EXAMPLES])
            problems.append(f"ID {sid} (line {number}): non-integer token(s) {shown}"
                            + (f" (and {len(bad) - _EXAMPLES} more)" if len(bad) > _EXAMPLES else ""))
        rows.append(_ParsedRow(number, sid, None if bad or negative or huge or not top else [int(t) for t in tokens]))
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
    tmp_name = None
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="ascii", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, 0o644)  # mkstemp creates 0600; a submission is an ordinary shareable file
        _publish_exclusive(Path(tmp_name), path)
    except OSError as exc:
        if exc.errno not in _DISK_ERRNOS:
            raise
        raise PipelineError(f"{path}: cannot write the submission: {exc.strerror or exc}") from None
    finally:
        if tmp_name is not None:
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


def _read_text(path: Path, max_bytes: int | None = None, what: str = "submission") -> str:
    """The file's ASCII text; a file that is not a regular file, or larger than ``max_bytes``, is
    refused before it is read."""
    reason = unreadable_reason(path)
    if reason == "file not found":
        raise FormatError(path, f"{what} file not found")
    if reason is not None:
        raise FormatError(path, f"cannot read {what}: {reason}")
    try:
        size = path.stat().st_size
        if max_bytes is not None and size > max_bytes:
            raise SubmissionError(path, [f"file is {size} bytes; a well-formed {what} for this data root is at most "
                                         f"{max_bytes} bytes (refused without reading it)"])
        data = path.read_bytes()
    except OSError as exc:
        raise FormatError(path, f"cannot read {what} ({exc.strerror or exc})") from None
    if data.startswith(_BOM):
        raise SubmissionError(path, ["starts with a UTF-8 byte-order mark (BOM): save it as plain ASCII "
                                     "without a BOM"])
    try:
        return data.decode("ascii")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SubmissionError(path, [f"not an ASCII text file: byte {exc.start} (line {line}) is "
                                     f"0x{data[exc.start]:02x}"]) from None


def read_sample_ids(data_root: Path | str) -> list[str]:
    """The test IDs of ``<data_root>/sample_submission.csv``, the official list a submission must cover.

    The file is bounded in size, its header checked, every ID must name a known collection and be
    unique; any problem raises a FormatError naming the file.
    """
    path = DataRoot(data_root).sample_submission
    try:
        text = _read_text(path, MAX_SAMPLE_BYTES, "sample_submission.csv")
    except SubmissionError as exc:
        raise FormatError(path, "; ".join(exc.violations)) from None
    except FormatError as exc:
        if exc.problem.endswith("file not found"):
            raise FormatError(path, "missing: the official list of test IDs is needed to check test files and "
                                    "submissions (download it again with `python -m pipelines download`)") from None
        raise
    lines = [line.rstrip("\r") for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    if not lines or lines[0] != HEADER:
        found = repr(lines[0][:60]) if lines else "an empty file"
        raise FormatError(path, f"not a sample submission: header is {found}, expected {HEADER!r}")
    ids, problems, seen = [], [], set()
    for number, line in enumerate(lines[1:], start=2):
        sid = line.split(",", 1)[0]
        try:
            split_submission_id(sid)
        except (ConfigError, ValueError):
            problems.append(f"line {number}: {sid[:80]!r} is not an ID of a TpuGraphs collection")
            continue
        if sid in seen:
            problems.append(f"line {number}: duplicate ID {sid}")
            continue
        seen.add(sid)
        ids.append(sid)
    if not ids and not problems:
        problems.append("lists no test ID")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise FormatError(path, "; ".join(problems[:5]) + more)
    return ids


def test_ref_problem(ref: GraphRef, probe: bool = False) -> str | None:
    """Why test file ``ref`` cannot be ranked in a submission, or None: from its directory entry (not a
    regular file, a name its submission ID cannot carry) and, with ``probe``, from a quick look inside
    (:func:`pipelines.data.tpugraphs.probe_problem`: garbage, cut short, a member missing). A test file
    cannot be left out (``data.on_bad_file = "skip"`` applies to train and valid files only), so the
    data-root check probes them all before the first stage."""
    return unreadable_reason(ref.path) or stem_problem(ref.stem) or (probe_problem(ref.path, ref.collection)
                                                                      if probe else None)


def test_file_problems(data_root: Path | str, collections: Sequence[Collection] = ALL_COLLECTIONS,
                       sample_ids: Sequence[str] | None = None,
                       probe: bool = False) -> tuple[dict[str, GraphRef], list[str]]:
    """The test graphs of ``collections`` by submission ID, and how they differ from the IDs of
    sample_submission.csv (an ID without a file, a file not listed, an unreadable entry)."""
    root = DataRoot(data_root)
    sample_ids = read_sample_ids(root) if sample_ids is None else sample_ids
    wanted = {c.name for c in collections}
    listed = {sid for sid in sample_ids if split_submission_id(sid)[0].name in wanted}
    found: dict[str, GraphRef] = {}
    problems = []
    for collection in collections:
        refs = root.graphs(collection, "test")
        if not refs:
            problems.append(f"{root.split_dir(collection, 'test')}: no test graphs of {collection.name} "
                            "(no *.npz file)")
        for ref in refs:
            found[ref.submission_id] = ref
            reason = test_ref_problem(ref, probe)
            if reason is not None:
                problems.append(f"{ref.path}: {reason}")
            elif ref.submission_id not in listed:
                problems.append(f"{ref.path}: test file not listed in sample_submission.csv")
    for sid in sorted(listed - set(found)):
        collection, stem = split_submission_id(sid)
        problems.append(f"ID {sid} of sample_submission.csv has no test file "
                        f"({root.split_dir(collection, 'test') / f'{stem}.npz'})")
    return found, problems


def check_test_files(data_root: Path | str, collections: Sequence[Collection] = ALL_COLLECTIONS) -> dict[str, GraphRef]:
    """Raise a FormatError unless the test files of ``collections`` match sample_submission.csv exactly."""
    found, problems = test_file_problems(data_root, collections)
    if problems:
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise FormatError(DataRoot(data_root).sample_submission,
                          f"the test files do not match the official test IDs ({len(problems)} problem(s)):\n  "
                          + "\n  ".join(problems[:20]) + more)
    return found


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
    if split == "test":  # the official list of test IDs decides what a complete submission is
        return check_test_files(data_root)
    root = DataRoot(data_root)
    refs = {ref.submission_id: ref for c in ALL_COLLECTIONS for ref in root.graphs(c, split)}
    for ref in refs.values():
        reason = unreadable_reason(ref.path)
        if reason is not None:
            raise FormatError(ref.path, reason)
    return refs


def _size_bound(expected: Mapping[str, GraphRef], num_configs: Mapping[str, int]) -> int:
    """Largest byte size a well-formed submission for these graphs can reasonably have."""
    total = len(HEADER) + 1
    for sid, ref in expected.items():
        c = num_configs[sid]
        indices = min(TILE_TOP_K, c) if ref.collection.is_tile else c
        total += len(sid) + 2 + indices * (len(str(max(c - 1, 0))) + 1)
    return SIZE_SLACK_FACTOR * total + SIZE_SLACK_BYTES


def _checked_rows(path: Path, data_root: Path | str, split: str) -> tuple[dict[str, list[int]], dict[str, GraphRef],
                                                                           dict[str, int]]:
    """Parse and check a submission against a split; returns rows, their graphs and config counts."""
    expected = _expected_graphs(data_root, split)
    # Every graph's config count from its npy header (cheap), so the file's size is bounded before reading it.
    num_configs = {sid: count_configs(ref.path, ref.collection) for sid, ref in expected.items()}
    rows, problems = _parse(_read_text(path, _size_bound(expected, num_configs)))
    first_line: dict[str, int] = {}
    accepted: dict[str, list[int]] = {}
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
        results.append(score_submission_row(ref.collection.name, ref.stem, indices, truth))
    return summarize(results)
