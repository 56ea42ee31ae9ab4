"""``python -m pipelines report RUN_ID``: a self-contained HTML report of one run.

Everything comes from the run's ``manifest.json`` and the stage outputs it names (training
``scores.parquet`` / ``importance.parquet``, the ensemble's ``curve.parquet``); nothing is
recomputed. Sections: per-collection CV scores (mean +- std over seeds, per model and for the
blend), the per-graph score distribution, the worst graphs, GBDT gain importances and the
ensemble weights with the weight -> score curve. Figures are PNGs embedded as base64, so the one
file can be mailed or archived; it is written next to the run's submission as ``report.html``
(or to ``out``) atomically.

:func:`build_report` (stage outputs -> sections) and :func:`render_html` (sections -> text) are
pure; :func:`write_report` is the I/O shell.
"""

from __future__ import annotations

import base64
import html
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from pipelines.analysis import RunOutputs, figure_png, importance_table, run_outputs
from pipelines.errors import PipelineError

REPORT_FILE = "report.html"
WORST_GRAPHS = 5
TOP_FEATURES = 10


@dataclass
class Section:
    """A titled block of the report: paragraphs, tables and PNG figures, in that order."""

    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[tuple[str, pl.DataFrame]] = field(default_factory=list)
    figures: list[tuple[str, bytes]] = field(default_factory=list)


# ----------------------------------------------------------------------------- pure parts


def cv_table(manifest: dict[str, Any]) -> pl.DataFrame:
    """Per collection and model: OOF score mean and std over seeds (training) and the score of the
    seed-averaged predictions the blend uses, with the blend's own row (``ensemble``)."""
    rows = []
    for collection, scores in manifest.get("cv_scores", {}).items():
        weights = manifest.get("ensemble_weights", {}).get(collection, {})
        blend = scores.get("blend", {})
        for model, m in scores.get("training", {}).items():
            rows.append({"collection": collection, "model": model, "oof_mean": m.get("oof_score"),
                         "oof_std_seeds": m.get("oof_score_std"), "seeds": len(m.get("oof_score_by_seed") or {}),
                         "seed_averaged": blend.get(model), "weight": weights.get(model)})
        rows.append({"collection": collection, "model": "ensemble", "oof_mean": blend.get("ensemble"),
                     "oof_std_seeds": None, "seeds": None, "seed_averaged": blend.get("ensemble"), "weight": None})
    schema = {"collection": pl.Utf8, "model": pl.Utf8, "oof_mean": pl.Float64, "oof_std_seeds": pl.Float64,
              "seeds": pl.Int64, "seed_averaged": pl.Float64, "weight": pl.Float64}
    return pl.DataFrame(rows, schema=schema)


def graph_scores_table(scores: pl.DataFrame) -> pl.DataFrame:
    """Per (collection, model, graph): mean OOF score over seeds, its std, and configs."""
    return (scores.filter((pl.col("split") == "oof") & pl.col("score").is_not_nan())
            .group_by("collection", "model", "graph")
            .agg(pl.col("score").mean().alias("mean"), pl.col("score").std(ddof=0).alias("std_seeds"),
                 pl.col("num_configs").first().alias("configs"), pl.col("fold").first())
            .sort("collection", "model", "mean"))


def worst_graphs(per_graph: pl.DataFrame, k: int = WORST_GRAPHS) -> pl.DataFrame:
    """The ``k`` lowest-scoring graphs of each collection and model."""
    return per_graph.sort("collection", "model", "mean").group_by("collection", "model", maintain_order=True).head(k)


def _format_cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4f}"
    return str(value)


def html_table(frame: pl.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in frame.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_format_cell(v))}</td>" for v in row) + "</tr>"
                   for row in frame.iter_rows())
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:0.85em}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f2f2f2}
td:first-child,th:first-child{text-align:left}img{max-width:100%}h2{border-bottom:1px solid #ddd}
.caption{color:#555;font-size:0.85em}"""


def render_html(title: str, sections: list[Section]) -> str:
    """One HTML document, figures inlined as base64 PNG data URIs (no external file)."""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"]
    for section in sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        parts += [f"<p>{html.escape(text)}</p>" for text in section.paragraphs]
        for caption, frame in section.tables:
            parts.append(f"<p class='caption'>{html.escape(caption)}</p>{html_table(frame)}")
        for caption, png in section.figures:
            data = base64.b64encode(png).decode("ascii")
            parts.append(f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'>"
                         f"<figcaption class='caption'>{html.escape(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


# ----------------------------------------------------------------------------- figures


def _distribution_figure(per_graph: pl.DataFrame) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    collections = per_graph["collection"].unique(maintain_order=True).to_list()
    fig, axes = plt.subplots(1, len(collections), figsize=(3.4 * len(collections), 3.2), squeeze=False)
    for ax, name in zip(axes[0], collections):
        part = per_graph.filter(pl.col("collection") == name)
        models = part["model"].unique(maintain_order=True).to_list()
        ax.boxplot([part.filter(pl.col("model") == m)["mean"].to_numpy() for m in models], tick_labels=models)
        ax.set_title(name, fontsize=9)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("per-graph OOF score (mean over seeds)")
    fig.tight_layout()
    return figure_png(fig)


def _importance_figure(table: pl.DataFrame) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    collections = table["collection"].unique(maintain_order=True).to_list()
    fig, axes = plt.subplots(1, len(collections), figsize=(3.6 * len(collections), 3.6), squeeze=False)
    for ax, name in zip(axes[0], collections):
        part = table.filter(pl.col("collection") == name).reverse()
        ax.barh(part["feature"].to_list(), part["mean"].to_numpy(), xerr=part["std"].to_numpy(), capsize=2)
        ax.set_title(name, fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_xlabel("share of gain")
    fig.tight_layout()
    return figure_png(fig)


def _curve_figure(curves: dict[str, tuple[str, pl.DataFrame, float]]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(3.4 * len(curves), 3.0), squeeze=False)
    for ax, (name, (model, curve, chosen)) in zip(axes[0], curves.items()):
        ax.plot(curve["weight"].to_numpy(), curve["score"].to_numpy(), marker=".")
        ax.axvline(chosen, color="grey", linestyle="--", linewidth=1)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(f"weight of {model}")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("OOF score of the blend")
    fig.tight_layout()
    return figure_png(fig)


# ----------------------------------------------------------------------------- build and write


def build_report(run: RunOutputs) -> list[Section]:
    """The report's sections from a run's stage outputs (reads their files, writes nothing)."""
    from pipelines.run import ENSEMBLE_CURVE
    from pipelines.train import IMPORTANCE_FILE, SCORES_FILE

    manifest = run.manifest
    config = manifest.get("config") or {}
    folds = (config.get("folds") or {}).get("k")
    seeds = (config.get("run") or {}).get("seeds")
    combined = ", ".join(f"{m} {_format_cell(v.get('value'))}{'' if v.get('complete') else ' (incomplete)'}"
                         for m, v in (manifest.get("combined_oof") or {}).items())
    overview = Section("Run", [
        f"run {run.run_id} ({manifest.get('kind', 'run')}), created {manifest.get('created', '?')}, "
        f"wall time {manifest.get('wall_time_s', '?')} s; command: {manifest.get('command', '?')}",
        f"data root {manifest.get('data_root')}; models {', '.join(manifest.get('models', []))}; "
        f"{folds} folds x seeds {seeds}; code {(manifest.get('code_version') or {}).get('commit', '?')}",
        f"combined OOF score (mean of the collections): {combined or '-'}",
    ])
    cv = Section("Cross-validation scores per collection",
                 ["oof_mean: mean over seeds of the OOF score (each seed: mean over graphs of the metric, "
                  "tile top-5 score or layout Kendall tau-b); oof_std_seeds: its standard deviation over "
                  "seeds; seed_averaged: the score of the seed-averaged normalised predictions the blend uses."],
                 [("OOF scores", cv_table(manifest))])

    scores, importances = [], []
    for collection, models in run.trained.items():
        for model, output in models.items():
            scores.append(pl.read_parquet(output.file(SCORES_FILE)).with_columns(pl.lit(model).alias("model")))
            if (output.path / IMPORTANCE_FILE).exists():
                importances.append(pl.read_parquet(output.file(IMPORTANCE_FILE))
                                   .with_columns(pl.lit(collection).alias("collection")))
    per_graph = graph_scores_table(pl.concat(scores, how="vertical_relaxed"))
    distribution = Section("Per-graph score distribution",
                           ["Each box: the graphs of a collection, each scored out of fold and averaged over seeds."],
                           figures=[("per-graph OOF scores", _distribution_figure(per_graph))])
    worst = Section("Worst graphs", [f"The {WORST_GRAPHS} lowest-scoring graphs per collection and model."],
                    [("worst graphs", worst_graphs(per_graph))])
    sections = [overview, cv, distribution, worst]

    if importances:
        table = importance_table(pl.concat(importances), top=TOP_FEATURES)
        sections.append(Section("Feature importances (GBDT)",
                                ["Gain of each feature as a share of its fold model's total gain, mean +- std over "
                                 f"fold models; the top {TOP_FEATURES} per collection."],
                                [("gain importances", table)], [("gain importances", _importance_figure(table))]))

    weights = manifest.get("ensemble_weights") or {}
    weight_rows = [{"collection": c, **{f"w:{m}": w for m, w in ws.items()}} for c, ws in weights.items()]
    ensemble = Section("Ensemble weights",
                       ["Weights fitted on the out-of-fold predictions (seed-averaged, normalised per graph); the "
                        "curve is every weight the ensemble stage tried (two models: the first model's weight; "
                        "dashed: the chosen one)."],
                       [("weights per collection", pl.DataFrame(weight_rows))] if weight_rows else [])
    curves = {}
    for collection, output in run.ensemble.items():
        models = [m for m in manifest.get("models", []) if m in weights.get(collection, {})]
        if len(models) != 2:
            continue
        curve = pl.read_parquet(output.file(ENSEMBLE_CURVE)).select(pl.col(f"w:{models[0]}").alias("weight"), "score")
        curves[collection] = (models[0], curve.sort("weight"), weights[collection][models[0]])
    if curves:
        ensemble.figures.append(("OOF score vs. blend weight", _curve_figure(curves)))
    sections.append(ensemble)
    return sections


def write_report(run_id: str, *, submissions_dir: Path | str = "submissions", out: Path | str | None = None,
                 work_dir: Path | str | None = None) -> Path:
    """Render the report of ``run_id`` to ``out`` (default ``<submissions_dir>/<run_id>/report.html``)."""
    run = run_outputs(submissions_dir, run_id, work_dir)
    if not run.trained:
        raise PipelineError(f"run {run_id}: its manifest names no collection")
    from pipelines.evaluate import evaluation_sections  # the `evaluate` scores, when the run has them

    sections = build_report(run) + evaluation_sections(Path(submissions_dir) / run_id)
    text = render_html(f"TpuGraphs run {run_id}", sections)
    target = Path(out) if out is not None else Path(submissions_dir) / run_id / REPORT_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)
    return target
