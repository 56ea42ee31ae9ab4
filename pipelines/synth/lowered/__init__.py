"""Worlds over programs we did not write: public model code lowered by jax, priced by the cost families.

``catalogue`` names the architectures and their variants (mode, batch, element type, data format),
``models`` holds the model code (transformers' Flax models, haiku nets, flax and equinox cells, and a
few written here), ``cache`` lowers a variant once and keeps its HLO module, ``convert`` turns a
featurized module into the synthetic :class:`~pipelines.synth.programs.Program` every family prices
(real opcodes, shapes, layouts and dimension numbers), and ``world`` writes a world in the usual format
with its hidden labels (``synth --programs lowered``). See docs/lowered.md.
"""

from pipelines.synth.lowered.world import generate_lowered_world

__all__ = ["generate_lowered_world"]
