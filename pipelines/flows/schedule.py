"""Where and in what order a run's work happens: the training stages over a shared pool of workers (or a
Dask cluster), the config and device the machine calls for, and the stage counter with the run's ETA
that a run's log shows. :mod:`pipelines.flows.run` chains the stages; this module places them."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipelines.config.registry import device_models
from pipelines.config.settings import PipelineConfig, config_to_dict
from pipelines.core.collection import Collection
from pipelines.core.engine import StageOutput
from pipelines.core.parallel import JobPool
from pipelines.core.progress import format_duration
from pipelines.core.stages import Stage, StageCall
from pipelines.flows import dag

logger = logging.getLogger(__name__)


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


class StageCounter(logging.Filter):
    """Prefixes the engine's "computing" / "cached" line of each stage with ``stage i/N`` (N: every
    stage of the run, known before it starts), so a log says how far a run is, and ends each "done"
    line with the whole run's ETA. A filter on the engine's logger for the length of a run
    (:meth:`counting`).

    The ETA sums an estimate per stage not yet finished (``plan``: how many stages of each name the run
    has): the mean time of that stage's outputs computed so far in this run, else of its earlier
    outputs in the work dir (``history``, seconds by stage name); stages of a name with neither are
    counted apart, not guessed from others (a data stage takes seconds, a training stage hours): the ETA
    then reads "at least" the timed part, or "not known yet" while nothing left is timed, and names the
    stages not timed yet. Cached stages count 0 s, so the estimate is refined as stages finish.
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

    def eta_text(self) -> str:
        """The ETA as the log shows it: a time, a lower bound while some stages are not timed yet, or
        "not known yet" while none of those left is."""
        seconds, untimed = self.eta()
        if not untimed:
            return f"run ETA ~{format_duration(seconds)}"
        names = [stage for stage, count in self.left.items()
                 if count and not (self.seconds.get(stage) or self.history.get(stage))]
        what = f"{untimed} stage{'s' if untimed != 1 else ''} not timed yet: {', '.join(names)}"
        if seconds < 1:
            return f"run ETA not known yet, {what}"
        return f"run ETA at least {format_duration(seconds)}, {what}"

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
                record.msg, record.args = f"{message} ({self.eta_text()})", ()
        return True

    @contextmanager
    def counting(self) -> Iterator[StageCounter]:
        engine_logger = logging.getLogger("pipelines.core.engine")
        engine_logger.addFilter(self)
        try:
            yield self
        finally:
            engine_logger.removeFilter(self)
