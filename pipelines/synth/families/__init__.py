"""Cost-model families: worlds whose TPU differs in rules, not only in constants (issue 67).

A family is a module with

* ``NAME``: its registry name;
* ``layout_runtimes(program, blocks) -> (k,) float64``: noise-free ns of one program run per layout
  config (``blocks`` int8 (k, nc, 18), see :mod:`pipelines.synth.searches`);
* ``tile_runtimes(kernel, config_feat) -> (k,) float64``: noise-free ns of one kernel run per tile
  config (``config_feat`` (k, 24));
* ``noise_sigma(search) -> float``: the log-normal width of a measurement, ``search`` one of
  ``"tile"``, ``"default"``, ``"random"``; optionally ``noise_range(search) -> (low, high)``, a
  per-file range the world draws the width from (``noise_sigma`` is then not used).

Each family documents its rules in its module docstring, the one place they are written down.
Only measured runtimes come from the family: the world's searches (random, and the default
search whose autotuner prices candidates with :func:`costmodel.layout_cost_model`) keep using the
reference model as the compiler's own heuristic, as a real compiler explores with its analytic
model while runtimes are measured on the chip. Measurement noise, benchmark-loop repeats and the
handling of duplicate configs stay in :mod:`pipelines.synth.world`, with the family's widths.

``reference`` is :mod:`pipelines.synth.costmodel` itself (its ``--variant`` constants apply to it
alone). ``heldout`` is written by an outside author from public facts only; it is registered here
so that the merged file works, and selecting it before the file exists is a clear error.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from pipelines.core.errors import ConfigError
from pipelines.synth import costmodel

REFERENCE = "reference"
HELDOUT = "heldout"
SEARCHES = ("tile", "default", "random")

# name -> module (imported only when the family is chosen)
REGISTRY: dict[str, str] = {
    REFERENCE: "pipelines.synth.families.reference",
    "mxu_strict": "pipelines.synth.families.mxu_strict",
    "copy_fusion": "pipelines.synth.families.copy_fusion",
    "packed_tiles": "pipelines.synth.families.packed_tiles",
    HELDOUT: "pipelines.synth.families.heldout",
}
# the families decisions are taken on (docs/transfer-protocol.md); heldout only confirms
DECIDING = (REFERENCE, "mxu_strict", "copy_fusion", "packed_tiles")


def family_module(name: str) -> ModuleType:
    """The module of a registered family; an unknown name or a missing module is a ConfigError."""
    if name not in REGISTRY:
        raise ConfigError(f"unknown cost-model family {name!r}; expected one of {', '.join(REGISTRY)}")
    path = REGISTRY[name]
    try:
        module = importlib.import_module(path)
    except ModuleNotFoundError as exc:
        if exc.name != path:
            raise
        raise ConfigError(f"cost-model family {name!r} is registered but its module {path} is missing "
                          f"({path.replace('.', '/')}.py not merged yet?)") from None
    for attr in ("NAME", "layout_runtimes", "tile_runtimes", "noise_sigma"):
        if not hasattr(module, attr):
            raise ConfigError(f"cost-model family {name!r}: {path} defines no {attr}")
    return module


@dataclass(frozen=True)
class CostFamily:
    """A loaded family bound to the world's constants (``params``: the reference's variant)."""

    name: str
    module: ModuleType
    params: costmodel.CostParams = costmodel.DEFAULT_PARAMS

    @property
    def takes_params(self) -> bool:
        return bool(getattr(self.module, "TAKES_PARAMS", False))

    def layout_runtimes(self, program, blocks: np.ndarray) -> np.ndarray:
        if self.takes_params:
            return self.module.layout_runtimes(program, blocks, params=self.params)
        return np.asarray(self.module.layout_runtimes(program, blocks), dtype=np.float64)

    def tile_runtimes(self, kernel, config_feat: np.ndarray) -> np.ndarray:
        if self.takes_params:
            return self.module.tile_runtimes(kernel, config_feat, params=self.params)
        return np.asarray(self.module.tile_runtimes(kernel, config_feat), dtype=np.float64)

    def noise_range(self, search: str) -> tuple[float, float]:
        """The range the world draws a file's noise width from (one draw either way, so every
        family consumes the file's random stream alike)."""
        if search not in SEARCHES:
            raise ValueError(f"search must be one of {SEARCHES}, got {search!r}")
        ranged = getattr(self.module, "noise_range", None)
        if ranged is not None:
            low, high = (ranged(search, params=self.params) if self.takes_params else ranged(search))
            return float(low), float(high)
        sigma = float(self.module.noise_sigma(search))
        return sigma, sigma


def load_family(name: str = REFERENCE, variant: int = 0) -> CostFamily:
    """The family ``name``; ``variant`` (the reference's constants) applies to ``reference`` only."""
    module = family_module(name)
    if variant and name != REFERENCE:
        raise ConfigError(f"--variant applies to the reference family only (got family {name!r}, variant {variant})")
    return CostFamily(name, module, costmodel.variant_params(variant))


__all__ = ["DECIDING", "HELDOUT", "REFERENCE", "REGISTRY", "CostFamily", "family_module", "load_family"]
