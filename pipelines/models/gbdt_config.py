"""Hyperparameters of the GBDT ranker (a plain dataclass: importing it must stay cheap)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GBDTConfig:
    objective: str = "lambdarank"  # lambdarank | xendcg | regression | pairwise
    seed: int = 0
