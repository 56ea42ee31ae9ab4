"""Hyperparameters of the GNN ranker (a plain dataclass: importing it must not import torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GNNConfig:
    hidden: int = 64
    seed: int = 0
