"""Hyperparameters of the GNN ranker (a plain dataclass: importing it must not import torch).

``collections`` maps a collection name (``"layout:xla:default"``) to field overrides; the ranker
resolves them with :meth:`GNNConfig.for_collection` for the collection of its training graphs, so
one config object can carry the choices for all five collections.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from pipelines.errors import ConfigError

CONVS = ("sage", "gat")
LOSSES = ("hinge", "listmle")
NORMS = ("layer", "none")
SCHEDULES = ("cosine", "onecycle", "constant")


@dataclass
class GNNConfig:
    # --- architecture
    hidden: int = 64  # node state width H
    opcode_dim: int = 32  # opcode embedding width (projected with the node features to H)
    config_value_dim: int = 8  # layout: embedding width of each of the 18 config values (-1..5)
    conv: str = "sage"  # "sage" (bidirectional mean GraphSAGE, fused) or "gat" (GATv2, unfused)
    free_layers: int = 2  # message-passing layers run once per graph, before configs are injected
    config_layers: int = 1  # layers run per config after injection (tile: all layers are config-free)
    norm: str = "layer"  # "layer" (LayerNorm per node) or "none"; graph-level norms break the fusion
    dropout: float = 0.0
    gat_heads: int = 2
    layout_physics: bool = True  # layout: add the padding the chosen layouts imply (batch.layout_physics)
    cross_config_attention: bool = False  # transformer layer across the K pooled configs of a graph
    attention_heads: int = 4
    # --- loss and sampling
    loss: str = "hinge"  # "hinge" (all pairs with different runtimes) or "listmle"
    margin: float = 0.1  # hinge margin on the score scale
    configs_per_graph: int = 32  # K configs sampled per graph per step
    graphs_per_step: int = 1  # graphs per optimiser step (tile graphs are small: use more)
    # --- optimisation
    epochs: int = 20
    lr: float = 1e-3
    weight_decay: float = 1e-4
    schedule: str = "cosine"  # cosine (after linear warmup), onecycle, constant
    warmup_fraction: float = 0.05
    grad_clip: float = 1.0
    patience: int = 5  # epochs without a better validation score before stopping; 0 = never stop
    # --- evaluation
    eval_chunk: int = 512  # at most this many configs scored per forward pass when predicting
    eval_chunk_mb: int = 8  # ... and few enough that one per-config state tensor fits in this (MiB)
    eval_max_configs: int = 256  # configs per validation graph used for early stopping (fixed sample)
    # --- unsupervised pre-training of the node encoder (graph autoencoder)
    pretrain: bool = False
    pretrain_epochs: int = 2
    pretrain_lr: float = 1e-3
    pretrain_mask_rate: float = 0.15  # share of nodes whose opcode is masked and predicted
    # --- runtime
    num_threads: int = 2
    progress: bool = True  # tqdm bars (also switched off when stderr is not a terminal)
    # per-collection overrides, e.g. {"layout:xla:default": {"cross_config_attention": True}};
    # tile graphs are tiny, so several go into one step
    collections: dict[str, dict] = field(default_factory=lambda: {"tile:xla": {"graphs_per_step": 16}})

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError on values the model cannot use."""
        checks = [
            (self.conv in CONVS, f"conv must be one of {CONVS}, got {self.conv!r}"),
            (self.loss in LOSSES, f"loss must be one of {LOSSES}, got {self.loss!r}"),
            (self.norm in NORMS, f"norm must be one of {NORMS}, got {self.norm!r}"),
            (self.schedule in SCHEDULES, f"schedule must be one of {SCHEDULES}, got {self.schedule!r}"),
            (self.hidden > 0 and self.opcode_dim > 0 and self.config_value_dim > 0, "widths must be positive"),
            (self.free_layers >= 0, "free_layers must be >= 0"),
            (self.config_layers >= 1, "config_layers must be >= 1 (configs must reach the graph)"),
            (0.0 <= self.dropout < 1.0, "dropout must be in [0, 1)"),
            (self.hidden % self.gat_heads == 0, "hidden must be divisible by gat_heads"),
            (self.configs_per_graph >= 2, "configs_per_graph must be >= 2 (a ranking needs pairs)"),
            (self.graphs_per_step >= 1, "graphs_per_step must be >= 1"),
            (self.epochs >= 1 and self.pretrain_epochs >= 0, "epochs must be >= 1"),
            (self.lr > 0 and self.pretrain_lr > 0 and self.weight_decay >= 0, "bad learning rate or decay"),
            (0.0 <= self.warmup_fraction < 1.0, "warmup_fraction must be in [0, 1)"),
            (self.grad_clip > 0, "grad_clip must be positive"),
            (self.patience >= 0, "patience must be >= 0"),
            (self.eval_chunk >= 1 and self.eval_chunk_mb >= 1 and self.eval_max_configs >= 2,
             "bad eval_chunk / eval_chunk_mb / eval_max_configs"),
            (0.0 < self.pretrain_mask_rate < 1.0, "pretrain_mask_rate must be in (0, 1)"),
            (self.num_threads >= 1, "num_threads must be >= 1"),
            (self.margin >= 0, "margin must be >= 0"),
        ]
        problems = [message for ok, message in checks if not ok]
        if self.cross_config_attention and self.hidden % self.attention_heads:
            problems.append("hidden must be divisible by attention_heads")
        if problems:
            raise ConfigError("GNN config: " + "; ".join(problems))

    def for_collection(self, collection: str) -> GNNConfig:
        """This config with the overrides of ``collection`` applied (and no override table left)."""
        overrides = dict(self.collections.get(collection, {}))
        known = {f.name for f in fields(self)} - {"collections"}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError(f"GNN config: unknown field(s) {unknown} in overrides for {collection}")
        return replace(self, collections={}, **overrides)

    def to_dict(self) -> dict:
        return asdict(self)


# What ``python -m pipelines tune --model gnn`` searches (pipelines.tune): field -> ("int" | "float",
# low, high, log scale) or ("categorical", choices). Width, depth, loss and optimiser; the schedule
# length (epochs) and evaluation knobs stay the config's, so a trial costs what a run costs.
SEARCH_SPACE: dict[str, tuple] = {
    "hidden": ("categorical", (32, 64, 128)),
    "free_layers": ("int", 1, 3, False),
    "dropout": ("float", 0.0, 0.3, False),
    "loss": ("categorical", LOSSES),
    "margin": ("float", 0.01, 0.5, True),
    "lr": ("float", 1e-4, 3e-3, True),
    "weight_decay": ("float", 1e-6, 1e-3, True),
    "configs_per_graph": ("categorical", (16, 32, 64)),
}
