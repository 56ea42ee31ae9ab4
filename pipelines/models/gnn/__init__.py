"""Graph neural network rankers (PyTorch / PyTorch Geometric). Importing this package imports torch."""

from pipelines.models.gnn.ranker import GNNRanker

__all__ = ["GNNRanker"]
