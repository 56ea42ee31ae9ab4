"""Shared helpers of the analysis notebooks (``notebooks/``) and the run report.

The notebooks stay thin: they pick :class:`NotebookSettings` from the environment, run the cached
pipeline stages for each variant of an ablation (:func:`train_variants`), and read every result
back from the stage outputs' files and manifests (never from objects held in memory), so a
notebook re-run reuses what it already computed.

Pieces, in the house order (pure functions first, thin I/O shells after):

* settings: :func:`notebook_settings` reads ``TPUGRAPHS_CONFIG`` and ``TPUGRAPHS_SET`` (see its docstring);
* pure tables: :func:`cell_scores` (one mean score per fold x seed cell), :func:`summarize_cells`
  (mean and spread), :func:`blend_by_seed` (the ensemble of saved OOF predictions per seed),
  :func:`weight_curve` (score along the two-model blend weight), :func:`importance_table`,
  :func:`opcode_mix`, :func:`runtime_spread`;
* I/O shells: :func:`prepare_world`, :func:`graph_facts` (raw files, one at a time),
  :func:`train_variants`, :func:`load_scores`, :func:`load_importance`, :func:`run_outputs` (the
  stage outputs a run manifest names), :func:`hidden_label_weight_curve` (the blend-weight curve on
  a synthetic world's hidden test labels);
* plots (matplotlib, Agg backend): :func:`errorbar_plot`, :func:`save_figure`.

Spread: Kendall tau on a few graphs is noisy, so every comparison is run over several folds and
seeds. A *cell* is one fold model of one seed scored on the graphs it held out; ``std_cells`` is
the standard deviation over cells (fold-to-fold plus seed-to-seed noise), ``std_seeds`` the
standard deviation over seeds of the whole OOF score (only model randomness), and ``sem`` the
standard error of the mean over cells.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from pipelines.data.root import DataRoot
from pipelines.core import paths
from pipelines.core.engine import StageOutput
from pipelines.core.errors import ConfigError, PipelineError
from pipelines.core.stage_files import read_parquet

logger = logging.getLogger(__name__)

# One collection per kind: where the tile and the layout ablations differ.
SMOKE_COLLECTIONS = ("tile:xla", "layout:xla:default")
SMOKE_MODELS = ("gbdt", "feature", "random")
LAYOUT_COLLECTIONS = ("layout:xla:default", "layout:xla:random", "layout:nlp:default", "layout:nlp:random")
ALL_COLLECTION_NAMES = ("tile:xla", *LAYOUT_COLLECTIONS)

# Hand-made feature groups of pipelines.data.features, by f_* column prefix (layout and tile names).
FEATURE_GROUPS: dict[str, tuple[str, ...]] = {
    "violation ratio": ("f_violation_ratio",),
    "padding cost": ("f_pad_", "f_tile_waste", "f_tile_count"),
    "implied copies": ("f_implied_copies", "f_out_off_default"),
    "value frequencies": ("f_freq_",),
    "layout chains": ("f_chain_",),
    "tile vector registers": ("f_tile_out_", "f_tile_in_", "f_tile_kernel_", "f_tile_minor_", "f_tile_log_"),
}


# ----------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class NotebookSettings:
    """Where a notebook reads and writes and how much it runs."""

    smoke: bool
    data_root: Path
    work_dir: Path
    submissions_dir: Path
    scale: str  # synthetic world generated at data_root when missing
    config: str  # base config name (pipelines/configs)
    folds: int
    seeds: tuple[int, ...]
    collections: tuple[str, ...]
    overrides: tuple[str, ...] = field(default=())
    models: tuple[str, ...] | None = None  # models a notebook may train; None: every registered one
    run_id: str | None = None  # the run notebook 05 reads; None: the newest
    temporary: Path | None = None  # the scratch folder made for this notebook (smoke mode), removed by finish()

    def config_overrides(self, *extra: str) -> list[str]:
        """``--set``-style overrides of every run of the notebook, then ``extra`` (a variant's)."""
        seeds = ", ".join(str(s) for s in self.seeds)
        return [f"folds.k={self.folds}", f"run.seeds=[{seeds}]", *self.overrides, *extra]

    def describe(self) -> str:
        mode = "SMOKE (tiny world, numbers mean nothing)" if self.smoke else f"{self.scale} world"
        models = ", ".join(self.models) if self.models is not None else "all registered"
        return (f"{mode}: data {self.data_root}, work {self.work_dir}, config {self.config}, "
                f"{self.folds} folds x {len(self.seeds)} seeds {list(self.seeds)}, "
                f"collections {', '.join(self.collections)}; models {models}")


CONFIG_ENV = "TPUGRAPHS_CONFIG"  # the pipeline config: a name in pipelines/configs or a TOML file
SET_ENV = "TPUGRAPHS_SET"  # ";"-separated key=value overrides: pipeline keys, and notebook.* keys
NOTEBOOK_KEYS = ("smoke", "scratch", "data_root", "work_dir", "submissions_dir", "collections", "run_id")


def notebook_settings(environ: Mapping[str, str] | None = None) -> NotebookSettings:
    """Settings from the environment (``os.environ`` by default): the one config mechanism of the
    pipeline, a config plus overrides, read from two variables.

    ``TPUGRAPHS_CONFIG`` names the pipeline config (a name in ``pipelines/configs`` or a ``.toml``
    file; default ``quick``). ``TPUGRAPHS_SET`` holds ``key=value`` overrides separated by ``;``
    (values are TOML literals, as for ``--set``): pipeline keys (``folds.k=3``, ``run.seeds=[4, 5]``,
    ``run.models=["gbdt"]``, ``prune.hops=2`` ...) are validated by :func:`pipelines.config.settings.load_config`
    before anything runs; ``notebook.<key>`` keys set where the notebooks read and write:
    ``notebook.data_root``, ``notebook.work_dir``, ``notebook.submissions_dir``,
    ``notebook.collections`` (``["tile:xla"]``), ``notebook.run_id`` (notebook 05's run, default the
    newest), ``notebook.scratch`` and ``notebook.smoke``.

    ``TPUGRAPHS_CONFIG=smoke`` is the smoke mode: the ``tiny`` world in a scratch folder (a new
    temporary one unless ``notebook.scratch`` names it), 2 folds, 2 seeds, two collections and the
    tiny models of the ``smoke`` config, without the GNN (whose fits take tens of seconds even
    there; ``run.models`` brings it back); this is what the test suite runs. Otherwise the
    ``small`` world at ``data/synthetic-small``, 5 folds and 3 seeds over every collection.
    """
    from pipelines.config.settings import load_config, parse_override

    env = dict(os.environ if environ is None else environ)
    config_name = env.get(CONFIG_ENV, "").strip() or "quick"
    notebook: dict[str, Any] = {}
    overrides: list[str] = []
    for text in (part.strip() for part in env.get(SET_ENV, "").split(";")):
        if not text:
            continue
        keys, value = parse_override(text, f"{SET_ENV} entry {text!r}")
        if keys[0] != "notebook":
            overrides.append(text)
        elif len(keys) != 2 or keys[1] not in NOTEBOOK_KEYS:
            raise ConfigError(f"{SET_ENV} entry {text!r}: unknown notebook key; expected one of "
                              + ", ".join(f"notebook.{k}" for k in NOTEBOOK_KEYS))
        else:
            notebook[keys[1]] = value
    smoke = bool(notebook.get("smoke", Path(config_name).stem == "smoke"))
    if smoke:
        temporary = None if notebook.get("scratch") else Path(tempfile.mkdtemp(prefix="tpugraphs-smoke-"))
        scratch = Path(notebook.get("scratch") or temporary)
        defaults = dict(data_root=scratch / "tiny-world", work_dir=scratch / "work",
                        submissions_dir=scratch / "submissions", scale="tiny", overrides=["run.seeds=[0, 1]"],
                        collections=SMOKE_COLLECTIONS, models=SMOKE_MODELS)
    else:
        temporary = None
        defaults = dict(data_root=paths.DEMO_DATA_ROOT, work_dir=paths.WORK_DIR,
                        submissions_dir=paths.SUBMISSIONS_DIR, scale="small",
                        overrides=["folds.k=5", "run.seeds=[0, 1, 2]"],
                        collections=ALL_COLLECTION_NAMES, models=None)
    config = load_config(config_name, [*defaults["overrides"], *overrides])  # every value checked here
    collections = defaults["collections"]
    if "collections" in notebook:
        from pipelines.core.collection import parse_collection

        listed = notebook["collections"]
        if not isinstance(listed, list) or not listed:
            raise ConfigError(f"{SET_ENV}: notebook.collections must be a non-empty list such as [\"tile:xla\"], "
                              f"got {listed!r}")
        collections = tuple(parse_collection(str(c)).name for c in listed)
    models_given = any(parse_override(text, SET_ENV)[0][:2] == ["run", "models"] for text in overrides)
    return NotebookSettings(
        smoke=smoke,
        data_root=Path(notebook.get("data_root") or defaults["data_root"]),
        work_dir=Path(notebook.get("work_dir") or defaults["work_dir"]),
        submissions_dir=Path(notebook.get("submissions_dir") or defaults["submissions_dir"]),
        scale=defaults["scale"],
        config=config_name,
        folds=config.folds.k, seeds=tuple(config.run.seeds), collections=collections,
        overrides=tuple(overrides),
        models=tuple(config.run.models) if models_given else defaults["models"],
        run_id=str(notebook["run_id"]) if notebook.get("run_id") else None,
        temporary=temporary,
    )


def finish(settings: NotebookSettings, figures: Path) -> str:
    """A notebook's last cell: says where its figures went, and removes the temporary scratch folder
    of a smoke run (figures with it; ``notebook.scratch`` names a folder that is kept)."""
    import shutil

    names = sorted(p.name for p in Path(figures).glob("*.png"))
    text = f"figures: {len(names)} PNG file(s) in {figures}" + (f" ({', '.join(names)})" if names else "")
    if settings.temporary is not None:
        shutil.rmtree(settings.temporary, ignore_errors=True)
        text += (f"\nremoved the smoke scratch folder {settings.temporary} (and the figures in it); "
                 "TPUGRAPHS_SET=\"notebook.scratch='DIR'\" keeps them in DIR")
    return text


# ----------------------------------------------------------------------------- pure tables

CELL_KEYS = ("collection", "seed", "fold")


def cell_scores(scores: pl.DataFrame) -> pl.DataFrame:
    """Mean per-graph score of every (collection, seed, fold) cell of a training ``scores.parquet``
    frame (out-of-fold rows; undefined NaN graph scores left out), plus the graphs it averaged."""
    oof = scores.filter((pl.col("split") == "oof") & pl.col("score").is_not_nan())
    return (oof.group_by(*CELL_KEYS)
            .agg(pl.col("score").mean(), pl.len().alias("graphs"))
            .sort(*CELL_KEYS))


def summarize_cells(cells: pl.DataFrame, by: Sequence[str]) -> pl.DataFrame:
    """Mean and spread of cell scores per group ``by`` (see the module docstring):
    ``mean`` (= mean over seeds of the per-seed mean over cells), ``std_seeds``, ``std_cells``,
    ``sem`` (std_cells / sqrt(cells)), ``cells``, ``seeds``."""
    by = list(by)
    per_seed = cells.group_by(*by, "seed").agg(pl.col("score").mean().alias("seed_score"))
    seeds = per_seed.group_by(*by).agg(pl.col("seed_score").mean().alias("mean"),
                                       pl.col("seed_score").std(ddof=0).alias("std_seeds"),
                                       pl.len().alias("seeds"))
    spread = cells.group_by(*by).agg(pl.col("score").std(ddof=1).fill_null(0.0).alias("std_cells"),
                                     pl.len().alias("cells"))
    return (seeds.join(spread, on=by)
            .with_columns((pl.col("std_cells") / pl.col("cells").cast(pl.Float64).sqrt()).alias("sem"))
            .select(*by, "mean", "std_seeds", "std_cells", "sem", "cells", "seeds")
            .sort(by))


def paired_differences(cells: pl.DataFrame, baseline: str, by: Sequence[str] = ("collection",)) -> pl.DataFrame:
    """Each variant's cell score minus the ``baseline`` variant's score in the same (fold, seed) cell
    (same graphs, same seed): the paired view that cancels most fold-to-fold noise. ``cells`` needs
    ``variant``, ``seed``, ``fold``, ``score`` and the ``by`` columns; baseline rows are dropped."""
    keys = [*by, "seed", "fold"]
    base = cells.filter(pl.col("variant") == baseline).select(*keys, pl.col("score").alias("_baseline"))
    if base.height == 0:
        raise ConfigError(f"no cell of the baseline variant {baseline!r}")
    return (cells.filter(pl.col("variant") != baseline).join(base, on=keys, how="inner")
            .with_columns((pl.col("score") - pl.col("_baseline")).alias("score")).drop("_baseline"))


def graph_metric_scores(blended: pl.DataFrame, truths: Mapping[str, np.ndarray], collection: str) -> pl.DataFrame:
    """Per-graph competition metric of one prediction frame (one row per config and graph):
    ``graph``, ``fold``, ``score``; graphs with an undefined metric get NaN."""
    from pipelines.training.ensemble import competition_metric

    metric = competition_metric(collection)
    rows = []
    for (graph,), part in blended.sort("graph", "config_index").partition_by("graph", as_dict=True,
                                                                              maintain_order=True).items():
        truth = np.asarray(truths[graph])[part["config_index"].to_numpy()]
        rows.append({"graph": graph, "fold": int(part["fold"][0]),
                     "score": float(metric(part["score"].to_numpy(), truth))})
    return pl.DataFrame(rows, schema={"graph": pl.Utf8, "fold": pl.Int64, "score": pl.Float64})


def _model_rows(predictions: Mapping[str, pl.DataFrame], collection: str, split: str) -> pl.DataFrame:
    """Every model's ``split`` rows of ``collection``, each tagged with the model's name."""
    return pl.concat([frame.filter((pl.col("split") == split) & (pl.col("collection") == collection))
                      .with_columns(pl.lit(name).alias("model")) for name, frame in predictions.items()])


def _shared_seeds(frame: pl.DataFrame, models: Sequence[str], collection: str, what: str) -> list[int]:
    """The run seeds every model of ``frame`` has, sorted; a PipelineError when there is none."""
    seeds = sorted(set.intersection(*(set(frame.filter(pl.col("model") == m)["seed"].unique().to_list())
                                      for m in models)))
    if not seeds:
        raise PipelineError(f"{collection}: the models {list(models)} share no seed of {what} predictions")
    return seeds


def _two_model_blend(caller: str, predictions: Mapping[str, pl.DataFrame],
                     weights: Sequence[float]) -> tuple[str, str]:
    """The two models of a curve along ``w * first + (1 - w) * second``, after checking the weights."""
    if len(predictions) != 2:
        raise ConfigError(f"{caller} blends exactly two models, got {list(predictions)}")
    outside = [w for w in weights if not 0.0 <= w <= 1.0]
    if outside:
        raise ConfigError(f"blend weights must lie in [0, 1], got {outside}")
    first, second = predictions
    return first, second


def blend_by_seed(predictions: Mapping[str, pl.DataFrame], truths: Mapping[str, np.ndarray], collection: str,
                  *, method: str = "minmax", weights: Mapping[str, float] | None = None) -> pl.DataFrame:
    """Per-graph scores of the ensemble of saved OOF predictions, seed by seed.

    ``predictions`` maps each model to its prediction frame (the training stage's
    ``predictions.parquet``); for every seed the models' OOF rows of that seed are normalised, the
    blend weights are fitted on them (or ``weights`` used as given) and the blend is scored per
    graph. Returns ``collection``, ``seed``, ``fold``, ``graph``, ``score``, ``weight:<model>``.
    Seeds: those every model has. Weights fitted on the same OOF rows they are scored on are an
    optimistic estimate (the weight grid is coarse, so only slightly).
    """
    from pipelines.training.ensemble import blend, fit_blend_weights, prepare_model_scores
    from pipelines.training.ensemble import common_oof

    models = list(predictions)
    oof = common_oof(_model_rows(predictions, collection, "oof"), models)
    seeds = _shared_seeds(oof, models, collection, "out-of-fold")
    keyed_truths = {(collection, g): t for g, t in truths.items()}
    frames = []
    for seed in seeds:
        scaled = prepare_model_scores(oof.filter(pl.col("seed") == seed), method)
        chosen = dict(weights) if weights is not None else fit_blend_weights(
            {m: scaled.filter(pl.col("model") == m) for m in models}, keyed_truths, collection).weights
        per_graph = graph_metric_scores(blend(scaled, chosen), truths, collection)
        frames.append(per_graph.with_columns(pl.lit(collection).alias("collection"), pl.lit(seed).alias("seed"),
                                             *[pl.lit(float(chosen[m])).alias(f"weight:{m}") for m in models]))
    return pl.concat(frames).select("collection", "seed", "fold", "graph", "score",
                                    *[f"weight:{m}" for m in models])


def weight_curve(predictions: Mapping[str, pl.DataFrame], truths: Mapping[str, np.ndarray], collection: str,
                 weights: Sequence[float], *, method: str = "minmax") -> pl.DataFrame:
    """Two models ``a``, ``b``: the OOF score of ``w * a + (1 - w) * b`` for each ``w``, per seed and
    fold cell (``collection``, ``weight``, ``seed``, ``fold``, ``score``), from saved predictions only."""
    first, second = _two_model_blend("weight_curve", predictions, weights)
    rows = []
    for w in weights:
        per_graph = blend_by_seed(predictions, truths, collection, method=method,
                                  weights={first: float(w), second: 1.0 - float(w)})
        rows.append(cell_scores(per_graph.with_columns(pl.lit("oof").alias("split")))
                    .with_columns(pl.lit(float(w)).alias("weight")))
    return pl.concat(rows).select("collection", "weight", "seed", "fold", "score").sort("weight", "seed", "fold")


def feature_group_of(column: str, groups: Mapping[str, Sequence[str]] = FEATURE_GROUPS) -> str:
    """The hand-made group whose prefix ``column`` starts with, else ``"other"``."""
    for group, prefixes in groups.items():
        if column.startswith(tuple(prefixes)):
            return group
    return "other"


def importance_table(importance: pl.DataFrame, top: int | None = None) -> pl.DataFrame:
    """Gain importance per feature, as a share of each fold model's total gain, then averaged over
    fold models (``mean``, ``std``) with its feature group; sorted, the ``top`` first."""
    share = importance.with_columns(
        (pl.col("gain") / pl.col("gain").sum().over("collection", "fold", "seed")).fill_nan(0.0).alias("share"))
    table = (share.group_by("collection", "feature")
             .agg(pl.col("share").mean().alias("mean"), pl.col("share").std(ddof=0).alias("std"))
             .with_columns(pl.col("feature").map_elements(feature_group_of, return_dtype=pl.Utf8).alias("group"))
             .sort(["collection", "mean"], descending=[False, True]))
    return table.group_by("collection", maintain_order=True).head(top) if top else table


def runtime_spread(runtimes: np.ndarray) -> dict[str, float]:
    """How much a graph's configs differ: ``max/min`` ratio (log10) and coefficient of variation of
    the positive runtimes; NaN when fewer than two are positive."""
    positive = np.asarray(runtimes, dtype=np.float64)
    positive = positive[positive > 0]
    if positive.size < 2:
        return {"log10_max_over_min": math.nan, "cv": math.nan}
    return {"log10_max_over_min": float(np.log10(positive.max() / positive.min())),
            "cv": float(positive.std() / positive.mean())}


def opcode_label(code: int) -> str:
    """The HLO opcode name of a TpuGraphs opcode id where known, else ``op<code>``."""
    from pipelines.data.features import HISTOGRAM_OPCODES
    from pipelines.synth.programs import OP  # the id table of the opcodes the synthetic worlds use

    names = {**{c: n for n, c in OP.items()}, **{c: n for n, c in HISTOGRAM_OPCODES.items()}}
    return names.get(int(code), f"op{int(code)}")


def opcode_mix(counts: pl.DataFrame, top: int = 12) -> pl.DataFrame:
    """Share of nodes per opcode within each collection (from ``collection``, ``opcode``, ``nodes``
    rows), the ``top`` opcodes of each collection kept and the rest summed as ``other``."""
    share = (counts.group_by("collection", "opcode").agg(pl.col("nodes").sum())
             .with_columns((pl.col("nodes") / pl.col("nodes").sum().over("collection")).alias("share"))
             .sort(["collection", "share"], descending=[False, True])
             .with_columns(pl.int_range(pl.len()).over("collection").alias("_rank")))
    kept = share.filter(pl.col("_rank") < top).with_columns(
        pl.col("opcode").map_elements(opcode_label, return_dtype=pl.Utf8).alias("name"))
    rest = (share.filter(pl.col("_rank") >= top).group_by("collection")
            .agg(pl.col("nodes").sum(), pl.col("share").sum()).with_columns(pl.lit("other").alias("name")))
    return pl.concat([kept.select("collection", "name", "nodes", "share"),
                      rest.select("collection", "name", "nodes", "share")]).sort(
        ["collection", "share"], descending=[False, True])


# ----------------------------------------------------------------------------- I/O shells


def graph_facts(data_root: Path | str, collections: Sequence[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One row per raw graph (``collection``, ``split``, ``graph``, ``nodes``, ``edges``,
    ``configurable``, ``configs``, runtime spread) and per (collection, opcode) node counts, reading
    the raw files one at a time without their config arrays."""
    from pipelines.core.collection import SPLITS, parse_collection
    from pipelines.data.tpugraphs import load_ref

    rows, opcodes = [], []
    for name in collections:
        collection = parse_collection(name)
        for split in SPLITS:
            for ref in DataRoot(data_root).graphs(collection, split):
                graph = load_ref(ref, with_configs=False)
                configurable = 0 if collection.is_tile else int(graph.node_config_ids.size)
                spread = runtime_spread(graph.target) if split != "test" else runtime_spread(np.zeros(0))
                rows.append({"collection": name, "split": split, "graph": ref.stem, "nodes": graph.num_nodes,
                             "edges": int(graph.edge_index.shape[0]), "configurable": configurable,
                             "configs": int(graph.config_runtime.shape[0]), **spread})
                codes, counts = np.unique(graph.node_opcode.astype(np.int64), return_counts=True)
                opcodes += [{"collection": name, "opcode": int(c), "nodes": int(k)} for c, k in zip(codes, counts)]
    return pl.DataFrame(rows), pl.DataFrame(opcodes)


def prepare_world(settings: NotebookSettings) -> str:
    """Generate the synthetic world at ``settings.data_root`` unless it is already there (a world of
    the same arguments is reused; the real data or a foreign folder is left alone)."""
    from pipelines.synth import generate_world
    from pipelines.synth.world import MARKER

    root = settings.data_root
    if root.is_dir() and any(root.iterdir()) and not (root / MARKER).exists():
        return f"{root}: using the data found there (not a synthetic world; nothing generated)"
    summary = generate_world(root, scale=settings.scale, seed=0)
    logger.info(summary)
    return summary.splitlines()[0]


@dataclass(frozen=True)
class Trained:
    """One trained variant: its label, collection, model and training stage output."""

    variant: str
    collection: str
    model: str
    output: StageOutput
    prepared: Any  # pipelines.data.prepared.Prepared of the variant's config


def load_pipeline_config(settings: NotebookSettings, *extra: str) -> Any:
    """The notebook's config (``settings.config`` + its overrides) with a variant's ``extra`` overrides."""
    from pipelines.config.settings import load_config

    return load_config(settings.config, settings.config_overrides(*extra))


def train_variants(settings: NotebookSettings, variants: Mapping[str, Sequence[str]], models: Sequence[str],
                   collections: Sequence[str] | None = None) -> list[Trained]:
    """Prepare and train every ``model`` for every variant (label -> extra config overrides) and
    collection; stages are cached by key, so a re-run (or another notebook) reuses them."""
    from pipelines.flows.prepare import prepare
    from pipelines.training.fit import train_model

    chosen = list(collections or settings.collections)
    out = []
    for label, extra in variants.items():
        config = load_pipeline_config(settings, *extra)
        prepared = prepare(config, settings.data_root, settings.work_dir, chosen)
        for name in chosen:
            for model in models:
                output = train_model(config, prepared[name], model=model, work_dir=settings.work_dir)
                out.append(Trained(label, name, model, output, prepared[name]))
    return out


def load_scores(trained: Iterable[Trained]) -> pl.DataFrame:
    """Per-graph scores of trained variants, read from their ``scores.parquet`` (OOF rows), with
    ``variant`` and ``model`` columns."""
    from pipelines.training.fit import SCORES_FILE

    frames = [read_parquet(t.output.file(SCORES_FILE)).filter(pl.col("split") == "oof")
              .with_columns(pl.lit(t.variant).alias("variant"), pl.lit(t.model).alias("model"))
              for t in trained]
    if not frames:
        raise PipelineError("no trained variant to load scores of")
    return pl.concat(frames)


def load_importance(trained: Iterable[Trained]) -> pl.DataFrame:
    """Feature importances (``importance.parquet``) of the trained variants that wrote them."""
    from pipelines.training.fit import IMPORTANCE_FILE

    frames = []
    for t in trained:
        if (t.output.path / IMPORTANCE_FILE).exists():
            frames.append(read_parquet(t.output.file(IMPORTANCE_FILE))
                          .with_columns(pl.lit(t.collection).alias("collection"), pl.lit(t.variant).alias("variant"),
                                        pl.lit(t.model).alias("model")))
    if not frames:
        return pl.DataFrame(schema={"feature": pl.Utf8, "gain": pl.Float64, "split": pl.Int64, "fold": pl.Int16,
                                    "seed": pl.Int64, "collection": pl.Utf8, "variant": pl.Utf8, "model": pl.Utf8})
    return pl.concat(frames)


def variant_cells(trained: Sequence[Trained]) -> pl.DataFrame:
    """Cell scores (:func:`cell_scores`) of trained variants, with ``variant`` and ``model`` columns."""
    return pl.concat([cell_scores(load_scores([t])).with_columns(pl.lit(t.variant).alias("variant"),
                                                                 pl.lit(t.model).alias("model"))
                      for t in trained])


def variant_summary(trained: Sequence[Trained]) -> pl.DataFrame:
    """Mean and spread of the OOF score per collection, variant and model (see the module docstring)."""
    cells = variant_cells(trained)
    order = {label: i for i, label in enumerate(dict.fromkeys(t.variant for t in trained))}
    return (summarize_cells(cells, ["collection", "variant", "model"])
            .with_columns(pl.col("variant").replace_strict(order, return_dtype=pl.Int64).alias("_order"))
            .sort("collection", "model", "_order").drop("_order"))


def registered_models() -> list[str]:
    """Model names the training stage can train now (``pipelines.config.registry.MODELS``)."""
    from pipelines.config.registry import MODELS

    return list(MODELS)


def choose_models(settings: NotebookSettings, wanted: Sequence[str]) -> list[str]:
    """``wanted`` models that are registered and that ``settings.models`` allows; the others are
    named and skipped."""
    registered = registered_models()
    chosen = [m for m in wanted if m.partition(":")[0] in registered
              and (settings.models is None or m in settings.models)]
    skipped = [m for m in wanted if m not in chosen]
    if skipped:
        logger.warning(f"warning: skipped model(s) {', '.join(skipped)} (not registered in "
                       "pipelines.config.registry.MODELS, or left out by the settings: run.models)")
    if not chosen:
        raise ConfigError(f"none of the models {list(wanted)} can be trained here")
    return chosen


def latest_run(submissions_dir: Path) -> str | None:
    """The newest run-id under ``submissions_dir`` that has a manifest (run-ids sort by time)."""
    from pipelines.outputs.run_folders import RUN_MANIFEST

    if not submissions_dir.is_dir():
        return None
    runs = sorted(p.name for p in submissions_dir.iterdir() if (p / RUN_MANIFEST).is_file())
    return runs[-1] if runs else None


@dataclass(frozen=True)
class RunOutputs:
    """The stage outputs one run manifest names, per collection."""

    run_id: str
    manifest: dict
    trained: dict[str, dict[str, StageOutput]]  # collection -> model -> training output
    ensemble: dict[str, StageOutput]  # collection -> ensemble output
    prune: dict[str, StageOutput]  # collection -> prune output (true runtimes)


def run_outputs(submissions_dir: Path | str, run_id: str, work_dir: Path | str | None = None) -> RunOutputs:
    """Load the training, ensemble and prune outputs of a run from its ``manifest.json``
    (``work_dir`` overrides the work dir the run recorded, e.g. after moving the cache)."""
    from pipelines.training.ensemble import ENSEMBLE_STAGE
    from pipelines.outputs.run_folders import load_named_stage, read_run_manifest, recorded_folder, training_stage_dir

    manifest = read_run_manifest(submissions_dir, run_id)
    root = recorded_folder(manifest, "work_dir", work_dir)
    trained, ensemble, prune = {}, {}, {}
    for collection, stages in manifest["stages"].items():
        def saved(where: Path, stage: str, key: str, what: str) -> StageOutput:  # gone, or why not usable
            return load_named_stage(where, stage, key, f"run {run_id}: the saved {what} output of {collection}")

        trained[collection] = {name: saved(training_stage_dir(ref, manifest, work_dir), ref["stage"], ref["key"], name)
                               for name, ref in stages["train"].items()}
        ensemble[collection] = saved(root, ENSEMBLE_STAGE, stages[ENSEMBLE_STAGE], ENSEMBLE_STAGE)
        prune[collection] = saved(root, "prune", stages["prepare"]["prune"], "prune")
    return RunOutputs(run_id, manifest, trained, ensemble, prune)


def true_runtimes(prune: StageOutput, collection: str, graphs: Iterable[str]) -> dict[str, np.ndarray]:
    """What the metric ranks for each graph (runtime; tile: runtime / normaliser), from the prune output."""
    from pipelines.core.collection import parse_collection
    from pipelines.data.prepared import Prepared

    source = Prepared(parse_collection(collection), {"prune": prune})
    return {g: source.runtimes(g) for g in sorted(set(graphs))}


def hidden_label_weight_curve(predictions: Mapping[str, pl.DataFrame], data_root: Path | str, collection: str,
                              weights: Sequence[float], *, method: str = "minmax") -> pl.DataFrame:
    """Two models ``a``, ``b``: the test score of ``w * a + (1 - w) * b`` on a synthetic world's hidden
    labels, for each ``w`` -- the curve that :func:`weight_curve` estimates out of fold.

    One row per (``weight``, ``seed``): each run seed's fold models averaged, and ``seed`` =
    ``AVERAGED`` for every seed and fold model averaged, which is exactly what the run's submission
    blends. Columns ``collection``, ``weight``, ``seed``, ``score``. A data root without hidden labels
    (the real data) is refused with :class:`PipelineError`.
    """
    from pipelines.core.collection import parse_collection
    from pipelines.training.ensemble import AVERAGED, blend, prepare_model_scores
    from pipelines.flows.evaluate import evaluate_rows, require_sidecar
    from pipelines.flows.scores import submission_rows

    first, second = _two_model_blend("hidden_label_weight_curve", predictions, weights)
    require_sidecar(data_root)
    test = _model_rows(predictions, collection, "test")
    seeds = _shared_seeds(test, [first, second], collection, "test")
    runs = {seed: test.filter(pl.col("seed") == seed) for seed in seeds} | {AVERAGED: test}
    entries, rows = [], {}
    for seed, frame in runs.items():
        scaled = prepare_model_scores(frame, method)
        for w in weights:
            entry = f"w={float(w)!r} seed={seed}"
            rows[entry] = submission_rows(blend(scaled, {first: float(w), second: 1.0 - float(w)}))
            entries.append((entry, float(w), seed))
    scores = evaluate_rows(data_root, rows, collections=[parse_collection(collection)])
    return pl.DataFrame([(collection, w, seed, scores.collection_scores(entry)[collection])
                         for entry, w, seed in entries],
                        schema={"collection": pl.Utf8, "weight": pl.Float64, "seed": pl.Int64, "score": pl.Float64},
                        orient="row").sort("weight", "seed")


# ----------------------------------------------------------------------------- plots


FIGURE_DPI = 130  # legible when a report or notebook shows the PNG at its natural size


def use_agg() -> None:
    """Draw off-screen (tests, servers); a notebook front end may switch back to inline."""
    import matplotlib

    matplotlib.use("Agg")


def errorbar_plot(summary: pl.DataFrame, *, x: str, series: str | None = None, panel: str = "collection",
                  spread: str = "std_cells", title: str = "", ylabel: str = "OOF score", xlabel: str | None = None):
    """One panel per ``panel`` value: mean +- ``spread`` of each ``x`` value, one line per ``series``.

    ``x`` may be numeric (drawn as a line) or categorical (drawn as offset points). Returns the figure.
    """
    import matplotlib.pyplot as plt

    panels = summary[panel].unique(maintain_order=True).to_list()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    numeric = summary.schema[x].is_numeric()
    groups = summary[series].unique(maintain_order=True).to_list() if series else [None]
    for ax, name in zip(axes[0], panels):
        part = summary.filter(pl.col(panel) == name)
        labels = part[x].unique(maintain_order=True).to_list()
        for i, group in enumerate(groups):
            rows = part if group is None else part.filter(pl.col(series) == group)
            if rows.height == 0:
                continue
            if numeric:
                xs = rows[x].to_numpy().astype(float)
            else:
                offset = (i - (len(groups) - 1) / 2) * 0.12
                xs = np.array([labels.index(v) for v in rows[x].to_list()], dtype=float) + offset
            ax.errorbar(xs, rows["mean"].to_numpy(), yerr=rows[spread].to_numpy(), marker="o", capsize=3,
                        linestyle="-" if numeric else "none", label=None if group is None else str(group))
        if not numeric:
            ax.set_xticks(range(len(labels)), [str(v) for v in labels], rotation=30, ha="right")
        ax.set_title(str(name), fontsize=10)
        ax.set_xlabel(xlabel if xlabel is not None else x)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    if series:
        axes[0][-1].legend(fontsize=8)
    if title:
        fig.suptitle(f"{title} (mean +- {spread})", fontsize=11)
    fig.tight_layout()
    return fig


def save_figure(fig: Any, path: Path | str, *, close: bool = True) -> Path:
    """Write a figure as PNG atomically (temp file + rename); ``close=False`` keeps it open so a
    notebook still shows it inline."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=FIGURE_DPI, bbox_inches="tight")
    if close:
        plt.close(fig)
    os.replace(tmp, path)
    return path


def figure_png(fig: Any) -> bytes:
    """A figure as PNG bytes (for self-contained reports); the figure is closed."""
    import io

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=FIGURE_DPI, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def format_table(frame: pl.DataFrame, digits: int = 4) -> str:
    """A frame as plain text with floats rounded (for notebook output and the closing notes)."""
    rounded = frame.with_columns(pl.col(c).round(digits) for c, t in frame.schema.items() if t.is_float())
    with pl.Config(tbl_rows=200, tbl_cols=30, tbl_width_chars=200, tbl_hide_dataframe_shape=True,
                   tbl_hide_column_data_types=True):
        return str(rounded)

