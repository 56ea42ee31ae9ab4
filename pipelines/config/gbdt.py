"""Hyperparameters of the GBDT ranker (a plain dataclass: importing it must stay cheap).

Every field except ``collections`` is a hyperparameter of :class:`pipelines.models.gbdt.GBDTRanker`
or of how the training stage feeds it. ``collections`` maps a collection name (``"tile:xla"``) to
field overrides for that collection; the config machinery resolves them before a model is built.
``metadata`` holds the allowed ``choices`` and bounds that the config checker enforces on load.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.core.errors import ConfigError
from pipelines.config.fields import bounded, choice

OBJECTIVES = ("lambdarank", "xendcg", "regression", "pairwise")
GRAPH_FEATURE_MODES = ("auto", "always", "never")
LABEL_GAINS = ("exponential", "linear")
REGRESSION_TARGETS = ("log_centered", "rank_pct")
# LightGBM refuses ranking queries with this many rows or more.
LIGHTGBM_MAX_QUERY_ROWS = 10_000


@dataclass
class GBDTConfig:
    # lambdarank | xendcg: one LightGBM query per graph, graded relevance from the runtime rank;
    # regression: pointwise on a per-graph normalised target; pairwise: "which of two is faster".
    objective: str = choice("pairwise", OBJECTIVES)
    # Added to every run seed, to draw a different family of models without new run seeds.
    seed: int = bounded(0, 0, below=2**32)  # numpy and LightGBM seeds: [0, 2^32), larger ones alias
    # --- LightGBM trees
    # Leaves per tree.
    num_leaves: int = bounded(31, 2, 131072)
    # Shrinkage of each boosting round.
    learning_rate: float = bounded(0.05, 1e-6, 1.0)
    # Upper bound on boosting rounds; early stopping on the held-out fold picks the number.
    n_estimators: int = bounded(600, 1, 1_000_000)
    # Rounds without a better held-out score before boosting stops.
    early_stopping_rounds: int = bounded(50, 1)
    # Fewest rows in a leaf.
    min_child_samples: int = bounded(20, 1)
    # Share of the columns drawn for each tree.
    feature_fraction: float = bounded(0.8, 1e-6, 1.0)
    # Below 1 (with bagging_freq > 0) rows are resampled per round, so seeds give different models.
    bagging_fraction: float = bounded(0.8, 1e-6, 1.0)
    # Rows are resampled every this many rounds (0: never).
    bagging_freq: int = bounded(1, 0)
    # L2 regularisation of the leaf values.
    lambda_l2: float = bounded(1.0, 0.0)
    # LightGBM threads per model; 0: the cores available divided by the stage's parallel jobs.
    num_threads: int = bounded(0, 0)
    # --- data fed to the trees
    # g_* (graph-constant) columns: auto = tile only (they cannot order configs within one graph,
    # but let tile trees interact graph shape with tile sizes) | always | never.
    graph_features: str = choice("auto", GRAPH_FEATURE_MODES)
    # Add each f_* column's rank within its graph (in [0, 1]): thresholds that transfer across graphs.
    graph_rank_features: bool = False
    # f_* columns left out of the model: a column is dropped when its name starts with any of these
    # prefixes (feature ablations, e.g. ["f_pad_", "f_tile_waste"]); g_* columns are not affected.
    exclude_features: list[str] = field(default_factory=list)
    # Training configs per graph, subsampled by runtime-rank strata (see pipelines.models.gbdt).
    max_configs_per_graph: int = bounded(1000, 1)
    # Configs per graph read from the feature cache for fitting (bounds memory; test never capped).
    load_max_configs: int = bounded(5000, 1)
    # --- objective details
    # lambdarank/xendcg labels 0..bins-1 from the runtime rank within the graph, fastest highest.
    relevance_bins: int = bounded(31, 2)
    # lambdarank gain of label l: exponential 2^l - 1 (rewards the top) | linear l (the whole order).
    label_gain: str = choice("exponential", LABEL_GAINS)
    # lambdarank: pairs are formed with the top this-many configs of each query.
    truncation_level: int = bounded(30, 1)
    # regression target: log_centered = log y - mean over the graph | rank_pct = rank in [0, 1].
    regression_target: str = choice("log_centered", REGRESSION_TARGETS)
    # pairwise: training pairs drawn per graph (tied pairs dropped).
    pairs_per_graph: int = bounded(4000, 1)
    # pairwise: configs of the same graph each config is compared with when scoring.
    pairwise_references: int = bounded(64, 1)
    # Validation pairs per graph for the OPA early-stopping metric (layout; fixed once per fit).
    stopping_pairs_per_graph: int = bounded(2000, 1)
    # Per-collection overrides of the fields above. Pairwise is best on every layout collection,
    # regression on tile (pairwise there is slow for little gain), with within-graph rank features
    # (docs/decisions.md).
    collections: dict[str, dict] = field(default_factory=lambda: {
        "tile:xla": {"objective": "regression", "graph_rank_features": True}})

    def __post_init__(self) -> None:
        """Rules that relate two fields (single-field bounds are metadata, checked on load)."""
        if self.objective in ("lambdarank", "xendcg") and self.max_configs_per_graph >= LIGHTGBM_MAX_QUERY_ROWS:
            raise ConfigError(f"max_configs_per_graph must be below {LIGHTGBM_MAX_QUERY_ROWS} for ranking "
                              f"objectives (LightGBM's query limit), got {self.max_configs_per_graph}")


# What ``python -m pipelines tune --model gbdt`` searches (pipelines.flows.tune): field -> ("int" | "float",
# low, high, log scale) or ("categorical", choices). Trees and regularisation only: the objective per
# collection is chosen on evidence (see ``collections`` above) and the data caps trade speed for score.
SEARCH_SPACE: dict[str, tuple] = {
    "num_leaves": ("int", 7, 127, True),
    "learning_rate": ("float", 0.01, 0.2, True),
    "min_child_samples": ("int", 5, 100, True),
    "feature_fraction": ("float", 0.4, 1.0, False),
    "bagging_fraction": ("float", 0.5, 1.0, False),
    "lambda_l2": ("float", 1e-3, 30.0, True),
    "graph_rank_features": ("categorical", (False, True)),
}
