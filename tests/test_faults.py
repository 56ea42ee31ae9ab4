"""Reliability under bad input and interruption, on the tiny synthetic world with a fast config.

* bad raw files (garbage, truncated, a byte flipped inside compressed data, a foreign npz): a
  FormatError naming the file and nothing complete-looking written; ``data.on_bad_file = "skip"``
  leaves the graph out, warns on every run and records it in the prune manifest;
* a full or read-only output disk: simulated by raising ``OSError(ENOSPC/EROFS)`` at the write points
  (monkeypatched, always run), and for real with a tiny tmpfs and a read-only bind mount (only where
  this process may mount, e.g. as root in a container; skipped elsewhere);
* ``kill -9`` of ``python -m pipelines run`` in the middle of each stage, then a rerun: the same
  submission bytes as an uninterrupted run, and no leftover work folders;
* ``kill`` (SIGTERM): the run stops as on Ctrl-C (exit 130, the running stage discarded), and so do
  its parallel workers;
* two concurrent runs on one work dir: both finish, with identical complete outputs.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import pipelines.data.prune as prune_module
from pipelines.cli import main
from pipelines.core.collection import LAYOUT_XLA_DEFAULT, TILE_XLA
from pipelines.config.settings import load_config
from pipelines.core.engine import TMP_PREFIX, list_stages
from pipelines.core.errors import FormatError, PipelineError
from pipelines.data.folds import FOLDS_TABLE
from pipelines.flows.prepare import prepare
from pipelines.data.prune import GRAPHS_TABLE
from pipelines.data.root import DataRoot

ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 300


def fast_config(*extra: str):
    return load_config("smoke", extra)


def run_args(data_root: Path, work: Path, submissions: Path) -> list[str]:
    args = ["run", "--data-root", str(data_root), "--work-dir", str(work), "--submissions-dir", str(submissions),
            "--config", "smoke", "--models", "gbdt"]
    return args


def python_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def leftovers(work: Path) -> list[Path]:
    """Work folders of killed or failed stages still on disk."""
    return sorted(work.glob(f"*/{TMP_PREFIX}*")) if work.is_dir() else []


def complete_stages(work: Path) -> list[tuple[str, str]]:
    return sorted((r["stage"], r["key"]) for r in list_stages(work) if r["complete"])


def submission_csv(submissions: Path) -> bytes:
    files = sorted(submissions.glob("*/submission.csv"))
    assert len(files) == 1, files
    return files[0].read_bytes()


@pytest.fixture()
def data_copy(tiny_world: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny world (modification times kept) that a test may damage."""
    root = tmp_path / "data"
    shutil.copytree(tiny_world, root)
    return root


# ----------------------------------------------------------------------------- bad raw files


def _garbage(path: Path) -> None:
    path.write_bytes(b"these are not the arrays you are looking for\n" * 20)


def _truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flipped(path: Path) -> None:
    """Flip bytes inside the compressed data of the largest member (the zip stays well-formed)."""
    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda i: i.compress_size)
    data = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    for offset in range(start + info.compress_size // 3, start + info.compress_size // 3 + 8):
        data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _foreign(path: Path) -> None:
    """A valid npz, but not a graph of this collection (other arrays)."""
    with path.open("wb") as handle:
        np.savez(handle, weights=np.ones((3, 3), np.float32))


DAMAGE = {"garbage": _garbage, "truncated": _truncated, "flipped bytes": _flipped, "foreign npz": _foreign}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_bad_file_stops_prepare_with_an_error_naming_it(kind, data_copy, tmp_path):
    bad = DataRoot(data_copy).graphs(LAYOUT_XLA_DEFAULT, "train")[1].path
    DAMAGE[kind](bad)
    work = tmp_path / "work"
    with pytest.raises(FormatError) as raised:
        prepare(fast_config(), data_copy, work, [LAYOUT_XLA_DEFAULT])
    assert raised.value.path == bad
    assert str(bad) in str(raised.value) and "data.on_bad_file=skip" in str(raised.value)
    assert complete_stages(work) == [] and leftovers(work) == []


def test_a_foreign_non_npz_file_is_ignored_and_a_tile_graph_among_layout_files_is_an_error(data_copy, tmp_path):
    folder = DataRoot(data_copy).graphs(LAYOUT_XLA_DEFAULT, "train")[0].path.parent
    (folder / "README.txt").write_text("notes next to the data are not graphs\n")
    tile = DataRoot(data_copy).graphs(TILE_XLA, "train")[0].path
    shutil.copy2(tile, folder / "stray_tile_graph.npz")
    with pytest.raises(FormatError, match="stray_tile_graph.npz: missing key"):
        prepare(fast_config(), data_copy, tmp_path / "work", [LAYOUT_XLA_DEFAULT])
    (folder / "stray_tile_graph.npz").unlink()
    prepared = prepare(fast_config(), data_copy, tmp_path / "work", [LAYOUT_XLA_DEFAULT])
    assert "README" not in " ".join(prepared[LAYOUT_XLA_DEFAULT.name].graph_table["graph"].to_list())


def test_the_command_line_reports_a_bad_file_by_name(data_copy, tmp_path, capsys):
    bad = DataRoot(data_copy).graphs(TILE_XLA, "valid")[0].path
    _truncated(bad)
    code = main(["prepare", "--data-root", str(data_copy), "--work-dir", str(tmp_path / "work"), "--config", "quick",
                 "--collections", "tile:xla"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(f"error: {bad}: corrupt or truncated archive") and "Traceback" not in err


def test_skip_option_leaves_bad_files_out_with_a_warning_on_every_run_and_records_them(data_copy, tmp_path, caplog):
    refs = DataRoot(data_copy).graphs(LAYOUT_XLA_DEFAULT, "train")
    bad, kept = refs[0], refs[1]
    _truncated(bad.path)
    config = fast_config("data.on_bad_file=skip")
    caplog.set_level(logging.INFO, logger="pipelines")
    prepared = prepare(config, data_copy, tmp_path / "work", [LAYOUT_XLA_DEFAULT])
    item = prepared[LAYOUT_XLA_DEFAULT.name]

    warnings = [m for m in caplog.messages if "warning" in m]
    assert len(warnings) == 1 and str(bad.path) in warnings[0] and "truncated" in warnings[0]
    skipped = item.stages["prune"].metrics["skipped_files"]
    assert [(s["split"], s["graph"], s["path"]) for s in skipped] == [("train", bad.stem, str(bad.path))]
    assert "corrupt or truncated archive" in skipped[0]["reason"]
    # the graph is gone from every stage downstream; its neighbours are not
    assert bad.stem not in item.graph_table["graph"].to_list() and kept.stem in item.graph_table["graph"].to_list()
    assert bad.stem not in item.folds()["graph"].to_list() and kept.stem in item.folds()["graph"].to_list()
    assert not (item.stages["features"].path / "train" / "configs" / f"{bad.stem}.parquet").exists()
    assert not (item.stages["node_arrays"].path / "train" / f"{bad.stem}.npz").exists()
    assert item.stages["prune"].metrics["graphs"]["train"] == len(refs) - 1

    caplog.clear()
    prepared = prepare(config, data_copy, tmp_path / "work", [LAYOUT_XLA_DEFAULT])
    assert all(prepared[LAYOUT_XLA_DEFAULT.name].cached.values())
    assert [m for m in caplog.messages if "warning" in m] == warnings  # a cached skip is still reported

    # the default ("error") never reuses the output that skipped the file
    with pytest.raises(FormatError, match="truncated"):
        prepare(fast_config(), data_copy, tmp_path / "work", [LAYOUT_XLA_DEFAULT])


def test_skip_option_is_a_no_op_on_good_data(tiny_world, tmp_path):
    skip = prepare(fast_config("data.on_bad_file=skip"), tiny_world, tmp_path / "a", [TILE_XLA])
    error = prepare(fast_config(), tiny_world, tmp_path / "b", [TILE_XLA])
    assert skip["tile:xla"].stages["prune"].metrics["skipped_files"] == []
    assert skip["tile:xla"].graph_table.equals(error["tile:xla"].graph_table)
    assert pl.read_parquet(skip["tile:xla"].stages["folds"].file(FOLDS_TABLE)).equals(error["tile:xla"].folds())


# ----------------------------------------------------------------------------- full or read-only disk (simulated)


def test_a_full_disk_in_the_middle_of_a_stage_is_a_clear_error_and_leaves_no_output(tiny_world, tmp_path,
                                                                                     monkeypatch):
    work = tmp_path / "work"
    real_save = prune_module.save_pruned
    calls = []

    def save_until_full(path: Path, graph, compress: str = "auto") -> None:
        calls.append(path)
        if len(calls) == 3:  # half a file, then the disk is full
            path.write_bytes(b"\0" * 10)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real_save(path, graph, compress)

    monkeypatch.setattr(prune_module, "save_pruned", save_until_full)
    with pytest.raises(PipelineError) as raised:
        prepare(fast_config(), tiny_world, work, [LAYOUT_XLA_DEFAULT])
    message = str(raised.value)
    assert str(work / "prune") in message and "No space left on device" in message and str(calls[2]) in message
    assert complete_stages(work) == [] and leftovers(work) == []
    assert not any(p.is_file() for p in (work / "prune").rglob("*"))

    monkeypatch.setattr(prune_module, "save_pruned", real_save)  # space freed: the rerun completes
    prepared = prepare(fast_config(), tiny_world, work, [LAYOUT_XLA_DEFAULT])
    assert len(complete_stages(work)) == 4 and leftovers(work) == []
    assert prepared[LAYOUT_XLA_DEFAULT.name].graph_table.height == 10


def test_a_writer_error_without_errno_is_reported_as_disk_full_only_when_the_disk_is(tiny_world, tmp_path,
                                                                                    monkeypatch):
    """Some writers (polars' parquet sink) fail on a full disk with their own error and no errno."""
    import pipelines.core.engine as engine

    def failing_save(path: Path, graph, compress: str = "auto") -> None:
        raise RuntimeError("parquet: File out of specification: Invalid thrift: transport error")

    monkeypatch.setattr(prune_module, "save_pruned", failing_save)
    with pytest.raises(RuntimeError, match="thrift"):  # a disk with room: the error is not disguised
        prepare(fast_config(), tiny_world, tmp_path / "a", [LAYOUT_XLA_DEFAULT])

    real_statvfs = os.statvfs

    def full(path):
        st = real_statvfs(path)
        return os.statvfs_result((st.f_bsize, st.f_frsize, st.f_blocks, 0, 0, st.f_files, st.f_ffree,
                                  st.f_favail, st.f_flag, st.f_namemax))

    monkeypatch.setattr(engine.os, "statvfs", full)
    with pytest.raises(PipelineError, match=r"No space left on device \(RuntimeError: .*thrift"):
        prepare(fast_config(), tiny_world, tmp_path / "b", [LAYOUT_XLA_DEFAULT])
    assert complete_stages(tmp_path / "b") == [] and leftovers(tmp_path / "b") == []


def test_a_read_only_work_dir_is_a_clear_error_and_nothing_is_written(tiny_world, tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    real_mkdir = Path.mkdir

    def read_only_mkdir(self: Path, *args, **kwargs) -> None:
        if self == work or work in self.parents:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only_mkdir)
    code = main(["prepare", "--data-root", str(tiny_world), "--work-dir", str(work), "--config", "quick"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("error: ") and "Read-only file system" in err and str(work) in err
    assert not work.exists()


@pytest.mark.slow
def test_a_full_submissions_disk_is_a_clear_error_and_leaves_no_run_folder(tiny_world, tmp_path, monkeypatch,
                                                                            capsys):
    import pipelines.data.submission as submission

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "submission.csv")

    monkeypatch.setattr(submission, "write_submission", disk_full)
    submissions = tmp_path / "submissions"
    code = main(run_args(tiny_world, tmp_path / "work", submissions))
    err = capsys.readouterr().err
    assert code == 1 and "No space left on device" in err and "Traceback" not in err
    assert list(submissions.iterdir()) == []  # the new run folder was removed again


# ----------------------------------------------------------------------------- full or read-only disk (real mounts)


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture()
def mounts(tmp_path: Path):
    """``mount(kind, path)`` for "full" (a 64 KiB tmpfs) or "read-only" (a read-only bind mount of an
    empty folder); unmounted afterwards. Skips where this process may not mount."""
    done: list[Path] = []

    def mount(kind: str, path: Path) -> Path:
        path.mkdir(parents=True)
        try:
            if kind == "full":
                _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path))
            else:
                _mount("--bind", str(path), str(path))
                done.append(path)
                _mount("-o", "remount,ro,bind", str(path))
        except (OSError, subprocess.SubprocessError) as exc:
            pytest.skip(f"cannot mount here ({exc})")
        if path not in done:
            done.append(path)
        return path

    yield mount
    for path in reversed(done):
        subprocess.run(["umount", str(path)], capture_output=True, timeout=30)


def _prepare_cli(data_root: Path, work: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines", "prepare", "--data-root", str(data_root),
                           "--work-dir", str(work), "--config", "quick", "--collections", "layout:xla:default"],
                          capture_output=True, text=True, env=python_env(), timeout=RUN_TIMEOUT_S)


def test_a_real_read_only_mount_is_a_clear_error(tiny_world, tmp_path, mounts):
    work = mounts("read-only", tmp_path / "ro")
    done = _prepare_cli(tiny_world, work)
    assert done.returncode == 2, done.stderr  # found by the up-front check of --work-dir: a usage error
    assert done.stderr.startswith("error: ") and "Read-only file system" in done.stderr
    assert list(work.iterdir()) == []


def test_a_real_full_disk_is_a_clear_error_and_leaves_no_partial_output(tiny_world, tmp_path, mounts):
    work = mounts("full", tmp_path / "full")
    done = _prepare_cli(tiny_world, work)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: ") and "No space left on device" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    # stages that fitted were published whole; the one that hit the full disk left nothing behind
    failed = Path(done.stderr.split("error: ", 1)[1].split(":", 1)[0])  # the stage's work folder
    assert failed.parent.parent == work and failed.name.startswith(TMP_PREFIX) and not failed.exists()
    assert not any(failed.parent.iterdir())
    assert all(r["state"] == "complete" for r in list_stages(work)) and leftovers(work) == []


# ----------------------------------------------------------------------------- kill -9 and restart

# Runs ``python -m pipelines ARGS`` with run_stage wrapped: when stage STAGE computes, the process
# writes MARKER (at the start of compute, or after compute wrote every file but before the manifest)
# and sleeps until the test kills it. Patched before the pipeline modules import run_stage.
_KILLABLE = """
import sys, time
import pipelines.core.engine as engine
from pipelines.core.atomic import write_text_atomic
stage, when, marker = sys.argv[1:4]
original = engine.run_stage

def pause(folder):
    # atomic: the test kills the run as soon as the marker exists, and must never read it half
    # written (an empty marker read as Path(".") failed a loaded CI run)
    write_text_atomic(marker, str(folder))
    time.sleep(600)

def run_stage(**kwargs):
    if kwargs["stage"] == stage:
        compute = kwargs["compute"]
        def paused(folder):
            if when == "start":
                pause(folder)
            metrics = compute(folder)
            pause(folder)
            return metrics
        kwargs["compute"] = paused
    return original(**kwargs)

engine.run_stage = run_stage
from pipelines.cli import main
sys.exit(main(sys.argv[4:]))
"""

# (stage, when): every stage a run computes, killed once each, each restart resuming the previous.
KILL_POINTS = [("prune", "end"), ("features", "start"), ("node_arrays", "end"), ("folds", "end"),
               ("train-gbdt", "start"), ("ensemble", "end")]


def _paused_in(stage: str, when: str, args: list[str], marker: Path) -> tuple[subprocess.Popen, Path]:
    """Start a run and wait until ``stage`` is computing (paused there); returns the process and the
    stage's work folder. The caller stops the process."""
    process = subprocess.Popen([sys.executable, "-c", _KILLABLE, stage, when, str(marker), *args],
                               env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while not marker.exists():
            if process.poll() is not None:
                raise AssertionError(f"run ended (rc {process.returncode}) before stage {stage} computed: "
                                     f"{process.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"stage {stage} did not start within {RUN_TIMEOUT_S}s")
            time.sleep(0.05)
    except BaseException:
        process.kill()
        process.wait(timeout=60)
        process.stderr.close()
        raise
    folder = Path(marker.read_text())
    marker.unlink()
    return process, folder


def _kill_during(stage: str, when: str, args: list[str], marker: Path) -> Path:
    """Start a run, SIGKILL it once ``stage`` is computing; returns the stage's work folder."""
    process, folder = _paused_in(stage, when, args, marker)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    process.stderr.close()
    return folder


@pytest.fixture(scope="module")
def uninterrupted(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The submission bytes of one uninterrupted run."""
    base = tmp_path_factory.mktemp("uninterrupted")
    done = subprocess.run([sys.executable, "-m", "pipelines",
                           *run_args(tiny_world, base / "work", base / "submissions")],
                          capture_output=True, text=True, env=python_env(), timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return submission_csv(base / "submissions")


@pytest.mark.slow
def test_a_run_killed_in_each_stage_and_restarted_gives_the_same_submission(tiny_world, tmp_path, uninterrupted):
    work, submissions = tmp_path / "work", tmp_path / "submissions"
    args = run_args(tiny_world, work, submissions)
    for stage, when in KILL_POINTS:
        before = complete_stages(work)
        folder = _kill_during(stage, when, args, tmp_path / "marker")
        assert folder.parent == work / stage and folder.name.startswith(TMP_PREFIX)
        assert folder.is_dir() and not (folder / "manifest.json").exists()
        if when == "end":
            assert any(p.name != ".lock" for p in folder.rglob("*"))  # outputs written, not published
        newly = [s for s in complete_stages(work) if s not in before]
        assert stage not in {s for s, _ in newly}, f"{stage} was published although killed"
        assert not submissions.exists() or list(submissions.iterdir()) == []

    done = subprocess.run([sys.executable, "-m", "pipelines", *args], capture_output=True, text=True,
                          env=python_env(), timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert submission_csv(submissions) == uninterrupted
    assert leftovers(work) == []  # the abandoned work folders were cleaned by the restarts
    assert all(r["state"] == "complete" for r in list_stages(work))


@pytest.mark.slow
def test_sigterm_stops_a_run_as_ctrl_c_does_and_discards_the_running_stage(tiny_world, tmp_path):
    work, submissions = tmp_path / "work", tmp_path / "submissions"
    process, folder = _paused_in("train-gbdt", "start", run_args(tiny_world, work, submissions), tmp_path / "marker")
    process.send_signal(signal.SIGTERM)
    stderr = process.communicate(timeout=60)[1].decode()
    assert process.returncode == 130 and "interrupted" in stderr, stderr[-2000:]
    assert not folder.exists() and leftovers(work) == []  # the stage's partial output went with it
    assert "train-gbdt" not in {stage for stage, _ in complete_stages(work)}
    assert not submissions.exists() or list(submissions.iterdir()) == []


# Jobs that record their worker's pid and then outlast the test; SIGTERM arrives while they run.
_SLOW_JOBS = """
import os, sys, time
from pipelines.core.parallel import map_in_order, terminate_as_interrupt

def job(folder):
    open(os.path.join(folder, str(os.getpid())), "w").close()
    time.sleep(300)

if __name__ == "__main__":
    with terminate_as_interrupt():
        try:
            list(map_in_order(job, [(sys.argv[1],)] * 4, 2))
        except KeyboardInterrupt:
            sys.exit(130)
"""

# The same through the pool that a run's training stages share: the first stage's two jobs hold both
# workers, the second stage waits for one.
_SLOW_STAGES = """
import os, sys, time
from pipelines.core.parallel import terminate_as_interrupt
from pipelines.flows.schedule import _train_sharing_workers

def job(folder):
    open(os.path.join(folder, str(os.getpid())), "w").close()
    time.sleep(300)

def stage(task, pool):
    return list(pool.map_unordered(job, [(task[0],)] * 2))

if __name__ == "__main__":
    with terminate_as_interrupt():
        try:
            _train_sharing_workers(stage, [(sys.argv[1], "first"), (sys.argv[1], "second")], 2)
        except KeyboardInterrupt:
            sys.exit(130)
"""


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
@pytest.mark.parametrize("jobs", [_SLOW_JOBS, _SLOW_STAGES], ids=["one-stage", "stages-sharing-workers"])
def test_sigterm_during_parallel_jobs_stops_the_worker_processes_too(tmp_path, jobs):
    """Killed on the spot, the parent would leave its loky workers running their jobs as orphans."""
    script = tmp_path / "slow_jobs.py"
    script.write_text(jobs)
    pids = tmp_path / "pids"
    pids.mkdir()
    process = subprocess.Popen([sys.executable, str(script), str(pids)], env=python_env(),
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while len(list(pids.iterdir())) < 2:
            assert process.poll() is None and time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.05)
        workers = [int(path.name) for path in pids.iterdir()]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 130
        deadline = time.monotonic() + 30
        while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in workers if _running(pid)] == []
    finally:
        process.kill()
        for path in pids.iterdir():
            if _running(int(path.name)):
                os.kill(int(path.name), signal.SIGKILL)


# ----------------------------------------------------------------------------- concurrency


def test_a_fold_job_finishing_while_a_concurrent_run_removes_the_partial_folder_is_not_an_error(tmp_path):
    """A run that finished the stage removes ``.folds-<key>/`` while the other run saves the same fold
    job: the rename meets a half-removed twin (not empty, no fold.json). The job's result stands; it
    just cannot be resumed from (seen once in CI as "Directory not empty")."""
    from pipelines.training.fit import FOLD_RESULT, FoldResult, fold_job_name, load_fold_result, save_fold_result

    result = FoldResult(1, 0, pl.DataFrame({"graph": ["g"], "score": [0.5]}), pl.DataFrame({"graph": ["g"]}),
                        None, {"epochs": 1}, 1.5, {"model.txt": b"weights"})
    partial = tmp_path / ".folds-key"
    being_removed = partial / fold_job_name(1, 0)
    being_removed.mkdir(parents=True)
    (being_removed / "predictions.parquet").write_bytes(b"half removed")
    assert save_fold_result(result, partial) is False
    assert sorted(p.name for p in partial.iterdir()) == [being_removed.name]  # our private copy is gone

    shutil.rmtree(being_removed)  # a complete twin is kept, and counts as saved
    assert save_fold_result(result, partial) is True and (being_removed / FOLD_RESULT).is_file()
    assert save_fold_result(result, partial) is True
    assert load_fold_result(being_removed).model_files == {"model.txt": b"weights"}


@pytest.mark.slow
def test_two_concurrent_runs_on_one_work_dir_both_finish_with_identical_outputs(tiny_world, tmp_path, uninterrupted):
    work = tmp_path / "work"
    processes = [subprocess.Popen([sys.executable, "-m", "pipelines",
                                   *run_args(tiny_world, work, tmp_path / f"submissions-{i}")],
                                  env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i in range(2)]
    for process in processes:
        out, err = process.communicate(timeout=RUN_TIMEOUT_S)
        assert process.returncode == 0, err[-3000:]
    assert submission_csv(tmp_path / "submissions-0") == submission_csv(tmp_path / "submissions-1") == uninterrupted
    rows = list_stages(work)
    assert rows and all(r["state"] == "complete" for r in rows) and leftovers(work) == []
    # one output per stage and collection: the loser of each race reused the winner's folder
    per_stage = pl.DataFrame(rows).group_by("stage").len()
    assert per_stage.filter(pl.col("stage") == "prune")["len"].item() == 5
    assert (work / "prune").is_dir() and all((p / GRAPHS_TABLE).is_file() for p in (work / "prune").iterdir())


@pytest.mark.slow
def test_two_runs_started_together_on_one_work_dir_succeed_with_the_same_bytes_every_time(tiny_world, tmp_path):
    """Issue 71, class 6: of 6 trials of two runs on one work dir started 1 s apart, one failed (a
    checkpoint's temporary file moved by the other). Three trials, a fresh work dir each, the second
    run started 0, 0.3 and 1 s after the first: both succeed, with one submission's bytes throughout."""
    seen = set()
    for trial, offset in enumerate((0.0, 0.3, 1.0)):
        work, processes = tmp_path / f"work-{trial}", []
        for i in range(2):
            args = ["run", "--data-root", str(tiny_world), "--work-dir", str(work), "--submissions-dir",
                    str(tmp_path / f"subs-{trial}-{i}"), "--config", "smoke", "--models", "random"]
            processes.append(subprocess.Popen([sys.executable, "-m", "pipelines", *args], env=python_env(),
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            time.sleep(offset if i == 0 else 0)
        for process in processes:
            _, err = process.communicate(timeout=RUN_TIMEOUT_S)
            assert process.returncode == 0, f"trial {trial}: {err[-3000:]}"
        seen |= {submission_csv(tmp_path / f"subs-{trial}-{i}") for i in range(2)}
        assert leftovers(work) == [] and all(r["state"] == "complete" for r in list_stages(work))
    assert len(seen) == 1


def _folder_removed_during_mkdir(monkeypatch, folder: Path) -> list[Path]:
    """Replay the interleaving of two runs on one work dir: ``folder`` exists when this process's
    ``mkdir`` of it runs, and the other run's cleanup removes it before ``mkdir`` checks what is
    there (pathlib's ``exist_ok`` check then finds nothing). Returns the calls it raced."""
    raced: list[Path] = []
    real_mkdir = os.mkdir

    def mkdir(path, mode=0o777, **kwargs):
        if Path(path) == folder and not raced:
            raced.append(Path(path))
            raise FileExistsError(errno.EEXIST, "File exists", str(path))  # ... and it is gone at the check
        return real_mkdir(path, mode, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    return raced


def test_a_fold_folder_removed_by_a_concurrent_run_while_being_made_is_made_again(tmp_path, monkeypatch):
    """Issue 79: two runs on one work dir; one finished the training stage and removed its folder of
    fold jobs (.folds-<key>) while the other was creating it to save a fold: "file system error: File
    exists". The fold is saved (the folder made again), as when the folder was gone before the call."""
    from pipelines.training.fit import FoldResult, fold_job_name, load_fold_result, save_fold_result

    result = FoldResult(0, 0, pl.DataFrame({"graph": ["g"], "score": [0.5]}), pl.DataFrame({"graph": ["g"]}),
                        None, {}, 1.0, {"model.txt": b"weights"})
    partial = tmp_path / "train-random" / ".folds-key"
    raced = _folder_removed_during_mkdir(monkeypatch, partial)
    assert save_fold_result(result, partial)
    assert raced == [partial]
    assert load_fold_result(partial / fold_job_name(0, 0)).predictions["score"].to_list() == [0.5]


def test_a_checkpoint_folder_removed_by_a_concurrent_run_while_being_made_is_made_again(tmp_path, monkeypatch):
    """The same race on a GNN fold's epoch checkpoint folder (inside .folds-<key>)."""
    pytest.importorskip("torch")
    from pipelines.models.gnn.trainer import atomic_torch_save

    path = tmp_path / ".folds-key" / "f0-s0.ckpt" / "gnn_seed0.pt"
    raced = _folder_removed_during_mkdir(monkeypatch, path.parent)
    atomic_torch_save({"epoch": 1}, path)
    assert raced == [path.parent] and path.is_file()


def test_a_resumed_fold_result_whose_files_were_altered_is_trained_again(tmp_path, caplog):
    """Issue 71, class 2: negated scores in a finished fold's predictions entered the stage output."""
    from pipelines.training.fit import FoldResult, fold_job_name, load_fold_result, save_fold_result

    result = FoldResult(1, 0, pl.DataFrame({"graph": ["g"], "score": [0.5]}), pl.DataFrame({"graph": ["g"]}),
                        None, {"epochs": 1}, 1.5, {"model.txt": b"weights"})
    partial = tmp_path / ".folds-key"
    assert save_fold_result(result, partial)
    folder = partial / fold_job_name(1, 0)
    assert load_fold_result(folder).predictions["score"].to_list() == [0.5]
    pl.DataFrame({"graph": ["g"], "score": [-0.5]}).write_parquet(folder / "predictions.parquet")
    with caplog.at_level("WARNING"):
        assert load_fold_result(folder) is None
    assert any("predictions.parquet" in m for m in caplog.messages)
    assert save_fold_result(result, tmp_path / "other")
    (tmp_path / "other" / fold_job_name(1, 0) / "model.txt").write_bytes(b"weighty")  # a planted model file
    assert load_fold_result(tmp_path / "other" / fold_job_name(1, 0)) is None
