"""How the training stage (``pipelines.training.fit``) drives the GNN: its entry in
:mod:`pipelines.config.registry`, imported only when the GNN is trained (torch is heavy)."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from pipelines.core.collection import Collection
from pipelines.core.errors import ConfigError
from pipelines.models.gnn.batch import compact_configs
from pipelines.models.gnn.ranker import GNNRanker, read_model_file
from pipelines.data.node_arrays import NODE_FEATURE_DIM, GraphArrays

# job_memory: configurable nodes per layout graph assumed, tensors alive in a step, torch's own footprint
AVG_CONFIG_NODES = 64
STEP_COPIES = 12
STEP_COPIES_HEAP_REUSE = 21  # gnn.cpu_heap_reuse keeps freed blocks of other sizes: +0.8 GB on an 11k-node graph
TORCH_BYTES = 512 * 2**20
INIT_DIGEST = "init_from_sha256"  # the stage-key-only setting beside gnn.init_from: the file's bytes


def subsample_configs(graph: GraphArrays, max_configs: int, seed: int) -> GraphArrays:
    """At most ``max_configs`` configs of ``graph`` (a seeded sample, kept in file order)."""
    if graph.num_configs <= max_configs:
        return graph
    rng = np.random.default_rng([seed, *graph.stem.encode()])
    keep = np.sort(rng.choice(graph.num_configs, size=max_configs, replace=False))
    return replace(graph, config_feat=graph.config_feat[keep], target=graph.target[keep],
                   config_index=graph.config_index[keep])


class GNNAdapter:
    """Drives :class:`GNNRanker` in the training stage (see :mod:`pipelines.models.contract`)."""

    name = "gnn"
    ranker_class = GNNRanker
    checkpoints = True  # the training stage passes a checkpoint_dir, so a killed fit resumes at its last epoch
    long_jobs = True  # fold jobs of many epochs: a run starts these stages first (run.train_models)
    input_stages = ("node_arrays", "folds")

    def settings(self, config: Any, collection: Collection) -> dict[str, Any]:
        from pipelines.config.settings import model_settings

        # resolved, with its empty `collections` kept: the ranker must not apply its defaults' tables again
        settings = model_settings(config, "gnn", collection)
        if settings.get("init_from"):
            # the fits start from that file's weights: its bytes key the stage, not only its name; absolute,
            # as fold jobs in worker processes may run elsewhere
            path = Path(settings["init_from"]).resolve()
            try:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError as exc:
                raise ConfigError(f"gnn.init_from: cannot read {path} ({exc.strerror or exc})") from None
            kind = read_model_file(path)["kind"]  # a foreign file is refused here, before any stage runs
            if kind != collection.kind:
                raise ConfigError(f"gnn.init_from {path}: a {kind} model cannot start the fits of {collection.name}")
            settings |= {"init_from": str(path), INIT_DIGEST: digest}
        return settings

    def inputs(self, prepared: Any) -> dict[str, str]:
        return {name: prepared.stages[name].key for name in self.input_stages}

    def load(self, prepared: Any, graphs: list[str], *, settings: dict[str, Any], fit: bool,
             seed: int) -> list[GraphArrays]:
        if not fit:
            return [prepared.load_graph_arrays(g) for g in graphs]
        # one graph at a time: a file's full configs are only in memory until its sample is compacted
        return [compact_configs(subsample_configs(prepared.load_graph_arrays(g), settings["load_max_configs"], seed))
                for g in graphs]

    def index(self, data: list[GraphArrays]) -> tuple[np.ndarray, np.ndarray]:
        names = np.concatenate([np.full(g.num_configs, g.stem, dtype=object) for g in data]) if data \
            else np.zeros(0, dtype=object)
        index = np.concatenate([g.config_index for g in data]) if data else np.zeros(0, np.int64)
        return names, index

    def make(self, settings: dict[str, Any], collection: Collection, *, num_threads: int) -> GNNRanker:
        config = {k: v for k, v in settings.items() if k != INIT_DIGEST}
        return GNNRanker({**config, "progress": False}, collection=collection, num_threads=num_threads)

    def job_memory(self, prepared: Any, graphs: list[str], settings: dict[str, Any]) -> int:
        """Rough peak bytes of a fit: every graph's arrays plus one training step on the largest graph.

        The graph table has no count of configurable nodes, so configs are costed at
        ``AVG_CONFIG_NODES`` nodes each, 2 bytes per node (``LayoutConfigs``' ids, as ``load`` holds them);
        a step keeps ~``STEP_COPIES`` (nodes, K, hidden) float tensors (``STEP_COPIES_HEAP_REUSE`` when
        freed ones stay in the heap).
        """
        table = prepared.graph_table.filter(pl.col("graph").is_in(graphs))
        nodes = table["nodes_after"].to_numpy()
        configs = np.minimum(table["configs_after"].to_numpy(), settings["load_max_configs"])
        arrays = nodes * 4 * NODE_FEATURE_DIM + configs * AVG_CONFIG_NODES * 2  # float32 features, uint16 ids
        copies = STEP_COPIES_HEAP_REUSE if settings.get("cpu_heap_reuse") else STEP_COPIES
        step = int(nodes.max(initial=0)) * settings["configs_per_graph"] * settings["hidden"] * 4 * copies
        return int(arrays.sum()) + step + TORCH_BYTES

    def describe(self, fitted: GNNRanker) -> tuple[dict[str, Any], pl.DataFrame | None]:
        history = fitted.history_
        return {"best_score": fitted.best_score_, "epochs_run": len(history),
                # every epoch ran: early stopping never ended the fit, which may not have converged
                "stopped_at_cap": len(history) >= int(fitted.config.epochs),
                "train_seconds": float(sum(h["seconds"] for h in history)), "device": fitted.device_}, None
