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
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from pipelines.core import paths
from pipelines.reports.analysis import RunOutputs, figure_png, importance_table, run_outputs
from pipelines.core.atomic import write_text_atomic
from pipelines.core.errors import PipelineError
from pipelines.core.stage_files import read_parquet
from pipelines.flows.evaluate import evaluation_table, read_evaluation

logger = logging.getLogger(__name__)

REPORT_FILE = "report.html"
REPORT_TITLE = "TpuGraphs run "
_SIGNATURE = f"<title>{REPORT_TITLE}"  # how a report we wrote is recognised (in its first bytes)
WORST_GRAPHS = 5
TOP_FEATURES = 10


@dataclass
class Section:
    """A titled block of the report: paragraphs, tables and PNG figures, in that order."""

    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[tuple[str, pl.DataFrame]] = field(default_factory=list)
    figures: list[tuple[str, bytes]] = field(default_factory=list)
    collapsed: bool = False  # rendered folded (<details>): long tables that would dominate the page
    markup: str = ""  # trusted HTML built by this module (the summary table), placed after the paragraphs


# ----------------------------------------------------------------------------- pure parts


def cv_table(manifest: dict[str, Any]) -> pl.DataFrame:
    """Per collection and model: OOF score mean and std over seeds (training) and the score of the
    seed-averaged predictions the blend uses, with the blend's own row (``ensemble``)."""
    rows = []
    for collection in _collection_order(manifest):
        scores = manifest["cv_scores"][collection]
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


def _spread(values: Any) -> float | None:
    values = [float(v) for v in (values or []) if v is not None and not math.isnan(float(v))]
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def summary_table(manifest: dict[str, Any], fold_scores: dict[tuple[str, str], dict[str, float]] | None = None
                  ) -> pl.DataFrame:
    """One row per model (then ``ensemble``): the CV score per collection with its spread over seeds
    and over folds, and the combined score (mean of the collections) with its spread over seeds.

    Columns per collection ``c``: ``c`` (mean over seeds), ``c:seeds`` (std over seeds), ``c:folds``
    (std over folds of the fold means; from ``fold_scores[(c, model)]`` = fold -> score). The
    ensemble's score is the OOF score of the blend of seed-averaged predictions (one number).
    """
    fold_scores = fold_scores or {}
    collections = _collection_order(manifest)
    models: list[str] = []
    for scores in (manifest.get("cv_scores") or {}).values():
        models += [m for m in (scores.get("training") or {}) if m not in models]
    rows = []
    for model in [*models, "ensemble"]:
        row: dict[str, Any] = {"model": model}
        by_seed: dict[str, list[float]] = {}
        means = []
        for c in collections:
            scores = manifest["cv_scores"][c]
            if model == "ensemble":
                mean, seeds, folds = (scores.get("blend") or {}).get("ensemble"), None, None
            else:
                m = (scores.get("training") or {}).get(model) or {}
                mean = m.get("oof_score")
                seeds = m.get("oof_score_std") if len(m.get("oof_score_by_seed") or {}) > 1 else None
                folds = _spread((fold_scores.get((c, model)) or {}).values())
                for seed, value in (m.get("oof_score_by_seed") or {}).items():
                    by_seed.setdefault(seed, []).append(value)
            row |= {c: mean, f"{c}:seeds": seeds, f"{c}:folds": folds}
            means.append(mean)
        complete = bool(means) and all(v is not None for v in means)
        row["combined"] = sum(means) / len(means) if complete else None
        row["combined:seeds"] = _spread([sum(v) / len(v) for v in by_seed.values() if len(v) == len(collections)])
        rows.append(row)
    schema = {"model": pl.Utf8, "combined": pl.Float64, "combined:seeds": pl.Float64}
    for c in collections:
        schema |= {c: pl.Float64, f"{c}:seeds": pl.Float64, f"{c}:folds": pl.Float64}
    return pl.DataFrame(rows, schema=schema).select(list(schema))


def _collection_order(manifest: dict[str, Any]) -> list[str]:
    """The run's collections in the order it ran them (the competition's), not the JSON key order."""
    scored = list(manifest.get("cv_scores") or {})
    return [c for c in manifest.get("collections") or [] if c in scored] + \
        [c for c in scored if c not in (manifest.get("collections") or [])]


def summary_html(table: pl.DataFrame) -> str:
    """The summary table: a column per collection, each cell ``mean`` with ``+- seeds / +- folds`` below."""
    collections = [c for c in table.columns if c != "model" and not c.endswith((":seeds", ":folds"))
                   and c != "combined"]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["model", "combined", *collections])

    def cell(row: dict[str, Any], name: str, strong: bool = False) -> str:
        value = _format_cell(row.get(name))
        spreads = []
        if row.get(f"{name}:seeds") is not None:
            spreads.append(f"&plusmn;{row[f'{name}:seeds']:.4f} seeds")
        if row.get(f"{name}:folds") is not None:
            spreads.append(f"&plusmn;{row[f'{name}:folds']:.4f} folds")
        value = f"<b>{value}</b>" if strong else value
        small = f"<br><span class='spread'>{' '.join(spreads)}</span>" if spreads else ""
        return f"<td>{value}{small}</td>"

    body = []
    for row in table.iter_rows(named=True):
        ensemble = row["model"] == "ensemble"
        body.append(f"<tr{' class=ensemble' if ensemble else ''}><td>{html.escape(row['model'])}</td>"
                    + cell(row, "combined", strong=True) + "".join(cell(row, c) for c in collections) + "</tr>")
    return f"<table class='summary'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


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
.headline{font-size:1.3em;margin:0.3em 0 0.8em}.headline b{font-size:1.3em}
table.summary{font-size:0.95em}table.summary tr.ensemble td{background:#eef5ff;font-weight:bold}
.spread{color:#777;font-size:0.8em;font-weight:normal}details summary{cursor:pointer;color:#235}
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
        if section.collapsed:
            parts.append(f"<details><summary>show {html.escape(section.title.lower())}</summary>")
        parts += [f"<p>{html.escape(text)}</p>" for text in section.paragraphs]
        if section.markup:
            parts.append(section.markup)
        for caption, frame in section.tables:
            parts.append(f"<p class='caption'>{html.escape(caption)}</p>{html_table(frame)}")
        for caption, png in section.figures:
            data = base64.b64encode(png).decode("ascii")
            parts.append(f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'>"
                         f"<figcaption class='caption'>{html.escape(caption)}</figcaption></figure>")
        if section.collapsed:
            parts.append("</details>")
    parts.append("</body></html>")
    return "\n".join(parts)


# ----------------------------------------------------------------------------- figures


def _panels(plt: Any, count: int, width: float, height: float, columns: int = 3) -> tuple[Any, list[Any]]:
    """A grid of ``count`` panels, at most ``columns`` a row (five side by side are unreadable on a
    page), unused cells hidden; returns the figure and the used axes in order."""
    ncols = max(1, min(columns, count))
    nrows = math.ceil(count / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def _in_order(present: list[str], order: list[str] | None) -> list[str]:
    order = order or []
    return [c for c in order if c in present] + [c for c in present if c not in order]


def _distribution_figure(per_graph: pl.DataFrame, order: list[str] | None = None) -> bytes:
    """Per collection, a histogram of the per-graph OOF scores of each model on one set of bins."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    collections = _in_order(per_graph["collection"].unique(maintain_order=True).to_list(), order)
    fig, axes = _panels(plt, len(collections), 3.8, 3.2)
    for ax, name in zip(axes, collections):
        part = per_graph.filter(pl.col("collection") == name)
        edges = np.histogram_bin_edges(part["mean"].to_numpy(), bins=12)  # shared by the models of the panel
        for model in part["model"].unique(maintain_order=True).to_list():
            values = part.filter(pl.col("model") == model)["mean"].to_numpy()
            ax.hist(values, bins=edges, histtype="step", linewidth=1.6, label=model)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("per-graph OOF score (seed mean)")
        ax.set_ylabel("graphs")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return figure_png(fig)


def _importance_figure(table: pl.DataFrame, order: list[str] | None = None) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    collections = _in_order(table["collection"].unique(maintain_order=True).to_list(), order)
    fig, axes = _panels(plt, len(collections), 5.0, 3.4)
    for ax, name in zip(axes, collections):
        part = table.filter(pl.col("collection") == name).reverse()
        ax.barh(part["feature"].to_list(), part["mean"].to_numpy(), xerr=part["std"].to_numpy(), capsize=2)
        ax.set_title(name, fontsize=10)
        ax.tick_params(axis="y", labelsize=9)
        ax.set_xlabel("share of gain")
    fig.tight_layout()
    return figure_png(fig)


def _curve_figure(curves: dict[str, tuple[str, pl.DataFrame, float]]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = _panels(plt, len(curves), 3.8, 3.0)
    for ax, (name, (model, curve, chosen)) in zip(axes, curves.items()):
        ax.plot(curve["weight"].to_numpy(), curve["score"].to_numpy(), marker=".")
        ax.axvline(chosen, color="grey", linestyle="--", linewidth=1)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(f"weight of {model}")
        ax.set_ylabel("OOF score of the blend")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return figure_png(fig)


def _training_curves_figure(curves: pl.DataFrame, order: list[str] | None = None) -> bytes:
    """One panel per collection and model: every fold model's training loss (solid, left axis) and
    held-out score (dashed, right axis) per epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(c, m) for c in _in_order(curves["collection"].unique().to_list(), order)
              for m in sorted(curves.filter(pl.col("collection") == c)["model"].unique().to_list())]
    fig, axes = _panels(plt, len(panels), 4.2, 3.0)
    for ax, (collection, model) in zip(axes, panels):
        part = curves.filter((pl.col("collection") == collection) & (pl.col("model") == model))
        score_ax = ax.twinx()
        for index, ((fold, seed), run) in enumerate(part.sort("epoch").partition_by(["fold", "seed"], as_dict=True,
                                                                                    maintain_order=True).items()):
            colour = f"C{index % 10}"
            ax.plot(run["epoch"].to_numpy(), run["train_loss"].to_numpy(), color=colour, linewidth=1,
                    label=f"f{fold} s{seed}")
            valid = run.filter(pl.col("valid_score").is_not_nan())
            score_ax.plot(valid["epoch"].to_numpy(), valid["valid_score"].to_numpy(), color=colour, linewidth=1,
                          linestyle="--", marker=".")
        ax.set_title(f"{collection} ({model})", fontsize=10)
        ax.set_xlabel("epoch")
        ax.set_ylabel("training loss (solid)")
        score_ax.set_ylabel("held-out score (dashed)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="upper right", ncol=2)
    fig.tight_layout()
    return figure_png(fig)


def epoch_cap_lines(trained: dict[str, dict[str, Any]]) -> list[str]:
    """Per collection and model trained in epochs: how many fold models stopped at the epoch cap."""
    lines = []
    for collection, models in trained.items():
        for model, output in models.items():
            cap = output.metrics.get("epoch_cap")
            if cap:
                lines.append(f"{collection} {model}: {cap['at_cap']} of {cap['fold_models']} fold models stopped at "
                             f"the epoch cap ({cap['epochs']} epochs)")
    return lines


# ----------------------------------------------------------------------------- build and write


def build_report(run: RunOutputs) -> list[Section]:
    """The report's sections from a run's stage outputs (reads their files, writes nothing)."""
    from pipelines.training.ensemble import ENSEMBLE_CURVE
    from pipelines.training.fit import CURVES_FILE, IMPORTANCE_FILE, SCORES_FILE

    manifest = run.manifest
    config = manifest.get("config") or {}
    order = _collection_order(manifest)
    fold_scores = {(c, model): {f: v for f, v in (out.metrics.get("oof_score_by_fold") or {}).items()}
                   for c, models in run.trained.items() for model, out in models.items()}
    combined = (manifest.get("combined_oof") or {}).get("ensemble") or {}
    headline = f"combined CV score (ensemble, mean of the collections): {_format_cell(combined.get('value'))}"
    if combined and not combined.get("complete"):
        headline += " (not all five collections: the mean of those present)"
    summary = Section("Summary", markup=f"<p class='headline'>{html.escape(headline).replace(': ', ': <b>', 1)}"
                                        f"</b></p>" + summary_html(summary_table(manifest, fold_scores)),
                      paragraphs=[])
    summary.markup += ("<p class='caption'>Out-of-fold CV scores (tile: top-5 slowdown score, layout: Kendall tau-b; "
                       "higher is better). Each model: mean over seeds, &plusmn; standard deviation over seeds and "
                       "over folds (fold means averaged over seeds). ensemble: the blend of the seed-averaged "
                       "predictions with the weights below.</p>")
    capped = epoch_cap_lines(run.trained)
    at_cap = sum(o.metrics["epoch_cap"]["at_cap"] for ms in run.trained.values() for o in ms.values()
                 if o.metrics.get("epoch_cap"))
    if capped:
        total = sum(o.metrics["epoch_cap"]["fold_models"] for ms in run.trained.values() for o in ms.values()
                    if o.metrics.get("epoch_cap"))
        summary.markup += (f"<p>{at_cap} of {total} fold models trained in epochs stopped at the epoch cap"
                           + (" (early stopping never ended them: they may not have converged; see Training curves)"
                              if at_cap else "") + ".</p>")
    if manifest.get("kind") == "ensemble":
        sources = config.get("source_runs") or {}
        described = []
        for run_id in manifest.get("source_runs") or list(sources):
            source = sources.get(run_id) or {}
            described.append(f"{run_id} ({(source.get('folds') or {}).get('k', '?')} folds x seeds "
                             f"{(source.get('run') or {}).get('seeds', '?')})")
        setup = (f"re-blend of {len(described)} run(s), training nothing: {'; '.join(described)}; method "
                 f"{(config.get('ensemble') or {}).get('method', '?')}")
    else:
        setup = (f"{(config.get('folds') or {}).get('k', '?')} folds x seeds "
                 f"{(config.get('run') or {}).get('seeds', '?')}")
    if manifest.get("kind") == "predict":
        setup = (f"ranked by the saved fold models and blend weights of run {manifest.get('source_run')}, training "
                 f"nothing ({setup}); every CV score below is that run's")
    overview = Section("Run", [
        f"run {run.run_id} ({manifest.get('kind', 'run')}), created {manifest.get('created', '?')}, "
        f"wall time {manifest.get('wall_time_s', '?')} s; command: {manifest.get('command', '?')}",
        f"data root {manifest.get('data_root')}; models {', '.join(manifest.get('models', []))}; {setup}; "
        f"code {(manifest.get('code_version') or {}).get('commit', '?')}",
    ])
    cv = Section("Cross-validation scores per collection",
                 ["oof_mean: mean over seeds of the OOF score (each seed: mean over graphs of the metric, "
                  "tile top-5 score or layout Kendall tau-b); oof_std_seeds: its standard deviation over "
                  "seeds; seed_averaged: the score of the seed-averaged normalised predictions the blend uses."],
                 [("OOF scores", cv_table(manifest))])

    scores, importances, curves_found = [], [], []
    for collection, models in run.trained.items():
        for model, output in models.items():
            scores.append(read_parquet(output.file(SCORES_FILE)).with_columns(pl.lit(model).alias("model")))
            if (output.path / CURVES_FILE).exists():
                curves_found.append(read_parquet(output.file(CURVES_FILE))
                                    .with_columns(pl.lit(model).alias("model")))
            if (output.path / IMPORTANCE_FILE).exists():
                importances.append(read_parquet(output.file(IMPORTANCE_FILE))
                                   .with_columns(pl.lit(collection).alias("collection")))
    per_graph = graph_scores_table(pl.concat(scores, how="vertical_relaxed"))
    distribution = Section("Per-graph score distribution",
                           ["Histograms of the graphs of each collection, each scored out of fold and averaged "
                            "over seeds; the models of a panel share its bins."],
                           figures=[("per-graph OOF scores", _distribution_figure(per_graph, order))])
    worst = Section("Worst graphs", [f"The {WORST_GRAPHS} lowest-scoring graphs per collection and model."],
                    [("worst graphs", worst_graphs(per_graph))], collapsed=True)
    sections = [summary, overview, cv, distribution]
    folded: list[Section] = []
    if curves_found:
        sections.append(Section("Training curves",
                                ["Per epoch, every fold model's mean training loss (solid) and the score of its "
                                 "held-out fold (dashed; epochs that validated), per collection. A curve still "
                                 "rising at the last epoch has not converged.", *capped],
                                figures=[("training loss and held-out score per epoch",
                                          _training_curves_figure(pl.concat(curves_found), order))]))

    if importances:
        table = importance_table(pl.concat(importances), top=TOP_FEATURES)
        sections.append(Section("Feature importances (GBDT)",
                                ["Gain of each feature as a share of its fold model's total gain, mean +- std over "
                                 f"fold models; the top {TOP_FEATURES} per collection."],
                                figures=[("gain importances", _importance_figure(table, order))]))
        folded.append(Section("Feature importance table", [], [("gain importances", table)], collapsed=True))

    weights = manifest.get("ensemble_weights") or {}
    weight_rows = [{"collection": c, **{f"w:{m}": w for m, w in weights[c].items()}, **_blend_rule(run, c)}
                   for c in _in_order(list(weights), order)]
    ensemble = Section("Ensemble weights",
                       ["Weights fitted on the out-of-fold predictions (seed-averaged, normalised per graph): the "
                        "grid optimum ('fitted'), or the best single model alone where the optimum's gain over it "
                        "(as measured on OOF, or expected at the test's averaged runs: ensemble.gain_at) is within "
                        "ensemble.min_gain_se standard errors of the OOF gain; the curve is every weight the "
                        "ensemble stage tried (two models: the first model's weight; dashed: the one used)."],
                       [("weights per collection", pl.DataFrame(weight_rows))] if weight_rows else [])
    curves = {}
    for collection in _in_order(list(run.ensemble), order):
        output = run.ensemble[collection]
        models = [m for m in manifest.get("models", []) if m in weights.get(collection, {})]
        if len(models) != 2:
            continue
        curve = read_parquet(output.file(ENSEMBLE_CURVE)).select(pl.col(f"w:{models[0]}").alias("weight"), "score")
        curves[collection] = (models[0], curve.sort("weight"), weights[collection][models[0]])
    if curves:
        ensemble.figures.append(("OOF score vs. blend weight", _curve_figure(curves)))
    sections += [ensemble, worst, *folded]
    return sections


def _blend_rule(run: RunOutputs, collection: str) -> dict[str, Any]:
    """``ensemble.blend_rule`` of the collection's ensemble stage, less the weights used (the w: columns);
    nothing for stages written before ``ensemble.min_gain_se`` (their weights are the optimum)."""
    from pipelines.training.ensemble import blend_rule

    stage = run.ensemble.get(collection)
    if stage is None or "fitted_weights" not in stage.metrics:
        return {}
    rule = blend_rule(stage)
    del rule["used"]
    return rule


def write_report(run_id: str, *, submissions_dir: Path | str = paths.SUBMISSIONS_DIR, out: Path | str | None = None,
                 work_dir: Path | str | None = None) -> Path:
    """Render the report of ``run_id`` to ``out`` (default ``<submissions_dir>/<run_id>/report.html``)."""
    from pipelines.outputs.run_folders import resolve_run_id

    run_id = resolve_run_id(submissions_dir, run_id)  # a unique prefix or a run's name works too
    target = Path(out) if out is not None else Path(submissions_dir) / run_id / REPORT_FILE
    _check_report_target(target)  # before the work: a refused path costs nothing
    run = run_outputs(submissions_dir, run_id, work_dir)
    if not run.trained:
        raise PipelineError(f"run {run_id}: its manifest names no collection")
    sections = build_report(run) + evaluation_sections(Path(submissions_dir) / run_id)  # `evaluate`'s scores
    text = render_html(f"{REPORT_TITLE}{run_id}", sections)
    _check_report_target(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(target, text)
    return target



def evaluation_sections(run_dir: Path | str) -> list:
    """The report's "Test evaluation" section when ``evaluate`` has scored the run, else nothing."""
    record = read_evaluation(run_dir)
    if record is None:
        return []
    world = record.get("world") or {}
    return [Section("Test evaluation (hidden labels)", [
        f"Scored by `evaluate` on {record.get('data_root')} (scale {world.get('scale')}, seed {world.get('seed')}, "
        f"variant {world.get('variant')}) on {record.get('created')}: the test split's measured runtimes. floor: "
        "the best heuristic per collection (picked on these labels); ceiling: configs ranked by their noise-free "
        "runtime; each model alone and the submitted ensemble in between."],
        [("test scores", evaluation_table(record))])]


def write_run_report(run_id: str, submissions_dir: Path) -> Path | None:
    """``report.html`` in the new run folder. The submission is already published and valid, so a
    report that cannot be drawn is a warning, not a failed run (``report RUN_ID`` retries it)."""
    try:
        path = write_report(run_id, submissions_dir=submissions_dir)
    except (PipelineError, OSError, ValueError) as exc:
        logger.warning(f"warning: report of run {run_id} not written ({exc}); retry with: report {run_id}")
        return None
    logger.info(f"report {path}")
    return path


def _check_report_target(target: Path) -> None:
    """A report may replace only an earlier report: any other existing path (a submission, a
    manifest, a link, a folder) is refused, so ``--out`` can never destroy a file we did not write."""
    if not (target.exists() or target.is_symlink()):
        return
    if target.is_symlink() or not target.is_file():
        raise PipelineError(f"{target}: exists and is not a regular file; refusing to write the report there")
    try:
        with open(target, "rb") as handle:
            head = handle.read(4096).decode("utf-8", "replace")
    except OSError as exc:
        raise PipelineError(f"{target}: exists and cannot be read ({exc.strerror}); refusing to replace it") from None
    if _SIGNATURE not in head:
        raise PipelineError(f"{target}: exists and is not a report written by this command; refusing to "
                            "overwrite it (choose another --out)")
