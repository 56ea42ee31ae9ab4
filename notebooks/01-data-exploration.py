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
# # 01 Data exploration
#
# Sizes per collection and split, runtime spread per graph, opcode mix, configurable-node counts
# and duplicate configs. Raw files are read one at a time (without their config arrays); the
# duplicate counts come from the `prune` stage's `graphs.parquet`, found through its manifest.
#
# `TPUGRAPHS_CONFIG=smoke` runs it on the `tiny` world in a temporary folder (what the tests do);
# otherwise on the `small` synthetic world (`data/synthetic-small`, generated when missing).
# See `pipelines.reports.analysis.notebook_settings` for every switch.

# %%
import numpy as np
import polars as pl

from pipelines.reports import analysis
from pipelines.flows.prepare import prepare

settings = analysis.notebook_settings()
figures = settings.work_dir / "figures"
print(settings.describe())
print(analysis.prepare_world(settings))

# %% [markdown]
# ## Sizes per collection and split

# %%
graphs, opcodes = analysis.graph_facts(settings.data_root, settings.collections)
sizes = (graphs.group_by("collection", "split")
         .agg(pl.len().alias("graphs"), pl.col("nodes").median().alias("nodes_median"),
              pl.col("nodes").max().alias("nodes_max"), pl.col("configs").median().alias("configs_median"),
              pl.col("configs").sum().alias("configs_total"),
              pl.col("configurable").median().alias("configurable_median"))
         .sort("collection", "split"))
print(analysis.format_table(sizes))

# %% [markdown]
# ## Runtime spread per graph
#
# `log10(max/min)` of a graph's runtimes: how much there is to gain by choosing well. Graphs whose
# configs barely differ make Kendall tau noisy (many near-ties).

# %%
import matplotlib.pyplot as plt

labelled = graphs.filter(pl.col("split") != "test")
spread = (labelled.group_by("collection")
          .agg(pl.col("log10_max_over_min").median().alias("median_log10_max_min"),
               pl.col("log10_max_over_min").min().alias("min"), pl.col("log10_max_over_min").max().alias("max"),
               pl.col("cv").median().alias("median_cv"))
          .sort("collection"))
print(analysis.format_table(spread))
fig, ax = plt.subplots(figsize=(6, 3.2))
values_by_collection = {name: labelled.filter(pl.col("collection") == name)["log10_max_over_min"].drop_nans().to_numpy()
                        for name in settings.collections}
# one set of bin edges for every collection, so the bars compare like with like
edges = np.histogram_bin_edges(np.concatenate([v for v in values_by_collection.values()] or [np.zeros(1)]), bins=20)
for name, values in values_by_collection.items():
    ax.hist(values, bins=edges, histtype="step", linewidth=1.5, label=name)
ax.set_xlabel("log10(max runtime / min runtime) per graph")
ax.set_ylabel("graphs")
ax.legend(fontsize=8)
fig.tight_layout()
analysis.save_figure(fig, figures / "01-runtime-spread.png", close=False)

# %% [markdown]
# ## Opcode mix

# %%
mix = analysis.opcode_mix(opcodes, top=10)
print(analysis.format_table(mix))
wide = mix.pivot(on="collection", index="name", values="share").fill_null(0.0)
fig, ax = plt.subplots(figsize=(7, 3.4))
names = wide["name"].to_list()
width = 0.8 / max(1, len(wide.columns) - 1)
for i, column in enumerate(c for c in wide.columns if c != "name"):
    ax.bar([j + i * width for j in range(len(names))], wide[column].to_numpy(), width=width, label=column)
ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, rotation=45, ha="right")
ax.set_xlabel("opcode")
ax.set_ylabel("share of nodes")
ax.legend(fontsize=8)
fig.tight_layout()
analysis.save_figure(fig, figures / "01-opcode-mix.png", close=False)

# %% [markdown]
# ## Configurable nodes (layout) and duplicate configs
#
# Duplicates: configs of a labelled graph identical to an earlier one (the `prune` stage keeps one;
# `prune.dedup`). The synthetic search re-measures a few duplicates, so they can disagree.

# %%
config = analysis.load_pipeline_config(settings)
prepared = prepare(config, settings.data_root, settings.work_dir, settings.collections)
dedup = pl.concat([
    item.graph_table.with_columns(pl.lit(name).alias("collection"))
    .select("collection", "split", "graph", "configs_before", "configs_after")
    for name, item in prepared.items()
]).filter(pl.col("split") != "test")
duplicates = (dedup.group_by("collection")
              .agg(pl.col("configs_before").sum().alias("configs"),
                   (pl.col("configs_before") - pl.col("configs_after")).sum().alias("duplicates"),
                   ((pl.col("configs_before") - pl.col("configs_after")) > 0).sum().alias("graphs_with_duplicates"))
              .with_columns((pl.col("duplicates") / pl.col("configs")).alias("duplicate_share"))
              .sort("collection"))
print(analysis.format_table(duplicates))
layout = graphs.filter(pl.col("configurable") > 0)
if layout.height:
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for name in layout["collection"].unique(maintain_order=True).to_list():
        part = layout.filter(pl.col("collection") == name)
        ax.scatter(part["nodes"].to_numpy(), part["configurable"].to_numpy(), s=12, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("nodes")
    ax.set_ylabel("configurable nodes")
    ax.legend(fontsize=8)
    fig.tight_layout()
    analysis.save_figure(fig, figures / "01-configurable-nodes.png", close=False)

# %% [markdown]
# ## Where the figures went

# %%
print(analysis.finish(settings, figures))
