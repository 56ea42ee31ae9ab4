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
# # 04 Model comparison
#
# GBDT vs. GNN vs. their ensemble per collection (with the `random` and single-`feature`
# references every model must beat), then the GNN's options, one knob at a time from the config's
# GNN: loss (`listmle` vs. `hinge`), layout physics on/off (layout collections: the padding the chosen
# layouts imply, fed to the config embedding), config pairs on/off (layout: a message per config at
# every place two layouts meet, directly or through elementwise chains), cross-config attention
# on/off, autoencoder pre-training on/off, one or two passes over the training graphs per epoch (twice
# the optimiser steps for the same validations). Every number is a mean +- spread
# over folds x seeds, read from the training stages' `scores.parquet`. The ensemble is blended seed
# by seed from the saved out-of-fold predictions (`predictions.parquet`), weights fitted on them.
# When the GNN is not registered in `pipelines.config.registry.MODELS`, its rows are skipped and the
# ensemble blends the GBDT with the best single feature instead.

# %%
import polars as pl

from pipelines.reports import analysis
from pipelines.training.fit import load_predictions

settings = analysis.notebook_settings()
figures = settings.work_dir / "figures"
print(settings.describe())
print(analysis.prepare_world(settings))
models = analysis.choose_models(settings, ["gbdt", "gnn", "feature", "random"])
has_gnn = "gnn" in models

# %% [markdown]
# ## Models and their ensemble per collection

# %%
trained = analysis.train_variants(settings, {"default": []}, models)
partner = "gnn" if has_gnn else "feature"
blended = []
for name in settings.collections:
    outputs = {t.model: t for t in trained if t.collection == name and t.model in ("gbdt", partner)}
    if len(outputs) < 2:
        continue
    predictions = {m: load_predictions(t.output) for m, t in outputs.items()}
    graphs = predictions["gbdt"].filter(pl.col("split") == "oof")["graph"].unique().to_list()
    truths = analysis.true_runtimes(outputs["gbdt"].prepared.stages["prune"], name, graphs)
    per_graph = analysis.blend_by_seed(predictions, truths, name)
    blended.append(per_graph)
cells = pl.concat([analysis.cell_scores(analysis.load_scores([t])).with_columns(pl.lit(t.model).alias("model"))
                   for t in trained])
if blended:
    ensemble = pl.concat(blended)
    cells = pl.concat([cells, analysis.cell_scores(ensemble.with_columns(pl.lit("oof").alias("split")))
                      .with_columns(pl.lit(f"ensemble (gbdt+{partner})").alias("model"))], how="vertical_relaxed")
    weights = (ensemble.group_by("collection", "seed").agg(pl.col(f"weight:{partner}").first())
               .sort("collection", "seed"))
    print(f"fitted weight of {partner} per seed:")
    print(analysis.format_table(weights))
comparison = analysis.summarize_cells(cells, ["collection", "model"])
print(analysis.format_table(comparison))
fig = analysis.errorbar_plot(comparison, x="model", title="Models per collection", xlabel="model")
analysis.save_figure(fig, figures / "04-models.png", close=False)

# %% [markdown]
# ## GNN options: loss, layout physics, config pairs, readout, attention, pre-training, passes, free layers,
# other collections' graphs

# %%
if has_gnn:
    # Each option changes one knob of the config's GNN (the same stage as a listed loss is reused).
    options = {
        "config default": [],
        "hinge loss": ['gnn.loss="hinge"'],
        "listmle loss": ['gnn.loss="listmle"'],
        "layout physics on": ["gnn.layout_physics=true"],
        "layout physics off": ["gnn.layout_physics=false"],
        "config pairs on": ["gnn.config_pairs=true"],
        "config pairs off": ["gnn.config_pairs=false"],
        "pooled readout": ['gnn.readout="pooled"'],
        "pooled+sum readout": ['gnn.readout="pooled+sum"'],
        "cross-config attention on": ["gnn.cross_config_attention=true"],
        "cross-config attention off": ["gnn.cross_config_attention=false"],
        "pre-training on": ["gnn.pretrain=true"],
        "pre-training off": ["gnn.pretrain=false"],
        "1 pass per epoch": ["gnn.passes_per_epoch=1"],
        "2 passes per epoch": ["gnn.passes_per_epoch=2"],
        "3 free layers": ["gnn.free_layers=3"],
        # per collection: each xla layout collection also trains on its nlp twin's labelled graphs (base.toml
        # does so for xla:random; the lighter configs train every collection on its own graphs only)
        "own graphs only": ["gnn.extra_train_collections=[]"],
        "xla also trains on nlp graphs": [
            'gnn.collections."layout:xla:random".extra_train_collections=["layout:nlp:random"]',
            'gnn.collections."layout:xla:default".extra_train_collections=["layout:nlp:default"]'],
    }
    gnn_trained = analysis.train_variants(settings, options, ["gnn"])
    gnn_summary = analysis.variant_summary(gnn_trained)
    print(analysis.format_table(gnn_summary))
    paired = analysis.paired_differences(analysis.variant_cells(gnn_trained), baseline="config default")
    print("paired change against the config default (same fold x seed cells):")
    print(analysis.format_table(analysis.summarize_cells(paired, ["collection", "variant"])))
    fig = analysis.errorbar_plot(gnn_summary, x="variant", title="GNN options", xlabel="GNN variant")
    analysis.save_figure(fig, figures / "04-gnn-options.png", close=False)
else:
    print("the GNN is not registered in pipelines.config.registry.MODELS: no GNN options to compare")

# %% [markdown]
# ## Where the figures went

# %%
print(analysis.finish(settings, figures))
