"""One-command runs: prepare -> train every model -> ensemble per collection -> validated submission.

:func:`run_pipeline` chains the cached stages for every collection of a data root in the Kaggle
layout (ours or the real one): the four preparation stages, one training stage per model, and an
``ensemble`` stage that blends the models' out-of-fold predictions with weights fitted on them
alone and applies the weights to the test predictions. Every stage goes through
:func:`pipelines.core.engine.run_stage`, so a second run with the same config reuses all of them.

The ``ensemble`` stage lives in :mod:`pipelines.training.ensemble` (its pure functions, I/O shell and reader).

The submission goes to ``<submissions_dir>/<run-id>/`` (created exclusively, never reused):
``submission.csv``, validated against the data root before it is published, and ``manifest.json``
(resolved config, every upstream stage key per collection, code and library versions, OOF scores
per model and for the ensemble, weights, data root, run-id, command). The CSV depends only on the
predictions, so the same config run from scratch yields the same bytes.

:func:`ensemble_runs` re-blends the saved training outputs of earlier runs (found through their
manifests) without training anything.

Training jobs (fold x seed of a model) run through joblib: local loky processes by default, or a
Dask cluster when ``scheduler`` is its address. Dask workers must see the same filesystem (the
work dir and the data root at the same paths) and the same Python environment as this process.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from pipelines.data.root import DataRoot
from pipelines.core import paths
from pipelines.core.collection import Collection, parse_collection
from pipelines.config.registry import device_models
from pipelines.config.settings import PipelineConfig, config_to_dict
from pipelines.core.engine import (
    StageOutput,
    code_version,
    library_versions,
    load_stage,
)
from pipelines.core.stages import Stage, StageCall
from pipelines.flows import dag
from pipelines.training.ensemble import ENSEMBLE_STAGE, ensemble_stage, load_blended_test
from pipelines.core.errors import ConfigError, FormatError, PipelineError
from pipelines.core.logs import tagged
from pipelines.core.parallel import JobPool, fan_out
from pipelines.core.progress import format_duration
from pipelines.outputs.run_folders import (check_trained, publish_submission, read_run_manifest, resolve_run_id,
                                         training_stage_dir)

logger = logging.getLogger(__name__)



# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class CollectionRun:
    """Everything one collection contributed to a run: its stages and what they measured."""

    collection: Collection
    prepare_keys: dict[str, str]  # stage -> key (prune, features, node_arrays, folds)
    trained: dict[str, StageOutput]  # model name -> training stage output
    ensemble: StageOutput
    # the data stages (stage -> key) of the other collections its models also train on, by collection
    companion_keys: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def weights(self) -> dict[str, float]:
        return dict(self.ensemble.metrics["weights"])


@dataclass(frozen=True)
class RunResult:
    """A published submission and how it was made."""

    run_id: str
    run_dir: Path
    submission: Path
    manifest: dict[str, Any]
    scores: pl.DataFrame  # see scores_table
    computed: tuple[str, ...]  # "stage/key" of every stage this call computed (empty: all reused)

    def describe(self) -> str:
        return format_scores(self.scores)


# ----------------------------------------------------------------------------- pure helpers


def resolve_models(config: PipelineConfig, models: Sequence[str] | None) -> list[str]:
    """The models a run trains and blends: ``models`` when given, else the config's ensemble models
    (which must all be among ``run.models``, the models the config trains)."""
    if models is not None:
        chosen = list(dict.fromkeys(m.strip() for m in models if m.strip()))
        if not chosen:
            raise ConfigError("--models names no model")
        return chosen
    missing = [m for m in config.ensemble.models if m not in config.run.models]
    if missing:
        raise ConfigError(f"ensemble.models names {', '.join(missing)}, which run.models does not train "
                          f"(run.models = {config.run.models})")
    return list(config.ensemble.models)


def submission_rows(test: pl.DataFrame) -> dict[str, list[int]]:
    """Submission rows from one score per test config (lower = faster): tile top-5, layout full order.

    Every graph must have a score for each config ``0..c-1`` exactly once; ties are ordered by index.
    """
    from pipelines.data.submission import submission_row

    rows: dict[str, list[int]] = {}
    keys = ["collection", "graph"]
    for (name, graph), part in test.sort([*keys, "config_index"]).partition_by(keys, as_dict=True,
                                                                               maintain_order=True).items():
        index = part["config_index"].to_numpy()
        if not np.array_equal(index, np.arange(index.shape[0])):
            raise FormatError("<test predictions>", f"{name}:{graph}: scores must cover configs 0..c-1 exactly "
                                                    f"once (got {index.shape[0]} rows)")
        collection = parse_collection(name)
        rows[collection.submission_id(graph)] = submission_row(collection, part["score"].to_numpy())
    return rows


SCORES_SCHEMA: dict[str, pl.DataType] = {
    "collection": pl.Utf8,
    "model": pl.Utf8,  # a model name or "ensemble"
    "oof_score": pl.Float64,  # training stage: mean over seeds of the OOF score (mean over graphs)
    "oof_std": pl.Float64,  # its standard deviation over seeds (null for the ensemble)
    "seeds": pl.Int64,
    "blend_score": pl.Float64,  # OOF score of the seed-averaged, normalised predictions the blend uses
    "weight": pl.Float64,  # blend weight (null for the ensemble row)
}


def scores_table(runs: Sequence[CollectionRun]) -> pl.DataFrame:
    """One row per collection and model, then the collection's ensemble row."""
    rows = []
    for item in runs:
        blend = item.ensemble.metrics["oof_scores"]
        for name, output in item.trained.items():
            m = output.metrics
            rows.append({"collection": item.collection.name, "model": name, "oof_score": m.get("oof_score"),
                         "oof_std": m.get("oof_score_std"), "seeds": len(m.get("seeds", [])),
                         "blend_score": blend.get(name), "weight": item.weights.get(name)})
        rows.append({"collection": item.collection.name, "model": "ensemble", "oof_score": blend.get("ensemble"),
                     "oof_std": None, "seeds": None, "blend_score": blend.get("ensemble"), "weight": None})
    return pl.DataFrame(rows, schema=SCORES_SCHEMA)


def scores_from_manifest(manifest: Mapping[str, Any]) -> pl.DataFrame:
    """The :func:`scores_table` of a published run, rebuilt from its manifest alone."""
    rows = []
    for cname, scores in (manifest.get("cv_scores") or {}).items():
        blend = scores.get("blend") or {}
        weights = (manifest.get("ensemble_weights") or {}).get(cname) or {}
        for name, m in (scores.get("training") or {}).items():
            rows.append({"collection": cname, "model": name, "oof_score": m.get("oof_score"),
                         "oof_std": m.get("oof_score_std"), "seeds": len(m.get("oof_score_by_seed") or {}),
                         "blend_score": blend.get(name), "weight": weights.get(name)})
        rows.append({"collection": cname, "model": "ensemble", "oof_score": blend.get("ensemble"),
                     "oof_std": None, "seeds": None, "blend_score": blend.get("ensemble"), "weight": None})
    return pl.DataFrame(rows, schema=SCORES_SCHEMA)


def combined_by_model(table: pl.DataFrame, column: str = "blend_score") -> dict[str, Any]:
    """``{model: CombinedScore}`` of a scores table (mean of the collection means)."""
    from pipelines.core.metric import combine_collection_scores

    out = {}
    for model in table["model"].unique(maintain_order=True).to_list():
        part = table.filter(pl.col("model") == model)
        out[model] = combine_collection_scores({c: math.nan if s is None else s
                                                for c, s in part.select("collection", column).iter_rows()})
    return out


def format_scores(table: pl.DataFrame) -> str:
    """The out-of-fold table printed at the end of a run, with the combined score per model."""
    def num(value: float | None) -> str:
        return "-" if value is None or math.isnan(value) else f"{value:.4f}"

    lines = [f"{'collection':<20} {'model':<22} {'OOF mean +- std (seeds)':<26} {'seed-avg':>8} {'weight':>6}"]
    for row in table.iter_rows(named=True):
        if row["model"] == "ensemble":
            oof = num(row["oof_score"])
        else:
            oof = f"{num(row['oof_score'])} +- {num(row['oof_std'])} ({row['seeds']})"
        weight = "" if row["weight"] is None else f"{row['weight']:.2f}"
        lines.append(f"{row['collection']:<20} {row['model']:<22} {oof:<26} {num(row['blend_score']):>8} {weight:>6}")
    combined = combined_by_model(table)
    parts = [f"{model} {num(score.value)}" for model, score in combined.items()]
    complete = all(score.complete for score in combined.values())
    label = "combined OOF score (mean of the 5 collections)" if complete else \
        "combined OOF score UNDEFINED (collections missing); mean of those present"
    lines.append(f"{label}: " + " | ".join(parts))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- training (fan-out: pipelines.core.parallel)


def train_models(config: PipelineConfig, prepared: Mapping[str, Any], models: Sequence[str], *,
                 work_dir: Path, backend: str = "loky", force: bool = False,
                 stages: Sequence[Stage] | None = None) -> dict[str, dict[str, StageOutput]]:
    """Run (or reuse) the training stage of every model on every prepared collection (``stages``: those
    of the DAG, :func:`pipelines.flows.dag.model_stages` of ``models``, in their order).

    Each stage fans its fold x seed jobs out through joblib. With the ``"dask"`` backend the stages
    themselves run concurrently (one driver thread each), so the cluster receives the fold x seed x
    model jobs of all collections at once. Locally, with ``run.n_jobs`` > 1, the stages share one
    pool of that many workers (:class:`pipelines.core.parallel.JobPool`): the next stage starts as soon
    as the current one has handed out its last job and a worker is free, so the workers that a
    stage's last jobs leave idle take the next stage's first ones; the stages of models with long
    fold jobs (adapters with ``long_jobs``, the GNN) go first, so that at the end the short jobs of
    the others fill the workers that the last long jobs leave idle. Each job gets the threads it gets
    in its stage run alone (``train.stage_job_threads``: ``cores // run.n_jobs`` unless the stage has
    fewer fold jobs), and so gives the same results.
    """
    by_model = dict(zip(models, dag.model_stages(models) if stages is None else stages))
    tasks = [(cname, model) for cname in prepared for model in models]

    def one(task: tuple[str, str], pool: JobPool | None = None) -> StageOutput:
        cname, model = task
        call = StageCall(config, prepared[cname].collection, Path(work_dir), prepared=prepared[cname],
                         options={"pool": pool}, force=force)
        if backend == "dask":
            import joblib

            with joblib.parallel_config(backend="dask"):  # the backend choice is per thread
                return by_model[model].run(call)
        return by_model[model].run(call)

    if backend == "dask" and len(tasks) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=len(tasks), thread_name_prefix="train") as threads:
            outputs = list(threads.map(one, tasks))
    elif backend == "loky" and config.run.n_jobs > 1 and len(tasks) > 1:
        from pipelines.config.registry import get_adapter

        scheduled = sorted(tasks, key=lambda task: not getattr(get_adapter(task[1]), "long_jobs", False))
        by_task = dict(zip(scheduled, _train_sharing_workers(one, scheduled, config.run.n_jobs)))
        outputs = [by_task[task] for task in tasks]
    else:
        outputs = [one(task) for task in tasks]
    trained: dict[str, dict[str, StageOutput]] = {cname: {} for cname in prepared}
    for (cname, model), output in zip(tasks, outputs):
        trained[cname][model] = output
    return trained


# How often the start of the next stage is reconsidered while the current one hands out its jobs.
STAGE_START_POLL_S = 0.5


def _train_sharing_workers(one: Callable[..., StageOutput], tasks: Sequence[tuple[str, str]],
                           workers: int) -> list[StageOutput]:
    """``one(task, pool)`` for every task in a thread of its own, started in order: a task starts when
    the one before it has ended or has queued its jobs and a worker is free with nothing waiting.
    Returns the outputs in task order; the first failure (or Ctrl-C) cancels the rest and is raised."""
    from concurrent.futures import ThreadPoolExecutor

    from pipelines.training.fit import shared_fold_pool

    pool = shared_fold_pool(workers)
    threads = ThreadPoolExecutor(max_workers=len(tasks), thread_name_prefix="train")
    futures: list[Future] = []
    try:
        for task in tasks:
            if futures:
                _wait_for_a_free_worker(pool, futures, queued_before)
            queued_before = pool.maps_queued
            futures.append(threads.submit(one, task, pool))
        while not all(f.done() for f in futures):
            _raise_first_failure(futures)
            pool.wait_for_change(STAGE_START_POLL_S)
        _raise_first_failure(futures)
        return [f.result() for f in futures]
    except BaseException:
        pool.close(cancel=True)  # waiting jobs end with KeyboardInterrupt, running ones with their killed worker
        raise
    finally:
        threads.shutdown(wait=True)  # every stage thread has its results or its exception by now
        pool.close()


def _wait_for_a_free_worker(pool: JobPool, futures: Sequence[Future], queued_before: int) -> None:
    """Until the last stage started has ended, or has queued its jobs (``pool.maps_queued`` went past
    ``queued_before``; a stage queues them at once) and a worker is free with no job waiting."""
    while not futures[-1].done():
        _raise_first_failure(futures)
        if pool.maps_queued > queued_before and pool.has_idle_worker():
            return
        pool.wait_for_change(STAGE_START_POLL_S)


def _raise_first_failure(futures: Sequence[Future]) -> None:
    for future in futures:
        if future.done() and future.exception() is not None:
            raise future.exception()


def checked_models(config: PipelineConfig, models: Sequence[str] | None) -> list[str]:
    """:func:`resolve_models`, each of them a registered model: an unknown name fails before any work."""
    from pipelines.config.registry import get_adapter

    names = resolve_models(config, models)
    for name in names:
        get_adapter(name)
    return names


# The schedule `run` picks without --config: base's on a GPU (configs/gpu.toml: base with gnn.device = "auto"),
# configs/cpu.toml on a CPU (base is sized for a GPU: hours of GNN training per fold on a CPU).
MACHINE_CONFIGS = {"gpu": "gpu", "cpu": "cpu"}
# GNN keys that say where and how it runs, not how long it trains (left out when comparing schedules)
_PLACEMENT_KEYS = ("device", "precision", "num_threads", "progress")


def machine_config(gpu: str | None) -> tuple[str, str]:
    """The config ``run`` uses without ``--config`` on a machine whose CUDA hardware is ``gpu``
    (:func:`pipelines.models.gnn.device.cuda_summary`; None: none), and why."""
    if gpu:
        return MACHINE_CONFIGS["gpu"], (f"torch sees {gpu}, so base's schedule on the GPU: configs/gpu.toml is "
                                        "base with gnn.device = auto")
    return MACHINE_CONFIGS["cpu"], ("torch sees no CUDA GPU, so the CPU schedule of configs/cpu.toml; base and gpu "
                                    "are sized for a GPU and run for hours on a CPU")


def gpu_sized_on_cpu(config: PipelineConfig, models: Sequence[str], gpu: str | None) -> bool:
    """True when a model of ``config`` that trains on a device (the registry's ``uses_device``) trains on
    base's GPU-sized schedule on a machine without a GPU: its section equals base's but for where it runs."""
    from pipelines.config.settings import load_config

    if gpu or not device_models(models):
        return False
    base = load_config("base")

    def schedule(c: PipelineConfig, name: str) -> dict:
        return {k: v for k, v in config_to_dict(getattr(c, name)).items() if k not in _PLACEMENT_KEYS}

    return any(schedule(config, name) == schedule(base, name) for name in device_models(models))


def stage_history(work_dir: Path) -> dict[str, list[float]]:
    """Wall times of the complete stage outputs already in ``work_dir``, by stage name (ETA estimates)."""
    from pipelines.core.engine import list_stages

    out: dict[str, list[float]] = {}
    for row in list_stages(work_dir, verify_content=False):  # wall times only: the reuse checks content
        if row["complete"] and row["wall_time_s"] is not None:
            out.setdefault(row["stage"], []).append(float(row["wall_time_s"]))
    return out


def check_training_root(data_root: Path) -> None:
    """A data root a run can train on: it exists, holds TpuGraphs files, and has train graphs. A root of
    test graphs only is for the models of an earlier run (``predict --run``), which this says."""
    # .collections(): "data root does not exist" / "no TpuGraphs data here", naming the folder
    if not DataRoot(data_root).collections():
        raise FormatError(data_root, "no train graphs (a root of test graphs only?): a run trains on train graphs; "
                                     f"to rank these test graphs with the fold models of an earlier run: "
                                     f"predict --run RUN_ID --data-root {data_root} (runs list shows the runs)")


def check_devices(config: PipelineConfig, models: Sequence[str], collections: Sequence[Collection]) -> None:
    """The ``device`` setting of every model that trains on one (the registry's ``uses_device``), resolved
    for every collection it trains for before any stage runs, so ``cuda`` on a machine without a GPU
    fails at once, not after the data stages. Logs the device."""
    from pipelines.config.settings import resolve_for_collection

    for name in device_models(models):
        asked = {c.name: resolve_for_collection(getattr(config, name), c).device for c in collections}
        if set(asked.values()) == {"cpu"}:
            logger.info(f"{name.upper()} device: cpu ({name}.device)")
            continue
        from pipelines.models.gnn.device import resolve_device  # torch: only when a GPU may be used

        resolved = {collection: str(resolve_device(device)) for collection, device in asked.items()}
        shown = sorted(set(resolved.values()))
        why = ": torch sees no CUDA GPU" if "auto" in asked.values() and shown == ["cpu"] else ""
        logger.info(f"{name.upper()} device: {', '.join(shown)} ({name}.device = "
                    f"{', '.join(sorted(set(asked.values())))}{why})")


# ----------------------------------------------------------------------------- publishing


def stage_index(runs: Sequence[CollectionRun]) -> dict[str, dict]:
    """Per collection, the stages behind it, as a run manifest records them under ``stages``; a
    ``companions`` entry only where its models also train on other collections' graphs."""
    return {r.collection.name: {
        "prepare": r.prepare_keys,
        "train": {name: {"stage": out.stage, "key": out.key, "work_dir": str(out.path.parent.parent.resolve())}
                  for name, out in r.trained.items()},
        ENSEMBLE_STAGE: r.ensemble.key,
    } | ({"companions": r.companion_keys} if r.companion_keys else {}) for r in runs}


def indexed_stage_count(stages: Mapping[str, dict]) -> int:
    """How many stages a run's ``stages`` index names, each once (a companion's data stages may also
    be a chosen collection's)."""
    return len(_indexed_stages(stages, ""))


def _indexed_stages(stages: Mapping[str, dict], work_dir: Path | str) -> dict[tuple[str, str], Path | str]:
    """(stage, key) -> the work dir it lies in, for every stage of a run's ``stages`` index."""
    where: dict[tuple[str, str], Path | str] = {}
    for entry in stages.values():
        prepared = [entry["prepare"], *entry.get("companions", {}).values()]
        where |= {(stage, key): work_dir for keys in prepared for stage, key in keys.items()}
        where |= {(ref["stage"], ref["key"]): ref.get("work_dir") or work_dir for ref in entry["train"].values()}
        where[ENSEMBLE_STAGE, entry[ENSEMBLE_STAGE]] = work_dir
    return where


def stages_wall_time(stages: Mapping[str, dict], work_dir: Path | str) -> float:
    """Seconds the stages of a run's ``stages`` index took when they were computed, each stage once.

    A run's compute time also when it was made in several calls: the run's own wall time counts only
    what its call computed, so a run resumed from the stage cache (after a time limit or a Ctrl-C)
    shows only its tail. A training stage that was itself cut and resumed from its finished fold
    jobs records only its last attempt, so the sum is then a lower bound.
    """
    return sum(float(load_stage(Path(where), stage, key).manifest.get("wall_time_s") or 0.0)
               for (stage, key), where in _indexed_stages(stages, work_dir).items())


def _manifest(*, kind: str, config: Any, data_root: Path, work_dir: Path, runs: Sequence[CollectionRun],
              table: pl.DataFrame, command: str | None, wall_s: float, extra: dict[str, Any] | None = None) -> dict:
    combined = combined_by_model(table)
    return {
        "kind": kind,
        "command": command if command is not None else default_command(),
        "config": config,
        "data_root": str(data_root.resolve()),
        "work_dir": str(work_dir.resolve()),
        "models": list(runs[0].trained) if runs else [],
        "collections": [r.collection.name for r in runs],
        "stages": stage_index(runs),
        "cv_scores": {r.collection.name: {
            "training": {name: {k: out.metrics.get(k) for k in ("oof_score", "oof_score_std", "oof_score_by_seed")}
                         for name, out in r.trained.items()},
            "blend": r.ensemble.metrics["oof_scores"],
        } for r in runs},
        "ensemble_weights": {r.collection.name: r.weights for r in runs},
        "combined_oof": {m: {"value": s.value, "complete": s.complete} for m, s in combined.items()},
        "code_version": code_version(),
        "library_versions": library_versions(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_time_s": round(wall_s, 3),
        **(extra or {}),
    }


# ----------------------------------------------------------------------------- run


class StageCounter(logging.Filter):
    """Prefixes the engine's "computing" / "cached" line of each stage with ``stage i/N`` (N: every
    stage of the run, known before it starts), so a log says how far a run is, and ends each "done"
    line with the whole run's ETA. A filter on the engine's logger for the length of a run
    (:meth:`counting`).

    The ETA sums an estimate per stage not yet finished (``plan``: how many stages of each name the run
    has): the mean time of that stage's outputs computed so far in this run, else of its earlier
    outputs in the work dir (``history``, seconds by stage name); stages of a name with neither are
    counted apart ("+ N stages not timed yet"), not guessed from others (a data stage takes seconds,
    a training stage hours). Cached stages count 0 s, so the estimate is refined as stages finish.
    Stages that run side by side (training stages sharing workers) are summed: an upper bound then."""

    _START = re.compile(r"\[([\w.:-]+)\] (computing|cached) [0-9a-f]+$")
    _DONE = re.compile(r"\[([\w.:-]+)\] done [0-9a-f]+ in ([0-9.]+)s$")

    def __init__(self, total: int, plan: Mapping[str, int] | None = None,
                 history: Mapping[str, Sequence[float]] | None = None):
        super().__init__()
        self.total, self.index = total, 0
        self.left = dict(plan or {})  # stage name -> stages of it not finished yet
        self.history = {k: list(v) for k, v in (history or {}).items()}
        self.seconds: dict[str, list[float]] = {}  # stage name -> wall times computed in this run

    def eta(self) -> tuple[float, int]:
        """Seconds the stages not finished yet should take, and how many of them have no estimate."""
        total, untimed = 0.0, 0
        for stage, count in self.left.items():
            known = self.seconds.get(stage) or self.history.get(stage)
            if not known:
                untimed += count
            elif count:
                total += count * sum(known) / len(known)
        return total, untimed

    def _finished(self, stage: str, seconds: float | None) -> None:
        if self.left.get(stage, 0) > 0:
            self.left[stage] -= 1
        if seconds is not None:
            self.seconds.setdefault(stage, []).append(seconds)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        started, done = self._START.search(message), self._DONE.search(message)
        if started:
            self.index += 1
            if started.group(2) == "cached":
                self._finished(started.group(1), None)
            record.msg, record.args = f"stage {self.index}/{self.total}: {message}", ()
        elif done:
            self._finished(done.group(1), float(done.group(2)))
            if any(self.left.values()):
                seconds, untimed = self.eta()
                more = f" + {untimed} stage{'s' if untimed != 1 else ''} not timed yet" if untimed else ""
                record.msg, record.args = f"{message} (run ETA ~{format_duration(seconds)}{more})", ()
        return True

    @contextmanager
    def counting(self) -> Iterator[StageCounter]:
        engine_logger = logging.getLogger("pipelines.core.engine")
        engine_logger.addFilter(self)
        try:
            yield self
        finally:
            engine_logger.removeFilter(self)


def run_pipeline(config: PipelineConfig, data_root: Path | str, *, work_dir: Path | str,
                 models: Sequence[str] | None = None, collections: Sequence[Collection | str] | None = None,
                 submissions_dir: Path | str = paths.SUBMISSIONS_DIR, scheduler: str | None = None,
                 force: bool = False, command: str | None = None,
                 extra: Mapping[str, Any] | None = None) -> RunResult:
    """Prepare, train ``models`` (default: the config's), ensemble and submit; see the module docstring.

    ``scheduler`` overrides ``run.scheduler``; ``collections`` defaults to every collection with a
    train directory (a submission needs all five). ``extra``: entries added to the run manifest as
    they are (``run --name/--note``: ``name``, ``note``), never part of the run-id or a stage key.
    Returns the published run.
    """
    from pipelines.data.submission import check_test_files
    from pipelines.flows.prepare import check_output_dir

    started = time.perf_counter()
    data_root, work_dir, submissions_dir = Path(data_root), Path(work_dir), Path(submissions_dir)
    models = checked_models(config, models)  # an unknown model is the first error, as it was before the split
    check_training_root(data_root)
    # A submission needs every collection and exactly the official test IDs: checked before any stage runs.
    check_test_files(data_root)
    check_output_dir(submissions_dir, data_root, "--submissions-dir")
    runs, computed = train_and_blend(config, data_root, work_dir=work_dir, models=models, collections=collections,
                                     scheduler=scheduler, force=force)
    return _finish(runs, kind="run", config=config_to_dict(config), data_root=data_root, work_dir=work_dir,
                   submissions_dir=submissions_dir, command=command, started=started, computed=computed,
                   extra=dict(extra or {}))


def train_and_blend(config: PipelineConfig, data_root: Path | str, *, work_dir: Path | str,
                    models: Sequence[str] | None = None, collections: Sequence[Collection | str] | None = None,
                    scheduler: str | None = None, force: bool = False) -> tuple[list[CollectionRun], list[str]]:
    """The stages of a run without its submission: prepare, train every model, ensemble, per collection.

    Returns each collection's run and the "stage/key" of every stage this call computed. On its own it
    serves work on some collections only (scoring one collection on a world with hidden labels, see
    :func:`pipelines.flows.evaluate.evaluate_collection_runs`); its stages are the ones a full run reuses.
    """
    from pipelines.flows.prepare import collections_to_prepare, prepare

    data_root, work_dir = Path(data_root), Path(work_dir)
    names = checked_models(config, models)
    computed: list[str] = []
    # prepare, train per model and ensemble per chosen collection; only the data stages of the others
    # their models train on (gnn.extra_train_collections)
    chosen, companions = collections_to_prepare(config, data_root, collections)
    check_devices(config, names, chosen)  # a GPU asked for and absent fails before the data stages
    from pipelines.training.fit import check_models

    check_models(names, chosen)  # e.g. feature:<column> naming no column: before the data stages
    stages = dag.pipeline(names)  # data stages, a training stage per model, the ensemble
    data_names = {stage.name for stage in dag.data_stages()}
    plan: dict[str, int] = {}
    for stage in stages:
        plan[stage.name] = plan.get(stage.name, 0) + len(chosen) + (len(companions) if stage.name in data_names else 0)
    trainers, blend = tuple(stage for stage in stages[:-1] if stage.name not in data_names), stages[-1]
    counter = StageCounter(sum(plan.values()), plan, stage_history(work_dir))

    def track(output: StageOutput) -> StageOutput:
        if not output.cached:
            computed.append(f"{output.stage}/{output.key}")
        return output

    # Connect first: an unreachable scheduler fails before any work.
    with counter.counting():
        with fan_out(scheduler if scheduler is not None else config.run.scheduler) as backend:
            prepared = prepare(config, data_root, work_dir, collections, force=force)
            # every prepared collection once: a companion may be a chosen collection too
            every = {name: c for p in prepared.values() for name, c in p.companions.items()} | prepared
            for item in every.values():
                computed += [f"{stage}/{key}" for stage, key in item.stage_keys.items() if not item.cached.get(stage)]
            trained = train_models(config, prepared, names, work_dir=work_dir, backend=backend, force=force,
                                   stages=trainers)
        for outputs in trained.values():
            for output in outputs.values():
                track(output)
        runs = []
        for cname, item in prepared.items():
            with tagged(cname):
                output = track(blend.run(StageCall(config, item.collection, work_dir,
                                                   upstream={name: item.stages[name] for name in blend.inputs
                                                             if name in item.stages},
                                                   options={"trained": trained[cname]}, force=force)))
            runs.append(CollectionRun(item.collection, item.stage_keys, trained[cname], output,
                                      {name: c.stage_keys for name, c in item.companions.items()}))
    return runs, computed


def _finish(runs: Sequence[CollectionRun], *, kind: str, config: Any, data_root: Path, work_dir: Path,
            submissions_dir: Path, command: str | None, started: float, computed: list[str],
            extra: dict[str, Any] | None = None) -> RunResult:
    rows: dict[str, list[int]] = {}
    for item in runs:
        rows.update(submission_rows(load_blended_test(item.ensemble)))
    table = scores_table(runs)
    manifest = _manifest(kind=kind, config=config, data_root=data_root, work_dir=work_dir, runs=runs, table=table,
                         command=command, wall_s=time.perf_counter() - started,
                         extra={"stages_computed": list(computed), **(extra or {})})
    run_id, path, manifest = publish_submission(rows, manifest, data_root=data_root,
                                                submissions_dir=submissions_dir)
    return RunResult(run_id, path.parent, path, manifest, table, tuple(computed))


# ----------------------------------------------------------------------------- re-ensemble


def _model_matches(name: str, wanted: Sequence[str]) -> bool:
    return name in wanted or name.split("@", 1)[0] in wanted


def ensemble_runs(run_ids: Sequence[str], *, submissions_dir: Path | str = paths.SUBMISSIONS_DIR,
                  work_dir: Path | str | None = None, data_root: Path | str | None = None,
                  method: str | None = None, min_gain_se: float | None = None, gain_at: str | None = None,
                  models: Sequence[str] | None = None, force: bool = False, command: str | None = None) -> RunResult:
    """Blend the saved training outputs of earlier runs into a new submission, training nothing.

    Training outputs are found in the work dir recorded by each run (or ``work_dir``); with several
    runs, a model is named ``<model>@<run-id>``. The runs must share the prune and folds stages of
    every collection, so their out-of-fold predictions are comparable. ``models`` keeps models by
    name or by the part before ``@``; ``method``, ``min_gain_se`` and ``gain_at`` default to the first
    run's (``min_gain_se`` 0, the fitted blend always, and ``gain_at`` "oof" for runs made before
    these settings existed).
    """
    from pipelines.training.ensemble import GAIN_AT_CHOICES, NORMALISE_METHODS

    started = time.perf_counter()
    submissions_dir = Path(submissions_dir)
    run_ids = list(dict.fromkeys(resolve_run_id(submissions_dir, r) for r in run_ids))
    if not run_ids:
        raise ConfigError("ensemble needs at least one run-id")
    manifests = {r: read_run_manifest(submissions_dir, r) for r in run_ids}
    for run_id, manifest in manifests.items():
        check_trained(manifest, run_id, "ensemble --runs")  # a predict run has no OOF predictions to blend
    first = manifests[run_ids[0]]
    method = method or first.get("config", {}).get("ensemble", {}).get("method", "minmax")
    if method not in NORMALISE_METHODS:
        raise ConfigError(f"unknown ensemble method {method!r}; expected one of {', '.join(NORMALISE_METHODS)}")
    if min_gain_se is None:
        min_gain_se = float(first.get("config", {}).get("ensemble", {}).get("min_gain_se", 0.0))
    gain_at = gain_at or first.get("config", {}).get("ensemble", {}).get("gain_at", "oof")
    if gain_at not in GAIN_AT_CHOICES:
        raise ConfigError(f"unknown gain_at {gain_at!r}; expected one of {', '.join(GAIN_AT_CHOICES)}")
    data_root = Path(data_root if data_root is not None else first["data_root"])
    out_dir = Path(work_dir if work_dir is not None else first["work_dir"])
    collections = list(first.get("collections") or first["stages"])  # "stages" is key-sorted JSON
    for run_id, manifest in manifests.items():
        if sorted(manifest["stages"]) != sorted(collections):
            raise PipelineError(f"run {run_id} covers {sorted(manifest['stages'])}, "
                                f"run {run_ids[0]} {sorted(collections)}")

    runs = []
    for cname in collections:
        prepare_keys = first["stages"][cname]["prepare"]
        for run_id, manifest in manifests.items():
            theirs = manifest["stages"][cname]["prepare"]
            for stage in ("prune", "folds"):
                if theirs.get(stage) != prepare_keys.get(stage):
                    raise PipelineError(f"{cname}: runs {run_ids[0]} and {run_id} use different {stage} stages "
                                        f"({prepare_keys.get(stage)} vs {theirs.get(stage)}); their out-of-fold "
                                        "predictions cannot be blended")
        trained: dict[str, StageOutput] = {}
        seen: set[tuple[str, str]] = set()
        for run_id, manifest in manifests.items():
            for model, ref in manifest["stages"][cname]["train"].items():
                name = model if len(run_ids) == 1 else f"{model}@{run_id}"
                if (ref["stage"], ref["key"]) in seen or (models is not None and not _model_matches(name, models)):
                    continue
                seen.add((ref["stage"], ref["key"]))
                trained[name] = _load_saved(training_stage_dir(ref, manifest, work_dir), ref["stage"], ref["key"],
                                            run_id, model, cname)
        if not trained:
            raise ConfigError(f"{cname}: no model of runs {', '.join(run_ids)} matches "
                              f"--models {', '.join(models or [])}")
        prune = _load_saved(out_dir if work_dir is not None else Path(first["work_dir"]), "prune",
                            prepare_keys["prune"], run_ids[0], "prune", cname)
        output = ensemble_stage(parse_collection(cname), prune, trained, method=method, min_gain_se=min_gain_se,
                                gain_at=gain_at, work_dir=out_dir, force=force)
        runs.append(CollectionRun(parse_collection(cname), dict(prepare_keys), trained, output,
                                  dict(first["stages"][cname].get("companions", {}))))
    computed = [f"{r.ensemble.stage}/{r.ensemble.key}" for r in runs if not r.ensemble.cached]
    config = {"ensemble": {"method": method, "min_gain_se": min_gain_se, "gain_at": gain_at,
                           "models": list(models) if models is not None else None},
              "source_runs": {r: manifests[r].get("config") for r in run_ids}}
    return _finish(runs, kind="ensemble", config=config, data_root=data_root, work_dir=out_dir,
                   submissions_dir=submissions_dir, command=command, started=started, computed=computed,
                   extra={"source_runs": run_ids})


def _load_saved(work_dir: Path, stage: str, key: str, run_id: str, what: str, collection: str) -> StageOutput:
    from pipelines.outputs.run_folders import load_named_stage  # "gone" only when absent; else why not usable

    return load_named_stage(work_dir, stage, key, f"run {run_id}: the saved {what} output of {collection}")


# ----------------------------------------------------------------------------- command line helpers


def parse_models(text: str | None) -> list[str] | None:
    """``"gbdt,gnn"`` -> ``["gbdt", "gnn"]``; None stays None (use the config's models)."""
    if text is None:
        return None
    return [m.strip() for m in text.split(",") if m.strip()]


def default_command() -> str:
    return shlex.join([os.path.basename(sys.executable), "-m", "pipelines", *sys.argv[1:]])
