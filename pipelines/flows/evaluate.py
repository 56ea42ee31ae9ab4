"""Score a run's test submission on a synthetic world's hidden labels, next to a floor and a ceiling.

``python -m pipelines evaluate RUN_ID --data-root WORLD`` needs a world with the ``labels/`` sidecar:
one written by ``synth`` (see :mod:`pipelines.synth.world`), by ``synth``'s lowered programs
(:mod:`pipelines.synth.lowered`) or by an outside generator that writes the same sidecar plus
``labels/programs.json`` (each graph's program kind, for the per-family table); the real data has no
test labels and is refused. Every test graph is scored with the competition metric
(:mod:`pipelines.core.metric`: top-5 slowdown for tile, Kendall tau-b for layout) against the measured
runtimes, for:

* ``submission``: the run's ``submission.csv`` (the ensemble);
* each model of the run alone (its test predictions from the run's training stages, normalised per
  fold model and averaged over folds and seeds exactly as the ensemble does before blending);
* the heuristics, no learning and no runtime read: ``identity`` (file order), ``random`` (a
  permutation seeded by the graph's stem), ``baseline`` (:mod:`pipelines.models.baseline`), and the
  single hand-made features of :mod:`pipelines.data.features` that price a layout by what it wastes:
  ``violation_ratio`` (layout) and ``padding_waste`` (layout ``f_pad_waste``, tile
  ``f_tile_waste``). The **floor** of a collection is its best heuristic. It is picked on the test
  labels themselves, so it is an optimistic floor: a model has to beat the best of them in
  hindsight;
* the **ceiling**: configs ranked by their noise-free runtime, scored against the measured ones
  (the best any predictor can do in expectation; below 1 because of measurement noise).

The ratio ``submission / ceiling`` is reported per collection and for the combined score (the
unweighted mean of the five collections), and per test graph with its program family and size
(:func:`per_graph_table`, ``evaluate --per-graph``). The result goes to ``<run folder>/evaluation.json``,
written atomically; a file of that name this module did not write is never replaced.
"""

from __future__ import annotations


import json
import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from pipelines.data.root import DataRoot
from pipelines.core.collection import ALL_COLLECTIONS, Collection
from pipelines.core.errors import FormatError, PipelineError
from pipelines.core.metric import GraphScore, ScoreReport, best_scoring, score_submission_row, summarize
from pipelines.data.tpugraphs import Graph, load_ref

if TYPE_CHECKING:
    from pipelines.core.engine import StageOutput
    from pipelines.flows.scores import CollectionRun
    from pipelines.synth.programs import Family
    from pipelines.synth.world import ProgramLabel

EVALUATION_FILE = "evaluation.json"
GENERATOR = "pipelines.flows.evaluate"
EVALUATION_VERSION = 1
SUBMISSION = "submission"
CEILING = "ceiling"
FLOOR = "floor"
HEURISTIC = "heuristic:"  # entry-name prefix of the heuristics (a model may be called "random" too)

Heuristic = Callable[[Graph], np.ndarray]


# ----------------------------------------------------------------------------- heuristics (pure)


def _identity(graph: Graph) -> np.ndarray:
    return np.arange(graph.num_configs, dtype=np.float64)


def _random(graph: Graph) -> np.ndarray:
    return np.random.default_rng(zlib.crc32(graph.stem.encode())).random(graph.num_configs)


def _layout_feature(column: str) -> Heuristic:
    def costs(graph: Graph) -> np.ndarray:
        from pipelines.data.features import layout_config_features
        from pipelines.data.prune import prune_layout_graph

        pruned, _ = prune_layout_graph(graph, 0, "config_only")  # these features read configurable nodes only
        return layout_config_features(pruned, value_frequency=False)[column].astype(np.float64)
    return costs


def _tile_feature(column: str) -> Heuristic:
    def costs(graph: Graph) -> np.ndarray:
        from pipelines.data.features import tile_config_features

        return tile_config_features(graph.config_feat, graph.node_feat)[column].astype(np.float64)
    return costs


def _baseline(graph: Graph) -> np.ndarray:
    from pipelines.models.baseline import baseline_costs

    return baseline_costs(graph)


def heuristics(collection: Collection) -> dict[str, Heuristic]:
    """The non-learned rankers of a collection (costs: lower = predicted faster; ties by index)."""
    out: dict[str, Heuristic] = {"identity": _identity, "random": _random, "baseline": _baseline}
    if collection.is_tile:
        out["padding_waste"] = _tile_feature("f_tile_waste")
    else:
        out["violation_ratio"] = _layout_feature("f_violation_ratio")
        out["padding_waste"] = _layout_feature("f_pad_waste")
    return out


# ----------------------------------------------------------------------------- scoring (pure)


def truth_of(collection: Collection, runtime: np.ndarray, normalizer: np.ndarray | None) -> np.ndarray:
    """What the metric ranks: runtime / normalizer (tile), the runtime itself (layout)."""
    if collection.is_tile:
        return runtime.astype(np.float64) / normalizer.astype(np.float64)
    return runtime


def costs_row(collection: Collection, costs: np.ndarray) -> list[int]:
    from pipelines.data.submission import submission_row

    return submission_row(collection, costs)


# ----------------------------------------------------------------------------- the evaluation


@dataclass(frozen=True)
class Evaluation:
    """Per entry (submission, models, heuristics, floor, ceiling): a score report over the test split."""

    reports: dict[str, ScoreReport]
    floor_by_collection: dict[str, str]  # collection -> name of its best heuristic
    heuristic_names: tuple[str, ...]
    model_names: tuple[str, ...]
    graph_sizes: pl.DataFrame | None = None  # collection, graph, nodes, config_nodes of each test graph
    node_kinds: pl.DataFrame | None = None  # per collection, entry and node kind: importance, agreement

    def collection_scores(self, entry: str) -> dict[str, float]:
        frame = self.reports[entry].per_collection
        return dict(zip(frame["collection"].to_list(), frame["score"].to_list()))

    def graph_gap(self, entry: str, baseline: str, collection: str) -> tuple[float, float]:
        """:func:`paired_graph_gap` of two entries on one collection's test graphs."""
        def graphs(name: str) -> pl.DataFrame:
            frame = self.reports[name].per_graph
            return frame.filter(frame["collection"] == collection)
        return paired_graph_gap(graphs(entry), graphs(baseline))

    def interval(self, entry: str, baseline: str, collection: str | None = None) -> Any:
        """``entry - baseline`` on the test graphs both score: mean, 95% interval and verdict of the
        paired sign-flip test (:func:`pipelines.outputs.significance.paired_difference`); ``collection``
        None: the combined score (each collection weighted equally)."""
        from pipelines.outputs.significance import paired_difference

        keys = ["collection", "graph"]
        a = self.reports[baseline].per_graph.select(*keys, pl.col("score").alias("a"))
        b = self.reports[entry].per_graph.select(*keys, pl.col("score").alias("b"))
        joined = a.join(b, on=keys, how="inner").filter(pl.col("a").is_not_nan() & pl.col("b").is_not_nan())
        if collection is not None:
            return paired_difference(*(joined.filter(pl.col("collection") == collection)[c].to_numpy()
                                       for c in ("a", "b")))
        counts = joined.group_by("collection").agg(pl.len().alias("_n"))
        joined = joined.join(counts, on="collection").with_columns((1.0 / (pl.col("_n") * counts.height)).alias("_w"))
        return paired_difference(joined["a"].to_numpy(), joined["b"].to_numpy(), joined["_w"].to_numpy())

    def intervals(self) -> dict[str, dict[str, Any]]:
        """The submission against the floor and the ceiling, per collection and combined, as dicts."""
        out: dict[str, dict[str, Any]] = {}
        for baseline in (FLOOR, CEILING):
            rows = {name: self.interval(SUBMISSION, baseline, name).to_dict() for name in self.collection_scores(CEILING)}
            rows["combined"] = self.interval(SUBMISSION, baseline).to_dict()
            out[f"submission-{baseline}"] = rows
        return out

    def to_dict(self) -> dict[str, Any]:
        ceiling = self.collection_scores(CEILING)
        rows: dict[str, dict[str, Any]] = {}
        for name in ceiling:
            row: dict[str, Any] = {entry: self.collection_scores(entry).get(name) for entry in self.reports}
            row["floor_heuristic"] = self.floor_by_collection[name]
            row["ratio_to_ceiling"] = {entry: _ratio(row[entry], ceiling[name]) for entry in self.reports}
            row["graphs"] = int(self.reports[CEILING].per_collection.filter(
                self.reports[CEILING].per_collection["collection"] == name)["graphs"][0])
            rows[name] = row
        combined = {entry: {"value": r.combined.value, "complete": r.combined.complete}
                    for entry, r in self.reports.items()}
        return {"collections": rows, "combined": combined,
                "combined_ratio_to_ceiling": {e: _ratio(c["value"], combined[CEILING]["value"])
                                              for e, c in combined.items()},
                "intervals": self.intervals() if SUBMISSION in self.reports and FLOOR in self.reports else {},
                "heuristics": list(self.heuristic_names), "models": list(self.model_names)}

    def to_text(self) -> str:
        entries = [FLOOR, *self.model_names, SUBMISSION, CEILING]
        width = max(12, *(len(e) for e in entries))
        lines = [f"{'collection':<20} " + " ".join(f"{e:>{width}}" for e in entries)
                 + f" {'sub/ceiling':>11}  floor heuristic"]
        scores = {e: self.collection_scores(e) for e in entries}
        for name in scores[CEILING]:
            cells = " ".join(f"{_num(scores[e].get(name)):>{width}}" for e in entries)
            lines.append(f"{name:<20} {cells} {_num(_ratio(scores[SUBMISSION].get(name), scores[CEILING][name])):>11}"
                         f"  {self.floor_by_collection[name]}")
        combined = {e: self.reports[e].combined for e in entries}
        cells = " ".join(f"{_num(combined[e].value):>{width}}" for e in entries)
        ratio = _ratio(combined[SUBMISSION].value, combined[CEILING].value)
        note = "" if combined[CEILING].complete else "  (NOT the competition score: collections missing)"
        lines.append(f"{'combined':<20} {cells} {_num(ratio):>11}{note}")
        heur = ", ".join(f"{h} {_num(self.reports[HEURISTIC + h].combined.value)}" for h in self.heuristic_names)
        lines.append(f"heuristics (combined, over the collections each applies to): {heur}")
        lines.append("submission - floor on the test graphs (paired sign-flip test, 95% interval):")
        for name in [*scores[CEILING], None]:
            lines.append(f"  {name or 'combined':<20} {self.interval(SUBMISSION, FLOOR, name).text()}")
        return "\n".join(lines)


def paired_graph_gap(scores: pl.DataFrame, baseline: pl.DataFrame) -> tuple[float, float]:
    """Mean per-graph ``score`` of one entry minus another's, and that gap's standard error, paired over
    the graphs (``graph``) both score (undefined, NaN, left out): how far the test's own sample of graphs
    can tell two entries apart (pure)."""
    from pipelines.training.ensemble import paired_gain

    joined = scores.select("graph", "score").join(
        baseline.select("graph", pl.col("score").alias("baseline")), on="graph", how="inner")
    return paired_gain(joined["score"].to_numpy(), joined["baseline"].to_numpy())


def _ratio(score: float | None, ceiling: float | None) -> float | None:
    if score is None or ceiling is None or math.isnan(score) or math.isnan(ceiling) or ceiling == 0:
        return None
    return score / ceiling


def _num(value: float | None) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"


def require_sidecar(data_root: Path | str) -> dict[str, Any]:
    """The world's label record; a data root without the sidecar (e.g. the real data) is refused."""
    from pipelines.synth.world import LABELS_DIR, LABELS_MARKER, read_labels_marker

    marker = read_labels_marker(data_root)
    if marker is None:
        raise PipelineError(
            f"{data_root}: no hidden test labels ({LABELS_DIR}/{LABELS_MARKER} is missing): evaluate needs a "
            "world with hidden labels: one written by `python -m pipelines synth`, or by another generator that "
            "writes the same sidecar (see docs/evaluation.md; the real data has no test labels; re-running synth "
            "on an older world of the same arguments adds the sidecar)")
    return marker


def evaluate_rows(data_root: Path | str, rows: Mapping[str, Mapping[str, Sequence[int]]], *,
                  collections: Sequence[Collection] = ALL_COLLECTIONS,
                  heuristic_sets: Callable[[Collection], dict[str, Heuristic]] = heuristics) -> Evaluation:
    """Score submission rows (``rows[entry][submission_id]``) plus heuristics and the ceiling on the
    test split of a world with hidden labels. Graphs are loaded one at a time."""
    from pipelines.synth.world import read_labels

    require_sidecar(data_root)
    scored: dict[str, list[GraphScore]] = {entry: [] for entry in rows}
    scored[CEILING] = []
    sizes: list[tuple[str, str, int, int | None]] = []
    heuristic_names: list[str] = []
    for collection in collections:
        named = heuristic_sets(collection)
        heuristic_names += [h for h in named if h not in heuristic_names]
        for ref in DataRoot(data_root).graphs(collection, "test"):
            labels = read_labels(data_root, collection, "test", ref.stem)
            graph = load_ref(ref)
            if labels.runtime.shape[0] != graph.num_configs:
                raise FormatError(ref.path, f"{graph.num_configs} configs but {labels.runtime.shape[0]} hidden labels")
            truth = truth_of(collection, labels.runtime, labels.normalizer)
            config_nodes = int(graph.node_config_ids.shape[0]) if collection.kind == "layout" else None
            sizes.append((collection.name, ref.stem, graph.num_nodes, config_nodes))

            def score(indices: Sequence[int]) -> GraphScore:
                return score_submission_row(collection.name, ref.stem, indices, truth)

            for entry, entry_rows in rows.items():
                if ref.submission_id not in entry_rows:
                    raise PipelineError(f"{entry}: no row for test graph {ref.submission_id}")
                scored[entry].append(score(entry_rows[ref.submission_id]))
            scored[CEILING].append(score(costs_row(collection, labels.noise_free)))
            for name, costs in named.items():
                scored.setdefault(HEURISTIC + name, []).append(score(costs_row(collection, costs(graph))))
    reports = {entry: summarize(graph_scores) for entry, graph_scores in scored.items()}
    floor_by_collection: dict[str, str] = {}
    floor_scores: list[GraphScore] = []
    for collection in collections:
        applicable = list(heuristic_sets(collection))
        means = {h: reports[HEURISTIC + h].collection_score(collection.name) for h in applicable}
        best = best_scoring(means)
        floor_by_collection[collection.name] = best
        floor_scores += [g for g in scored[HEURISTIC + best] if g.collection == collection.name]
    reports[FLOOR] = summarize(floor_scores)
    models = tuple(e for e in rows if e != SUBMISSION)  # everything else the caller passed
    graph_sizes = pl.DataFrame(sizes, schema={"collection": pl.Utf8, "graph": pl.Utf8, "nodes": pl.Int64,
                                              "config_nodes": pl.Int64}, orient="row")
    return Evaluation(reports, floor_by_collection, tuple(heuristic_names), models, graph_sizes)


# ----------------------------------------------------------------------------- a run's entries


def model_rows(manifest: Mapping[str, Any], work_dir: Path | None, *,
               per_seed: bool = False) -> dict[str, dict[str, list[int]]]:
    """Submission rows of each model of a run alone (with ``per_seed``: of each of its run seeds alone), from
    its saved training stages (see module doc)."""
    from pipelines.outputs.run_folders import load_named_stage, training_stage_dir

    method = (manifest.get("config") or {}).get("ensemble", {}).get("method", "minmax")
    outputs: list[tuple[str, StageOutput]] = []
    for collection, stages in manifest["stages"].items():
        for model, where in stages.get("train", {}).items():
            folder = training_stage_dir(where, manifest, work_dir)  # a clean error when neither records it
            outputs.append((model, load_named_stage(folder, where["stage"], where["key"],
                                                    f"the saved {model} training output of {collection}")))
    return trained_rows(outputs, method, per_seed=per_seed)


def trained_rows(outputs: Sequence[tuple[str, StageOutput]], method: str, *,
                  per_seed: bool = False) -> dict[str, dict[str, list[int]]]:
    """Submission rows of each (model name, training output) alone, its test scores normalised as a blend would;
    with ``per_seed``, of each of its run seeds alone instead (entries :func:`seed_entry`)."""
    from pipelines.training.ensemble import prepare_model_scores
    from pipelines.flows.scores import submission_rows
    from pipelines.training.fit import load_predictions

    out: dict[str, dict[str, list[int]]] = {}
    for model, output in outputs:
        test = load_predictions(output)
        test = test.filter(test["split"] == "test").with_columns(pl.lit(model).alias("model"))
        parts = ([(seed_entry(model, seed), test.filter(test["seed"] == seed))
                  for seed in sorted(test["seed"].unique().to_list())] if per_seed else [(model, test)])
        for entry, part in parts:
            out.setdefault(entry, {}).update(submission_rows(prepare_model_scores(part, method)))
    return out


_SEED = " seed "


def seed_entry(model: str, seed: int) -> str:
    """The entry of one run seed of a model (its fold models of that seed averaged) in a seed evaluation."""
    return f"{model}{_SEED}{seed}"


def evaluate_collection_runs(runs: Sequence[CollectionRun], data_root: Path | str, *, method: str) -> Evaluation:
    """Score some collections of a run that was not published (``pipelines.flows.run.train_and_blend``) on a
    world's hidden labels: each model alone and the blend (as ``submission``), floor and ceiling. The
    combined figures are then over these collections only."""
    from pipelines.training.ensemble import load_blended_test
    from pipelines.flows.scores import submission_rows

    rows: dict[str, Mapping[str, Sequence[int]]] = dict(
        trained_rows([(model, output) for run in runs for model, output in run.trained.items()], method))
    blended: dict[str, list[int]] = {}
    for run in runs:
        blended.update(submission_rows(load_blended_test(run.ensemble)))
    rows[SUBMISSION] = blended
    return evaluate_rows(data_root, rows, collections=[run.collection for run in runs])


def evaluate_collection_seeds(runs: Sequence[CollectionRun], data_root: Path | str, *, method: str) -> Evaluation:
    """Each model of :func:`evaluate_collection_runs` scored once per run seed (entries :func:`seed_entry`):
    how far its seeds alone spread, which is what the ensemble's distance to the best model is judged by."""
    rows = trained_rows([(model, output) for run in runs for model, output in run.trained.items()], method,
                         per_seed=True)
    return evaluate_rows(data_root, rows, collections=[run.collection for run in runs])


@dataclass(frozen=True)
class SeedCheck:
    """One collection: the ensemble against the model that scores best on test, and that model's seed spread."""

    collection: str
    best_model: str
    best_score: float
    seed_scores: tuple[float, ...]  # the best model's run seeds alone, in seed order
    ensemble_score: float
    gap_se: float = math.nan  # the standard error of ``gap`` paired over the test graphs (nan: not known)

    @property
    def spread(self) -> float:
        """max - min of the seed scores (0 with one seed, nan with none: not known)."""
        return max(self.seed_scores) - min(self.seed_scores) if self.seed_scores else math.nan

    @property
    def gap(self) -> float:
        """ensemble - best single model (negative: below it)."""
        return self.ensemble_score - self.best_score

    @property
    def within_spread(self) -> bool:
        """At or above the best model, or below it by at most the spread (not known: False)."""
        return self.gap >= 0 or self.gap >= -self.spread


def seed_checks(evaluation: Evaluation, seeds: Evaluation) -> list[SeedCheck]:
    """Per collection of ``evaluation`` (models and ensemble), the :class:`SeedCheck` against ``seeds``
    (:func:`evaluate_collection_seeds` or ``model_rows(..., per_seed=True)`` of the same runs)."""
    checks = []
    for collection, ensemble in evaluation.collection_scores(SUBMISSION).items():
        scores = {m: evaluation.collection_scores(m).get(collection, math.nan) for m in evaluation.model_names}
        best = best_scoring(scores)
        best_seeds = sorted((int(seed), entry) for entry in seeds.model_names
                            for model, _, seed in [entry.rpartition(_SEED)] if model == best and seed.isdigit())
        _, gap_se = evaluation.graph_gap(SUBMISSION, best, collection)
        checks.append(SeedCheck(collection, best, scores[best],
                                tuple(seeds.collection_scores(entry)[collection] for _, entry in best_seeds), ensemble,
                                gap_se))
    return checks


def node_kind_table(data_root: Path | str, rows: Mapping[str, Mapping[str, Sequence[int]]],
                    families: Mapping[tuple[str, str], str] | None = None) -> pl.DataFrame:
    """Per layout collection, entry (submission, each model) and kind of configurable node
    (:mod:`pipelines.data.node_kinds`): how many such nodes the test graphs hold, their share of the
    importance (how much their layout choices move the noise-free runtime) and the importance-weighted
    agreement of the entry's order with those effects (1: follows them, 0: blind, < 0: backwards).
    With ``families`` ((collection, stem) -> program family, :func:`pipelines.synth.world.program_kinds`),
    per program family too: a ``program_family`` column, the shares summing to 1 within each family."""
    from pipelines.data.node_kinds import configurable_node_kinds, node_effects
    from pipelines.synth.world import read_labels

    parts = []
    for collection in ALL_COLLECTIONS:
        if collection.is_tile:
            continue
        for ref in DataRoot(data_root).graphs(collection, "test"):
            graph = load_ref(ref)
            truth = read_labels(data_root, collection, "test", ref.stem).noise_free
            kinds = configurable_node_kinds(graph.node_feat, graph.node_opcode, graph.edge_index, graph.node_config_ids)
            for entry, entry_rows in rows.items():
                order = np.asarray(entry_rows[ref.submission_id], dtype=np.int64)
                position = np.empty(graph.num_configs, np.float64)
                position[order] = np.arange(order.shape[0], dtype=np.float64)
                importance, agreement = node_effects(graph.node_config_feat, truth, position)
                parts.append(pl.DataFrame({"collection": collection.name, "entry": entry, "graph": ref.stem,
                                           "program_family": (families or {}).get((collection.name, ref.stem)),
                                           "kind": kinds, "importance": importance, "agreement": agreement},
                                          schema_overrides={"program_family": pl.Utf8}))
    within = ["collection", "program_family", "entry"] if families is not None else ["collection", "entry"]
    if not parts:
        return pl.DataFrame(schema={**{name: pl.Utf8 for name in within}, "kind": pl.Utf8, "nodes": pl.UInt32,
                                    "importance_share": pl.Float64, "agreement": pl.Float64})
    nodes = pl.concat(parts)
    weighted = pl.when(pl.col("agreement").is_nan()).then(0.0).otherwise(pl.col("importance") * pl.col("agreement"))
    known = pl.when(pl.col("agreement").is_nan()).then(0.0).otherwise(pl.col("importance"))
    table = (nodes.group_by(*within, "kind", maintain_order=True)
             .agg(pl.len().alias("nodes"), pl.col("importance").sum().alias("_importance"),
                  weighted.sum().alias("_weighted"), known.sum().alias("_known")))
    totals = table.group_by(within).agg(pl.col("_importance").sum().alias("_total"))
    return (table.join(totals, on=within, nulls_equal=True)
            # no share or agreement where no node's choices could be told apart (too few configs per choice)
            .with_columns(pl.when(pl.col("_total") > 0).then(pl.col("_importance") / pl.col("_total"))
                          .alias("importance_share"),
                          pl.when(pl.col("_known") > 0).then(pl.col("_weighted") / pl.col("_known")).alias("agreement"))
            .select(*within, "kind", "nodes", "importance_share", "agreement")
            .sort(*within, "importance_share", descending=[False] * len(within) + [True]))


def node_kind_text(table: pl.DataFrame) -> str:
    """The per-node-kind table as printed lines (with a family column where it is split by program family)."""
    by_family = "program_family" in table.columns
    family = f"{'family':<12} " if by_family else ""
    lines = [f"{'collection':<20} {family}{'entry':<12} {'node kind':<24} {'nodes':>5} {'share':>6} {'agreement':>9}"]
    for row in table.iter_rows(named=True):
        agreement = "-" if row["agreement"] is None else f"{row['agreement']:+.3f}"
        share = "-" if row["importance_share"] is None else f"{row['importance_share']:.3f}"
        family = f"{row['program_family'] or '-':<12} " if by_family else ""
        lines.append(f"{row['collection']:<20} {family}{row['entry']:<12} {row['kind']:<24} {row['nodes']:>5} "
                     f"{share:>6} {agreement:>9}")
    return "\n".join(lines)


def evaluate_run(run_id: str, data_root: Path | str, *, submissions_dir: Path | str = "submissions",
                 work_dir: Path | str | None = None, with_models: bool = True,
                 node_kinds: bool = False, node_kinds_by_family: bool = False) -> tuple[Evaluation, Path]:
    """Evaluate a run on a world with hidden labels and write ``evaluation.json`` into its folder
    (``node_kinds``: with the per-node-kind table, split by program family if ``node_kinds_by_family``)."""
    from pipelines.outputs.run_folders import RUN_MANIFEST, SUBMISSION_FILE, read_run_manifest, resolve_run_id
    from pipelines.data.submission import read_submission, validate_submission

    data_root = Path(data_root)
    run_id = resolve_run_id(submissions_dir, run_id)  # a unique prefix or a run's name works too
    marker = require_sidecar(data_root)
    run_dir = Path(submissions_dir) / run_id
    manifest = read_run_manifest(submissions_dir, run_id)
    submission = run_dir / SUBMISSION_FILE
    if not submission.is_file():
        raise PipelineError(f"{submission}: the run has no submission file")
    out = run_dir / EVALUATION_FILE
    _check_ours(out)
    validate_submission(submission, data_root, split="test")  # other IDs: the run was made for another world
    rows: dict[str, Mapping[str, Sequence[int]]] = {}
    if with_models:
        rows.update(model_rows(manifest, None if work_dir is None else Path(work_dir)))
    rows[SUBMISSION] = read_submission(submission)
    evaluation = evaluate_rows(data_root, rows)
    from pipelines.synth.world import program_families

    families = program_families(data_root)  # the per-graph rows' programs; their kinds split the node table
    if node_kinds:
        kinds = {key: family.kind for key, family in families.items()} if node_kinds_by_family else None
        evaluation = replace(evaluation, node_kinds=node_kind_table(data_root, rows, kinds))
    record = {
        "generator": GENERATOR, "version": EVALUATION_VERSION, "run_id": run_id,
        "run_manifest": RUN_MANIFEST, "submission_sha256": (manifest.get("submission") or {}).get("sha256"),
        "data_root": str(data_root.resolve()),
        "world": {k: marker.get(k) for k in ("generator", "scale", "seed", "variant", "family", "limit",
                                             "collections")},
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **evaluation.to_dict(),
        "per_graph": per_graph_table(evaluation, families).to_dicts(),
        **({"per_node_kind": evaluation.node_kinds.to_dicts()} if evaluation.node_kinds is not None else {}),
    }
    _write_evaluation(out, record)
    return evaluation, out


def _check_ours(path: Path) -> None:
    """An existing evaluation file may be replaced only when this module wrote it."""
    if not path.exists():
        return
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        found = None
    if not isinstance(found, dict) or found.get("generator") != GENERATOR:
        raise PipelineError(f"{path}: exists and was not written by `evaluate`; refusing to overwrite it")


def _write_evaluation(path: Path, record: dict[str, Any]) -> None:
    from pipelines.core.engine import write_json_atomic

    _check_ours(path)
    write_json_atomic(path, record)


def read_evaluation(run_dir: Path | str) -> dict[str, Any] | None:
    """A run folder's evaluation record, or None when it has none (for the report)."""
    path = Path(run_dir) / EVALUATION_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise FormatError(path, f"unreadable evaluation ({exc})") from None
    return record if isinstance(record, dict) and record.get("generator") == GENERATOR else None


def evaluation_table(record: Mapping[str, Any]) -> pl.DataFrame:
    """One row per collection (and ``combined``): floor, each model, submission, ceiling, ratio."""
    models = list(record.get("models") or [])
    entries = [FLOOR, *models, SUBMISSION, CEILING]
    rows = []
    for name, row in (record.get("collections") or {}).items():
        rows.append({"collection": name, **{e: row.get(e) for e in entries},
                     "submission/ceiling": (row.get("ratio_to_ceiling") or {}).get(SUBMISSION),
                     "floor heuristic": row.get("floor_heuristic")})
    combined = record.get("combined") or {}
    rows.append({"collection": "combined", **{e: (combined.get(e) or {}).get("value") for e in entries},
                 "submission/ceiling": (record.get("combined_ratio_to_ceiling") or {}).get(SUBMISSION),
                 "floor heuristic": "-"})
    schema = {"collection": pl.Utf8, **{e: pl.Float64 for e in entries}, "submission/ceiling": pl.Float64,
              "floor heuristic": pl.Utf8}
    return pl.DataFrame(rows, schema=schema)


# ----------------------------------------------------------------------------- per program family (issue 67)


def program_family_table(evaluation: Evaluation, kinds: Mapping[tuple[str, str], str],
                         entry: str = SUBMISSION) -> pl.DataFrame:
    """Per (collection, program family): ``entry``'s mean score, the ceiling's, their ratio and the
    number of test graphs (pure). ``kinds`` maps (collection, stem) to the graph's program family
    (:func:`pipelines.synth.world.program_kinds`); graphs it does not know are ``unknown``."""
    def per_graph(name: str) -> pl.DataFrame:
        frame = evaluation.reports[name].per_graph.select("collection", "graph", "score")
        return frame.with_columns(pl.struct("collection", "graph").map_elements(
            lambda row: kinds.get((row["collection"], row["graph"]), "unknown"),
            return_dtype=pl.Utf8).alias("program_family"))

    keys = ["collection", "program_family"]
    order = {c.name: i for i, c in enumerate(ALL_COLLECTIONS)}
    ceiling = per_graph(CEILING).group_by(keys).agg(pl.col("score").mean().alias("ceiling"),
                                                    pl.len().alias("graphs"))
    score = per_graph(entry).group_by(keys).agg(pl.col("score").mean().alias("score"))
    table = score.join(ceiling, on=keys, how="right").with_columns(
        # a share of a ceiling at or below 0 (no ranking beats chance there) means nothing: left empty
        pl.when(pl.col("ceiling") > 0).then(pl.col("score") / pl.col("ceiling")).otherwise(None)
        .alias("share_of_ceiling"),
        pl.col("collection").replace_strict(order, default=len(order), return_dtype=pl.Int64).alias("_order"))
    return table.sort("_order", "program_family").select(
        "collection", "program_family", "score", "ceiling", "share_of_ceiling", pl.col("graphs").cast(pl.Int64))


def per_graph_table(evaluation: Evaluation,
                    families: Mapping[tuple[str, str], Family | ProgramLabel]) -> pl.DataFrame:
    """One row per test graph (pure): its collection and stem, program family kind and architecture
    (``families``, :func:`pipelines.synth.world.program_families`; ``unknown`` where it has none),
    nodes, configurable nodes and configs, the score of each model, the submission, the floor and the
    ceiling, and ``share_of_ceiling`` (submission / ceiling). Worst share first within a collection."""
    keys = ["collection", "graph"]
    entries = [*evaluation.model_names, SUBMISSION, FLOOR, CEILING]
    table = evaluation.reports[CEILING].per_graph.select(*keys, "num_configs")
    for entry in entries:
        table = table.join(evaluation.reports[entry].per_graph.select(*keys, pl.col("score").alias(entry)),
                           on=keys, how="left")
    if evaluation.graph_sizes is not None:
        table = table.join(evaluation.graph_sizes, on=keys, how="left")
    else:
        table = table.with_columns(pl.lit(None, pl.Int64).alias("nodes"), pl.lit(None, pl.Int64).alias("config_nodes"))

    def described(row: Mapping[str, Any], field: str) -> str:
        family = families.get((row["collection"], row["graph"]))
        return "unknown" if family is None else getattr(family, field)
    order = {c.name: i for i, c in enumerate(ALL_COLLECTIONS)}
    return table.with_columns(
        pl.struct(*keys).map_elements(lambda row: described(row, "kind"), return_dtype=pl.Utf8).alias("program_family"),
        pl.struct(*keys).map_elements(lambda row: described(row, "name"), return_dtype=pl.Utf8).alias("program"),
        pl.when(pl.col(CEILING) > 0).then(pl.col(SUBMISSION) / pl.col(CEILING)).otherwise(None).alias("share_of_ceiling"),
        pl.col("collection").replace_strict(order, default=len(order), return_dtype=pl.Int64).alias("_order"),
    ).sort("_order", "share_of_ceiling", "graph", nulls_last=True).select(
        *keys, "program_family", "program", "nodes", "config_nodes", "num_configs", *entries, "share_of_ceiling")


def per_graph_text(table: pl.DataFrame) -> str:
    """The per-graph table as ``evaluate --per-graph`` prints it (``cnodes``: configurable nodes)."""
    entries = [c for c in table.columns[7:] if c != "share_of_ceiling"]
    width = max(9, *(len(e) for e in entries))
    lines = [f"{'collection':<20} {'graph':<24} {'program':<22} {'nodes':>6} {'cnodes':>6} {'configs':>7} "
             + " ".join(f"{e:>{width}}" for e in entries) + f" {'share':>6}"]
    for row in table.iter_rows(named=True):
        program = f"{row['program_family']}/{row['program']}"
        lines.append(f"{row['collection']:<20} {row['graph'][:24]:<24} {program[:22]:<22} {_count(row['nodes']):>6} "
                     f"{_count(row['config_nodes']):>6} {row['num_configs']:>7} "
                     + " ".join(f"{_num(row[e]):>{width}}" for e in entries) + f" {_num(row['share_of_ceiling']):>6}")
    return "\n".join(lines)


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def program_family_text(table: pl.DataFrame) -> str:
    """The per-program-family table as printed by ``evaluate``."""
    lines = [f"{'collection':<20} {'program family':<14} {'score':>8} {'ceiling':>8} {'share':>8} {'graphs':>6}"]
    for row in table.iter_rows(named=True):
        lines.append(f"{row['collection']:<20} {row['program_family']:<14} {_num(row['score']):>8} "
                     f"{_num(row['ceiling']):>8} {_num(row['share_of_ceiling']):>8} {row['graphs']:>6}")
    return "\n".join(lines)
