"""The reference family: :mod:`pipelines.synth.costmodel` unchanged (its docstring holds the rules).

Every world written before families existed is a reference world, byte for byte; ``--variant N``
draws this family's constants (:func:`costmodel.variant_params`).
"""

from __future__ import annotations

import numpy as np

from pipelines.synth import costmodel
from pipelines.synth.programs import Program, TileKernel

NAME = "reference"
TAKES_PARAMS = True  # the world passes the variant's constants


def layout_runtimes(program: Program, blocks: np.ndarray,
                    params: costmodel.CostParams = costmodel.DEFAULT_PARAMS) -> np.ndarray:
    return costmodel.chunked_costs(costmodel.layout_cost_model(program, params), blocks)


def tile_runtimes(kernel: TileKernel, config_feat: np.ndarray,
                  params: costmodel.CostParams = costmodel.DEFAULT_PARAMS) -> np.ndarray:
    return costmodel.tile_costs(kernel, config_feat, params)


def noise_range(search: str, params: costmodel.CostParams = costmodel.DEFAULT_PARAMS) -> tuple[float, float]:
    return {"tile": params.tile_noise, "default": params.default_noise, "random": params.random_noise}[search]


def noise_sigma(search: str) -> float:
    low, high = noise_range(search)
    return (low + high) / 2
