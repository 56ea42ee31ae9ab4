"""Hyperparameters of the GNN ranker (a plain dataclass: importing it must not import torch).

``collections`` maps a collection name (``"layout:xla:default"``) to field overrides; the config
machinery (:func:`pipelines.config.settings.resolve_for_collection`) applies them for the collection a model
is built for. Choices and bounds are field metadata checked by the one config checker
(:mod:`pipelines.config.settings`); ``__post_init__`` holds only the rules that relate two fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.core.collection import parse_collection
from pipelines.core.errors import ConfigError
from pipelines.config.fields import bounded, choice

CONVS = ("sage", "gat")
LOSSES = ("hinge", "hinge-gap", "hinge-std", "listmle")
NORMS = ("layer", "none")
SCHEDULES = ("cosine", "onecycle", "constant")
DEVICES = ("auto", "cpu", "cuda")  # "cuda:N" picks one GPU of several
PRECISIONS = ("fp32", "bf16")
READOUTS = ("pooled", "pooled+sum", "pooled+sum+bytes", "pooled+sum+work")


@dataclass
class GNNConfig:
    # --- architecture
    hidden: int = bounded(64, 1, 8192)  # node state width H
    opcode_dim: int = bounded(32, 1)  # opcode embedding width (projected with the node features to H)
    config_value_dim: int = bounded(8, 1)  # layout: embedding width of each of the 18 config values (-1..5)
    conv: str = choice("sage", CONVS)  # "sage" (bidirectional mean GraphSAGE, fused) or "gat" (GATv2, unfused)
    free_layers: int = bounded(2, 0)  # message-passing layers run once per graph, before configs are injected
    # layers run per config after injection (tile: all layers are config-free); 0: the configs stay at the
    # configurable nodes and reach the nodes they meet only through the chain-end messages (config_pairs)
    config_layers: int = bounded(1, 0)
    norm: str = choice("layer", NORMS)  # "layer" (LayerNorm per node) or "none"; graph-level norms break the fusion
    dropout: float = bounded(0.0, 0.0, below=1.0)  # dropout probability in the message-passing layers
    gat_heads: int = bounded(2, 1)  # attention heads of conv = "gat" (must divide hidden)
    layout_physics: bool = True  # layout: add the padding the chosen layouts imply (batch.layout_physics)
    # layout: add the kernel's padding and the role (batch, feature, spatial) of the dims each layout puts
    # minor-most (batch.layout_roles)
    layout_roles: bool = False
    # layout: pair each convolution's and dot's input and kernel blocks with the operands their shapes say (a
    # convolution's dimension numbers, a dot's output order), not with the file's edge order (real files sort
    # edges, so the first edge is operand 0 only when it was defined first); always on with layout_roles
    match_operands: bool = False
    # layout: add, per reshape and config, whether its two layouts make it a bitcast (else XLA copies the
    # tensor) and whether its tiled minor dims keep their sizes (batch.reshape_physics)
    reshape_physics: bool = False
    # tile: add what each tile size implies against the output shape and the (8, 128) registers (batch.tile_physics)
    tile_physics: bool = True
    cross_config_attention: bool = False  # transformer layer across the K pooled configs of a graph
    # layout: a message per config and chain end (configurable nodes whose layouts meet, directly or
    # through elementwise chains, or one and a fixed-layout node), added at both ends and pooled
    config_pairs: bool = True
    # layout: "pooled" (mean/max pooling, LayerNorm, MLP head) or "pooled+sum": plus a per-node cost
    # (MLP on each node state that differs between configs) summed per graph and config, / configurable nodes;
    # "pooled+sum+bytes": plus a second such cost weighted by the node's share of the graph's output bytes
    # "pooled+sum+work": plus two such costs weighted by the node's shares of the graph's bytes moved and flops
    readout: str = choice("pooled", READOUTS)
    attention_heads: int = bounded(4, 1)  # heads of cross_config_attention (must divide hidden)
    # --- loss and sampling
    # "hinge" (all pairs with different runtimes, alike), "hinge-gap" (each pair weighted by its log-runtime
    # gap over the graph's mean gap), "hinge-std" (scores over their per-graph standard deviation first, so
    # the margin does not shrink with a graph's score spread) or "listmle"
    loss: str = choice("hinge", LOSSES)
    margin: float = bounded(0.1, 0.0)  # hinge margin on the score scale ("hinge-std": in standard deviations)
    configs_per_graph: int = bounded(32, 2)  # K configs sampled per graph per step (a ranking needs pairs)
    graphs_per_step: int = bounded(1, 1)  # graphs per optimiser step (tile graphs are small: use more)
    # passes over the training graphs per epoch (each with fresh K-config samples) before one validation:
    # more optimiser steps per epoch without more validation passes (docs/decisions.md: why 4)
    passes_per_epoch: int = bounded(4, 1)
    # Configs kept per training graph when loading for a fit. The base schedule draws K=32 configs per
    # graph and pass for 20 epochs (640 draws; 2,560 with the layout collections' 4 passes), so a pool
    # of 4096 loses little, while the int8 arrays of a collection stay bounded (a real graph may have
    # 3,000 configurable nodes: 4096 x 3000 x 18 B = 221 MB).
    load_max_configs: int = bounded(4096, 2)
    # Other collections of the same kind whose labelled (train + valid) graphs join every fold model's
    # training set, never its validation, out-of-fold or test graphs: e.g. the nlp graphs, all
    # transformers, for the xla collection, where transformers are a minority (docs/decisions.md).
    extra_train_collections: list[str] = field(default_factory=list)
    # Extra graphs a pass visits, as a share of the collection's own training graphs (rounded; at most
    # all of them, drawn afresh each pass)
    extra_train_share: float = bounded(1.0, 0.0)
    # A pass's visits to the collection's own training graphs, shared in proportion to each graph's
    # configurable nodes ** this power (0: every graph once; 0.5: a graph with 4x the configurable nodes twice
    # as often). A pass keeps its number of steps, so small graphs are then skipped in some passes.
    visit_power: float = bounded(0.0, 0.0, 2.0)
    # --- optimisation
    epochs: int = bounded(20, 1)  # epochs at most (early stopping may end a fit sooner)
    lr: float = bounded(1e-3, 1e-12)  # AdamW learning rate (the schedule's peak)
    weight_decay: float = bounded(1e-4, 0.0)  # AdamW weight decay
    schedule: str = choice("cosine", SCHEDULES)  # cosine (after linear warmup), onecycle, constant
    warmup_fraction: float = bounded(0.05, 0.0, below=1.0)  # share of the steps spent warming up (linear)
    grad_clip: float = bounded(1.0, 1e-12)  # gradients clipped to this total norm
    patience: int = bounded(5, 0)  # epochs without a better validation score before stopping; 0 = never stop
    # the weights validated, kept and saved: a moving average of the trained ones over about this many epochs
    # of optimiser steps (exponential; 0: the trained weights themselves)
    weight_average_epochs: float = bounded(0.0, 0.0)
    # epochs between validations (the last epoch is always validated): a validation scores
    # eval_max_configs configs of every held-out graph, a sizeable share of a base xla fit and most of one
    # with one pass per epoch (configs/cpu.toml takes 2)
    validate_every: int = bounded(1, 1)
    # --- evaluation
    eval_chunk: int = bounded(512, 1)  # at most this many configs scored per forward pass when predicting
    eval_chunk_mb: int = bounded(32, 1)  # ... and few enough that one per-config state tensor fits in this (MiB)
    eval_chunk_mb_cuda: int = bounded(128, 1)  # the same budget when the GNN runs on a CUDA device
    eval_max_configs: int = bounded(256, 2)  # configs per validation graph used for early stopping (fixed sample)
    # --- unsupervised pre-training of the node encoder (graph autoencoder)
    pretrain: bool = False  # pre-train the node encoder (masked opcodes) before each fit
    pretrain_epochs: int = bounded(2, 0)  # epochs of that pre-training
    pretrain_lr: float = bounded(1e-3, 1e-12)  # its learning rate
    pretrain_mask_rate: float = bounded(0.15, 1e-6, below=1.0)  # share of nodes whose opcode is masked and predicted
    # --- fine-tuning: a saved GNN model file (a run's models/gnn-f*-s*.pt) whose weights start every fold
    # model's fit instead of random ones; the same architecture settings. "" = random initial weights
    init_from: str = ""
    # each fold model of a run seed fits with a seed of its own (initial weights, sampled configs), not the
    # run seed's: the test average over fold models then also averages over initialisations
    fold_seeds: bool = False
    # --- runtime
    num_threads: int = bounded(0, 0)  # 0: the training stage's share of the cores (standalone: torch's default)
    device: str = "cpu"  # "cpu", "cuda" ("cuda:N"), or "auto": CUDA when torch sees a GPU, else CPU
    precision: str = choice("fp32", PRECISIONS)  # "fp32", or "bf16": autocast mixed precision of the forward pass (GPU)
    deterministic: bool = False  # torch.use_deterministic_algorithms during the fit (GPU: bitwise repeatable)
    cpu_heap_reuse: bool = True  # CPU fits keep freed memory in the heap (glibc): same results, faster steps
    progress: bool = True  # tqdm bars (also switched off when stderr is not a terminal)
    # per-collection overrides, e.g. {"layout:xla:default": {"cross_config_attention": True}};
    # tile graphs are tiny, so several go into one step (and passes were only compared on layout), on
    # one thread (a second is overhead there);
    # nlp:random and xla:random gain from the roofline-weighted node cost, the xla
    # collections from 8 passes, xla:random from the nlp:random graphs (base.toml)
    collections: dict[str, dict] = field(default_factory=lambda: {
        "tile:xla": {"graphs_per_step": 16, "passes_per_epoch": 1, "num_threads": 1},
        "layout:nlp:random": {"readout": "pooled+sum+work"},
        "layout:xla:default": {"passes_per_epoch": 8},
        "layout:xla:random": {"passes_per_epoch": 8, "extra_train_collections": ["layout:nlp:random"],
                              "readout": "pooled+sum+work"},
    })

    def __post_init__(self) -> None:
        """Rules field metadata cannot express: two related fields, a pattern (single-field bounds are
        metadata, checked on load)."""
        if self.hidden % self.gat_heads:
            raise ConfigError(f"hidden ({self.hidden}) must be divisible by gat_heads ({self.gat_heads})")
        if self.device not in DEVICES and not (self.device.startswith("cuda:") and self.device[5:].isdigit()):
            raise ConfigError(f"device must be one of {DEVICES} or 'cuda:N', got {self.device!r}")
        for name in self.extra_train_collections:
            parse_collection(name)  # a ConfigError naming the valid collections
        if len(set(self.extra_train_collections)) != len(self.extra_train_collections):
            raise ConfigError(f"extra_train_collections lists a collection twice: {self.extra_train_collections}")
        if self.cross_config_attention and self.hidden % self.attention_heads:
            raise ConfigError(f"hidden ({self.hidden}) must be divisible by attention_heads ({self.attention_heads})")


# What ``python -m pipelines tune --model gnn`` searches (pipelines.flows.tune): field -> ("int" | "float",
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
