"""Format-exact synthetic TpuGraphs worlds: ``python -m pipelines synth --out DIR --scale small``.

``programs`` builds HLO-like program graphs and their node features, ``costmodel`` turns configs
into runtimes (documented, physically motivated), ``searches`` draws configs, ``world`` names,
sizes and writes everything through :mod:`pipelines.data.tpugraphs`. ``families`` holds the cost-model
families a world's measured runtimes can follow (``synth --family NAME``; ``reference`` is
``costmodel``).
"""

from pipelines.synth.world import SCALES, generate_world

__all__ = ["SCALES", "generate_world"]
