"""Graph neural network rankers (PyTorch / PyTorch Geometric). Importing this package imports torch.

``GNNRanker`` is the model (fit / predict / save / load); ``GNNAdapter`` plugs it into the
training stage's registry (``pipelines.training.fit.MODELS``).
"""

from pipelines.models.gnn.adapter import GNNAdapter
from pipelines.models.gnn.ranker import GNNRanker

__all__ = ["GNNAdapter", "GNNRanker"]
