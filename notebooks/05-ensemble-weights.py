# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 Ensemble weights
#
# The out-of-fold score as a function of the blend weight, per collection, computed from the saved
# out-of-fold predictions of a run only (nothing is retrained). The run is `notebook.run_id` (in `TPUGRAPHS_SET`), else
# the newest run under the submissions folder; when there is none, one is made first with
# `pipelines.run.run_pipeline` (GBDT + GNN, or GBDT + the single-feature reference when the GNN is
# not registered). Each seed's predictions are blended at every weight, so the curve carries a
# spread over folds x seeds; the weight the run chose (fitted on the seed-averaged predictions) is
# marked, and the ensemble stage's own `curve.parquet` is shown next to it.

# %%
import numpy as np
import polars as pl

from pipelines import analysis
from pipelines.ensemble import ENSEMBLE_CURVE
from pipelines.train import load_predictions

settings = analysis.notebook_settings()
figures = settings.work_dir / "figures"
print(settings.describe())
print(analysis.prepare_world(settings))
run_id = settings.run_id or analysis.latest_run(settings.submissions_dir)
if run_id is None:
    from pipelines.run import run_pipeline

    models = analysis.choose_models(settings, ["gbdt", "gnn"])
    models = models if len(models) > 1 else ["gbdt", "feature"]
    config = analysis.load_pipeline_config(settings)
    run_id = run_pipeline(config, settings.data_root, work_dir=settings.work_dir, models=models,
                          submissions_dir=settings.submissions_dir).run_id
run = analysis.run_outputs(settings.submissions_dir, run_id)
print(f"run {run_id}: models {run.manifest['models']}, weights {run.manifest['ensemble_weights']}")

# %% [markdown]
# ## Score along the blend weight (mean +- std over folds x seeds)

# %%
grid = np.round(np.linspace(0.0, 1.0, 11), 2)
collections = [c for c in run.trained if c in settings.collections] or list(run.trained)
curves, saved = [], []
for name in collections:
    models = [m for m in run.manifest["models"] if m in run.trained[name]][:2]
    if len(models) < 2:
        print(f"{name}: the run has one model only; nothing to blend")
        continue
    predictions = {m: load_predictions(run.trained[name][m]) for m in models}
    graphs = predictions[models[0]].filter(pl.col("split") == "oof")["graph"].unique().to_list()
    truths = analysis.true_runtimes(run.prune[name], name, graphs)
    curve = analysis.weight_curve(predictions, truths, name, grid.tolist())
    curves.append(analysis.summarize_cells(curve, ["collection", "weight"]).with_columns(
        pl.lit(f"w = weight of {models[0]}").alias("series")))
    stage_curve = pl.read_parquet(run.ensemble[name].file(ENSEMBLE_CURVE))
    saved.append(stage_curve.select(pl.lit(name).alias("collection"), pl.col(f"w:{models[0]}").alias("weight"),
                                    "score").sort("weight"))
summary = pl.concat(curves)
print(analysis.format_table(summary))
best = summary.sort("mean", descending=True).group_by("collection", maintain_order=True).first()
print("best weight per collection (on the per-seed blends):")
print(analysis.format_table(best.select("collection", "weight", "mean", "std_cells")))

# %%
fig = analysis.errorbar_plot(summary, x="weight", series="series", title="OOF score vs. blend weight",
                             xlabel="blend weight")
for ax, name in zip(fig.axes, summary["collection"].unique(maintain_order=True).to_list()):
    chosen = run.manifest["ensemble_weights"][name]
    first = [m for m in run.manifest["models"] if m in run.trained[name]][0]
    ax.axvline(chosen[first], color="grey", linestyle="--", linewidth=1)
    stage = next(s for s in saved if s["collection"][0] == name)
    ax.plot(stage["weight"].to_numpy(), stage["score"].to_numpy(), color="black", linewidth=0.8, alpha=0.6)
analysis.save_figure(fig, figures / "05-ensemble-weights.png", close=False)
