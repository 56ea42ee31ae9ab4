"""map_in_order: costliest jobs first, results in input order (the data stages' fan-out)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipelines.parallel import file_cost, map_in_order


def _record_start(log: str, label: str, seconds: float) -> str:
    with open(log, "a") as out:  # one short O_APPEND write per job: lines never interleave
        out.write(f"{label}\n")
    time.sleep(seconds)
    return f"done {label}"


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
