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
from pipelines.outputs.significance import ALPHA, Difference, paired_difference, seed_difference

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


def identical_stages(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """(collection, model) -> why its scores are identical in both runs: both manifests name its stage with
    the same key, the same output (stage keys fingerprint config, inputs and code), so nothing is tested.
    ``model="ensemble"``: the ensemble stage."""
    out = {}
    stages_a, stages_b = a.get("stages") or {}, b.get("stages") or {}
    for cname in sorted(set(stages_a) & set(stages_b)):
        ea, eb = stages_a[cname] or {}, stages_b[cname] or {}
        if ea.get(ENSEMBLE) and ea.get(ENSEMBLE) == eb.get(ENSEMBLE):
            out[(cname, ENSEMBLE)] = f"the same {ENSEMBLE}/{ea[ENSEMBLE]} output"
        train_a, train_b = ea.get("train") or {}, eb.get("train") or {}
        for model in sorted(set(train_a) & set(train_b)):
            ra, rb = train_a[model] or {}, train_b[model] or {}
            if ra.get("key") and (ra.get("stage"), ra.get("key")) == (rb.get("stage"), rb.get("key")):
                out[(cname, model)] = f"the same {ra.get('stage')}/{ra['key']} output"
    return out


def compare_scores(a: pl.DataFrame, b: pl.DataFrame, seeds_a: Mapping[tuple[str, str], list[float]] | None = None,
                   seeds_b: Mapping[tuple[str, str], list[float]] | None = None,
                   identical: Mapping[tuple[str, str], str] | None = None, alpha: float = ALPHA) -> dict[str, Any]:
    """The tests of B against A: ``graphs[(collection, model)]`` (paired over the graphs both
    scored), ``combined[model]`` (the mean of the collection means, stratified: every collection
    the two share, each weighted equally) and ``seeds[(collection, model)]`` (over seeds, where both
    runs have 2 or more); ``identical``: the (collection, model) pairs whose stage both runs share
    (:func:`identical_stages`), reported as such and not tested, and a model's combined row when
    all its collections are.

    The rule for many tests at once: the combined ensemble row is the primary test, at level
    ``alpha``; the ``secondary`` other rows are each tested at ``alpha / secondary`` (Bonferroni), so
    that the chance of any false verdict among them stays below ``alpha``. ``levels`` holds both."""
    identical = dict(identical or {})
    keys = ["collection", "model", "graph"]
    joined = a.select(*keys, pl.col("score").alias("a")).join(b.select(*keys, pl.col("score").alias("b")),
                                                              on=keys, how="inner")
    joined = joined.filter(pl.col("a").is_not_nan() & pl.col("b").is_not_nan()).sort(keys)
    per_graph = {key: part for key, part in joined.partition_by("collection", "model", as_dict=True,
                                                                maintain_order=True).items()}
    for key, part in per_graph.items():  # other stage outputs (a code edit, say) that score every graph alike
        if key not in identical and (part["a"] == part["b"]).all():
            identical[key] = f"the same score on each of the {part.height} graphs"
    per_model = {model: part for (model,), part in joined.partition_by("model", as_dict=True,
                                                                        maintain_order=True).items()}
    same_models = {model for model, part in per_model.items()
                   if all((c, model) in identical for c in part["collection"].unique())}
    seed_keys = [key for key in sorted(set(seeds_a or {}) & set(seeds_b or {}))
                 if len(seeds_a[key]) >= 2 and len(seeds_b[key]) >= 2 and key not in identical]
    primary = ENSEMBLE in per_model and ENSEMBLE not in same_models
    secondary = (sum(1 for key in per_graph if key not in identical)
                 + sum(1 for model in per_model if model not in same_models) - int(primary) + len(seed_keys))
    low_alpha = alpha / max(1, secondary)
    graphs: dict[tuple[str, str], Difference] = {}
    for (cname, model), part in per_graph.items():
        if (cname, model) not in identical:
            graphs[(cname, model)] = paired_difference(part["a"].to_numpy(), part["b"].to_numpy(), alpha=low_alpha)
    combined: dict[str, Difference] = {}
    for model, part in per_model.items():
        if model in same_models:
            continue
        counts = part.group_by("collection").agg(pl.len().alias("_n"))
        part = part.join(counts, on="collection").with_columns(
            (1.0 / (pl.col("_n") * counts.height)).alias("_w"))
        combined[model] = paired_difference(part["a"].to_numpy(), part["b"].to_numpy(), part["_w"].to_numpy(),
                                            alpha=alpha if model == ENSEMBLE else low_alpha)
    seeds = {key: seed_difference(seeds_a[key], seeds_b[key], alpha=low_alpha) for key in seed_keys}
    return {"graphs": graphs, "combined": combined, "seeds": seeds,
            "identical": {key: stage for key, stage in identical.items() if key in per_graph},
            "identical_models": sorted(same_models),
            "levels": {"primary": alpha if primary else None, "secondary": low_alpha, "tests": secondary}}


def _interval_name(alpha: float) -> str:
    return f"{100 * (1 - alpha):.3g}%"


def format_tests(tests: Mapping[str, Any], missing: list[str] | None = None) -> str:
    """The verdict table of :func:`compare_scores`, ensemble rows first, with the rule it applies to
    many tests and the rows that compare one stage output with itself."""
    def order(item):
        (cname, model), _ = item
        return (model != ENSEMBLE, cname, model)

    levels = tests["levels"]
    lines = ["is B - A real? paired sign-flip test over the graphs both runs scored (per-graph OOF scores), "
             "the interval by inverting the test"]
    if levels["primary"] is not None:
        lines.append(f"rule: the combined ensemble row answers \"is B better than A?\" at {levels['primary']:.0%}; "
                     f"the other {levels['tests']} tested row(s) are each tested at {levels['secondary']:.2%} "
                     f"(Bonferroni: {levels['primary']:.0%} / {levels['tests']}), with "
                     f"{_interval_name(levels['secondary'])} intervals, so that together they raise a false "
                     f"verdict less than {levels['primary']:.0%} of the time")
    elif levels["tests"]:
        lines.append(f"rule: the {levels['tests']} tested row(s) are each tested at {levels['secondary']:.2%} "
                     f"(Bonferroni), with {_interval_name(levels['secondary'])} intervals")
    lines.append(f"{'collection':<20} {'model':<24} {'B - A':>8} {'interval':>20} {'p':>6} {'graphs':>6}  verdict")

    def row(cname: str, model: str, d: Difference) -> str:
        interval = "-" if math.isnan(d.low) else f"[{d.low:+.4f}, {d.high:+.4f}]"
        mean = "-" if math.isnan(d.mean) else f"{d.mean:+.4f}"
        p = "-" if math.isnan(d.p_value) else f"{d.p_value:.3f}"
        return f"{cname:<20} {model:<24} {mean:>8} {interval:>20} {p:>6} {d.n:>6}  {d.verdict}"

    def same(cname: str, model: str, what: str) -> str:
        return f"{cname:<20} {model:<24} {'=':>8} {'-':>20} {'-':>6} {'-':>6}  identical: {what}"

    rows = [(key, row(*key, d)) for key, d in tests["graphs"].items()]
    rows += [(key, same(*key, f"{what}, not tested")) for key, what in tests["identical"].items()]
    lines += [text for _, text in sorted(rows, key=order)]
    for model, d in sorted(tests["combined"].items(), key=lambda kv: (kv[0] != ENSEMBLE, kv[0])):
        lines.append(row("combined", model, d))
    for model in tests["identical_models"]:
        lines.append(same("combined", model, "every collection alike, not tested"))
    if not tests["graphs"] and not tests["identical"]:
        lines.append("(no graph scored by both runs)")
    if tests["seeds"]:
        lines += ["", "over seeds (Welch, per-seed OOF scores of each model; seeds are independent samples)",
                  f"{'collection':<20} {'model':<24} {'B - A':>8} {'interval':>20} {'p':>6} {'seeds':>6}  verdict"]
        for (cname, model), d in sorted(tests["seeds"].items()):
            lines.append(row(cname, model, d))
    for line in missing or []:
        lines.append(f"not tested: {line}")
    return "\n".join(lines)


def tests_to_dict(tests: Mapping[str, Any]) -> dict[str, Any]:
    return {"graphs": {f"{c}/{m}": d.to_dict() for (c, m), d in tests["graphs"].items()},
            "combined": {m: d.to_dict() for m, d in tests["combined"].items()},
            "seeds": {f"{c}/{m}": d.to_dict() for (c, m), d in tests["seeds"].items()},
            "identical": {f"{c}/{m}": stage for (c, m), stage in tests["identical"].items()},
            "levels": dict(tests["levels"])}
