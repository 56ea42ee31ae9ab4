"""What every model that reads the GBDT feature tables (one row per graph and config) shares: the
adapter half of :mod:`pipelines.models.contract` that loads, indexes and sizes those tables."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

# Copies of a fold's training table alive at once (polars frame, float32 matrix, its row-gathered
# copy, LightGBM's dataset).
MEMORY_COPIES = 4


class FeatureTableAdapter:
    """Loading for feature-table models; subclasses add ``name``, ``ranker_class``, ``settings``."""

    name = "feature-table"
    ranker_class: type
    input_stages = ("features", "folds")

    def inputs(self, prepared: Any) -> dict[str, str]:
        return {name: prepared.stages[name].key for name in self.input_stages}

    def load(self, prepared: Any, graphs: list[str], *, settings: dict[str, Any], fit: bool,
             seed: int) -> pl.DataFrame:
        cap = settings["load_max_configs"] if fit else None
        return prepared.load_features(graphs, max_configs=cap, seed=seed)

    def index(self, data: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        return data["graph"].to_numpy(), data["config_index"].to_numpy()

    def make(self, settings: dict[str, Any], collection: Any, *, num_threads: int) -> Any:
        return self.ranker_class(settings, collection=collection, num_threads=num_threads)

    def job_memory(self, prepared: Any, graphs: list[str], settings: dict[str, Any]) -> int:
        """Rough peak bytes of fitting on ``graphs``: capped rows x columns x copies in flight."""
        configs = prepared.graph_table.filter(pl.col("graph").is_in(graphs))["configs_after"].to_numpy()
        rows = int(np.minimum(configs, settings["load_max_configs"]).sum())
        columns = prepared.load_features(graphs[:1], max_configs=1).width
        return rows * columns * 4 * MEMORY_COPIES

    def describe(self, ranker: Any) -> tuple[dict[str, Any], pl.DataFrame | None]:
        return {}, None
