"""The data-preparation stages and their orchestration: prune -> features, node arrays; folds.

Each stage runs once per collection through :func:`pipelines.engine.run_stage`, so its output is
keyed by stage version, resolved config and input keys, and reused until one of them changes:

* ``prune``: raw files of the collection (key: sizes and times of its files) -> per-graph pruned
  npz (layout graphs cut to the k-hop neighbourhood of their configurable nodes; labelled configs
  de-duplicated) plus ``graphs.parquet`` (one row per graph: split and before/after counts). An
  unreadable file stops it with a FormatError naming the file, or, with ``data.on_bad_file =
  "skip"``, is left out, recorded in ``metrics.skipped_files`` and warned about on every run; the
  later stages see only the graphs in ``graphs.parquet``;
* ``features``: prune output + raw structure -> per-graph config feature tables
  ``<split>/configs/<stem>.parquet`` and ``<split>/graph_features.parquet``;
* ``node_arrays``: prune output -> per-graph :class:`GraphArrays` for the GNN;
* ``folds``: the train/valid stems -> ``folds.parquet``, the grouped folds every model shares.

Prune, features and node arrays run one job per graph file with ``run.n_jobs`` workers (local
processes, or the Dask cluster of an enclosing :func:`pipelines.parallel.fan_out`); every job writes
its own file and the stage collects what they return in file order, so the output bytes do not
depend on the number of workers. Each worker holds one graph at a time, so memory stays bounded by
``run.n_jobs`` times the largest single graph.
:func:`prepare` runs all four and returns a :class:`Prepared` per collection, the handle the
models load their data through.
"""

from __future__ import annotations

import errno
import os
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from pipelines.collections import ALL_COLLECTIONS, SPLITS, Collection, parse_collection, split_submission_id
from pipelines.config import PipelineConfig, resolve_for_collection
from pipelines.engine import Code, StageOutput, data_fingerprint, fingerprint, load_stage, run_stage, stage_key
from pipelines.errors import ConfigError, FormatError, PipelineError
from pipelines.features import (
    config_feature_table,
    graph_aggregates,
    graph_feature_table,
    layout_feature_names,
    tile_feature_names,
)
from pipelines.folds import assign_folds
from pipelines.node_arrays import GraphArrays, load_graph_arrays, make_graph_arrays, save_graph_arrays
from pipelines.parallel import map_in_order
from pipelines.progress import Progress
from pipelines.prune import (
    PrunedGraph,
    deduplicate_graph,
    load_file_target,
    load_pruned,
    prune_layout_graph,
    sample_configs,
    save_pruned,
    tile_as_pruned,
)
from pipelines.tpugraphs import (
    GraphRef,
    LayoutGraph,
    available_collections,
    collection_dir,
    list_graphs,
    load_ref,
    npz_root,
    sample_submission_path,
    unreadable_reason,
)

Log = Callable[[str], None]
Ran = tuple[StageOutput, bool]  # a stage output and whether it was reused from the cache

# The code each stage runs (part of its key): its own module, and this one, which holds its I/O shell.
PRUNE_CODE = Code(("pipelines.prune",), shallow=("pipelines.prepare",))
FEATURES_CODE = Code(("pipelines.prune", "pipelines.features"), shallow=("pipelines.prepare",))
NODE_ARRAYS_CODE = Code(("pipelines.prune", "pipelines.node_arrays"), shallow=("pipelines.prepare",))
FOLDS_CODE = Code(("pipelines.folds",), shallow=("pipelines.prepare",))
STAGES = ("prune", "features", "node_arrays", "folds")
LABELLED = ("train", "valid")
GRAPHS_TABLE = "graphs.parquet"
GRAPH_FEATURES = "graph_features.parquet"
FOLDS_TABLE = "folds.parquet"


# ----------------------------------------------------------------------------- inputs


def collection_refs(data_root: Path | str, collection: Collection) -> dict[str, list[GraphRef]]:
    """The collection's files per split; a stem found in two splits is a FormatError."""
    refs = {split: list_graphs(data_root, collection, split) for split in SPLITS}
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
    existing = next((p for p in (folder, *folder.parents) if p.exists() or p.is_symlink()), None)
    if existing is not None and not existing.is_dir():
        raise ConfigError(f"{what} {folder}: {existing} is not a directory")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        reason = os.strerror(errno.EROFS) if read_only else os.strerror(errno.EACCES)
        raise ConfigError(f"{what} {folder}: cannot write in {existing}: {reason}")


def check_data_root(data_root: Path | str, collections: Sequence[Collection], on_bad_file: str,
                    log: Log = print) -> None:
    """Structural checks of the raw data, run before the first stage (stat calls only, no file is opened):

    * every split directory of every chosen collection exists, train and test are not empty;
    * with ``sample_submission.csv`` present: every collection it lists exists, and the test files
      of the chosen collections match its IDs exactly (the submission must cover them all);
    * every ``*.npz`` entry is a regular file (not a dangling or looping link, directory, FIFO...).
      Such an entry is an error; with ``on_bad_file = "skip"`` a train/valid one is a warning (the
      prune stage records it in ``skipped_files``), a test one stays an error (the submission needs it).

    Every problem found is reported in one FormatError, so one fix-and-retry round suffices.
    """
    from pipelines.submission import read_sample_ids, test_file_problems

    data_root = Path(data_root)
    npz_root(data_root)  # "no data here" is its own clear error
    problems: list[str] = []
    warnings: list[str] = []
    sample = sample_submission_path(data_root)
    sample_ids = read_sample_ids(data_root) if sample.exists() or sample.is_symlink() else None
    if sample_ids is not None:
        listed = {split_submission_id(sid)[0] for sid in sample_ids}
        chosen = {c.name for c in collections}
        for collection in sorted(listed, key=lambda c: c.name):
            if collection.name in chosen:
                continue
            for split in SPLITS:
                if not collection_dir(data_root, collection, split).is_dir():
                    problems.append(f"{collection_dir(data_root, collection, split)}: missing directory for "
                                    f"{collection.name} {split} (sample_submission.csv lists test IDs of it)")
    for collection in collections:
        present = True
        for split in SPLITS:
            directory = collection_dir(data_root, collection, split)
            if not directory.is_dir():
                problems.append(f"{directory}: missing directory for {collection.name} {split}")
                present = False
                continue
            refs = list_graphs(data_root, collection, split)
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
            _, test_problems = test_file_problems(data_root, [collection], sample_ids)
            problems += test_problems
        else:
            problems += [f"{ref.path}: {reason}" for ref in list_graphs(data_root, collection, "test")
                         if (reason := unreadable_reason(ref.path)) is not None]
    if problems:
        hint = ("" if on_bad_file == "skip" or not any("not a regular file" in p or "symlink" in p for p in problems)
                else "\n(to leave unreadable train/valid entries out with a warning: --set data.on_bad_file=skip)")
        more = f"\n  ... and {len(problems) - 30} more" if len(problems) > 30 else ""
        raise FormatError(data_root, f"the data root is not usable ({len(problems)} problem(s)), nothing was "
                                     "computed:\n  " + "\n  ".join(problems[:30]) + more + hint)
    if sample_ids is None:
        log(f"warning: {sample}: missing; test files are not checked against the official test IDs "
            "(a submission cannot be validated without it)")
    for warning in warnings:
        log(f"warning: {warning} (left out: data.on_bad_file = \"skip\")")


def _seeded_rng(seed: int, stem: str) -> np.random.Generator:
    """A generator per (seed, graph), so a graph's sample does not depend on which graphs ran before."""
    return np.random.default_rng([seed, zlib.crc32(stem.encode("utf-8"))])


# ----------------------------------------------------------------------------- stage: prune


def prune_config(config: PipelineConfig, collection: Collection) -> dict[str, Any]:
    """What the prune stage of ``collection`` depends on (tile graphs ignore the pruning knobs)."""
    # on_bad_file is keyed: an output that skipped files must never be reused by a run that asks for errors
    if collection.is_tile:
        return {"collection": collection.name, "dedup": config.prune.dedup, "on_bad_file": config.data.on_bad_file}
    return {"collection": collection.name, **asdict(config.prune), "on_bad_file": config.data.on_bad_file}


def prune_one(ref: GraphRef, config: PipelineConfig) -> tuple[PrunedGraph, dict[str, Any]]:
    """Load, prune (layout) and de-duplicate (labelled splits) one graph; returns it and its stats row."""
    graph = load_ref(ref)
    if isinstance(graph, LayoutGraph):
        pruned, stats = prune_layout_graph(graph, config.prune.hops, config.prune.mode)
        counts = stats.as_dict()
    else:
        pruned = tile_as_pruned(graph)
        counts = {"nodes_before": graph.num_nodes, "nodes_after": graph.num_nodes,
                  "edges_before": int(graph.edge_index.shape[0]), "edges_after": int(graph.edge_index.shape[0])}
    del graph  # the pruned graph shares the config array; nothing else of the raw graph is kept
    configs_before = pruned.num_configs
    if ref.split in LABELLED:
        pruned = deduplicate_graph(pruned, config.prune.dedup)
    row = {"graph": ref.stem, "split": ref.split, **counts,
           "configs_before": configs_before, "configs_after": pruned.num_configs}
    return pruned, row


def _prune_to(folder: Path, ref: GraphRef,
              config: PipelineConfig) -> tuple[dict[str, Any] | None, tuple[str, str] | None]:
    """One prune job: writes the pruned graph and returns its stats row, or (None, (path, problem))
    for a bad file: a worker returns the problem rather than raising it, so the stage decides in
    file order (and a FormatError need not cross a process boundary)."""
    try:
        pruned, row = prune_one(ref, config)
    except FormatError as exc:
        return None, (str(exc.path), exc.problem)
    save_pruned(folder / ref.split / f"{ref.stem}.npz", pruned)
    return row, None


def run_prune(config: PipelineConfig, collection: Collection, work_dir: Path, refs: dict[str, list[GraphRef]],
              data_key: str, force: bool, log: Log) -> Ran:
    def compute(folder: Path) -> dict[str, Any]:
        rows, skipped = [], []
        for split in refs:
            (folder / split).mkdir()
        every = [ref for items in refs.values() for ref in items]
        progress = Progress(log, "[prune]", len(every))
        results = map_in_order(_prune_to, [(folder, ref, config) for ref in every], config.run.n_jobs)
        for ref, (row, bad) in zip(every, results):
            progress.step()
            if bad is None:
                rows.append(row)
                continue
            path, problem = bad
            if config.data.on_bad_file != "skip":
                raise FormatError(path, f"{problem} (to leave such files out with a warning: "
                                        "--set data.on_bad_file=skip)")
            skipped.append({"split": ref.split, "graph": ref.stem, "path": str(ref.path), "reason": problem})
        table = pl.DataFrame(rows, schema=_GRAPHS_SCHEMA)
        table.write_parquet(folder / GRAPHS_TABLE)
        labelled = table.filter(pl.col("split").is_in(LABELLED))
        return {
            "graphs": {split: table.filter(pl.col("split") == split).height for split in refs},
            "nodes_removed": int((table["nodes_before"] - table["nodes_after"]).sum()),
            "edges_removed": int((table["edges_before"] - table["edges_after"]).sum()),
            "node_share_kept": float(table["nodes_after"].sum() / max(table["nodes_before"].sum(), 1)),
            "configs_removed_by_dedup": int((labelled["configs_before"] - labelled["configs_after"]).sum()),
            "skipped_files": skipped,
        }

    return _run(work_dir, "prune", PRUNE_CODE, prune_config(config, collection), {"data": data_key},
                compute, force, log)


_GRAPHS_SCHEMA = {"graph": pl.String, "split": pl.String, "nodes_before": pl.Int64, "nodes_after": pl.Int64,
                  "edges_before": pl.Int64, "edges_after": pl.Int64, "configs_before": pl.Int64,
                  "configs_after": pl.Int64}


# ----------------------------------------------------------------------------- stage: features


def features_config(config: PipelineConfig, collection: Collection) -> dict[str, Any]:
    return {"collection": collection.name, **asdict(config.features),
            # how often each chosen value occurs is only informative where configs come from a search
            "value_frequency": collection.search == "default"}


def _features_to(folder: Path, ref: GraphRef, prune_path: Path, config: PipelineConfig,
                 value_frequency: bool) -> tuple[int, list[str], dict[str, float]]:
    """One features job: writes the graph's config table; returns its row count, feature columns and
    the graph aggregates (collected by the stage into one table per split)."""
    pruned = load_pruned(prune_path / ref.split / f"{ref.stem}.npz")
    if ref.split in LABELLED:
        pruned = sample_configs(pruned, config.features.max_configs_per_graph,
                                _seeded_rng(config.features.seed, ref.stem))
    table = config_feature_table(pruned, value_frequency=value_frequency)
    table.write_parquet(folder / ref.split / "configs" / f"{ref.stem}.parquet")
    if pruned.kind == "tile":  # unpruned: the graph is the whole program
        aggregate = graph_aggregates(pruned.node_feat, pruned.node_opcode, pruned.edge_index, pruned.config_nodes)
    else:  # aggregates describe the whole program, not the pruned part: re-read the raw structure
        del pruned
        raw = load_ref(ref, with_configs=False)
        aggregate = graph_aggregates(raw.node_feat, raw.node_opcode, raw.edge_index, raw.node_config_ids)
    return table.height, [c for c in table.columns if c.startswith("f_")], aggregate


def run_features(config: PipelineConfig, collection: Collection, work_dir: Path, refs: dict[str, list[GraphRef]],
                 data_key: str, prune: StageOutput, force: bool, log: Log) -> Ran:
    stage_config = features_config(config, collection)

    def compute(folder: Path) -> dict[str, Any]:
        rows = 0
        columns: list[str] = []
        progress = Progress(log, "[features]", sum(len(items) for items in refs.values()))
        for split, items in refs.items():
            (folder / split / "configs").mkdir(parents=True)
            aggregates = []
            jobs = [(folder, ref, prune.path, config, stage_config["value_frequency"]) for ref in items]
            for height, names, aggregate in map_in_order(_features_to, jobs, config.run.n_jobs):
                progress.step()
                rows += height
                columns = columns or names
                aggregates.append(aggregate)
            graph_feature_table(aggregates, [ref.stem for ref in items]).write_parquet(folder / split / GRAPH_FEATURES)
        return {"rows": rows, "config_features": len(columns)}

    return _run(work_dir, "features", FEATURES_CODE, stage_config,
                {"prune": prune.key, "data": data_key}, compute, force, log,
                seeds={"features": config.features.seed})


# ----------------------------------------------------------------------------- stage: node arrays


def _node_arrays_to(folder: Path, prune_path: Path, stem: str, split: str, collection: str) -> None:
    pruned = load_pruned(prune_path / split / f"{stem}.npz")
    save_graph_arrays(folder / split / f"{stem}.npz", make_graph_arrays(pruned, collection, split))


def run_node_arrays(collection: Collection, work_dir: Path, graphs: pl.DataFrame, prune: StageOutput,
                    force: bool, log: Log, n_jobs: int = 1) -> Ran:
    def compute(folder: Path) -> dict[str, Any]:
        for split in SPLITS:
            (folder / split).mkdir()
        progress = Progress(log, "[node_arrays]", graphs.height)
        jobs = [(folder, prune.path, stem, split, collection.name)
                for stem, split in graphs.select("graph", "split").iter_rows()]
        for _ in map_in_order(_node_arrays_to, jobs, n_jobs):
            progress.step()
        return {"graphs": graphs.height}

    return _run(work_dir, "node_arrays", NODE_ARRAYS_CODE, {"collection": collection.name},
                {"prune": prune.key}, compute, force, log)


# ----------------------------------------------------------------------------- stage: folds


def run_folds(config: PipelineConfig, collection: Collection, work_dir: Path, refs: dict[str, list[GraphRef]],
              force: bool, log: Log) -> Ran:
    labelled = [(ref.stem, split) for split in LABELLED for ref in refs[split]]

    def compute(folder: Path) -> dict[str, Any]:
        table = assign_folds([s for s, _ in labelled], [sp for _, sp in labelled], config.folds.k,
                             config.folds.seed, config.folds.holdout_valid)
        table.write_parquet(folder / FOLDS_TABLE)
        counts = table.group_by("fold").len().sort("fold")
        return {"families": table["family"].n_unique(),
                "graphs_per_fold": {str(f): int(n) for f, n in counts.iter_rows()}}

    return _run(work_dir, "folds", FOLDS_CODE, {"collection": collection.name, **asdict(config.folds)},
                {"graphs": fingerprint(labelled)}, compute, force, log, seeds={"folds": config.folds.seed})


# ----------------------------------------------------------------------------- orchestration


@dataclass
class Prepared:
    """The prepared data of one collection: its stage outputs and how to read them."""

    collection: Collection
    stages: dict[str, StageOutput]
    cached: dict[str, bool] = field(default_factory=dict)  # per stage: reused rather than computed

    @cached_property
    def graph_table(self) -> pl.DataFrame:
        """One row per graph: ``graph``, ``split`` and the prune counts."""
        return pl.read_parquet(self.stages["prune"].file(GRAPHS_TABLE))

    @cached_property
    def _split_of(self) -> dict[str, str]:
        return dict(self.graph_table.select("graph", "split").iter_rows())

    def split_of(self, graph: str) -> str:
        try:
            return self._split_of[graph]
        except KeyError:
            raise PipelineError(f"{self.collection.name}: no graph {graph!r} in the prepared data") from None

    def graphs(self, split: str) -> list[str]:
        """Stems of ``split``, sorted."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        return sorted(self.graph_table.filter(pl.col("split") == split)["graph"].to_list())

    def load_features(self, graphs: Iterable[str], max_configs: int | None = None, seed: int = 0) -> pl.DataFrame:
        """Config feature rows of ``graphs`` (at most ``max_configs`` per graph, a seeded sample kept
        in file order), joined with their ``g_*`` graph aggregates."""
        graphs = list(graphs)
        features = self.stages["features"]
        tables = []
        for stem in graphs:
            table = pl.read_parquet(features.file(f"{self.split_of(stem)}/configs/{stem}.parquet"))
            if max_configs is not None and table.height > max_configs:
                table = table[np.sort(_seeded_rng(seed, stem).choice(table.height, size=max_configs, replace=False))]
            tables.append(table)
        if not tables:
            raise ValueError("load_features needs at least one graph")
        splits = sorted({self.split_of(stem) for stem in graphs})
        aggregates = pl.concat([pl.read_parquet(features.file(f"{split}/{GRAPH_FEATURES}")) for split in splits])
        return pl.concat(tables).join(aggregates, on="graph", how="left")

    def load_graph_arrays(self, graph: str) -> GraphArrays:
        return load_graph_arrays(self.stages["node_arrays"].file(f"{self.split_of(graph)}/{graph}.npz"))

    def folds(self) -> pl.DataFrame:
        """``graph``, ``split``, ``family``, ``fold`` of every train/valid graph (fold -1: holdout)."""
        return pl.read_parquet(self.stages["folds"].file(FOLDS_TABLE))

    def runtimes(self, graph: str) -> np.ndarray:
        """float64 target of every config of the original file in file order (runtime for layout,
        runtime/normalizer for tile; zeros for test), for scoring predictions."""
        return load_file_target(self.stages["prune"].file(f"{self.split_of(graph)}/{graph}.npz"))

    def pruned_graph(self, graph: str) -> PrunedGraph:
        return load_pruned(self.stages["prune"].file(f"{self.split_of(graph)}/{graph}.npz"))


def prepare(config: PipelineConfig, data_root: Path | str, work_dir: Path | str,
            collections: Sequence[Collection | str] | None = None, force: bool = False,
            log: Log = print) -> dict[str, Prepared]:
    """Run (or reuse) the four preparation stages for each collection; ``None`` = every collection
    with a train directory under ``data_root``."""
    data_root, work_dir = Path(data_root), Path(work_dir)
    if collections is None:
        chosen = available_collections(data_root)
    else:
        chosen = [c if isinstance(c, Collection) else parse_collection(c) for c in collections]
    if not chosen:
        raise FormatError(data_root, "no collection to prepare (no train directory found)")
    check_feature_exclusions(config)
    check_output_dir(work_dir, data_root)
    check_data_root(data_root, chosen, config.data.on_bad_file, log)
    # Every collection's file list and folds setting is checked before any stage writes anything.
    refs = {c.name: collection_refs(data_root, c) for c in chosen}
    for c in chosen:
        check_folds(config, c, refs[c.name])
    return {c.name: prepare_collection(config, c, data_root, work_dir, force, log, refs=refs[c.name])
            for c in chosen}


def check_folds(config: PipelineConfig, collection: Collection, refs: dict[str, list[GraphRef]]) -> None:
    """Raise the folds stage's ConfigError now if ``folds`` cannot be met by these graphs (e.g. more
    folds than program families), rather than after the expensive stages ran."""
    labelled = [(ref.stem, split) for split in LABELLED for ref in refs[split]]
    if not labelled:
        return  # reported with the file context by prepare_collection
    try:
        assign_folds([s for s, _ in labelled], [sp for _, sp in labelled], config.folds.k, config.folds.seed,
                     config.folds.holdout_valid)
    except ConfigError as exc:
        raise ConfigError(f"{collection.name}: {exc}") from None


def prepare_collection(config: PipelineConfig, collection: Collection, data_root: Path, work_dir: Path,
                       force: bool = False, log: Log = print,
                       refs: dict[str, list[GraphRef]] | None = None) -> Prepared:
    tagged = tagged_log(log, collection)
    refs = collection_refs(data_root, collection) if refs is None else refs
    if not refs["train"]:
        raise FormatError(collection_dir(data_root, collection, "train"), f"{collection.name}: no train graphs")
    data_key = raw_data_key(data_root, refs)
    ran: dict[str, Ran] = {}
    ran["prune"] = run_prune(config, collection, work_dir, refs, data_key, force, tagged)
    prune = ran["prune"][0]
    for item in prune.metrics.get("skipped_files", []):  # warned on every run, cached or not
        tagged(f"warning: skipped bad file {item['path']}: {item['reason']} (data.on_bad_file = \"skip\")")
    graphs = pl.read_parquet(prune.file(GRAPHS_TABLE))
    kept = set(graphs["graph"].to_list())
    refs = {split: [ref for ref in items if ref.stem in kept] for split, items in refs.items()}
    ran["features"] = run_features(config, collection, work_dir, refs, data_key, prune, force, tagged)
    ran["node_arrays"] = run_node_arrays(collection, work_dir, graphs, prune, force, tagged, config.run.n_jobs)
    ran["folds"] = run_folds(config, collection, work_dir, refs, force, tagged)
    return Prepared(collection, {name: out for name, (out, _) in ran.items()},
                    {name: cached for name, (_, cached) in ran.items()})


# ----------------------------------------------------------------------------- internals


def _run(work_dir: Path, stage: str, code: Code, config: dict[str, Any], inputs: dict[str, str],
         compute: Callable[[Path], dict[str, Any]], force: bool, log: Log,
         seeds: dict[str, int] | None = None) -> Ran:
    """``run_stage`` plus whether it reused a complete output (known from the key beforehand)."""
    cached = not force and _is_complete(work_dir, stage, stage_key(stage, config, inputs, code))
    output = run_stage(work_dir=work_dir, stage=stage, config=config, inputs=inputs, code=code,
                       compute=compute, seeds=seeds, force=force, log=log)
    return output, cached


def _is_complete(work_dir: Path, stage: str, key: str) -> bool:
    try:
        load_stage(work_dir, stage, key)
    except PipelineError:
        return False
    return True


def tagged_log(log: Log, collection: Collection) -> Log:
    """``log`` with every message prefixed by the collection name."""
    return lambda message: log(f"{collection.name} {message}")
