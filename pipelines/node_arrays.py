"""Per-graph arrays the GNN consumes, cached per graph by the node-arrays stage.

This is the contract between feature preparation and the graph network: everything is already
pruned, de-duplicated and transformed, so a model only has to tensorise it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from pipelines.errors import FormatError


@dataclass
class GraphArrays:
    collection: str  # e.g. "layout:xla:default"
    stem: str
    split: str  # "train", "valid" or "test"
    opcode: np.ndarray  # int64 (n,) opcode ids 0..120
    node_feat: np.ndarray  # float32 (n, F): transformed features, F fixed per collection
    edge_index: np.ndarray  # int64 (2, m): PyG convention, row 0 = producer (source), row 1 = consumer
    config_nodes: np.ndarray  # int64 (nc,): positions of configurable nodes in this graph; empty for tile
    config_feat: np.ndarray  # int8 (c, nc, 18) for layout; float32 (c, 24) for tile
    runtime: np.ndarray  # float64 (c,): runtime (layout) or runtime/normalizer (tile); zeros on test
    config_index: np.ndarray  # int64 (c,): row of each config in the original file (after de-duplication)

    @property
    def num_configs(self) -> int:
        return int(self.config_feat.shape[0])

    @property
    def num_nodes(self) -> int:
        return int(self.opcode.shape[0])


_ARRAY_FIELDS = [f.name for f in fields(GraphArrays) if f.name not in ("collection", "stem", "split")]


def save_graph_arrays(path: Path | str, arrays: GraphArrays) -> None:
    """Write uncompressed (fast to load); the caller's stage folder is renamed into place atomically."""
    path = Path(path)
    meta = np.array([arrays.collection, arrays.stem, arrays.split])
    with open(path, "wb") as handle:
        np.savez(handle, meta=meta, **{name: getattr(arrays, name) for name in _ARRAY_FIELDS})


def load_graph_arrays(path: Path | str) -> GraphArrays:
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            collection, stem, split = (str(v) for v in archive["meta"])
            values = {name: archive[name] for name in _ARRAY_FIELDS}
    except (OSError, KeyError, ValueError) as exc:
        raise FormatError(path, f"cannot read cached graph arrays ({exc})") from None
    return GraphArrays(collection=collection, stem=stem, split=split, **values)
