"""benchmarks/training.py: the GNN's fit is extrapolated from what its epochs measured."""
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

import benchmarks.training as training
from benchmarks.training import FitRow, measure_fold, measure_folds, targets

pytestmark = pytest.mark.slow  # end-to-end: left out of make test-quick


def row(**changes) -> FitRow:
    base = FitRow("gnn", "layout:nlp:random", train_graphs=2, train_mean_nodes=100.0, fit_s=20.0, fit_cpu_s=20.0,
                  fit_scale=1.0, test_graphs=1, test_configs=10, predict_s=1.0, predict_cpu_s=1.0, peak_rss_mb=1.0,
                  valid_graphs=1, epochs_run=3, epochs_s=12.0, valid_s=3.0, load_s=1.5, prepare_s=1.5)
    return replace(base, **changes)


def test_steps_validation_and_graph_preparation_scale_and_the_rest_is_paid_once():
    r = row()
    real_train, real_valid = r.real_fold_graphs()
    assert r.fixed_s() == pytest.approx(20.0 - 12.0 - 3.0)
    expected = (3.0 / 3 * (real_train + real_valid)  # load + prepare per graph
                + 5.0  # once
                + (12.0 - 3.0) / 2 * real_train + 3.0 / 1 * real_valid)  # steps, validation
    assert r.fit_extrapolated_s() == pytest.approx(expected)
    # a larger fixed part (a GPU's start) adds to the total once, not once per graph
    assert row(fit_s=30.0).fit_extrapolated_s() == pytest.approx(expected + 10.0)
    # a one-pass model (GBDT) is linear in the train graphs, start-up included
    gbdt = row(model="gbdt", epochs_run=0, epochs_s=0.0, valid_s=0.0, prepare_s=0.0)
    assert gbdt.fixed_s() == 0.0 and gbdt.fit_extrapolated_s() == pytest.approx(20.0 / 2 * r.real_train_graphs())


def test_a_sample_far_from_the_real_graph_size_is_flagged():
    far = row(sample_raw_nodes=11_800.0)  # nlp's real graphs have ~5,900 nodes on average
    assert far.size_ratio() == pytest.approx(2.0)
    assert any(line.startswith("- NOTE gnn") and "layout:nlp:random 2.00x" in line for line in targets([far]))
    assert not any("NOTE" in line for line in targets([row(sample_raw_nodes=6_500.0)]))
    assert row(collection="tile:xla", sample_raw_nodes=40.0).size_ratio() is None  # no real mean to compare


def test_fits_measured_two_at_once_take_half_their_sum_of_the_machine():
    rows = [row(fit_s=20.0), row(collection="layout:xla:random", fit_s=40.0)]
    alone, together = targets(rows), targets(rows, jobs=2)
    minutes = sum(r.fit_extrapolated_s() for r in rows) / 60
    assert f"{minutes:.3g} min" in alone[0] and "at once" not in alone[0]
    assert f"{minutes / 2:.3g} min" in together[0] and "2 at once on 1 thread(s) each (sum / 2)" in together[0]
    seconds = sum(r.predict_extrapolated_s() for r in rows)
    assert f"{seconds / 2:.3g} s" in together[1]


@pytest.mark.parametrize("jobs", [1, 2])
def test_measure_folds_runs_jobs_at_once_on_the_cores_shared_out(monkeypatch, jobs):
    both_running = threading.Barrier(2, timeout=5)  # passes only when two measurements overlap
    calls = []

    def fake(*, collection, model, threads, **options):
        calls.append((collection, threads))
        if jobs == 2:
            both_running.wait()
        return row(collection=collection, model=model)

    monkeypatch.setattr(training, "measure_fold", fake)
    tasks = [("gnn", "layout:xla:default"), ("gnn", "layout:xla:random"), ("gnn", "layout:nlp:default"),
             ("gnn", "layout:nlp:random")]
    rows = measure_folds(tasks, jobs, root="r", work="w")
    assert [r.collection for r in rows] == [c for _, c in tasks]  # in the order asked, whatever finished first
    assert sorted(calls) == sorted((c, 2 // jobs) for _, c in tasks)


def test_measure_folds_takes_a_root_per_collection_and_reports_rows_as_they_come(monkeypatch):
    # make bench keeps its tile and layout samples in different worlds; its results file is rewritten
    # after each measured row, from the calling thread (the writer is not thread-safe)
    seen = []

    def fake(*, root, collection, model, threads, **options):
        seen.append((collection, root))
        return row(collection=collection, model=model)

    monkeypatch.setattr(training, "measure_fold", fake)
    roots = {"tile:xla": "tile-world", "layout:xla:default": "layout-world"}
    reported = []
    rows = measure_folds([("gbdt", "tile:xla"), ("gbdt", "layout:xla:default")], 2, root=roots, work="w",
                         on_row=lambda r: reported.append((r.collection, threading.current_thread())))
    assert sorted(seen) == [("layout:xla:default", "layout-world"), ("tile:xla", "tile-world")]
    assert [r.collection for r in rows] == ["tile:xla", "layout:xla:default"]
    assert sorted(c for c, _ in reported) == ["layout:xla:default", "tile:xla"]
    assert all(thread is threading.main_thread() for _, thread in reported)


def test_a_measured_gnn_fit_reports_its_epochs(tiny_world, tmp_path):
    # the benchmark used to look for the epochs on a wrapper the model contract removed: none were
    # found and every GNN fit was extrapolated linearly, its fixed start-up once per real graph
    r = measure_fold(tiny_world, "layout:nlp:random", "gnn", tmp_path / "work", gnn_epochs=2,
                     overrides=["gnn.hidden=8", "gnn.passes_per_epoch=1", "gnn.eval_max_configs=8"], threads=1)
    assert r.epochs_run == 2 and r.fit_scale == 20 / 2
    assert 0 < r.valid_s < r.epochs_s < r.fit_s
    assert r.load_s > 0 and r.prepare_s > 0 and r.fixed_s() >= 0 and r.companion_graphs == 0
    assert r.sample_raw_nodes > 0 and r.size_ratio() is not None


def test_graphs_of_the_extra_training_collections_join_the_measured_fit(tiny_world, tmp_path):
    # base.toml trains xla:random on nlp:random's graphs too: the benchmark fits with them, as a run does
    fast = ["gnn.hidden=8", "gnn.eval_max_configs=8"]
    r = measure_fold(tiny_world, "layout:xla:random", "gnn", tmp_path / "work", gnn_epochs=1, overrides=fast,
                     threads=1)
    assert r.companion_graphs > 0 and r.epochs_run == 1
    alone = measure_fold(tiny_world, "layout:xla:random", "gnn", tmp_path / "work", gnn_epochs=1,
                         overrides=fast + ["gnn.extra_train_collections=[]"], threads=1)
    assert alone.companion_graphs == 0  # cleared, as configs/demo.toml and quick.toml do


def test_a_gbdt_fit_is_measured_too(tiny_world, tmp_path):
    # its training data is one frame, not a list of graphs the companions could join: make bench's
    # default models (gbdt,gnn) failed on it
    r = measure_fold(tiny_world, "layout:nlp:random", "gbdt", tmp_path / "work", threads=1,
                     overrides=["gbdt.n_estimators=5"])
    assert r.model == "gbdt" and r.fit_s > 0 and r.epochs_run == 0 and r.companion_graphs == 0
    assert r.test_configs > 0 and r.fit_extrapolated_s() > 0


def test_the_machine_reference_flags_a_machine_whose_speed_moved_during_the_measurements():
    from benchmarks.common import REFERENCE_TOLERANCE, Reference, reference_lines

    assert 1.0 < REFERENCE_TOLERANCE < 1.25
    before = Reference(pass_ms=20.0, matmul_ms=10.0)
    steady = reference_lines(before, Reference(pass_ms=20.0 * REFERENCE_TOLERANCE * 0.99, matmul_ms=9.5))
    assert len(steady) == 1 and "20.0 -> " in steady[0] and "10.0 -> 9.5 ms" in steady[0]
    slower = reference_lines(before, Reference(pass_ms=25.0, matmul_ms=10.0))
    faster = reference_lines(before, Reference(pass_ms=20.0, matmul_ms=8.0))
    for lines in (slower, faster):
        assert len(lines) == 2 and lines[1].startswith("- NOTE the machine's speed moved")
        assert "1.25x" in lines[1]


def test_the_hosts_steal_during_the_measurements_is_reported_and_flagged_above_the_tolerance():
    from benchmarks.common import STEAL_TOLERANCE, CpuClock, steal_lines

    before = CpuClock(total_s=1000.0, steal_s=10.0)
    calm = steal_lines(before, CpuClock(total_s=1200.0, steal_s=10.0 + 200.0 * STEAL_TOLERANCE * 0.9))
    assert len(calm) == 1 and f"{STEAL_TOLERANCE * 0.9:.1%} of the machine's core time" in calm[0]
    taken = steal_lines(before, CpuClock(total_s=1200.0, steal_s=70.0))
    assert len(taken) == 2 and "30.0%" in taken[0] and taken[1].startswith("- NOTE the host took")
    assert steal_lines(None, before) == [] and steal_lines(before, None) == []
    assert steal_lines(before, before) == []  # no time passed: no share to give


def test_the_cpu_clock_reads_the_machines_counters_where_linux_gives_them():
    from benchmarks.common import cpu_clock

    first = cpu_clock()
    if not Path("/proc/stat").exists():
        assert first is None
        return
    deadline = time.perf_counter() + 0.2
    while time.perf_counter() < deadline:  # busy, so the counters move by at least a tick
        pass
    second = cpu_clock()
    assert second.total_s > first.total_s >= first.steal_s >= 0
    assert second.steal_s >= first.steal_s
