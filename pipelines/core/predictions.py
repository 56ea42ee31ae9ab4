"""The one prediction schema every model writes and every consumer (ensemble, notebooks, submission) reads.

One row per (collection, graph, config) prediction. ``score`` is a predicted cost: LOWER means the
config is predicted FASTER (any monotone scale: a predicted runtime, a negated relevance, ...).
Out-of-fold predictions carry ``split="oof"`` and the fold that held the graph out; test predictions
carry ``split="test"`` and the fold of the model that made them (one row per fold model).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from pipelines.core.errors import FormatError
from pipelines.core.stage_files import read_parquet

PREDICTION_SCHEMA: dict[str, pl.DataType] = {
    "collection": pl.Utf8,
    "graph": pl.Utf8,
    "split": pl.Utf8,  # "oof" or "test"
    "config_index": pl.Int32,
    "fold": pl.Int16,
    "seed": pl.Int64,  # the run seed, [0, 2^32)
    "model": pl.Utf8,
    "score": pl.Float64,
}


def prediction_frame(
    *,
    collection: str,
    graph: str,
    split: str,
    scores: np.ndarray,
    fold: int,
    seed: int,
    model: str,
    config_index: np.ndarray | None = None,
) -> pl.DataFrame:
    """Build a schema-conforming frame for the scores of one graph (config_index defaults to 0..c-1)."""
    if split not in ("oof", "test"):
        raise ValueError(f"split must be 'oof' or 'test', got {split!r}")
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if config_index is None:
        config_index = np.arange(scores.shape[0])
    n = scores.shape[0]
    return pl.DataFrame(
        {
            "collection": [collection] * n,
            "graph": [graph] * n,
            "split": [split] * n,
            "config_index": np.asarray(config_index, dtype=np.int32),
            "fold": np.full(n, fold, dtype=np.int16),
            "seed": np.full(n, seed, dtype=np.int64),
            "model": [model] * n,
            "score": scores,
        },
        schema=PREDICTION_SCHEMA,
    )


def validate_predictions(frame: pl.DataFrame, source: str | Path = "<predictions>") -> pl.DataFrame:
    """Check columns and dtypes, returning the frame with columns in schema order."""
    missing = [c for c in PREDICTION_SCHEMA if c not in frame.columns]
    if missing:
        raise FormatError(source, f"prediction table lacks column(s) {', '.join(missing)}")
    frame = frame.select(list(PREDICTION_SCHEMA)).cast(PREDICTION_SCHEMA)
    if frame["score"].is_nan().any() or frame["score"].is_null().any():
        raise FormatError(source, "prediction table has NaN or null scores")
    return frame


def read_predictions(path: Path | str) -> pl.DataFrame:
    path = Path(path)
    return validate_predictions(read_parquet(path, "prediction table"), path)
