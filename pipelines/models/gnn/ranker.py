"""GNNRanker: the scikit-learn-shaped face of the GNN (hyperparameters in, fit, predict, save/load)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import torch

from pipelines.core.collection import Collection, parse_collection
from pipelines.config.settings import config_from_dict, config_to_dict, resolve_for_collection
from pipelines.core.errors import ConfigError, FormatError
from pipelines.models.gnn.batch import PreparedGraph, graph_kind, prepare_for, prepare_graph
from pipelines.models.gnn.device import deterministic, heap_reuse_on, resolve_device, rng_devices
from pipelines.models.gnn.model import GNNModel
from pipelines.models.gnn.pretrain import pretrain_encoder
from pipelines.models.gnn.trainer import atomic_torch_save, score_graph, train_model
from pipelines.config.gnn import GNNConfig
from pipelines.data.node_arrays import GraphArrays

MODEL_FORMAT = 2  # 2: saved by name into a folder, config resolved for its collection
WALL_TIME_KEYS = ("seconds", "valid_seconds")  # per-epoch history entries left out of a saved model file


@contextlib.contextmanager
def _torch_threads(count: int) -> Iterator[None]:
    """Use ``count`` intra-op threads inside the block (0: leave torch's setting), restoring the caller's
    setting afterwards."""
    if count <= 0:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _single_value(graphs: list[GraphArrays], what: str, get: Callable[[GraphArrays], object]) -> object:
    values = {get(g) for g in graphs}
    if len(values) != 1:
        raise ConfigError(f"GNN: graphs of one model must share one {what}, got {sorted(map(str, values))}")
    return values.pop()


class GNNRanker:
    """Per-collection graph ranker in the shape every model shares (:mod:`pipelines.models.contract`):
    built from its config section for one collection, ``fit(train, valid, seed=...)``, ``predict(graphs)``
    (one cost per config, graphs concatenated in order), ``save``/``load``.

    ``config`` is the section resolved for ``collection`` (its per-collection overrides applied);
    ``gnn.num_threads = 0`` takes ``num_threads`` (the training stage's share of the cores), as the GBDT does.
    Learned state: ``model_`` (the torch module), ``kind_``, ``node_feat_dim_``, ``history_`` (one
    dict per epoch), ``best_score_`` (validation score of the kept weights; NaN without validation)
    and ``device_`` (where it was trained: ``gnn.device`` resolved, e.g. "cpu" or "cuda:0").

    The weights are initialised on the CPU with the seed, then moved to the device, so a GPU fit
    starts from the same weights as a CPU fit.
    """

    def __init__(self, config: GNNConfig | Mapping[str, Any] | None = None, *, collection: Collection | str,
                 num_threads: int | None = None):
        self.collection = parse_collection(collection) if isinstance(collection, str) else collection
        # checked like a loaded config (also when built by hand or from settings), then resolved for the
        # collection unless it comes resolved (the training stage's settings: model_settings, no tables left)
        plain = dict(config) if isinstance(config, Mapping) else config_to_dict(config or GNNConfig())
        if num_threads is not None and not plain.get("num_threads"):
            plain["num_threads"] = int(num_threads)
        checked = config_from_dict(GNNConfig, plain, "GNN config")
        self.config = resolve_for_collection(checked, self.collection) if checked.collections else checked

    # ------------------------------------------------------------------ fit

    def fit(
        self,
        train: list[GraphArrays],
        valid: list[GraphArrays] | None = None,
        *,
        seed: int,
        checkpoint_dir: Path | None = None,
        unlabeled: list[GraphArrays] | None = None,
    ) -> GNNRanker:
        """Train on ``train``; early-stop on ``valid``; resume from ``checkpoint_dir`` if it holds a run.

        ``unlabeled`` graphs (e.g. test) are used only by the optional encoder pre-training, which
        sees train, valid and unlabeled graphs alike.
        """
        valid = list(valid or [])
        unlabeled = list(unlabeled or [])
        if not train:
            raise ConfigError("GNN: no training graphs")
        allowed = {self.collection.name, *self.config.extra_train_collections}  # training graphs only
        for graphs, accepted in ((train, allowed), (valid + unlabeled, {self.collection.name})):
            foreign = sorted({g.collection for g in graphs} - accepted)
            if foreign:
                raise ConfigError(f"GNN: a ranker built for {self.collection.name} cannot fit graphs of "
                                  f"{', '.join(foreign)} (training graphs of other collections: "
                                  "gnn.extra_train_collections)")
        kind = str(_single_value(train + valid + unlabeled, "kind (tile or layout)", graph_kind))
        feat_dim = int(_single_value(train + valid + unlabeled, "node feature width", lambda g: g.node_feat.shape[1]))
        for g in train + valid:
            if not np.any(g.target > 0):
                raise FormatError(f"{g.collection}:{g.stem}", "training/validation graph has no runtimes")
        cfg = self.config
        device = resolve_device(cfg.device)
        own = [g for g in train if g.collection == self.collection.name]
        if not own:  # a pass is the own graphs plus at most as many others: none would leave no steps
            raise ConfigError(f"GNN: no training graphs of {self.collection.name} (graphs of "
                              "extra_train_collections only join them)")
        prepared_train = [prepare_for(g, cfg) for g in own]
        prepared_extra = [prepare_for(g, cfg) for g in train if g.collection != self.collection.name]
        prepared_valid = [prepare_for(g, cfg) for g in valid]
        fingerprint = _fingerprint(cfg, seed, train, valid, unlabeled)
        checkpoint_path = None if checkpoint_dir is None else Path(checkpoint_dir) / f"gnn_seed{seed}.pt"

        with _torch_threads(cfg.num_threads), torch.random.fork_rng(devices=rng_devices(device)), \
                deterministic(cfg.deterministic), heap_reuse_on(device, cfg.cpu_heap_reuse):
            torch.manual_seed(seed)
            model = GNNModel(cfg, feat_dim, kind)
            if cfg.init_from:
                start_from_saved(model, Path(cfg.init_from), kind, feat_dim)
            model = model.to(device)

            def pretrain(rng: np.random.Generator) -> None:
                if cfg.pretrain:
                    everything = [*prepared_train, *prepared_extra, *prepared_valid,
                                  *(prepare_graph(g, 0) for g in unlabeled)]
                    pretrain_encoder(model, everything, cfg, rng)

            state = train_model(model, prepared_train, prepared_valid, cfg, seed=seed, fingerprint=fingerprint,
                                checkpoint_path=checkpoint_path, before_training=pretrain, extra=prepared_extra)
        model.eval()
        self.model_ = model
        self.kind_ = kind
        self.node_feat_dim_ = feat_dim
        self.history_ = state.history
        self.best_score_ = state.best_score if valid else math.nan
        self.device_ = str(device)
        return self

    # ------------------------------------------------------------------ predict

    def _check_fitted(self) -> None:
        if not hasattr(self, "model_"):
            raise RuntimeError("GNNRanker: call fit (or load) before predict")

    def predict(self, graphs: list[GraphArrays]) -> np.ndarray:
        """float64 costs (LOWER = predicted FASTER): each graph's configs in its order, graphs one after
        another (the rows of ``GNNAdapter.index``)."""
        self._check_fitted()
        out = []
        device = resolve_device(self.config.device)
        self.model_.to(device)
        # deterministic scoring too: on CUDA the message passing sums with atomics otherwise; freed passes
        # reused from the heap on the CPU, as in a fit (the chunk budget, eval_chunk_mb, assumes it)
        with _torch_threads(self.config.num_threads), deterministic(self.config.deterministic), \
                heap_reuse_on(device, self.config.cpu_heap_reuse):
            for g in graphs:
                where = f"{g.collection}:{g.stem}"
                if graph_kind(g) != self.kind_ or g.node_feat.shape[1] != self.node_feat_dim_:
                    raise FormatError(where, f"graph does not fit a {self.kind_} model with "
                                             f"{self.node_feat_dim_} node features")
                prepared: PreparedGraph = prepare_for(g, self.config)
                out.append(score_graph(self.model_, prepared, self.config))
        return np.concatenate(out).astype(np.float64, copy=False) if out else np.zeros(0, dtype=np.float64)

    # ------------------------------------------------------------------ persistence

    def save(self, folder: Path | str, name: str) -> list[str]:
        """Write the fitted ranker (config, dims, weights, history) atomically as ``<name>.pt``."""
        self._check_fitted()
        path = Path(folder) / f"{name}.pt"
        # the history without its wall times (they are in the stage's metrics): the file is then a function of
        # what was learned, the same bytes for a fold trained straight through or resumed from a checkpoint
        history = [{k: v for k, v in epoch.items() if k not in WALL_TIME_KEYS} for epoch in self.history_]
        atomic_torch_save({
            "format": MODEL_FORMAT, "config": config_to_dict(self.config), "collection": self.collection.name,
            "kind": self.kind_, "node_feat_dim": self.node_feat_dim_, "history": history,
            "best_score": self.best_score_,
            "model": {key: value.cpu() for key, value in self.model_.state_dict().items()},  # loads anywhere
        }, path)
        return [path.name]

    @classmethod
    def load(cls, folder: Path | str, name: str, *, num_threads: int | None = None) -> GNNRanker:
        """A ranker written by :meth:`save`, ready to predict (on ``gnn.device``)."""
        path = Path(folder) / f"{name}.pt"
        saved = read_model_file(path)
        # a model saved before gnn.config_pairs (or gnn.tile_physics) existed was trained without it (the
        # default is now on); one saved before gnn.readout existed had the pooled readout
        config = {"config_pairs": False, "tile_physics": False, "readout": "pooled", **saved["config"]}
        if num_threads is not None:  # this process's choice, over the thread count the model was fitted with
            config["num_threads"] = int(num_threads)
        ranker = cls(config, collection=saved["collection"])
        ranker.kind_, ranker.node_feat_dim_ = saved["kind"], saved["node_feat_dim"]
        ranker.history_, ranker.best_score_ = saved["history"], saved["best_score"]
        ranker.device_ = "cpu"  # loaded weights start on the CPU; predict moves them to the config's device
        ranker.model_ = GNNModel(ranker.config, ranker.node_feat_dim_, ranker.kind_)
        ranker.model_.load_state_dict(saved["model"])
        ranker.model_.eval()
        return ranker


def read_model_file(path: Path) -> dict[str, Any]:
    """The dict :meth:`GNNRanker.save` wrote to ``path`` (FormatError naming the file otherwise)."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a missing, truncated or foreign file
        raise FormatError(path, f"cannot read GNN model ({exc})") from None
    if not isinstance(saved, dict) or saved.get("format") != MODEL_FORMAT:
        raise FormatError(path, "not a GNN model file of this version")
    return saved


def start_from_saved(model: GNNModel, path: Path, kind: str, feat_dim: int) -> None:
    """Load the weights of the model file at ``path`` into ``model`` (``gnn.init_from``): a ConfigError
    naming the file when its graphs' kind, node features or any weight's shape differ from ``model``'s."""
    saved = read_model_file(path)
    if saved["kind"] != kind or saved["node_feat_dim"] != feat_dim:
        raise ConfigError(f"gnn.init_from {path}: a {saved['kind']} model with {saved['node_feat_dim']} node "
                          f"features cannot start a {kind} model with {feat_dim}")
    own = model.state_dict()
    weights = saved["model"]
    missing, extra = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
    reshaped = sorted(k for k in set(own) & set(weights) if tuple(own[k].shape) != tuple(weights[k].shape))
    if missing or extra or reshaped:
        differ = [f"missing {', '.join(missing[:3])}" if missing else "", f"extra {', '.join(extra[:3])}" if extra else "",
                  f"other shapes {', '.join(reshaped[:3])}" if reshaped else ""]
        raise ConfigError(f"gnn.init_from {path}: its architecture differs from this config's "
                          f"({'; '.join(d for d in differ if d)}): the architecture settings (hidden, layers, "
                          "readout, physics inputs, ...) must be those it was trained with")
    model.load_state_dict(weights)


def _fingerprint(cfg: GNNConfig, seed: int, *graph_lists: list[GraphArrays]) -> str:
    """Identity of a training run, so a checkpoint is only resumed by the run that wrote it."""
    settings = {k: v for k, v in config_to_dict(cfg).items() if k not in ("progress", "num_threads")}
    data = [[(g.collection, g.stem, g.num_nodes, g.num_configs) for g in graphs] for graphs in graph_lists]
    text = json.dumps({"config": settings, "seed": seed, "data": data}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()
