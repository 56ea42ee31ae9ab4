"""Hyperparameters of the GNN ranker (a plain dataclass: importing it must not import torch)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GNNConfig:
    hidden: int = 64
    seed: int = 0
    # collection name -> overrides of the fields above for that collection (see pipelines.config)
    collections: dict[str, dict] = field(default_factory=dict)
