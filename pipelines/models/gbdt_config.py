"""Hyperparameters of the GBDT ranker (a plain dataclass: importing it must stay cheap).

Every field except ``collections`` is a hyperparameter of :class:`pipelines.models.gbdt.GBDTRanker`
or of how the training stage feeds it. ``collections`` maps a collection name (``"tile:xla"``) to
field overrides for that collection; the config machinery resolves them before a model is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GBDTConfig:
    # lambdarank | xendcg: one LightGBM query per graph, graded relevance from the runtime rank;
    # regression: pointwise on a per-graph normalised target; pairwise: "which of two is faster".
    objective: str = "lambdarank"
    seed: int = 0  # added to every run seed, to draw a different family of models without new run seeds
    # --- LightGBM trees
    num_leaves: int = 31
    learning_rate: float = 0.05
    n_estimators: int = 600  # upper bound; early stopping on the held-out fold picks the number
    early_stopping_rounds: int = 50
    min_child_samples: int = 20
    feature_fraction: float = 0.8
    bagging_fraction: float = 0.8  # < 1 (with bagging_freq > 0) makes seeds differ
    bagging_freq: int = 1
    lambda_l2: float = 1.0
    num_threads: int = 0  # 0: cores available / parallel jobs of the training stage
    # --- data fed to the trees
    graph_features: str = "auto"  # g_* columns: auto (tile only) | always | never
    max_configs_per_graph: int = 1000  # training subsample per graph, stratified by runtime rank
    load_max_configs: int = 5000  # configs per graph read from the feature cache for fitting (memory bound)
    # --- objective details
    relevance_bins: int = 31  # lambdarank/xendcg labels 0..bins-1 from the runtime rank, fastest highest
    label_gain: str = "exponential"  # lambdarank gain of label l: exponential 2^l - 1 | linear l
    truncation_level: int = 30  # lambdarank: pairs are formed with the top this-many of each query
    regression_target: str = "log_centered"  # log_centered: log y - mean per graph | rank_pct: rank in [0, 1]
    pairs_per_graph: int = 4000  # pairwise: training pairs sampled per graph (ties dropped)
    pairwise_references: int = 64  # pairwise: configs of the same graph each config is compared with
    collections: dict[str, dict] = field(default_factory=dict)
