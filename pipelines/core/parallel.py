"""Fan-out of independent jobs through joblib: local processes, or a Dask cluster.

One mechanism for every stage that runs many independent jobs: the training stages (fold x seed
jobs, ``pipelines.training.fit``) and the data stages (one job per graph file: prune, features, node
arrays, ``pipelines.flows.prepare``). Code that fans out calls joblib's ``Parallel`` without naming a
backend; :func:`fan_out` decides where the jobs go: local loky processes by default, or the Dask
cluster at ``--scheduler ADDRESS`` (workers must see the data root and the work directory at the
same paths and have this package installed).
"""

from __future__ import annotations

import heapq
import logging
import os
import queue
import signal
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pipelines.core.errors import PipelineError, redact_credentials

logger = logging.getLogger(__name__)
T = TypeVar("T")

LOCAL_SCHEDULER = "local"
DASK_CONNECT_TIMEOUT = "10s"


# loky replaces a worker whose memory grew by over 300 MB since its first job (it takes that for a leak),
# or that sat idle past the pool's timeout, and warns when a job was already queued for it. Our workers
# grow by design (a GNN job on a larger graph; gnn.cpu_heap_reuse keeps freed memory in the heap): the
# replacement frees that memory and the job runs in the new worker with the same result, so the warning
# ("... or by a memory leak") only alarms.
_WORKER_REPLACED = "A worker stopped while some jobs were given to the executor"


def quiet_worker_replacement() -> None:
    """Before local workers start: silence loky's warning about a replaced worker (see
    ``_WORKER_REPLACED``) in this process, and make ``LOKY_MAX_CPU_COUNT`` a count loky can read:
    it takes the variable with ``int()`` and ends in a ValueError traceback on anything else, so a
    value that is not a positive integer is replaced by the cores available, with a warning."""
    warnings.filterwarnings("ignore", message=_WORKER_REPLACED, category=UserWarning)
    given = os.environ.get("LOKY_MAX_CPU_COUNT")
    if given is not None and not (given.strip().isdigit() and int(given) > 0):
        from pipelines.core.machine import available_cores

        logger.warning(f"warning: LOKY_MAX_CPU_COUNT={given!r} is not a positive integer; using "
                       f"{available_cores()} (the cores available)")
        os.environ["LOKY_MAX_CPU_COUNT"] = str(available_cores())


@contextmanager
def fan_out(scheduler: str | None) -> Iterator[str]:
    """Within the block, joblib sends the jobs to ``scheduler``: ``None``/``"local"`` keeps local
    loky processes; anything else is the address of a running Dask scheduler. Yields the joblib
    backend name ("loky" or "dask")."""
    if scheduler is None or scheduler == LOCAL_SCHEDULER:
        yield "loky"
        return
    try:
        import joblib
        from distributed import Client
    except ImportError as exc:
        raise PipelineError(f"--scheduler {scheduler} needs Dask: pip install 'dask[distributed]' ({exc})") from None
    from urllib.parse import urlsplit

    try:
        secret = urlsplit(scheduler).password
    except ValueError:
        secret = None
    shown = redact_credentials(scheduler, secret)  # an address may carry a password: never echo it
    try:
        client = Client(scheduler, timeout=DASK_CONNECT_TIMEOUT, set_as_default=True)
    except (OSError, TimeoutError, ValueError, TypeError) as exc:
        raise PipelineError(f"cannot reach the Dask scheduler at {shown!r} within "
                            f"{DASK_CONNECT_TIMEOUT}: {redact_credentials(str(exc), secret)}") from None
    try:
        workers = len(client.scheduler_info().get("workers", {}))
        logger.info(f"jobs go to the Dask cluster at {shown} ({workers} worker(s); they must see this "
            "work dir and data root at the same paths)")
        with joblib.parallel_config(backend="dask"):
            yield "dask"
    finally:
        client.close()


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM (``kill``, a batch scheduler's cancel) raises KeyboardInterrupt, as Ctrl-C
    does, instead of ending the process on the spot.

    A process killed on the spot leaves its loky workers running their current job as orphans (a
    fold job can hold a core for minutes) and their memory-mapped inputs in /dev/shm; unwinding lets
    joblib abort the pool (it kills the workers), the resource tracker remove those folders, and
    stages discard their temporary output. Outside the main thread (where Python cannot take
    signals) the block runs unchanged.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def map_in_order(function: Callable[..., T], arguments: Iterable[tuple[Any, ...]], n_jobs: int,
                 costs: Sequence[float] | None = None) -> Iterator[T]:
    """``function(*args)`` for each tuple of ``arguments``, yielded in their order, with up to ``n_jobs``
    workers of the current joblib backend (see :func:`fan_out`).

    Results come back in input order whatever finished first, so a stage that writes what they
    return produces the same bytes with 1 or 16 workers. ``n_jobs == 1`` runs in this process,
    lazily (one result at a time, as a plain loop would). ``function`` must be importable by
    the workers (a module-level function), and so must its arguments.

    ``costs`` (one number per job, e.g. the size of the file it reads) makes the workers start the
    costliest jobs first: a large file that starts last runs alone while the other workers idle, the
    stage's tail, which is longest where files are few per worker (a cluster). Results that finish
    before those earlier in the input wait in memory, so keep them small.
    """
    arguments = list(arguments)
    jobs = max(1, min(n_jobs, len(arguments)))
    if jobs == 1:
        return (function(*args) for args in arguments)
    from joblib import Parallel, delayed

    quiet_worker_replacement()
    if costs is None:
        order = list(range(len(arguments)))
    else:
        costs = list(costs)
        if len(costs) != len(arguments):
            raise ValueError(f"map_in_order: {len(costs)} costs for {len(arguments)} jobs")
        order = sorted(range(len(arguments)), key=lambda i: -costs[i])  # stable: equal costs keep input order
    results = Parallel(n_jobs=jobs, return_as="generator")(delayed(function)(*arguments[i]) for i in order)
    return _in_input_order(results, order)


def file_cost(path: Path | str) -> int:
    """A job's cost for :func:`map_in_order`: the size of the file it reads (0 if it cannot be read: the
    job itself reports that problem)."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _in_input_order(results: Iterable[T], order: Sequence[int]) -> Iterator[T]:
    """Results that arrive in ``order`` (input positions), yielded by input position as soon as each is due."""
    waiting: dict[int, T] = {}
    due = 0
    for position, result in zip(order, results):
        waiting[position] = result
        while due in waiting:
            yield waiting.pop(due)
            due += 1


class JobPool:
    """Local worker processes shared by stages that run side by side in threads of this process.

    A stage's jobs rarely divide evenly among the workers: its last ones run while the other workers
    idle (5 fold jobs on 2 workers leave one core idle for a third of the stage, 10 on 8 workers for
    half of it). Stages that share one pool hand those workers to the next stage's jobs instead.
    ``map_unordered`` queues a stage's jobs behind those of stages that called it earlier (workers
    always take the earliest stage's next job, so stages finish in the order they started) and yields
    the stage's results as its jobs finish. A job starts only when its memory estimate fits beside
    the running jobs' within ``memory_budget`` (bytes; a job alone always starts).

    Workers are loky processes with joblib's thread limits at ``threads_per_job``; a training job
    sets its own thread count from its stage (``train.stage_job_threads``) whatever else runs, so a
    result is the same as in a pool of its own.
    """

    def __init__(self, workers: int, *, threads_per_job: int, memory_budget: float | None = None):
        from joblib._parallel_backends import ParallelBackendBase
        from joblib.externals.loky import ProcessPoolExecutor

        self.workers, self.threads_per_job, self.memory_budget = workers, threads_per_job, memory_budget
        quiet_worker_replacement()
        # what joblib's loky backend sets in its workers (unless the parent set them): same libraries, same threads
        env = {var: os.environ.get(var, str(threads_per_job)) for var in ParallelBackendBase.MAX_NUM_THREADS_VARS}
        self._executor = ProcessPoolExecutor(max_workers=workers, timeout=300, env=env)
        self._lock = threading.Condition()
        self._pending: list[tuple[int, int, float, Callable[..., Any], tuple, queue.SimpleQueue]] = []
        self._maps = 0  # map_unordered calls so far: a stage's priority
        self._running = 0
        self._memory = 0.0
        self._closed = False
        self._dispatcher = threading.Thread(target=self._dispatch, name="job-pool", daemon=True)
        self._dispatcher.start()

    def map_unordered(self, function: Callable[..., T], arguments: Iterable[tuple[Any, ...]], *,
                      job_memory: float | None = None) -> Iterator[T]:
        """Queue ``function(*args)`` for each tuple (now, not when iterated) and return an iterator over
        the results in the order the jobs finish; a failed job raises its exception there."""
        arguments = list(arguments)
        results: queue.SimpleQueue = queue.SimpleQueue()
        with self._lock:
            if self._closed:
                raise PipelineError("the job pool is closed")
            self._maps += 1
            for index, args in enumerate(arguments):
                heapq.heappush(self._pending, (self._maps, index, float(job_memory or 0), function, args, results))
            self._lock.notify_all()
        return self._results(results, len(arguments))

    @staticmethod
    def _results(results: queue.SimpleQueue, count: int) -> Iterator[Any]:
        for _ in range(count):
            item = results.get()
            if isinstance(item, BaseException):
                raise item
            yield item

    @property
    def maps_queued(self) -> int:
        """How many ``map_unordered`` calls have queued their jobs."""
        with self._lock:
            return self._maps

    def has_idle_worker(self) -> bool:
        """No job waits and a worker is free: the moment to start another stage."""
        with self._lock:
            return not self._pending and self._running < self.workers

    def wait_for_change(self, timeout: float) -> None:
        """Block until a job starts or ends (or ``timeout`` seconds pass)."""
        with self._lock:
            self._lock.wait(timeout)

    def _dispatch(self) -> None:
        while True:
            with self._lock:
                while not self._next_fits() and not (self._closed and not self._pending):
                    self._lock.wait()
                if not self._next_fits():  # closed, and nothing waits (or was cancelled)
                    return
                _, _, memory, function, args, results = heapq.heappop(self._pending)
                self._running += 1
                self._memory += memory
                self._lock.notify_all()
            try:  # never under the lock: the callback below takes it
                future = self._executor.submit(function, *args)
            except BaseException as exc:  # a broken or shut-down executor: the stage learns why
                self._finished(memory, results, exc)
                continue
            future.add_done_callback(lambda done, m=memory, r=results: self._finished(m, r, done))

    def _next_fits(self) -> bool:
        if not self._pending or self._running >= self.workers:
            return False
        memory = self._pending[0][2]
        return self._running == 0 or self.memory_budget is None or self._memory + memory <= self.memory_budget

    def _finished(self, memory: float, results: queue.SimpleQueue, outcome: Any) -> None:
        if isinstance(outcome, BaseException):
            results.put(outcome)
        else:
            try:
                results.put(outcome.result())
            except BaseException as exc:  # the job's own exception, or the worker's death
                results.put(exc)
        with self._lock:
            self._running -= 1
            self._memory -= memory
            self._lock.notify_all()

    def close(self, *, cancel: bool = False) -> None:
        """Stop taking new jobs. ``cancel``: drop the waiting jobs (their stages get KeyboardInterrupt)
        and kill the workers, whose running jobs are lost; else run the queued jobs and wait for them."""
        with self._lock:
            if self._closed and not cancel:
                return
            self._closed = True
            dropped = self._pending if cancel else []
            self._pending = [] if cancel else self._pending
            self._lock.notify_all()
        for *_, results in dropped:
            results.put(KeyboardInterrupt("job cancelled"))
        self._dispatcher.join()
        self._executor.shutdown(wait=not cancel, kill_workers=cancel)
