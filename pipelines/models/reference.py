"""The reference models every model must beat: ``random`` (uniform costs) and ``feature`` (rank by
the one hand-made ``f_*`` column, and sign, that scores best on the training folds;
``feature:<column>`` fixes the column). Both follow :mod:`pipelines.models.contract`."""

from __future__ import annotations

import difflib
import json
import math
import zlib
from pathlib import Path
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from pipelines.core.atomic import write_text_atomic
from pipelines.core.collection import Collection, parse_collection
from pipelines.config.settings import PipelineConfig, resolve_for_collection
from pipelines.core.errors import ConfigError, FormatError
from pipelines.models.feature_table import FeatureTableAdapter
from pipelines.models.gbdt import group_rows, pair_accuracy, sample_pairs, top5_score

MODEL_FORMAT = 1
# Pairs per graph on which the feature ranker compares candidate columns (layout, by pair accuracy).
FEATURE_PAIRS_PER_GRAPH = 2000


class _JsonState:
    """save/load for rankers whose whole learned state is a few JSON values."""

    def _state(self) -> dict[str, Any]:
        raise NotImplementedError

    def save(self, folder: Path | str, name: str) -> list[str]:
        state = self._state()  # raises before fit
        path = Path(folder) / f"{name}.json"
        write_text_atomic(path, json.dumps({"format": MODEL_FORMAT, "settings": self.settings,
                                            "collection": self.collection.name, "state": state}, sort_keys=True))
        return [path.name]

    @classmethod
    def load(cls, folder: Path | str, name: str, *, num_threads: int | None = None) -> Any:
        path = Path(folder) / f"{name}.json"
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            ranker = cls(saved["settings"], collection=saved["collection"])
            for key, value in saved["state"].items():
                setattr(ranker, key, value)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise FormatError(path, f"cannot read the saved {cls.__name__} ({exc})") from None
        if saved.get("format") != MODEL_FORMAT:
            raise FormatError(path, f"not a {cls.__name__} file of this version")
        return ranker


class RandomRanker(_JsonState):
    """Costs drawn uniformly per graph from the fit seed and the graph name (independent of batching)."""

    def __init__(self, settings: dict[str, Any] | None = None, *, collection: Collection | str,
                 num_threads: int = 1):
        self.settings = dict(settings or {})
        self.collection = parse_collection(collection) if isinstance(collection, str) else collection

    def fit(self, train: Any, valid: Any | None = None, *, seed: int) -> RandomRanker:
        self.seed_ = int(seed)
        return self

    def _state(self) -> dict[str, Any]:
        self._check_fitted()
        return {"seed_": self.seed_}

    def _check_fitted(self) -> None:
        if not hasattr(self, "seed_"):
            raise RuntimeError("RandomRanker: call fit (or load) before predict")

    def predict(self, frame: pl.DataFrame) -> np.ndarray:
        self._check_fitted()
        order, offsets = group_rows(frame["graph"])
        graphs = frame["graph"].to_numpy()[order]
        costs = np.empty(frame.height, dtype=np.float64)
        for start, stop in zip(offsets[:-1], offsets[1:]):
            rng = np.random.default_rng([self.seed_, zlib.crc32(str(graphs[start]).encode())])
            costs[order[start:stop]] = rng.random(stop - start)
        return costs


class FeatureRanker(_JsonState):
    """Rank by one feature column times a sign. ``fit`` picks the sign (and, when ``settings["column"]``
    is None, the ``f_*`` column) with the best training score: the tile metric (top-5) for tile, pair
    accuracy on a seeded sample of pairs per graph (the layout proxy) for layout."""

    def __init__(self, settings: dict[str, Any] | None = None, *, collection: Collection | str,
                 num_threads: int = 1):
        self.settings = dict(settings or {})
        self.collection = parse_collection(collection) if isinstance(collection, str) else collection
        self.column = self.settings.get("column")
        self.metric = "top5" if self.collection.is_tile else "opa"

    def fit(self, train: pl.DataFrame, valid: pl.DataFrame | None = None, *, seed: int) -> FeatureRanker:
        candidates = [self.column] if self.column else [c for c in train.columns if c.startswith("f_")]
        missing = [c for c in candidates if c not in train.columns]
        if missing or not candidates:
            raise ValueError(f"feature frame lacks column(s) {', '.join(missing) or 'f_*'}")
        order, offsets = group_rows(train["graph"])
        y = train["target"].to_numpy().astype(np.float64)[order]
        i, j = sample_pairs(y, offsets, FEATURE_PAIRS_PER_GRAPH, np.random.default_rng(seed))
        best = (-math.inf, candidates[0], 1.0)
        for column in candidates:
            values = train[column].to_numpy().astype(np.float64)[order]
            if not np.all(np.isfinite(values)):
                continue
            for sign in (1.0, -1.0):
                cost = sign * values
                score = top5_score(cost, y, offsets) if self.metric == "top5" else pair_accuracy(cost, y, i, j)
                if score > best[0]:
                    best = (score, column, sign)
        self.train_score_, self.column_, self.sign_ = best
        return self

    def _state(self) -> dict[str, Any]:
        self._check_fitted()
        return {"train_score_": self.train_score_, "column_": self.column_, "sign_": self.sign_}

    def _check_fitted(self) -> None:
        if not hasattr(self, "column_"):
            raise RuntimeError("FeatureRanker: call fit (or load) before predict")

    def predict(self, frame: pl.DataFrame) -> np.ndarray:
        self._check_fitted()
        values = frame[self.column_].to_numpy().astype(np.float64)
        return self.sign_ * np.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)


class RandomAdapter(FeatureTableAdapter):
    """Uniformly random costs: the floor every model must clear."""

    name = "random"
    ranker_class = RandomRanker

    def settings(self, config: PipelineConfig, collection: Collection) -> dict[str, Any]:
        return {"load_max_configs": 1}  # fitting reads nothing useful; keep the load minimal


class FeatureAdapter(FeatureTableAdapter):
    """One hand-made feature used as the ranking (``column=None``: the best one on the training folds)."""

    ranker_class = FeatureRanker

    def __init__(self, column: str | None = None, name: str = "feature"):
        self.column, self.name = column or None, name

    def check(self, collections: Sequence[Collection]) -> None:
        """``feature:<column>`` must name a column the features stage writes for every collection it
        trains on: a ConfigError listing them, before any stage (it failed after the data stages)."""
        from pipelines.core.collection import ALL_COLLECTIONS
        from pipelines.data.features import feature_columns

        for collection in collections if self.column else ():
            known = feature_columns(collection)
            if self.column in known:
                continue
            having = [c.name for c in ALL_COLLECTIONS if self.column in feature_columns(c)]
            close = difflib.get_close_matches(self.column, known, n=3)
            hint = (f" (only {', '.join(having)} have it: choose them with --collections)" if having
                    else f" (did you mean {', '.join(close)}?)" if close else "")
            raise ConfigError(f"model {self.name!r}: {collection.name} has no feature column {self.column!r}{hint}; "
                              f"its {len(known)} f_* columns: {', '.join(known)}")

    def settings(self, config: PipelineConfig, collection: Collection) -> dict[str, Any]:
        return {"column": self.column,
                "load_max_configs": resolve_for_collection(config.gbdt, collection).load_max_configs}

    def describe(self, ranker: Any) -> tuple[dict[str, Any], pl.DataFrame | None]:
        return {"column": ranker.column_, "sign": ranker.sign_, "train_score": ranker.train_score_}, None
