"""The orchestration of the data-preparation stages: prune -> features, node arrays; folds.

Each stage lives in its own module with its pure functions, its ``run_*`` shell and typed readers
of what it writes (``pipelines.data.prune``, ``features``, ``node_arrays``, ``folds``); this module only
checks the inputs and runs them in the order of the stage DAG (:mod:`pipelines.flows.dag`). Each stage
runs once per collection through :func:`pipelines.core.engine.run_stage`, so its output is keyed by
its code, resolved config and input keys (as its declaration names them), and reused until one of them
changes:

* ``prune``: raw files of the collection (key: sizes and times of its files) -> per-graph pruned
  npz (layout graphs cut to the k-hop neighbourhood of their configurable nodes; labelled configs
  de-duplicated) plus ``graphs.parquet`` (one row per graph: split and before/after counts). An
  unreadable file stops it with a FormatError naming the file, or, with ``data.on_bad_file =
  "skip"``, is left out, recorded in ``metrics.skipped_files`` and warned about on every run; the
  later stages see only the graphs in ``graphs.parquet``;
* ``features``: prune output + raw structure -> per-graph config feature tables and per-split
  graph aggregates;
* ``node_arrays``: prune output -> per-graph :class:`GraphArrays` for the GNN;
* ``folds``: the train/valid stems -> the grouped folds every model shares.

Prune, features and node arrays run one job per graph file with ``run.n_jobs`` workers (local
processes, or the Dask cluster of an enclosing :func:`pipelines.core.parallel.fan_out`); every job writes
its own file and the stage collects what they return in file order, so the output bytes do not
depend on the number of workers. Each worker holds one graph at a time, so memory stays bounded by
``run.n_jobs`` times the largest single graph.
:func:`prepare` runs all four and returns a :class:`Prepared` per collection, the handle the
models load their data through.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
from collections.abc import Sequence
from pathlib import Path


from pipelines.data.root import DataRoot
from pipelines.core.collection import ALL_COLLECTIONS, SPLITS, Collection, parse_collection, split_submission_id
from pipelines.config.registry import model_sections
from pipelines.config.settings import PipelineConfig, resolve_for_collection
from pipelines.core.engine import StageOutput, data_fingerprint, fingerprint
from pipelines.core.errors import ConfigError, FormatError
from pipelines.core.stages import RawFiles
from pipelines.data.features import layout_feature_names, tile_feature_names
from pipelines.data.folds import folds_table, labelled_graphs
from pipelines.data.prepared import Prepared
from pipelines.flows import dag
from pipelines.data.tpugraphs import (
    GraphRef,
    unreadable_reason,
)

logger = logging.getLogger(__name__)

# The data stages, in order (pipelines.flows.dag)
STAGES = tuple(stage.name for stage in dag.data_stages())


# ----------------------------------------------------------------------------- inputs


def collection_refs(data_root: Path | str, collection: Collection) -> dict[str, list[GraphRef]]:
    """The collection's files per split; a stem found in two splits is a FormatError."""
    root = DataRoot(data_root)
    refs = {split: root.graphs(collection, split) for split in SPLITS}
    seen: dict[str, str] = {}
    for split, items in refs.items():
        for ref in items:
            if ref.stem in seen:
                raise FormatError(ref.path, f"{collection.name}: stem {ref.stem!r} appears in both "
                                            f"{seen[ref.stem]} and {split}")
            seen[ref.stem] = split
    return refs


def raw_data_key(data_root: Path | str, refs: dict[str, list[GraphRef]]) -> str:
    paths = [ref.path for items in refs.values() for ref in items]
    readable = [path for path in paths if unreadable_reason(path) is None]
    key = data_fingerprint(readable, Path(data_root))
    if len(readable) == len(paths):
        return key
    # Unreadable entries (skipped with data.on_bad_file=skip) have no size or time to key: key their names.
    return fingerprint({"files": key, "unreadable": sorted(str(p) for p in paths if p not in set(readable))})


def check_feature_exclusions(config: PipelineConfig) -> None:
    """``gbdt.exclude_features`` must leave the GBDT at least one f_* column in every collection
    (else training fails after every data stage ran). Checked by ``prepare`` and ``config``."""
    for collection in ALL_COLLECTIONS:
        prefixes = tuple(resolve_for_collection(config.gbdt, collection).exclude_features)
        if not prefixes:
            continue
        columns = tile_feature_names() if collection.is_tile else layout_feature_names(collection.search == "default")
        if all(column.startswith(prefixes) for column in columns):
            raise ConfigError(f"gbdt.exclude_features = {list(prefixes)} excludes every f_* feature column of "
                              f"{collection.name} ({len(columns)} columns): the GBDT would have nothing to learn from")


def check_output_dir(folder: Path | str, data_root: Path | str, what: str = "--work-dir") -> None:
    """Refuse an output folder inside the raw data (raw data is never written) or one that cannot be
    created or written, before anything runs."""
    folder, data_root = Path(folder), Path(data_root)
    resolved, root = folder.resolve(), data_root.resolve()
    if resolved == root or root in resolved.parents:
        raise ConfigError(f"{what} {folder} is inside the data root {data_root}: raw data is never written; "
                          "choose a folder outside it")
    if resolved in root.parents:  # the converse: gc deletes folders of a work dir, never raw data
        raise ConfigError(f"{what} {folder} contains the data root {data_root}: keep raw data outside the folders "
                          "the pipeline writes (gc removes folders there)")
    existing = next((p for p in (folder, *folder.parents) if p.exists() or p.is_symlink()), None)
    if existing is not None and not existing.is_dir():
        raise ConfigError(f"{what} {folder}: {existing} is not a directory")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        reason = os.strerror(errno.EROFS) if read_only else os.strerror(errno.EACCES)
        raise ConfigError(f"{what} {folder}: cannot write in {existing}: {reason}")


def check_apart(work_dir: Path | str, submissions_dir: Path | str) -> None:
    """A ConfigError when the submissions folder is inside the work dir, or the work dir inside it: gc
    removes folders of the work dir (never a published run), ``runs`` reads every folder of the other."""
    work, subs = Path(work_dir).resolve(), Path(submissions_dir).resolve()
    if work == subs or work in subs.parents or subs in work.parents:
        inside = "is the work dir" if work == subs else "is inside the work dir" if work in subs.parents \
            else "contains the work dir"
        raise ConfigError(f"--submissions-dir {submissions_dir} {inside} {work_dir}: keep published runs and "
                          "cached stages in separate folders (gc removes folders of the work dir)")


def check_data_root(data_root: Path | str, collections: Sequence[Collection], on_bad_file: str) -> None:
    """Structural checks of the raw data, run before the first stage (stat calls; test files alone are opened,
    for a look at their archive directory and npy headers):

    * every split directory of every chosen collection exists, train and test are not empty;
    * with ``sample_submission.csv`` present: every collection it lists exists, and the test files
      of the chosen collections match its IDs exactly (the submission must cover them all);
    * every ``*.npz`` entry is a regular file (not a dangling or looping link, directory, FIFO...).
      Such an entry is an error; with ``on_bad_file = "skip"`` a train/valid one is a warning (the
      prune stage records it in ``skipped_files``), a test one stays an error (the submission needs it);
    * every test file's name fits a submission ID, and a quick look inside finds nothing wrong.

    Every problem found is reported in one FormatError, so one fix-and-retry round suffices.
    """
    from pipelines.data.submission import read_sample_ids, test_file_problems, test_ref_problem

    root = DataRoot(data_root)
    root.npz  # "no data here" is its own clear error
    problems: list[str] = []
    warnings: list[str] = []
    sample = root.sample_submission
    sample_ids = read_sample_ids(root) if sample.exists() or sample.is_symlink() else None
    if sample_ids is not None:
        listed = {split_submission_id(sid)[0] for sid in sample_ids}
        chosen = {c.name for c in collections}
        for collection in sorted(listed, key=lambda c: c.name):
            if collection.name in chosen:
                continue
            for split in SPLITS:
                if not root.split_dir(collection, split).is_dir():
                    problems.append(f"{root.split_dir(collection, split)}: missing directory for "
                                    f"{collection.name} {split} (sample_submission.csv lists test IDs of it)")
    for collection in collections:
        present = True
        for split in SPLITS:
            directory = root.split_dir(collection, split)
            if not directory.is_dir():
                problems.append(f"{directory}: missing directory for {collection.name} {split}")
                present = False
                continue
            refs = root.graphs(collection, split)
            if split != "valid" and not refs:
                problems.append(f"{directory}: no {split} graphs of {collection.name} (no *.npz file)")
            if split == "test":
                continue  # checked with the sample submission below (or here when there is none)
            for ref in refs:
                reason = unreadable_reason(ref.path)
                if reason is None:
                    continue
                if on_bad_file == "skip":
                    warnings.append(f"{ref.path}: {reason}")
                else:
                    problems.append(f"{ref.path}: {reason}")
        if not present:
            continue
        if sample_ids is not None:
            _, test_problems = test_file_problems(root, [collection], sample_ids, probe=True)
            problems += test_problems
        else:
            problems += [f"{ref.path}: {reason}" for ref in root.graphs(collection, "test")
                         if (reason := test_ref_problem(ref, probe=True)) is not None]
    if problems:
        hint = ("" if on_bad_file == "skip" or not any("not a regular file" in p or "symlink" in p for p in problems)
                else "\n(to leave unreadable train/valid entries out with a warning: --set data.on_bad_file=skip)")
        more = f"\n  ... and {len(problems) - 30} more" if len(problems) > 30 else ""
        raise FormatError(root.path, f"the data root is not usable ({len(problems)} problem(s)), nothing was "
                                     "computed:\n  " + "\n  ".join(problems[:30]) + more + hint)
    if sample_ids is None:
        logger.warning(f"warning: {sample}: missing; test files are not checked against the official test IDs "
            "(a submission cannot be validated without it)")
    for warning in warnings:
        logger.warning(f"warning: {warning} (left out: data.on_bad_file = \"skip\")")


# ----------------------------------------------------------------------------- orchestration


def prepare(config: PipelineConfig, data_root: Path | str, work_dir: Path | str,
            collections: Sequence[Collection | str] | None = None, force: bool = False) -> dict[str, Prepared]:
    """Run (or reuse) the four preparation stages for each collection; ``None`` = every collection
    with a train directory under ``data_root``."""
    # Absolute: the per-file jobs may run in worker processes started in another working directory
    # (a pool reused across calls of one process), where a relative path would name other files.
    root, work_dir = DataRoot(Path(data_root).absolute()), Path(work_dir).absolute()
    chosen, extra = collections_to_prepare(config, root, collections)
    check_feature_exclusions(config)
    check_output_dir(work_dir, root)
    check_data_root(root, [*chosen, *extra], config.data.on_bad_file)
    # Every collection's file list and folds setting is checked before any stage writes anything.
    refs = {c.name: collection_refs(root, c) for c in [*chosen, *extra]}
    for c in [*chosen, *extra]:
        check_folds(config, c, refs[c.name])
    prepared = {c.name: prepare_collection(config, c, root, work_dir, force, refs=refs[c.name])
                for c in [*chosen, *extra]}
    for c in chosen:
        # a companion's own Prepared, without companions of its own (no cycles when two name each other)
        prepared[c.name].companions = {x.name: dataclasses.replace(prepared[x.name], companions={})
                                       for x in companion_collections(config, c)}
    return {c.name: prepared[c.name] for c in chosen}


def collections_to_prepare(config: PipelineConfig, data_root: Path | str,
                           collections: Sequence[Collection | str] | None = None,
                           ) -> tuple[list[Collection], list[Collection]]:
    """What :func:`prepare` prepares: the chosen collections (``None`` = every collection with a train
    directory under ``data_root``) and, after them, the other collections their models also train on
    (:func:`companion_collections`)."""
    if collections is None:
        chosen = DataRoot(data_root).collections()
    else:
        chosen = [c if isinstance(c, Collection) else parse_collection(c) for c in collections]
    if not chosen:
        raise FormatError(data_root, "no collection to prepare (no train directory found)")
    named = dict.fromkeys(x for c in chosen for x in companion_collections(config, c))
    return list(chosen), [c for c in named if c not in chosen]


def companion_collections(config: PipelineConfig, collection: Collection) -> list[Collection]:
    """The other collections whose labelled graphs a model of ``config`` trains on for ``collection``
    (a model section's ``extra_train_collections``, resolved for it): of the same kind (tile or layout),
    not itself. Prepared with it whether or not that model is among the models a caller trains."""
    out: list[Collection] = []
    for model, _ in model_sections():
        section = getattr(config, model)
        for name in getattr(resolve_for_collection(section, collection), "extra_train_collections", ()):
            other = parse_collection(name)
            if other == collection or other.kind != collection.kind:
                raise ConfigError(f"{model}.extra_train_collections of {collection.name} names {other.name}: it "
                                  f"must be another {collection.kind} collection")
            out.append(other)
    return list(dict.fromkeys(out))


def check_folds(config: PipelineConfig, collection: Collection, refs: dict[str, list[GraphRef]]) -> None:
    """Raise the folds stage's ConfigError now if ``folds`` cannot be met by these graphs (e.g. more
    folds than program families), rather than after the expensive stages ran."""
    labelled = labelled_graphs(refs)
    if not labelled:
        return  # reported with the file context by prepare_collection
    try:
        folds_table(config, labelled)
    except ConfigError as exc:
        raise ConfigError(f"{collection.name}: {exc}") from None


def prepare_collection(config: PipelineConfig, collection: Collection, data_root: Path, work_dir: Path,
                       force: bool = False, refs: dict[str, list[GraphRef]] | None = None) -> Prepared:
    refs = collection_refs(data_root, collection) if refs is None else refs
    if not refs["train"]:
        raise FormatError(DataRoot(data_root).split_dir(collection, "train"), f"{collection.name}: no train graphs")
    stages = run_data_stages(config, collection, work_dir, refs, raw_data_key(data_root, refs), force)
    return Prepared(collection, stages, {name: out.cached for name, out in stages.items()})


def run_data_stages(config: PipelineConfig, collection: Collection, work_dir: Path, refs: dict[str, list[GraphRef]],
                    data_key: str, force: bool = False, with_folds: bool = True) -> dict[str, StageOutput]:
    """The data stages of the DAG (:func:`pipelines.flows.dag.data_stages`), in order: prune, then the
    stages over the graphs prune kept; without the training-only ones (folds) unless ``with_folds``.
    The one sequence of data stages, for training (:func:`prepare`) and for prediction. Their messages
    carry the collection's name."""
    return dag.run_data_stages(config, collection, work_dir, RawFiles(refs, data_key), force=force,
                               training=with_folds)
