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
# `pipelines.flows.run.run_pipeline` (GBDT + GNN, or GBDT + the single-feature reference when the GNN is
# not registered). Each seed's predictions are blended at every weight, so the curve carries a
# spread over folds x seeds; the weight the run chose is marked, and the ensemble stage's own
# `curve.parquet` (fitted on the seed-averaged predictions) is shown next to it. The chosen weight is
# the curve's optimum, or the best single model alone where the optimum's gain over that model (as
# measured on OOF, or as expected at the test's averaged runs: `ensemble.gain_at`) is within
# `ensemble.min_gain_se` standard errors of the OOF gain (table below).

# %%
import numpy as np
import polars as pl

from pipelines.reports import analysis
from pipelines.training.ensemble import ENSEMBLE_CURVE, blend_rule
from pipelines.training.fit import load_predictions

settings = analysis.notebook_settings()
figures = settings.work_dir / "figures"
print(settings.describe())
print(analysis.prepare_world(settings))
run_id = settings.run_id or analysis.latest_run(settings.submissions_dir)
if run_id is None:
    from pipelines.flows.run import run_pipeline

    models = analysis.choose_models(settings, ["gbdt", "gnn"])
    models = models if len(models) > 1 else ["gbdt", "feature"]
    config = analysis.load_pipeline_config(settings)
    run_id = run_pipeline(config, settings.data_root, work_dir=settings.work_dir, models=models,
                          submissions_dir=settings.submissions_dir).run_id
run = analysis.run_outputs(settings.submissions_dir, run_id)
print(f"run {run_id}: models {run.manifest['models']}, weights {run.manifest['ensemble_weights']}")

# %% [markdown]
# ## The blend rule: the fitted optimum, its OOF gain over the best single model, the weights used

# %%
rule = pl.DataFrame([{"collection": name, **blend_rule(stage)} for name, stage in run.ensemble.items()])
print(analysis.format_table(rule))

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

# %% [markdown]
# ## The same weights on hidden test labels (synthetic worlds only)
#
# A world written by `synth` keeps its test labels in a sidecar, so there the test score of every
# blend weight can be measured from the run's saved test predictions: each run seed's fold models
# averaged (mean +- std over seeds), and every seed and fold model averaged, which is what the
# submission blends (black line). The dashed line is the weight the run used. The gap between
# the two curves' best weights is what the OOF fit gets wrong: test predictions average more models
# than OOF ones, and the test graphs are few. The real data has no test labels: skipped there.

# %%
from pipelines.training.ensemble import AVERAGED
from pipelines.synth.world import labels_marker

world = run.manifest["data_root"]
if labels_marker(world) is None:
    print(f"{world}: no hidden test labels (the real data, or a world written before the sidecar): skipped")
else:
    blended_models = {name: [m for m in run.manifest["models"] if m in run.trained[name]][:2]
                      for name in summary["collection"].unique(maintain_order=True).to_list()}
    fitted = {name: run.manifest["ensemble_weights"][name][models[0]] for name, models in blended_models.items()}
    held_out = pl.concat([
        analysis.hidden_label_weight_curve({m: load_predictions(run.trained[name][m]) for m in models}, world, name,
                                           grid.tolist())
        for name, models in blended_models.items()])
    per_seed = analysis.summarize_cells(held_out.filter(pl.col("seed") != AVERAGED), ["collection", "weight"])
    averaged = held_out.filter(pl.col("seed") == AVERAGED).select("collection", "weight",
                                                                 pl.col("score").alias("all models"))
    print(analysis.format_table(per_seed.select("collection", "weight", "mean", "std_seeds")
                                .join(averaged, on=["collection", "weight"])))
    best_test = (averaged.sort(["all models", "weight"], descending=[True, False])  # ties: the smallest weight
                 .group_by("collection", maintain_order=True).first())
    print("best test weight per collection (all models averaged), next to the weight the run used:")
    print(analysis.format_table(best_test.with_columns(
        pl.col("collection").replace_strict(fitted, return_dtype=pl.Float64).alias("weight used"))))
    fig = analysis.errorbar_plot(per_seed, x="weight", spread="std_seeds", ylabel="test score",
                                 title="Test score vs. blend weight (hidden labels)", xlabel="blend weight")
    for ax, name in zip(fig.axes, per_seed["collection"].unique(maintain_order=True).to_list()):
        line = averaged.filter(pl.col("collection") == name).sort("weight")
        ax.plot(line["weight"].to_numpy(), line["all models"].to_numpy(), color="black", linewidth=0.8)
        ax.axvline(fitted[name], color="grey", linestyle="--", linewidth=1)
    analysis.save_figure(fig, figures / "05-ensemble-weights-test.png", close=False)

# %% [markdown]
# ## Where the figures went

# %%
print(analysis.finish(settings, figures))
