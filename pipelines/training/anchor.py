"""The compiler's default config as an anchor for the tile top-5 (pure functions).

Where a graph's default config is known (:meth:`pipelines.data.root.DataRoot.defaults`: the run a
tuning record marks ``is_default``, a world that names it), the default stays among the five configs
a tile submission names, unless the models are confident it is not among the fastest: every fold
model of every blended model (weight > 0), on every seed, ranks it outside its own top five. Only the
fifth pick can give way, and the metric takes the best of the five, so the anchor costs a graph only
when that fifth pick was the fastest of the five. Layout orders are left as the models give them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl

from pipelines.core.collection import Collection
from pipelines.core.metric import TILE_TOP_K as TOP_K


def default_votes(predictions: pl.DataFrame, defaults: Mapping[str, int],
                  top: int = TOP_K) -> dict[str, tuple[int, int]]:
    """Per graph with a known default: how many fold models rank the default in their own ``top``, and
    how many fold models there are. ``predictions``: one collection's test predictions of the blended
    models, one row per (graph, model, fold, seed, config) in the shared schema (lower = faster; ties
    go to the lower config index, as the submission orders them)."""
    votes: dict[str, tuple[int, int]] = {}
    keys = ["graph", "model", "fold", "seed"]
    wanted = predictions.filter(pl.col("graph").is_in(list(defaults)))
    for (graph, *_), part in wanted.partition_by(keys, as_dict=True, maintain_order=True).items():
        default = defaults[graph]
        scores, index = part["score"].to_numpy(), part["config_index"].to_numpy()
        mine = scores[index == default]
        if mine.size == 0:
            continue
        ahead = int(np.sum((scores < mine[0]) | ((scores == mine[0]) & (index < default))))
        inside, total = votes.get(graph, (0, 0))
        votes[graph] = (inside + int(ahead < top), total + 1)
    return votes


def anchor_row(row: Sequence[int], default: int, votes: tuple[int, int] | None, top: int = TOP_K) -> list[int]:
    """A tile row with the default among its first ``top`` picks, unless no fold model voted for it."""
    row = [int(i) for i in row]
    if default in row[:top] or (votes is not None and votes[0] == 0):
        return row
    return row[:top - 1] + [int(default)]


def anchor_rows(rows: Mapping[str, Sequence[int]], collection: Collection, defaults: Mapping[str, int],
                votes: Mapping[str, tuple[int, int]]) -> dict[str, list[int]]:
    """Submission rows (ID -> TopConfigs) of one collection with the tile anchor applied where the
    graph's default is known; other collections' rows unchanged."""
    out = {sid: list(row) for sid, row in rows.items()}
    if not collection.is_tile:
        return out
    for graph, default in defaults.items():
        sid = collection.submission_id(graph)
        if sid in out:
            out[sid] = anchor_row(out[sid], default, votes.get(graph))
    return out
