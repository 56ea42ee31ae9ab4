"""Stage engine: keys, caching, atomic publication, crash and concurrency safety, manifests, status."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipelines.core import engine
from pipelines.core.engine import (
    Code,
    StageOutput,
    canonical_json,
    data_fingerprint,
    fingerprint,
    format_status,
    list_stages,
    load_stage,
    run_stage,
    stage_key,
)
from pipelines.core.errors import PipelineError

REPO = Path(__file__).resolve().parents[1]
CODE = Code(("pipelines.core.errors",))  # the code the toy stages below claim to run


@dataclass
class Toy:
    a: int = 1
    path: Path = Path("x/y")
    pair: tuple = (1, 2)


class Counter:
    """A compute function that records its calls and writes two files (one in a subfolder)."""

    def __init__(self, payload: bytes = b"hello"):
        self.calls = 0
        self.payload = payload

    def __call__(self, folder: Path) -> dict:
        self.calls += 1
        (folder / "data.bin").write_bytes(self.payload)
        (folder / "sub").mkdir()
        (folder / "sub" / "more.txt").write_text("abc")
        return {"score": 0.5, "calls": self.calls}


def run(work: Path, compute=None, **kw) -> StageOutput:
    args = dict(work_dir=work, stage="feat", code=CODE, config={"k": 5}, inputs={"raw": "abc"})
    args.update(kw)
    return run_stage(compute=compute or Counter(), **args)


def entries(stage_dir: Path) -> list[str]:
    return sorted(p.name for p in stage_dir.iterdir()) if stage_dir.exists() else []


# ----------------------------------------------------------------------------- fingerprints


def test_canonical_json_sorts_keys_and_normalises_types():
    assert canonical_json({"b": 1, "a": (Path("x/y"), 2.5, None, True)}) == '{"a":["x/y",2.5,null,true],"b":1}'
    assert canonical_json(Toy()) == '{"a":1,"pair":[1,2],"path":"x/y"}'
    assert canonical_json({"s": {3, 1, 2}}) == '{"s":[1,2,3]}'


def test_fingerprint_equal_for_equivalent_values_and_16_hex():
    fp = fingerprint(Toy())
    assert len(fp) == 16 and int(fp, 16) >= 0
    assert fp == fingerprint({"path": "x/y", "pair": [1, 2], "a": 1})
    assert fp != fingerprint(Toy(a=2))
    assert fingerprint({"a": 1}) != fingerprint({"a": 1.5}) != fingerprint({"a": "1"})


def test_fingerprint_rejects_what_json_cannot_hold():
    with pytest.raises(TypeError, match="non-string key"):
        fingerprint({1: "a"})
    with pytest.raises(TypeError, match="object"):
        fingerprint({"f": object()})


def test_data_fingerprint_tracks_size_and_mtime_not_order_or_root(tmp_path):
    root = tmp_path / "a"
    root.mkdir()
    f1, f2 = root / "one.npz", root / "two.npz"
    f1.write_bytes(b"1234")
    f2.write_bytes(b"56")
    key = data_fingerprint([f1, f2], root)
    assert key == data_fingerprint([f2, f1], root)
    copy = shutil.copytree(root, tmp_path / "b")  # copy2 keeps modification times
    assert key == data_fingerprint([copy / "one.npz", copy / "two.npz"], copy)
    os.utime(f2, ns=(f2.stat().st_atime_ns, f2.stat().st_mtime_ns + 1_000_000))
    assert data_fingerprint([f1, f2], root) != key
    with pytest.raises(PipelineError, match="not under the data root"):
        data_fingerprint([tmp_path / "elsewhere"], root)
    with pytest.raises(PipelineError, match="cannot read"):
        data_fingerprint([root / "missing.npz"], root)


def test_stage_key_changes_with_every_ingredient():
    base = stage_key("feat", {"k": 5, "m": [1]}, {"raw": "abc"}, CODE)
    assert base == stage_key("feat", {"m": [1], "k": 5}, {"raw": "abc"}, CODE)
    variants = [
        stage_key("feat2", {"k": 5, "m": [1]}, {"raw": "abc"}, CODE),
        stage_key("feat", {"k": 5, "m": [1]}, {"raw": "abc"}, Code(("pipelines.core.atomic",))),
        stage_key("feat", {"k": 6, "m": [1]}, {"raw": "abc"}, CODE),
        stage_key("feat", {"k": 5, "m": [1, 2]}, {"raw": "abc"}, CODE),
        stage_key("feat", {"k": 5, "m": [1]}, {"raw": "abd"}, CODE),
        stage_key("feat", {"k": 5, "m": [1]}, {"raw2": "abc"}, CODE),
        stage_key("feat", {"k": 5, "m": [1]}, {}, CODE),
    ]
    assert len({base, *variants}) == len(variants) + 1
    with pytest.raises(ValueError):
        stage_key("../evil", {}, {}, CODE)
    with pytest.raises(TypeError):
        stage_key("feat", {}, {"raw": 1}, CODE)


# ----------------------------------------------------------------------------- caching


def test_same_config_is_a_cache_hit(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pipelines")
    compute = Counter()
    first = run(tmp_path, compute)
    caplog.clear()
    second = run(tmp_path, compute)
    messages = caplog.messages
    assert compute.calls == 1
    assert second == first
    assert (first.cached, second.cached) == (False, True)
    assert second.path == tmp_path / "feat" / first.key
    assert any("cached" in m for m in messages)
    assert entries(tmp_path / "feat") == [first.key]  # no leftover work folders


@pytest.mark.parametrize(
    "change",
    [{"config": {"k": 6}}, {"code": Code(("pipelines.core.atomic",))}, {"inputs": {"raw": "abd"}}, {"stage": "other"}],
)
def test_any_change_gives_a_new_key_and_recomputes(tmp_path, change):
    compute = Counter()
    first = run(tmp_path, compute)
    second = run(tmp_path, compute, **change)
    assert compute.calls == 2
    assert second.key != first.key
    assert load_stage(tmp_path, first.stage, first.key).manifest == first.manifest  # the old one stays


def test_force_recomputes_and_replaces(tmp_path):
    first = run(tmp_path, Counter(b"old"))
    compute = Counter(b"new")
    second = run(tmp_path, compute, force=True)
    assert compute.calls == 1
    assert second.key == first.key and second.path == first.path
    assert second.file("data.bin").read_bytes() == b"new"
    assert load_stage(tmp_path, "feat", first.key).manifest["finished"] == second.manifest["finished"]
    assert entries(tmp_path / "feat") == [first.key]  # the replaced folder was deleted


def test_manifest_contents(tmp_path):
    config = Toy(a=3)
    out = run(tmp_path, config=config, seeds={"fold": 7})
    m = json.loads((out.path / "manifest.json").read_text())
    assert m == out.manifest
    assert m["stage"] == "feat" and m["key"] == out.key
    assert m["code"] == {"roots": ["pipelines.core.errors"], "shallow": [], "fingerprint": CODE.fingerprint()}
    assert m["config"] == {"a": 3, "path": "x/y", "pair": [1, 2]}
    assert m["inputs"] == {"raw": "abc"}
    assert m["seeds"] == {"fold": 7}
    assert m["outputs"] == [{"path": "data.bin", "bytes": 5, "sha256": hashlib.sha256(b"hello").hexdigest()},
                            {"path": "sub/more.txt", "bytes": 3, "sha256": hashlib.sha256(b"abc").hexdigest()}]
    assert m["metrics"] == {"score": 0.5, "calls": 1}
    assert set(m["code_version"]) == {"commit", "dirty"}
    assert m["library_versions"]["python"].count(".") == 2 and "numpy" in m["library_versions"]
    assert m["started"] <= m["finished"] and m["wall_time_s"] >= 0
    assert out.key == stage_key("feat", config, {"raw": "abc"}, CODE)
    # written with sorted keys, so diffs of manifests are stable
    text = (out.path / "manifest.json").read_text()
    assert text == json.dumps(m, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    assert not (out.path / ".lock").exists()


def test_stage_output_file_names_missing_files(tmp_path):
    out = run(tmp_path)
    assert out.file("sub/more.txt").read_text() == "abc"
    with pytest.raises(PipelineError, match="no file 'nope.bin'"):
        out.file("nope.bin")


def test_exception_in_compute_leaves_nothing_complete_looking(tmp_path):
    def boom(folder: Path) -> None:
        (folder / "half.bin").write_bytes(b"x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run(tmp_path, boom)
    assert entries(tmp_path / "feat") == []
    key = stage_key("feat", {"k": 5}, {"raw": "abc"}, CODE)
    with pytest.raises(PipelineError, match="no complete output"):
        load_stage(tmp_path, "feat", key)
    assert run(tmp_path).key == key  # and a later run works


def test_disk_errors_become_pipeline_errors_naming_the_folder(tmp_path):
    def full(folder: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(PipelineError, match=r"\.tmp-.*No space left"):
        run(tmp_path, full)
    assert entries(tmp_path / "feat") == []


def test_damaged_or_foreign_output_is_not_a_cache_hit(tmp_path):
    first = run(tmp_path)
    (first.path / "data.bin").write_bytes(b"truncated!")  # size no longer matches the manifest
    compute = Counter()
    again = run(tmp_path, compute)
    assert compute.calls == 1 and again.file("data.bin").read_bytes() == b"hello"
    (again.path / "manifest.json").write_text("{not json")
    with pytest.raises(PipelineError, match="incomplete"):
        load_stage(tmp_path, "feat", again.key)
    assert run(tmp_path, compute).manifest["metrics"]["calls"] == 2
    assert entries(tmp_path / "feat") == [first.key]


def test_a_flipped_bit_in_a_cached_output_of_the_same_size_is_never_served(tmp_path, caplog):
    first = run(tmp_path)
    target = first.path / "data.bin"
    data = bytearray(target.read_bytes())
    data[0] ^= 1  # one bit, same size
    target.write_bytes(bytes(data))
    assert {"path", "bytes", "sha256"} <= set(first.manifest["outputs"][0])
    with pytest.raises(PipelineError, match=r"damaged: .*data\.bin"):
        load_stage(tmp_path, "feat", first.key)
    compute = Counter()
    with caplog.at_level(logging.WARNING, logger="pipelines.core.engine"):
        again = run(tmp_path, compute)
    assert compute.calls == 1 and again.file("data.bin").read_bytes() == b"hello"
    assert any("data.bin" in m and "does not match" in m for m in caplog.messages)
    assert run(tmp_path, compute).cached and compute.calls == 1  # the recomputed output is reused


def test_a_resized_cached_output_is_recomputed_with_a_warning_naming_the_file(tmp_path, caplog):
    """Issue 71, class 2: a cut-short output was recomputed silently (only a changed hash warned)."""
    first = run(tmp_path)
    (first.path / "data.bin").write_bytes(b"hel")  # truncated
    compute = Counter()
    with caplog.at_level(logging.WARNING, logger="pipelines.core.engine"):
        again = run(tmp_path, compute)
    assert compute.calls == 1 and again.file("data.bin").read_bytes() == b"hello"
    assert any("data.bin has 3 bytes" in m and "not served" in m for m in caplog.messages)


def test_cached_output_with_other_seeds_is_an_error(tmp_path):
    run(tmp_path, seeds={"s": 1})
    assert run(tmp_path, seeds={"s": 1}).manifest["seeds"] == {"s": 1}
    with pytest.raises(PipelineError, match="seeds"):
        run(tmp_path, seeds={"s": 2})


# ----------------------------------------------------------------------------- crashes and concurrency

WORKER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from pipelines.core.engine import Code, run_stage

    CODE = Code(("pipelines.core.errors",))
    work, markers, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]

    def compute(folder):
        (folder / "part.bin").write_bytes(b"x" * 100)
        (markers / str(os.getpid())).touch()
        deadline = time.time() + 30
        if mode == "sleep":
            time.sleep(60)
        while mode == "barrier" and len(list(markers.iterdir())) < 2 and time.time() < deadline:
            time.sleep(0.01)
        return {"pid": os.getpid()}

    out = run_stage(work_dir=work, stage="slow", code=CODE, config={"a": 1}, inputs={},
                    compute=compute)
    print(out.manifest["metrics"]["pid"], out.key)
    """
)


def start_worker(work: Path, markers: Path, mode: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, str(work), str(markers), mode],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(0.02)


def test_killed_run_is_never_mistaken_for_complete(tmp_path):
    work, markers = tmp_path / "work", tmp_path / "markers"
    markers.mkdir()
    proc = start_worker(work, markers, "sleep")
    try:
        wait_for(lambda: any(markers.iterdir()) or proc.poll() is not None)
        assert proc.poll() is None, proc.stderr.read()
    finally:
        proc.kill()  # SIGKILL: no cleanup code runs
        proc.wait()
    key = stage_key("slow", {"a": 1}, {}, CODE)
    (leftover,) = entries(work / "slow")
    assert leftover.startswith(f".tmp-{key}-")
    with pytest.raises(PipelineError):
        load_stage(work, "slow", key)
    assert [(r["key"], r["state"]) for r in list_stages(work)] == [(key, "interrupted")]

    out = run_stage(work_dir=work, stage="slow", code=CODE, config={"a": 1}, inputs={},
                    compute=Counter())
    assert out.key == key and out.file("data.bin").read_bytes() == b"hello"
    assert entries(work / "slow") == [key]  # the abandoned folder was cleaned up
    assert [(r["key"], r["state"]) for r in list_stages(work)] == [(key, "complete")]


def test_concurrent_runs_of_one_key_end_with_one_complete_output(tmp_path):
    work, markers = tmp_path / "work", tmp_path / "markers"
    markers.mkdir()
    procs = [start_worker(work, markers, "barrier") for _ in range(2)]
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr
        results.append(stdout.split())
    pids = {int(p.name) for p in markers.iterdir()}
    assert len(pids) == 2  # both really computed at the same time
    (winner_pid, key), other = results
    assert other == [winner_pid, key]  # the loser returned the winner's output
    assert int(winner_pid) in pids
    assert entries(work / "slow") == [key]
    assert load_stage(work, "slow", key).manifest["metrics"]["pid"] == int(winner_pid)


def test_cleanup_spares_live_runs_and_young_unlocked_folders(tmp_path):
    fcntl = pytest.importorskip("fcntl")
    stage_dir = tmp_path / "feat"
    dead, live, young, starting = (stage_dir / f".tmp-{n}-x" for n in ("dead", "live", "young", "starting"))
    for folder in (dead, live, young, starting):
        folder.mkdir(parents=True)
    (starting / ".lock").touch()  # created, not yet locked and no pid: its owner may be starting
    (dead / ".lock").write_text("12345\n")  # pid written, nobody holds the lock: owner died
    (live / ".lock").write_text(f"{os.getpid()}\n")
    (stage_dir / ".trash-k-1").mkdir()
    fd = os.open(live / ".lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        removed = engine.clean_abandoned(stage_dir)
        assert sorted(p.name for p in removed) == [".tmp-dead-x", ".trash-k-1"]
        assert entries(stage_dir) == [".tmp-live-x", ".tmp-starting-x", ".tmp-young-x"]
        states = {r["key"]: r["state"] for r in list_stages(tmp_path)}
        assert states == {"live": "running", "young": "interrupted", "starting": "interrupted"}
        old = time.time() - engine.STALE_AFTER_S - 10
        for folder in (young, starting, live):
            os.utime(folder, (old, old))
        removed = engine.clean_abandoned(stage_dir)  # old and unlocked: gone; locked: kept however old
        assert sorted(p.name for p in removed) == [".tmp-starting-x", ".tmp-young-x"]
    finally:
        os.close(fd)
    assert [p.name for p in engine.clean_abandoned(stage_dir)] == [".tmp-live-x"]  # its owner let go


# ----------------------------------------------------------------------------- status


def test_list_stages_and_format_status(tmp_path):
    a = run(tmp_path, config={"k": 5, "lr": 0.1})
    b = run(tmp_path, config={"k": 5, "lr": 0.2})
    c = run(tmp_path, stage="folds", config={"k": 5}, inputs={})
    (tmp_path / "feat" / "deadbeefdeadbeef").mkdir()  # a folder with no manifest
    rows = list_stages(tmp_path)
    by_key = {r["key"]: r for r in rows}
    assert set(by_key) == {a.key, b.key, c.key, "deadbeefdeadbeef"}
    assert by_key["deadbeefdeadbeef"]["state"] == "incomplete" and not by_key["deadbeefdeadbeef"]["complete"]
    assert by_key[a.key]["config"] == {"k": 5, "lr": 0.1} and by_key[a.key]["inputs"] == {"raw": "abc"}
    table = format_status(rows).splitlines()
    assert table[0].split() == ["STAGE", "KEY", "STATE", "CREATED", "WALL", "INPUTS", "CONFIG"]
    line_a = next(line for line in table if a.key in line)
    assert "lr=0.1" in line_a and "k=5" not in line_a  # only what differs between feat outputs
    assert "raw=abc" in line_a
    line_c = next(line for line in table if c.key in line)
    assert "k=5" in line_c  # a lone output shows its main values
    assert format_status([]) == "no stage outputs"
    assert list_stages(tmp_path / "missing") == []


def test_status_command_prints_the_table(tmp_path, capsys):
    from pipelines.cli import main

    assert main(["status", "--work-dir", str(tmp_path)]) == 0
    assert "no stage outputs" in capsys.readouterr().out
    out = run(tmp_path)
    run(tmp_path, stage="folds")
    assert main(["status", "--work-dir", str(tmp_path), "--stage", "feat"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split()[:2] == ["SIZE", "STAGE"] and len(printed) == 3  # the table, then the total
    assert printed[1].split()[2:5] == ["feat", out.key, "complete"]  # after the size, e.g. "1.1 kB"


def test_permission_errors_inside_compute_propagate_unchanged(tmp_path):
    def unreadable(folder: Path) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", "/data/raw.npz")

    with pytest.raises(PermissionError):  # a read failure, not the work folder's fault
        run(tmp_path, unreadable)


def test_load_stage_says_which_file_is_damaged_or_missing(tmp_path):
    """Issue 71, class 7: a resized or altered output was reported as if the stage were gone."""
    out = run(tmp_path)
    with pytest.raises(PipelineError, match="absent"):
        load_stage(tmp_path, "feat", "0" * 16)
    (out.path / "data.bin").write_bytes(b"hello, longer")
    with pytest.raises(PipelineError, match=r"damaged: .*data\.bin has 13 bytes, its manifest recorded 5"):
        load_stage(tmp_path, "feat", out.key)
    (out.path / "data.bin").write_bytes(b"jello")
    with pytest.raises(PipelineError, match=r"damaged: .*data\.bin: content does not match"):
        load_stage(tmp_path, "feat", out.key)
    (out.path / "data.bin").unlink()
    with pytest.raises(PipelineError, match=r"incomplete: .*data\.bin is missing"):
        load_stage(tmp_path, "feat", out.key)
