"""The training loop: sampling K configs per graph, AdamW + schedule, early stopping, checkpoints.

Everything random comes from one ``np.random.Generator`` (graph order, config samples) and the
torch RNG that the ranker seeds inside a ``fork_rng`` block (initialisation, dropout). Both states
are stored in the per-epoch checkpoint, so a resumed run continues exactly where it stopped.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import math
import os
import sys
import tempfile
import time
from collections import OrderedDict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from pipelines.core.atomic import make_folder, write_text_atomic
from pipelines.core.errors import ConfigError, FormatError
from pipelines.core.metric import kendall_tau_b, tile_score, tile_top_k
from pipelines.models.gnn.batch import GraphBatch, PreparedGraph, collate, gather_configs
from pipelines.models.gnn.device import autocast
from pipelines.models.gnn.losses import Loss, make_loss
from pipelines.models.gnn.model import GNNModel
from pipelines.config.gnn import GNNConfig

CHECKPOINT_FORMAT = 1
# Epoch lines are DEBUG: a fold job usually runs in a worker process, where nothing is printed, and
# the stage logs each finished job; `--verbose` shows them for jobs run in the main process.
logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- evaluation


def sample_configs(rng: np.random.Generator, num_configs: int, k: int) -> np.ndarray:
    """Up to ``k`` distinct config indices, uniformly."""
    if num_configs <= k:
        return rng.permutation(num_configs)
    return rng.choice(num_configs, size=k, replace=False)


def visit_counts(rng: np.random.Generator, weights: np.ndarray) -> np.ndarray:
    """How often each of ``len(weights)`` graphs is visited in a pass of ``len(weights)`` visits, in
    proportion to ``weights``: systematic sampling (one random offset, evenly spaced points), so a graph
    gets the whole part of its share or one more, and its share on average."""
    count = len(weights)
    edges = np.concatenate([[0.0], np.cumsum(weights) / np.sum(weights) * count])
    edges[-1] = count  # the points lie below it whatever the rounding of the sum
    points = rng.random() + np.arange(count)
    return np.diff(np.searchsorted(points, edges))


def pass_order(rng: np.random.Generator, own: int, extra: int, extra_per_pass: int,
               own_weights: np.ndarray | None = None) -> np.ndarray:
    """Indices into own + extra graphs for one pass: every own graph and ``extra_per_pass`` extra ones,
    shuffled together (one permutation of all of them when every extra graph is visited).

    ``own_weights``: the pass makes ``own`` visits to the own graphs in proportion to these
    (:func:`visit_counts`) instead of one each."""
    if own_weights is None and extra_per_pass >= extra:
        return rng.permutation(own + extra)
    visits = np.arange(own) if own_weights is None else np.repeat(np.arange(own), visit_counts(rng, own_weights))
    chosen = np.arange(extra) if extra_per_pass >= extra else np.sort(rng.choice(extra, size=extra_per_pass,
                                                                                replace=False))
    return rng.permutation(np.concatenate([visits, own + chosen]))


def configs_per_chunk(cfg: GNNConfig, graph: PreparedGraph, device_type: str = "cpu") -> int:
    """Configs scored per forward pass: at most ``eval_chunk``, and few enough that one per-config state
    tensor (config-dependent rows x chunk x hidden floats) fits in ``eval_chunk_mb`` (``eval_chunk_mb_cuda``
    on a CUDA device, where small passes leave the GPU waiting on kernel launches).

    On the CPU the budget assumes ``cpu_heap_reuse`` (fits and predictions run under it): freed
    passes are reused from the heap, so larger passes pay off up to a point (the figures behind the
    default are in docs/decisions.md, ``gnn.eval_chunk_mb``). Without heap reuse each pass above glibc's
    32 MiB mmap ceiling is mapped and zero-filled afresh (8 MiB was the faster budget there).
    """
    per_config = max(graph.varying_rows.shape[0], 1) * cfg.hidden * 4
    budget_mb = cfg.eval_chunk_mb_cuda if device_type == "cuda" else cfg.eval_chunk_mb
    return int(min(cfg.eval_chunk, max(1, budget_mb * 2**20 // per_config)))


def scoring_passes(cfg: GNNConfig, graph: PreparedGraph, count: int, device_type: str = "cpu") -> list[np.ndarray]:
    """Positions ``0..count-1`` of the configs to score, grouped into forward passes (a partition).

    Without cross-config attention a config's score depends on that config alone: consecutive chunks
    sized for memory (:func:`configs_per_chunk`). With it, a score depends on the configs scored in the
    same pass, so each pass holds a fixed pseudo-random group of at most ``configs_per_graph`` configs,
    as a training step samples them: a config is scored in the context it was trained in, and the
    scores do not depend on memory settings (with memory-sized chunks, a config of an 11k-node graph
    was scored beside one other config, on a small graph in passes of up to 512).
    """
    if not cfg.cross_config_attention:
        chunk = configs_per_chunk(cfg, graph, device_type)
        return [np.arange(start, min(start + chunk, count)) for start in range(0, count, chunk)]
    if count == 0:
        return []
    order = np.random.default_rng(0).permutation(count)  # fixed: the same groups on every call
    return np.array_split(order, -(-count // cfg.configs_per_graph))


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


class DeviceBatches:
    """Graph batches on the model's device, each graph copied there once per fit rather than per step.

    On CPU nothing is kept (``collate`` is cheap next to a step, and a second copy of a collection's
    node features would cost memory); on a GPU a single-graph batch is cached by graph position.
    Multi-graph steps (tile: 16 small graphs) are collated on the host and copied (~0.5 MB).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.cache: dict[int, GraphBatch] = {}

    def get(self, graphs: list[PreparedGraph], key: int | None = None) -> GraphBatch:
        if self.device.type == "cpu":
            return collate(graphs)
        if key is None or len(graphs) != 1:
            return collate(graphs).to(self.device, non_blocking=True)
        if key not in self.cache:
            self.cache[key] = collate(graphs).to(self.device)
        return self.cache[key]


@torch.no_grad()
def score_graph(model: GNNModel, graph: PreparedGraph, cfg: GNNConfig, indices: np.ndarray | None = None,
                batch: GraphBatch | None = None) -> np.ndarray:
    """Costs of the configs ``indices`` (default: all) of one graph, encoded once, scored in passes
    (:func:`scoring_passes`).

    ``batch``: the graph already collated on the model's device (else it is collated and copied).
    The scores stay on the device until the last pass, then come back in one copy.
    """
    device = model_device(model)
    was_training = model.training
    model.eval()
    idx = np.arange(graph.num_configs) if indices is None else indices
    passes = scoring_passes(cfg, graph, idx.shape[0], device.type)
    try:
        with autocast(device, cfg.precision):
            ctx = model.encode(batch if batch is not None else collate([graph]).to(device))
            parts = [model.score(ctx, gather_configs([graph], [idx[rows]]).to(device))[0].double()
                     for rows in passes]
    finally:
        model.train(was_training)
    if not parts:
        return np.zeros(0)
    scores = np.empty(idx.shape[0])
    scores[np.concatenate(passes)] = torch.cat(parts).cpu().numpy()  # back to the order of ``indices``
    return scores


def graph_metric(kind: str, scores: np.ndarray, runtime: np.ndarray) -> float:
    """Kendall tau-b (layout) or the top-5 tile score of one graph; NaN when undefined."""
    if kind == "layout":
        return kendall_tau_b(scores, runtime)
    if runtime.min() <= 0:
        return math.nan
    return tile_score(tile_top_k(scores), runtime)


def validation_score(model: GNNModel, graphs: list[PreparedGraph], subsets: list[np.ndarray], cfg: GNNConfig,
                     batches: DeviceBatches | None = None) -> float:
    batches = batches or DeviceBatches(model_device(model))
    values = [graph_metric(g.kind, score_graph(model, g, cfg, idx, batches.get([g], i)), g.target[idx])
              for i, (g, idx) in enumerate(zip(graphs, subsets))]
    values = [v for v in values if not math.isnan(v)]
    return float(np.mean(values)) if values else math.nan


# ----------------------------------------------------------------------------- optimisation


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: GNNConfig, total_steps: int):
    warmup = int(cfg.warmup_fraction * total_steps)
    if cfg.schedule == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=cfg.lr, total_steps=max(total_steps, 2),
                                                   pct_start=max(cfg.warmup_fraction, 0.01))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.schedule == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def make_optimizer(params, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW as one fused kernel over all parameters: on a CPU the per-tensor loop of the default
    implementation costs more than a tenth of a small model's step."""
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)


def train_step(model: GNNModel, graphs: list[PreparedGraph], indices: list[np.ndarray], loss_fn: Loss,
               optimizer: torch.optim.Optimizer, grad_clip: float, *, batch: GraphBatch | None = None,
               precision: str = "fp32") -> torch.Tensor:
    """One optimiser step on configs ``indices[i]`` of each graph (encoded once); returns the detached
    loss, still on the device (reading it back every step would stall a GPU).

    ``batch``: ``graphs`` already collated on the model's device. The K sampled configs are the only
    host-to-device copy of the step; nothing is read back.
    """
    device = model_device(model)
    configs = gather_configs(graphs, indices).to(device, non_blocking=True)
    with autocast(device, precision):
        scores = model.score(model.encode(batch if batch is not None else collate(graphs).to(device)), configs)
    loss = loss_fn(scores.float(), configs.target, configs.mask)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.detach()


class WeightAverage:
    """An exponential moving average of a model's floating-point weights, on the model's device.

    Each :meth:`update` moves the average ``1 - decay`` of the way to the trained weights, with decay
    ``1 - 1 / horizon`` (``horizon`` steps) but at most ``(1 + n) / (10 + n)`` after ``n`` updates, so the
    first steps are not averaged with the random initial weights (TensorFlow's ExponentialMovingAverage
    warm-up).
    """

    def __init__(self, model: nn.Module, horizon: float):
        self.horizon = horizon
        self.updates = 0
        self.averaged = {name: value.detach().clone() for name, value in model.state_dict().items()
                         if value.is_floating_point()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        decay = max(0.0, min(1.0 - 1.0 / self.horizon, (1 + self.updates) / (10 + self.updates)))
        trained = model.state_dict()
        for name, average in self.averaged.items():
            average.lerp_(trained[name], 1.0 - decay)

    @contextmanager
    def swapped_in(self, model: nn.Module) -> Iterator[None]:
        """Inside the block the model holds the averaged weights; after it, the trained ones again."""
        trained = {name: value.clone() for name, value in model.state_dict().items()}
        model.load_state_dict({**trained, **self.averaged})
        try:
            yield
        finally:
            model.load_state_dict(trained)

    def state_dict(self) -> dict:
        return {"updates": self.updates, "averaged": self.averaged}

    def load_state_dict(self, saved: dict) -> None:
        self.updates = saved["updates"]
        for name, average in self.averaged.items():
            average.copy_(saved["averaged"][name])


@dataclass
class TrainState:
    """Everything a checkpoint holds besides model, optimizer and scheduler."""

    epoch: int = 0  # epochs completed
    best_score: float = -math.inf
    best_state: dict | None = None
    best_epoch: int = 0
    bad_epochs: int = 0
    stopped: bool = False
    history: list[dict] = field(default_factory=list)


def atomic_torch_save(obj: dict, path: Path) -> None:
    """``torch.save`` to ``path`` through a temporary file and a rename; equal objects give equal bytes.

    Serialised in memory first: to a file, torch names the records of its zip archive after the file
    (here the random temporary name); to a buffer, they are always ``archive/...``. And every string is
    interned first: pickle writes a string it has seen as a back-reference only when it is the same
    object, so a history whose first epochs came back from a checkpoint (their keys unpickled, not the
    interned literals of the epochs trained since) would otherwise pickle to other bytes."""
    import io

    buffer = io.BytesIO()
    torch.save(_interned(obj), buffer)
    make_folder(path.parent)  # inside a training stage's fold folder, which a concurrent run may remove
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(buffer.getbuffer())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _interned(value: Any) -> Any:
    """``value`` with every string of its dicts, lists and tuples interned (tensors and numbers as they are)."""
    if type(value) is str:
        return sys.intern(value)
    if type(value) in (dict, OrderedDict):
        return type(value)((_interned(k), _interned(v)) for k, v in value.items())
    if type(value) in (list, tuple):
        return type(value)(_interned(v) for v in value)
    return value


def save_checkpoint(path: Path, fingerprint: str, model: nn.Module, optimizer, scheduler, state: TrainState,
                    rng: np.random.Generator, average: WeightAverage | None = None) -> None:
    device = model_device(model)
    try:
        _save_checkpoint_file(path, fingerprint, model, optimizer, scheduler, state, rng, device, average)
    except FileNotFoundError:
        # Another run on this work dir finished the same fold and removed its checkpoint folder while this
        # one was writing: a checkpoint only saves time, and the fold's result is the other run's.
        logger.info(f"{path.parent}: checkpoint folder removed by a concurrent run; checkpoint not saved")


def _save_checkpoint_file(path: Path, fingerprint: str, model: nn.Module, optimizer, scheduler, state: TrainState,
                          rng: np.random.Generator, device, average: WeightAverage | None) -> None:
    atomic_torch_save({
        "format": CHECKPOINT_FORMAT, "fingerprint": fingerprint, "model": model.state_dict(),
        "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "state": state.__dict__,
        "weight_average": average.state_dict() if average is not None else None,
        "np_rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
        # dropout on a GPU draws from that GPU's generator
        "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }, path)
    write_text_atomic(_hash_file(path), hashlib.sha256(path.read_bytes()).hexdigest() + "\n")


def _hash_file(path: Path) -> Path:
    """Where the SHA-256 of checkpoint ``path``, recorded when it was written, is kept."""
    return path.with_name(path.name + ".sha256")


def checkpoint_is_ours(path: Path) -> bool:
    """True when checkpoint ``path`` matches the hash recorded when this code wrote it (a planted,
    altered or half-written one does not: it is never read)."""
    try:
        recorded = _hash_file(path).read_text(encoding="utf-8").strip()
        return hashlib.sha256(path.read_bytes()).hexdigest() == recorded
    except OSError:
        return False


def load_checkpoint(path: Path, fingerprint: str, model: nn.Module, optimizer, scheduler,
                    rng: np.random.Generator, average: WeightAverage | None = None) -> TrainState:
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a truncated or foreign file (or a pickled program)
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise FormatError(path, f"cannot read GNN checkpoint ({detail}); delete {path.parent} to train this fold "
                                "afresh") from None
    if saved.get("format") != CHECKPOINT_FORMAT or saved.get("fingerprint") != fingerprint:
        raise ConfigError(f"{path}: checkpoint belongs to another config, seed or data; "
                          "use a fresh checkpoint directory")
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    if average is not None:  # the fingerprint holds the setting, so a checkpoint with averaging has its state
        average.load_state_dict(saved["weight_average"])
    rng.bit_generator.state = saved["np_rng"]
    torch.set_rng_state(saved["torch_rng"])
    device = model_device(model)
    if device.type == "cuda" and saved.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(saved["cuda_rng"], device)
    return TrainState(**saved["state"])


# ----------------------------------------------------------------------------- loop


def _show_progress(cfg: GNNConfig) -> bool:
    return cfg.progress and sys.stderr.isatty()


def train_model(
    model: GNNModel,
    train: list[PreparedGraph],
    valid: list[PreparedGraph],
    cfg: GNNConfig,
    *,
    seed: int,
    fingerprint: str,
    checkpoint_path: Path | None,
    before_training: Callable[[np.random.Generator], None] | None = None,
    extra: Sequence[PreparedGraph] = (),
) -> TrainState:
    """Train ``model`` in place; it ends holding the best-validation weights (or the last, without valid):
    with ``weight_average_epochs`` > 0, those of the moving average, which is what is validated.

    ``extra`` are training graphs of other collections (``gnn.extra_train_collections``). A pass visits
    every graph of ``train`` and at most ``extra_train_share`` times as many ``extra`` graphs (1: as many),
    drawn afresh each pass: the mix measured on the small worlds (about half of the steps on the
    collection's own graphs) then holds at any scale, where the real nlp collections have ~3x the xla
    graphs. When the extra graphs are no more than that, a pass visits them all, in one shuffled order
    with ``train``. With ``visit_power`` > 0 a pass shares its visits to ``train`` by configurable nodes.
    """
    from tqdm.auto import tqdm

    rng = np.random.default_rng(seed)
    # fixed validation subsets (as large as a test graph), drawn from their own stream
    eval_rng = np.random.default_rng([seed, 1])
    subsets = [sample_configs(eval_rng, g.num_configs, cfg.eval_max_configs) for g in valid]
    extra_per_pass = min(len(extra), round(cfg.extra_train_share * len(train)))
    own_weights = None if cfg.visit_power == 0 else \
        np.array([max(len(g.config_nodes), 1) for g in train], dtype=np.float64) ** cfg.visit_power
    steps_per_pass = math.ceil((len(train) + extra_per_pass) / cfg.graphs_per_step)
    steps_per_epoch = cfg.passes_per_epoch * steps_per_pass
    optimizer = make_optimizer(model.parameters(), cfg.lr, cfg.weight_decay)
    scheduler = make_scheduler(optimizer, cfg, cfg.epochs * steps_per_epoch)
    loss_fn = make_loss(cfg.loss, cfg.margin)
    device = model_device(model)
    train_batches, valid_batches = DeviceBatches(device), DeviceBatches(device)
    pool = [*train, *extra]
    horizon = cfg.weight_average_epochs * steps_per_epoch

    resumable = checkpoint_path is not None and checkpoint_path.exists()
    if resumable and not checkpoint_is_ours(checkpoint_path):
        logger.warning(f"{checkpoint_path}: does not match the hash recorded when it was written; "
                       "not resumed from, training starts afresh")
        resumable = False
    if not resumable and before_training is not None:
        before_training(rng)
    # from the weights the fit starts with; a resumed fit's average comes back from its checkpoint
    average = WeightAverage(model, horizon) if horizon else None
    if resumable:
        state = load_checkpoint(checkpoint_path, fingerprint, model, optimizer, scheduler, rng, average)
        logger.debug(f"resumed from {checkpoint_path} after epoch {state.epoch}")
    else:
        state = TrainState()

    while state.epoch < cfg.epochs and not state.stopped:
        epoch = state.epoch + 1
        started = time.perf_counter()
        model.train()
        losses = []
        bar = tqdm(total=steps_per_epoch, desc=f"epoch {epoch}/{cfg.epochs}", leave=False,
                   disable=not _show_progress(cfg))
        for step in range(steps_per_epoch):
            if step % steps_per_pass == 0:  # each pass draws its visits and their order afresh
                order = pass_order(rng, len(train), len(extra), extra_per_pass, own_weights)
            start = (step % steps_per_pass) * cfg.graphs_per_step
            chosen = order[start:start + cfg.graphs_per_step]
            graphs = [pool[i] for i in chosen]
            indices = [sample_configs(rng, g.num_configs, cfg.configs_per_graph) for g in graphs]
            batch = train_batches.get(graphs, int(chosen[0]))
            losses.append(train_step(model, graphs, indices, loss_fn, optimizer, cfg.grad_clip, batch=batch,
                                     precision=cfg.precision))
            scheduler.step()
            if average is not None:
                average.update(model)
            bar.update(1)
            if not bar.disable:  # reads losses back: only when someone watches
                recent = [float(x) for x in losses[-20:]]
                bar.set_postfix(loss=f"{np.mean(recent):.4f}", best_valid=f"{state.best_score:.4f}")
        bar.close()
        losses = torch.stack(losses).tolist()  # one device-to-host copy per epoch
        validated = bool(valid) and (epoch % cfg.validate_every == 0 or epoch == cfg.epochs)
        validation_started = time.perf_counter()
        with average.swapped_in(model) if average is not None else nullcontext():
            score = validation_score(model, valid, subsets, cfg, valid_batches) if validated else math.nan
            best = not valid or (validated and score > state.best_score)
            if best:
                state.best_state = copy.deepcopy(model.state_dict())
        valid_seconds = time.perf_counter() - validation_started
        state.epoch = epoch
        if best:
            state.best_score = score if valid else math.nan
            state.best_epoch = epoch
            state.bad_epochs = 0
        elif validated:  # patience counts epochs, however many ran since the last validation
            state.bad_epochs = epoch - state.best_epoch
            state.stopped = cfg.patience > 0 and state.bad_epochs >= cfg.patience
        seconds = time.perf_counter() - started
        state.history.append({"epoch": epoch, "loss": float(np.mean(losses)), "valid": score,
                              "lr": scheduler.get_last_lr()[0], "seconds": seconds, "valid_seconds": valid_seconds})
        if checkpoint_path is not None:
            save_checkpoint(checkpoint_path, fingerprint, model, optimizer, scheduler, state, rng, average)
        logger.debug(f"epoch {epoch}/{cfg.epochs} loss {np.mean(losses):.4f} valid {score:.4f} "
                     f"best {state.best_score:.4f}@{state.best_epoch} ({seconds:.1f}s)"
                     + (" early stop" if state.stopped else ""))
    if state.best_state is not None:  # None only when every validation score was NaN
        model.load_state_dict(state.best_state)
    return state
