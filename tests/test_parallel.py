"""map_in_order: costliest jobs first, results in input order (the data stages' fan-out); JobPool: stages sharing workers."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipelines.core.errors import PipelineError
from pipelines.core.parallel import JobPool, file_cost, map_in_order


def _record_start(log: str, label: str, seconds: float) -> str:
    with open(log, "a") as out:  # one short O_APPEND write per job: lines never interleave
        out.write(f"{label}\n")
    time.sleep(seconds)
    return f"done {label}"


def _grow(megabytes: int) -> int:
    """Keep ``megabytes`` alive in the worker (on a module every job sees, as a heap kept by a GNN job
    is) for a bit over loky's 1-s leak-check interval; return the worker's pid."""
    import os
    import sys

    import numpy as np

    sys.__dict__.setdefault("_test_parallel_kept", []).append(np.ones(megabytes * 2**20 // 8))
    time.sleep(1.1)
    return os.getpid()


@pytest.mark.slow
def test_a_worker_replaced_for_its_grown_memory_runs_on_without_the_leak_warning() -> None:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        pool = JobPool(2, threads_per_job=1)
        try:
            pids = list(pool.map_unordered(_grow, [(8,), (8,), (400,), (400,), (8,), (8,)]))
        finally:
            pool.close()
    assert len(set(pids)) > 2  # loky replaced the grown workers: the case the warning is raised in
    assert not [w for w in caught if "A worker stopped" in str(w.message)], [str(w.message) for w in caught]


def test_costliest_jobs_start_first_and_results_come_back_in_input_order(tmp_path: Path) -> None:
    log = str(tmp_path / "starts.log")
    labels = ["a", "b", "c", "d", "e", "f"]
    costs = [1, 50, 3, 40, 2, 30]
    results = list(map_in_order(_record_start, [(log, label, 0.3) for label in labels], 2, costs=costs))

    assert results == [f"done {label}" for label in labels]
    started = Path(log).read_text().split()
    assert sorted(started) == labels
    # two workers: the two costliest jobs start first, and the cheapest ones last
    assert set(started[:2]) == {"b", "d"}
    assert set(started[-2:]) == {"a", "e"}


def test_without_costs_or_with_one_worker_jobs_run_in_input_order(tmp_path: Path) -> None:
    log = str(tmp_path / "starts.log")
    labels = ["a", "b", "c"]
    results = list(map_in_order(_record_start, [(log, label, 0.0) for label in labels], 1, costs=[1, 9, 5]))
    assert results == [f"done {label}" for label in labels]
    assert Path(log).read_text().split() == labels  # one worker: this process, lazily, in input order


def test_costs_must_match_the_jobs() -> None:
    with pytest.raises(ValueError, match="2 costs for 3 jobs"):
        map_in_order(_record_start, [("x", "a", 0.0)] * 3, 2, costs=[1, 2])


def test_file_cost_is_the_size_or_zero_when_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "graph.npz"
    path.write_bytes(b"x" * 123)
    assert file_cost(path) == 123
    assert file_cost(tmp_path / "missing.npz") == 0


# ----------------------------------------------------------------------------- JobPool (training stages side by side)


def _record_span(log: str, label: str, seconds: float) -> str:
    """Append 'label start end' (wall clock) to ``log`` after sleeping ``seconds``."""
    start = time.time()
    time.sleep(seconds)
    with open(log, "a") as out:
        out.write(f"{label} {start} {time.time()}\n")
    return label


def _fail(label: str) -> str:
    raise ValueError(f"job {label} failed")


def _spans(log: str) -> dict[str, tuple[float, float]]:
    rows = [line.split() for line in Path(log).read_text().splitlines()]
    return {label: (float(start), float(end)) for label, start, end in rows}


def test_a_later_stage_takes_the_worker_that_an_earlier_stage_leaves_idle(tmp_path: Path) -> None:
    log = str(tmp_path / "spans.log")
    pool = JobPool(2, threads_per_job=1)
    try:
        first = pool.map_unordered(_record_span, [(log, "a-long", 2.0), (log, "a-short", 0.2)])
        second = pool.map_unordered(_record_span, [(log, "b1", 0.2), (log, "b2", 0.2), (log, "b3", 0.2)])
        assert sorted(first) == ["a-long", "a-short"] and sorted(second) == ["b1", "b2", "b3"]
    finally:
        pool.close()
    spans = _spans(log)
    # the second stage's jobs ran on the worker the first stage's short job freed, beside its long one
    assert all(spans[b][1] < spans["a-long"][1] for b in ("b1", "b2", "b3"))


def test_the_earliest_stage_jobs_start_first_and_memory_bounds_what_runs_together(tmp_path: Path) -> None:
    log = str(tmp_path / "spans.log")
    pool = JobPool(2, threads_per_job=1, memory_budget=100)
    try:
        big = pool.map_unordered(_record_span, [(log, f"big{i}", 0.3) for i in range(2)], job_memory=60)
        small = pool.map_unordered(_record_span, [(log, f"small{i}", 0.3) for i in range(2)], job_memory=40)
        assert sorted(big) == ["big0", "big1"] and sorted(small) == ["small0", "small1"]
    finally:
        pool.close()
    spans = _spans(log)
    # two 60-byte jobs never overlap within 100 bytes; a 40-byte one may run beside a 60-byte one
    assert spans["big0"][1] <= spans["big1"][0] or spans["big1"][1] <= spans["big0"][0]
    # the later stage's jobs waited behind the earlier stage's second job, although they fitted beside the
    # first one: none started before the first big job ended and let the second one go
    assert min(spans[s][0] for s in ("small0", "small1")) >= min(spans[b][1] for b in ("big0", "big1"))


def test_a_failed_job_raises_in_its_own_stage_and_a_cancelled_pool_ends_every_stage(tmp_path: Path) -> None:
    log = str(tmp_path / "spans.log")
    pool = JobPool(1, threads_per_job=1)
    try:
        failing = pool.map_unordered(_fail, [("x",)])
        with pytest.raises(ValueError, match="job x failed"):
            list(failing)
        running = pool.map_unordered(_record_span, [(log, "slow", 30.0)])
        waiting = pool.map_unordered(_record_span, [(log, "never", 0.0)])
        time.sleep(1.0)  # "slow" is running, "never" waits for the only worker
        started = time.perf_counter()
        pool.close(cancel=True)
        with pytest.raises(KeyboardInterrupt):
            list(waiting)
        with pytest.raises(BaseException):  # its worker was killed
            list(running)
        assert time.perf_counter() - started < 20
        with pytest.raises(PipelineError, match="closed"):
            pool.map_unordered(_record_span, [(log, "late", 0.0)])
    finally:
        pool.close()
    assert not Path(log).exists()  # neither the killed nor the cancelled job wrote anything


def _fake_stage(task: tuple[str, str, float, int], pool: JobPool) -> list[str]:
    """A training stage's use of the pool: queue ``jobs`` jobs of ``seconds``, return their labels."""
    log, name, seconds, jobs = task
    if name == "boom":
        raise ValueError("stage boom failed")
    with open(log, "a") as out:
        out.write(f"start-{name} {time.time()} {time.time()}\n")
    return sorted(pool.map_unordered(_record_span, [(log, f"{name}{i}", seconds) for i in range(jobs)]))


def test_stages_start_while_the_one_before_runs_its_last_job_and_keep_their_order(tmp_path: Path) -> None:
    from pipelines.flows.schedule import _train_sharing_workers

    log = str(tmp_path / "spans.log")
    tasks = [(log, "a", 2.0, 1), (log, "b", 0.2, 3), (log, "c", 0.2, 1)]
    assert _train_sharing_workers(_fake_stage, tasks, 2) == [["a0"], ["b0", "b1", "b2"], ["c0"]]
    spans = _spans(log)
    # b started once a had queued its single job (a worker was free), and c once b had handed out its
    # jobs: both ran beside a's long job
    assert spans["start-b"][0] < spans["a0"][1] and spans["start-c"][0] < spans["a0"][1]
    assert spans["start-c"][0] >= min(spans[f"b{i}"][0] for i in range(3))


def test_a_failed_stage_stops_the_others_and_its_error_is_raised(tmp_path: Path) -> None:
    from pipelines.flows.schedule import _train_sharing_workers

    log = str(tmp_path / "spans.log")
    started = time.perf_counter()
    with pytest.raises(ValueError, match="stage boom failed"):
        _train_sharing_workers(_fake_stage, [(log, "slow", 60.0, 1), (log, "boom", 0.0, 0)], 2)
    assert time.perf_counter() - started < 30  # the slow stage's job was killed, not waited for
    assert "slow0" not in Path(log).read_text()


@pytest.mark.parametrize("given", ["abc", "0", "-3", ""])
def test_a_bad_loky_max_cpu_count_is_warned_about_not_a_traceback(monkeypatch, caplog, given) -> None:
    """loky reads LOKY_MAX_CPU_COUNT with int() when it starts workers: the data stages' fan-out and the
    shared pool replace a bad value by the cores available, with a warning, as training does."""
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", given)
    assert list(map_in_order(abs, [(-1,), (-2,), (-3,)], n_jobs=2)) == [1, 2, 3]
    assert "LOKY_MAX_CPU_COUNT" in caplog.text and "not a positive integer" in caplog.text
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", given)
    pool = JobPool(2, threads_per_job=1)
    try:
        assert sorted(pool.map_unordered(abs, [(-1,), (-2,)])) == [1, 2]
    finally:
        pool.close()
