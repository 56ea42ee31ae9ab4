"""Per-graph out-of-fold scores of a published run, read back from the stages its manifest names, and
``runs compare``'s tests on them (:mod:`pipelines.outputs.significance`).

* the ensemble: the blended OOF rows of the run's ``ensemble`` stage scored per graph with the
  competition metric against the true runtimes of its ``prune`` stage (the numbers whose mean is the
  run's CV score);
* each model: its training stage's ``scores.parquet`` (``split == "oof"``), averaged over seeds per
  graph; and its per-seed OOF scores from the manifest (``oof_score_by_seed``).

:func:`graph_scores_of_run` is the I/O shell; :func:`compare_scores` and :func:`format_tests` are pure.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import polars as pl

from pipelines.core.errors import PipelineError
from pipelines.core.stage_files import read_parquet
from pipelines.outputs.significance import Difference, paired_difference, seed_difference

logger = logging.getLogger(__name__)

ENSEMBLE = "ensemble"
GRAPH_SCHEMA = {"collection": pl.Utf8, "model": pl.Utf8, "graph": pl.Utf8, "score": pl.Float64}


# ----------------------------------------------------------------------------- I/O shell


def _ensemble_graph_scores(cname: str, entry: Mapping[str, Any], work_dir: Path) -> pl.DataFrame:
    from pipelines.core.collection import parse_collection
    from pipelines.core.engine import load_stage
    from pipelines.core.predictions import read_predictions
    from pipelines.data.prepared import Prepared
    from pipelines.training.ensemble import ENSEMBLE_PREDICTIONS, ENSEMBLE_STAGE, competition_metric

    collection = parse_collection(cname)
    output = load_stage(work_dir, ENSEMBLE_STAGE, entry[ENSEMBLE_STAGE])
    oof = read_predictions(output.file(ENSEMBLE_PREDICTIONS)).filter(pl.col("split") == "oof")
    prune = load_stage(work_dir, "prune", entry["prepare"]["prune"])
    source = Prepared(collection, {"prune": prune})
    metric = competition_metric(cname)
    rows = []
    for (graph,), part in oof.sort("graph", "config_index").partition_by("graph", as_dict=True,
                                                                         maintain_order=True).items():
        truth = np.asarray(source.runtimes(graph))[part["config_index"].to_numpy()]
        rows.append({"collection": cname, "model": ENSEMBLE, "graph": graph,
                     "score": float(metric(part["score"].to_numpy(), truth))})
    return pl.DataFrame(rows, schema=GRAPH_SCHEMA)


def _model_graph_scores(cname: str, model: str, ref: Mapping[str, Any], manifest: Mapping[str, Any]) -> pl.DataFrame:
    from pipelines.core.engine import load_stage
    from pipelines.outputs.run_folders import training_stage_dir
    from pipelines.training.fit import SCORES_FILE

    output = load_stage(training_stage_dir(ref, manifest), ref["stage"], ref["key"])
    scores = read_parquet(output.file(SCORES_FILE))
    return (scores.filter((pl.col("split") == "oof") & pl.col("score").is_not_nan())
            .group_by("graph").agg(pl.col("score").mean())
            .select(pl.lit(cname).alias("collection"), pl.lit(model).alias("model"), "graph", "score")
            .cast(GRAPH_SCHEMA))


def graph_scores_of_run(manifest: Mapping[str, Any], *, models: bool = True) -> tuple[pl.DataFrame, list[str]]:
    """Per (collection, model, graph) OOF score of a run (``model="ensemble"`` for its blend), and a
    line per stage output that could not be read (moved or deleted work dir): what is missing is
    left out, never guessed."""
    work_dir = Path(manifest.get("work_dir") or ".")
    frames, missing = [], []
    for cname, entry in sorted((manifest.get("stages") or {}).items()):
        try:
            frames.append(_ensemble_graph_scores(cname, entry, work_dir))
        except (PipelineError, OSError, KeyError, TypeError) as exc:
            missing.append(f"{cname} ensemble: {exc}")
        if not models:
            continue
        for model, ref in (entry.get("train") or {}).items():
            try:
                frames.append(_model_graph_scores(cname, model, ref, manifest))
            except (PipelineError, OSError, KeyError, TypeError) as exc:
                missing.append(f"{cname} {model}: {exc}")
    table = pl.concat(frames) if frames else pl.DataFrame(schema=GRAPH_SCHEMA)
    return table, missing


# ----------------------------------------------------------------------------- pure parts


def seed_scores(manifest: Mapping[str, Any]) -> dict[tuple[str, str], list[float]]:
    """(collection, model) -> the model's per-seed OOF scores, as its run manifest records them."""
    out = {}
    for cname, scores in (manifest.get("cv_scores") or {}).items():
        for model, m in ((scores or {}).get("training") or {}).items():
            values = [v for v in ((m or {}).get("oof_score_by_seed") or {}).values()
                      if isinstance(v, (int, float)) and math.isfinite(v)]
            out[(cname, model)] = [float(v) for v in values]
    return out


def compare_scores(a: pl.DataFrame, b: pl.DataFrame, seeds_a: Mapping[tuple[str, str], list[float]] | None = None,
                   seeds_b: Mapping[tuple[str, str], list[float]] | None = None) -> dict[str, Any]:
    """The tests of B against A: ``graphs[(collection, model)]`` (paired over the graphs both
    scored), ``combined[model]`` (the mean of the collection means, stratified: every collection
    the two share, each weighted equally) and ``seeds[(collection, model)]`` (over seeds, where both
    runs have 2 or more)."""
    keys = ["collection", "model", "graph"]
    joined = a.select(*keys, pl.col("score").alias("a")).join(b.select(*keys, pl.col("score").alias("b")),
                                                              on=keys, how="inner")
    joined = joined.filter(pl.col("a").is_not_nan() & pl.col("b").is_not_nan()).sort(keys)
    graphs: dict[tuple[str, str], Difference] = {}
    for (cname, model), part in joined.partition_by("collection", "model", as_dict=True,
                                                    maintain_order=True).items():
        graphs[(cname, model)] = paired_difference(part["a"].to_numpy(), part["b"].to_numpy())
    combined: dict[str, Difference] = {}
    for (model,), part in joined.partition_by("model", as_dict=True, maintain_order=True).items():
        counts = part.group_by("collection").agg(pl.len().alias("_n"))
        part = part.join(counts, on="collection").with_columns(
            (1.0 / (pl.col("_n") * counts.height)).alias("_w"))
        combined[model] = paired_difference(part["a"].to_numpy(), part["b"].to_numpy(), part["_w"].to_numpy())
    seeds: dict[tuple[str, str], Difference] = {}
    for key in sorted(set(seeds_a or {}) & set(seeds_b or {})):
        if len(seeds_a[key]) >= 2 and len(seeds_b[key]) >= 2:
            seeds[key] = seed_difference(seeds_a[key], seeds_b[key])
    return {"graphs": graphs, "combined": combined, "seeds": seeds}


def format_tests(tests: Mapping[str, Any], missing: list[str] | None = None) -> str:
    """The verdict table of :func:`compare_scores`, ensemble rows first."""
    def order(item):
        (cname, model), _ = item
        return (model != ENSEMBLE, cname, model)

    lines = ["is B - A real? paired sign-flip test over the graphs both runs scored (per-graph OOF scores; "
             "95% interval by inverting the test)",
             f"{'collection':<20} {'model':<24} {'B - A':>8} {'95% interval':>20} {'p':>6} {'graphs':>6}  verdict"]

    def row(cname: str, model: str, d: Difference, n_label: str = "") -> str:
        interval = "-" if math.isnan(d.low) else f"[{d.low:+.4f}, {d.high:+.4f}]"
        mean = "-" if math.isnan(d.mean) else f"{d.mean:+.4f}"
        p = "-" if math.isnan(d.p_value) else f"{d.p_value:.3f}"
        return f"{cname:<20} {model:<24} {mean:>8} {interval:>20} {p:>6} {d.n:>6}  {d.verdict}"

    for (cname, model), d in sorted(tests["graphs"].items(), key=lambda kv: order(kv)):
        lines.append(row(cname, model, d))
    for model, d in sorted(tests["combined"].items(), key=lambda kv: (kv[0] != ENSEMBLE, kv[0])):
        lines.append(row("combined", model, d))
    if not tests["graphs"]:
        lines.append("(no graph scored by both runs)")
    if tests["seeds"]:
        lines += ["", "over seeds (Welch, per-seed OOF scores of each model; seeds are independent samples)",
                  f"{'collection':<20} {'model':<24} {'B - A':>8} {'95% interval':>20} {'p':>6} {'seeds':>6}  verdict"]
        for (cname, model), d in sorted(tests["seeds"].items()):
            lines.append(row(cname, model, d))
    for line in missing or []:
        lines.append(f"not tested: {line}")
    return "\n".join(lines)


def tests_to_dict(tests: Mapping[str, Any]) -> dict[str, Any]:
    return {"graphs": {f"{c}/{m}": d.to_dict() for (c, m), d in tests["graphs"].items()},
            "combined": {m: d.to_dict() for m, d in tests["combined"].items()},
            "seeds": {f"{c}/{m}": d.to_dict() for (c, m), d in tests["seeds"].items()}}
