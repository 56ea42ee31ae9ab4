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
# # 02 Pruning ablation
#
# Layout graphs are cut to the configurable nodes and their k-hop neighbourhood before features
# and node arrays are built (`prune.mode`, `prune.hops`). This compares 0/1/2/3 hops and
# config-only pruning: graph size after pruning against the out-of-fold score, per layout
# collection, as mean +- spread over folds x seeds (tile graphs are never pruned).
#
# Every variant is a cached pipeline run (prepare + train); scores are read back from each
# training stage's `scores.parquet` and its manifest.

# %%
import polars as pl

from pipelines.reports import analysis

settings = analysis.notebook_settings()
figures = settings.work_dir / "figures"
print(settings.describe())
print(analysis.prepare_world(settings))
collections = [c for c in settings.collections if c.startswith("layout")]
models = analysis.choose_models(settings, ["gbdt", "gnn"])
variants = {
    "config-only": ['prune.mode="config_only"'],
    "0-hop": ["prune.hops=0"],
    "1-hop": ["prune.hops=1"],
    "2-hop": ["prune.hops=2"],
    "3-hop": ["prune.hops=3"],
}

# %%
trained = analysis.train_variants(settings, variants, models, collections)
summary = analysis.variant_summary(trained)

# Graph size after pruning: mean nodes per labelled graph, from the prune stage's graphs.parquet.
sizes = pl.concat([
    t.prepared.graph_table.filter(pl.col("split") != "test")
    .select(pl.lit(t.collection).alias("collection"), pl.lit(t.variant).alias("variant"),
            pl.col("nodes_after").mean().alias("nodes_after"), pl.col("nodes_before").mean().alias("nodes_before"))
    for t in trained if t.model == models[0]
])
table = summary.join(sizes, on=["collection", "variant"], how="left")
print(analysis.format_table(table.select("collection", "model", "variant", "nodes_after", "mean", "std_seeds",
                                         "std_cells", "cells")))

# %% [markdown]
# Paired view: each variant minus the default 1-hop pruning in the same fold x seed cell (same
# graphs, same seed), which cancels most of the fold-to-fold noise.

# %%
paired = analysis.paired_differences(analysis.variant_cells(trained), baseline="1-hop",
                                     by=("collection", "model"))
print(analysis.format_table(analysis.summarize_cells(paired, ["collection", "model", "variant"])))

# %% [markdown]
# ## Score per variant, and graph size against score

# %%
import matplotlib.pyplot as plt

fig = analysis.errorbar_plot(summary, x="variant", series="model", title="Pruning: OOF score per variant")
analysis.save_figure(fig, figures / "02-pruning-score.png", close=False)

fig, axes = plt.subplots(1, len(collections), figsize=(4.2 * len(collections), 3.4), squeeze=False)
for ax, name in zip(axes[0], collections):
    for model in models:
        part = table.filter((pl.col("collection") == name) & (pl.col("model") == model))
        ax.errorbar(part["nodes_after"].to_numpy(), part["mean"].to_numpy(), yerr=part["std_cells"].to_numpy(),
                    marker="o", capsize=3, linestyle="none", label=model)
        for label, x, y in part.select("variant", "nodes_after", "mean").iter_rows():
            ax.annotate(label, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("mean nodes per graph after pruning")
    ax.set_title(name, fontsize=10)
    ax.grid(alpha=0.3)
axes[0][0].set_ylabel("OOF Kendall tau (mean +- std over cells)")
axes[0][-1].legend(fontsize=8)
fig.tight_layout()
analysis.save_figure(fig, figures / "02-pruning-size-vs-score.png", close=False)

# %% [markdown]
# ## Where the figures went

# %%
print(analysis.finish(settings, figures))
