"""Fan-out of independent jobs through joblib: local processes, or a Dask cluster.

One mechanism for every stage that runs many independent jobs: the training stages (fold x seed
jobs, ``pipelines.train``) and the data stages (one job per graph file: prune, features, node
arrays, ``pipelines.prepare``). Code that fans out calls joblib's ``Parallel`` without naming a
backend; :func:`fan_out` decides where the jobs go: local loky processes by default, or the Dask
cluster at ``--scheduler ADDRESS`` (workers must see the data root and the work directory at the
same paths and have this package installed).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pipelines.errors import PipelineError, redact_credentials

logger = logging.getLogger(__name__)
T = TypeVar("T")

LOCAL_SCHEDULER = "local"
DASK_CONNECT_TIMEOUT = "10s"


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
