"""The prepared data of one collection: the handle through which models and blends read the outputs of
the preparation stages (pruned graphs, features, node arrays, folds), never running a stage."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import polars as pl

from pipelines.core.collection import SPLITS, Collection
from pipelines.core.engine import StageOutput
from pipelines.core.errors import PipelineError
from pipelines.data.features import read_feature_rows
from pipelines.data.folds import read_folds
from pipelines.data.node_arrays import GraphArrays, read_graph_arrays
from pipelines.data.prune import PrunedGraph, read_file_target, read_graph_table, read_pruned


@dataclass
class Prepared:
    """The prepared data of one collection: its stage outputs and how to read them."""

    collection: Collection
    stages: dict[str, StageOutput]
    cached: dict[str, bool] = field(default_factory=dict)  # per stage: reused rather than computed
    # Other collections a model trains on besides this one (``gnn.extra_train_collections``), by name
    companions: dict[str, Prepared] = field(default_factory=dict)

    @property
    def stage_keys(self) -> dict[str, str]:
        """stage -> key of its outputs, as a run manifest records them."""
        return {name: out.key for name, out in self.stages.items()}

    @cached_property
    def graph_table(self) -> pl.DataFrame:
        """One row per graph: ``graph``, ``split`` and the prune counts."""
        return read_graph_table(self.stages["prune"])

    @cached_property
    def _split_of(self) -> dict[str, str]:
        return dict(self.graph_table.select("graph", "split").iter_rows())

    def split_of(self, graph: str) -> str:
        try:
            return self._split_of[graph]
        except KeyError:
            raise PipelineError(f"{self.collection.name}: no graph {graph!r} in the prepared data") from None

    def graphs(self, split: str) -> list[str]:
        """Stems of ``split``, sorted."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        return sorted(self.graph_table.filter(pl.col("split") == split)["graph"].to_list())

    def load_features(self, graphs: Iterable[str], max_configs: int | None = None, seed: int = 0) -> pl.DataFrame:
        """Config feature rows of ``graphs`` (at most ``max_configs`` per graph, a seeded sample kept
        in file order), joined with their ``g_*`` graph aggregates."""
        return read_feature_rows(self.stages["features"], [(stem, self.split_of(stem)) for stem in graphs],
                                 max_configs, seed)

    def load_graph_arrays(self, graph: str) -> GraphArrays:
        return read_graph_arrays(self.stages["node_arrays"], self.split_of(graph), graph)

    def folds(self) -> pl.DataFrame:
        """``graph``, ``split``, ``family``, ``fold`` of every train/valid graph (fold -1: holdout)."""
        return read_folds(self.stages["folds"])

    def runtimes(self, graph: str) -> np.ndarray:
        """float64 target of every config of the original file in file order (runtime for layout,
        runtime/normalizer for tile; zeros for test), for scoring predictions."""
        return read_file_target(self.stages["prune"], self.split_of(graph), graph)

    def pruned_graph(self, graph: str) -> PrunedGraph:
        return read_pruned(self.stages["prune"], self.split_of(graph), graph)
