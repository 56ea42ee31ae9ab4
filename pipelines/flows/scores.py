"""What a run produced, per collection, and what it scored: the results a run is made of, its submission
rows (with the tile anchor where defaults are known) and the out-of-fold score tables it prints and
records. Pure functions over stage outputs; :mod:`pipelines.flows.run` chains the stages."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from pipelines.core.collection import Collection, parse_collection
from pipelines.core.engine import StageOutput
from pipelines.core.errors import FormatError


@dataclass(frozen=True)
class CollectionRun:
    """Everything one collection contributed to a run: its stages and what they measured."""

    collection: Collection
    prepare_keys: dict[str, str]  # stage -> key (prune, features, node_arrays, folds)
    trained: dict[str, StageOutput]  # model name -> training stage output
    ensemble: StageOutput
    # the data stages (stage -> key) of the other collections its models also train on, by collection
    companion_keys: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def weights(self) -> dict[str, float]:
        return dict(self.ensemble.metrics["weights"])


@dataclass(frozen=True)
class RunResult:
    """A published submission and how it was made."""

    run_id: str
    run_dir: Path
    submission: Path
    manifest: dict[str, Any]
    scores: pl.DataFrame  # see scores_table
    computed: tuple[str, ...]  # "stage/key" of every stage this call computed (empty: all reused)

    def describe(self) -> str:
        return format_scores(self.scores)


def submission_rows(test: pl.DataFrame) -> dict[str, list[int]]:
    """Submission rows from one score per test config (lower = faster): tile top-5, layout full order.

    Every graph must have a score for each config ``0..c-1`` exactly once; ties are ordered by index.
    """
    from pipelines.data.submission import submission_row

    rows: dict[str, list[int]] = {}
    keys = ["collection", "graph"]
    for (name, graph), part in test.sort([*keys, "config_index"]).partition_by(keys, as_dict=True,
                                                                               maintain_order=True).items():
        index = part["config_index"].to_numpy()
        if not np.array_equal(index, np.arange(index.shape[0])):
            raise FormatError("<test predictions>", f"{name}:{graph}: scores must cover configs 0..c-1 exactly "
                                                    f"once (got {index.shape[0]} rows)")
        collection = parse_collection(name)
        rows[collection.submission_id(graph)] = submission_row(collection, part["score"].to_numpy())
    return rows


SCORES_SCHEMA: dict[str, pl.DataType] = {
    "collection": pl.Utf8,
    "model": pl.Utf8,  # a model name or "ensemble"
    "oof_score": pl.Float64,  # training stage: mean over seeds of the OOF score (mean over graphs)
    "oof_std": pl.Float64,  # its standard deviation over seeds (null for the ensemble)
    "seeds": pl.Int64,
    "blend_score": pl.Float64,  # OOF score of the seed-averaged, normalised predictions the blend uses
    "weight": pl.Float64,  # blend weight (null for the ensemble row)
}


def scores_table(runs: Sequence[CollectionRun]) -> pl.DataFrame:
    """One row per collection and model, then the collection's ensemble row."""
    rows = []
    for item in runs:
        blend = item.ensemble.metrics["oof_scores"]
        for name, output in item.trained.items():
            m = output.metrics
            rows.append({"collection": item.collection.name, "model": name, "oof_score": m.get("oof_score"),
                         "oof_std": m.get("oof_score_std"), "seeds": len(m.get("seeds", [])),
                         "blend_score": blend.get(name), "weight": item.weights.get(name)})
        rows.append({"collection": item.collection.name, "model": "ensemble", "oof_score": blend.get("ensemble"),
                     "oof_std": None, "seeds": None, "blend_score": blend.get("ensemble"), "weight": None})
    return pl.DataFrame(rows, schema=SCORES_SCHEMA)


def scores_from_manifest(manifest: Mapping[str, Any]) -> pl.DataFrame:
    """The :func:`scores_table` of a published run, rebuilt from its manifest alone."""
    rows = []
    for cname, scores in (manifest.get("cv_scores") or {}).items():
        blend = scores.get("blend") or {}
        weights = (manifest.get("ensemble_weights") or {}).get(cname) or {}
        for name, m in (scores.get("training") or {}).items():
            rows.append({"collection": cname, "model": name, "oof_score": m.get("oof_score"),
                         "oof_std": m.get("oof_score_std"), "seeds": len(m.get("oof_score_by_seed") or {}),
                         "blend_score": blend.get(name), "weight": weights.get(name)})
        rows.append({"collection": cname, "model": "ensemble", "oof_score": blend.get("ensemble"),
                     "oof_std": None, "seeds": None, "blend_score": blend.get("ensemble"), "weight": None})
    return pl.DataFrame(rows, schema=SCORES_SCHEMA)


def combined_by_model(table: pl.DataFrame, column: str = "blend_score") -> dict[str, Any]:
    """``{model: CombinedScore}`` of a scores table (mean of the collection means)."""
    from pipelines.core.metric import combine_collection_scores

    out = {}
    for model in table["model"].unique(maintain_order=True).to_list():
        part = table.filter(pl.col("model") == model)
        out[model] = combine_collection_scores({c: math.nan if s is None else s
                                                for c, s in part.select("collection", column).iter_rows()})
    return out


def format_scores(table: pl.DataFrame) -> str:
    """The out-of-fold table printed at the end of a run, with the combined score per model."""
    def num(value: float | None) -> str:
        return "-" if value is None or math.isnan(value) else f"{value:.4f}"

    lines = [f"{'collection':<20} {'model':<22} {'OOF mean +- std (seeds)':<26} {'seed-avg':>8} {'weight':>6}"]
    for row in table.iter_rows(named=True):
        if row["model"] == "ensemble":
            oof = num(row["oof_score"])
        else:
            oof = f"{num(row['oof_score'])} +- {num(row['oof_std'])} ({row['seeds']})"
        weight = "" if row["weight"] is None else f"{row['weight']:.2f}"
        lines.append(f"{row['collection']:<20} {row['model']:<22} {oof:<26} {num(row['blend_score']):>8} {weight:>6}")
    combined = combined_by_model(table)
    parts = [f"{model} {num(score.value)}" for model, score in combined.items()]
    complete = all(score.complete for score in combined.values())
    label = "combined OOF score (mean of the 5 collections)" if complete else \
        "combined OOF score UNDEFINED (collections missing); mean of those present"
    lines.append(f"{label}: " + " | ".join(parts))
    return "\n".join(lines)


def anchored_rows(collection: Collection, blended: pl.DataFrame, model_test: Callable[[], pl.DataFrame],
                  weights: Mapping[str, float], defaults: Mapping[str, int], anchor: str) -> dict[str, list[int]]:
    """One collection's submission rows from its blended test scores, with the tile anchor
    (:mod:`pipelines.training.anchor`; ``anchor``: ``ensemble.default_anchor``) where the graphs'
    defaults are known; ``model_test()``: the blended models' per-fold test predictions, read only for
    ``"unless-confident"``."""
    rows = submission_rows(blended)
    if anchor == "off" or not (collection.is_tile and defaults):
        return rows
    from pipelines.training.anchor import anchor_rows, default_votes

    votes: dict[str, tuple[int, int]] = {}
    if anchor == "unless-confident":
        voters = [name for name, weight in weights.items() if weight > 0]
        votes = default_votes(model_test().filter(pl.col("model").is_in(voters)), defaults)
    return anchor_rows(rows, collection, defaults, votes)


def default_anchor(config: Mapping[str, Any] | None) -> str:
    """``ensemble.default_anchor`` of a resolved config as a run manifest records it ("off" where absent)."""
    return str(((config or {}).get("ensemble") or {}).get("default_anchor", "off"))
