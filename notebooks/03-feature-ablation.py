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
# # 03 Feature ablation
#
# The GBDT with all hand-made features, and without each group (`gbdt.exclude_features`, by
# column prefix): violation ratio, padding cost, implied copies, value frequencies, layout chains
# (copies where layouts meet at the ends of elementwise chains, with their padded bytes) and tile
# vector registers (tile fit to the 8x128 registers, bytes moved, working set); the groups are
# `pipelines.reports.analysis.FEATURE_GROUPS`. A group is ablated only in the collections whose feature
# tables have it (value frequencies: default-search layout only; tile: padding and vector registers
# only). Scores are
# mean +- spread over folds x seeds; gain importances come from the full model's
# `importance.parquet` (share of each fold model's total gain, averaged over fold models).

# %%
import json

import polars as pl

from pipelines.reports import analysis

settings = analysis.notebook_settings()
figures = settings.work_dir / "figures"
print(settings.describe())
print(analysis.prepare_world(settings))

full = analysis.train_variants(settings, {"all features": []}, ["gbdt"])

# %% [markdown]
# ## Ablations

# %%
trained = list(full)
for item in full:
    sample = item.prepared.load_features(item.prepared.graphs("train")[:1], max_configs=1)
    present = {analysis.feature_group_of(c) for c in sample.columns if c.startswith("f_")}
    variants = {f"without {group}": [f"gbdt.exclude_features={json.dumps(list(prefixes))}"]
                for group, prefixes in analysis.FEATURE_GROUPS.items() if group in present}
    trained += analysis.train_variants(settings, variants, ["gbdt"], [item.collection])
summary = analysis.variant_summary(trained)
baseline = summary.filter(pl.col("variant") == "all features").select("collection", pl.col("mean").alias("all"))
summary = summary.join(baseline, on="collection").with_columns((pl.col("mean") - pl.col("all")).alias("delta"))
print(analysis.format_table(summary.select("collection", "variant", "mean", "delta", "std_seeds", "std_cells",
                                           "cells")))

# %% [markdown]
# A paired view: the drop of each ablation against the full model within the same fold x seed cell
# (same graphs, same seed), which cancels most of the fold-to-fold noise.

# %%
paired = analysis.paired_differences(analysis.variant_cells(trained), baseline="all features")
paired_summary = analysis.summarize_cells(paired, ["collection", "variant"])
print(analysis.format_table(paired_summary))
fig = analysis.errorbar_plot(paired_summary, x="variant", title="Feature ablation: score change vs. all features",
                             ylabel="paired OOF score change", xlabel="")
analysis.save_figure(fig, figures / "03-feature-ablation.png", close=False)

# %% [markdown]
# ## Gain importances of the full model

# %%
importance = analysis.importance_table(analysis.load_importance(full))
print(analysis.format_table(importance.group_by("collection", maintain_order=True).head(10)))
groups = (importance.group_by("collection", "group").agg(pl.col("mean").sum().alias("gain_share"))
          .sort(["collection", "gain_share"], descending=[False, True]))
print(analysis.format_table(groups))

import matplotlib.pyplot as plt

wide = groups.pivot(on="group", index="collection", values="gain_share").fill_null(0.0)
fig, ax = plt.subplots(figsize=(7, 3.4))
bottom = [0.0] * wide.height
for group in [c for c in wide.columns if c != "collection"]:
    values = wide[group].to_list()
    ax.bar(wide["collection"].to_list(), values, bottom=bottom, label=group)
    bottom = [b + v for b, v in zip(bottom, values)]
ax.set_xlabel("collection")
ax.set_ylabel("share of total gain")
ax.legend(fontsize=8)
plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
fig.tight_layout()
analysis.save_figure(fig, figures / "03-gain-by-group.png", close=False)

# %% [markdown]
# ## Where the figures went

# %%
print(analysis.finish(settings, figures))
