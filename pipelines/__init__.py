"""TpuGraphs runtime-ranking pipelines: data, features, rankers, ensembles and submissions."""

__version__ = "0.1.0"
