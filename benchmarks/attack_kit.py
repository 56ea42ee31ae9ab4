"""The attack replay's kit: running one case of ``python -m pipelines ...`` in a subprocess and what a case
is made of (its context on a private copy of the tiny world, its outcome) and the checks and input
builders the case lists of ``benchmarks.attack`` and ``benchmarks.attack_issue78`` share."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


REPO = Path(__file__).resolve().parents[1]


FAST = ["--config", "smoke", "--set", "gbdt.n_estimators=10"]


@dataclass
class Outcome:
    rc: int | None
    stdout: str
    stderr: str
    wall_s: float
    peak_rss_mb: float
    timed_out: bool


def run_cli(args: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None,
            stdin: int | None = subprocess.DEVNULL) -> Outcome:
    """``python -m pipelines ARGS`` with its own peak RSS (from wait4) and a hard timeout."""
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "pipelines", *args], cwd=cwd, stdout=out, stderr=err,
                             stdin=stdin, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                             start_new_session=True)
    timed_out = False
    peak_kb = 0
    while True:
        peak_kb = max(peak_kb, _high_water_kb(child.pid))
        pid, status, _ = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - started > timeout:
            os.killpg(child.pid, signal.SIGKILL)
            pid, status, _ = os.wait4(child.pid, 0)
            timed_out = True
            break
        time.sleep(0.01)
    child.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    err.seek(0)
    return Outcome(child.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                   time.perf_counter() - started, peak_kb / 1024, timed_out)


def _high_water_kb(pid: int) -> int:
    """VmHWM of a live process: its own peak RSS. (ru_maxrss from wait4 is not: on Linux a child
    inherits its parent's high-water mark through fork/exec, which would hide small peaks.)"""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def snapshot(root: Path) -> dict[str, tuple]:
    """Listing of a data root with type, size, mtime and content hash of every regular file (links not followed)."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            st = os.lstat(path)
            digest = ""
            if path.is_file() and not path.is_symlink():
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            out[str(path.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


@dataclass
class Context:
    base: Path  # scratch folder of this case
    data: Path  # this case's private copy of the tiny world
    world: Path  # the pristine tiny world (never touched)
    run_id: str  # a published run of the world (random model)
    subs: Path  # its submissions folder (copied per case)
    work: Path  # its work dir (shared, read-mostly)
    csv: Path  # its submission (in this case's copy of subs)
    gnn: tuple[str, Path, Path] | None = None  # a published GNN run: (run-id, its submissions folder, work dir)
    background: list = field(default_factory=list)  # processes a case started beside its command (races)
    runs_before: set = field(default_factory=set)  # the run folders in subs before the case's command ran
    env: dict = field(default_factory=dict)  # environment variables the case's command runs with

    @property
    def code_marker(self) -> Path:
        """The file a planted payload creates if it is ever executed ("code executed")."""
        return self.base / "CODE_RAN"


@dataclass
class Case:
    item: str  # issue item number, or "+" for our additions
    name: str
    prepare: Callable[[Context], list[str]]  # builds the hostile input, returns the CLI arguments
    expect: str = "reject"  # or "accept"
    check: Callable[[Context, Outcome], str | None] = lambda ctx, out: None  # a problem, or None
    needs_mount: bool = False
    results: dict = field(default_factory=dict)
    fast: bool = False  # in the quick subset (--fast) the test suite replays
    needs_gnn: bool = False  # uses the published GNN run (built once, when a chosen case needs it)
    needs_bombs: bool = False
    max_wall_s: float | None = None  # longer than this: "too slow" (time super-linear in the input)


def tile(ctx: Context, split: str) -> Path:
    return ctx.data / "npz_all" / "npz" / "tile" / "xla" / split


def first_npz(folder: Path) -> Path:
    return sorted(folder.glob("*.npz"))[0]


def csv_without_first_tile_test(ctx: Context) -> Path:
    victim = first_npz(tile(ctx, "test"))
    sid = f"tile:xla:{victim.stem}"
    lines = [line for line in ctx.csv.read_text().splitlines() if not line.startswith(sid + ",")]
    partial = ctx.base / "partial.csv"
    partial.write_text("\n".join(lines) + "\n")
    return partial


def prepare_args(ctx: Context, *extra: str) -> list[str]:
    return ["prepare", "--data-root", str(ctx.data), "--work-dir", str(ctx.base / "work"), "--collections",
            "tile:xla", *FAST, *extra]


def run_args(ctx: Context, *extra: str) -> list[str]:
    return ["run", "--data-root", str(ctx.data), "--work-dir", str(ctx.base / "work"), "--submissions-dir",
            str(ctx.base / "subs"), "--models", "random", *FAST, *extra]


def no_stage_output(ctx: Context, out: Outcome) -> str | None:
    done = list((ctx.base / "work").glob("*/*/manifest.json"))
    return f"stage output(s) completed before the error: {done}" if done else None


def nothing_written(ctx: Context, out: Outcome) -> str | None:
    if (ctx.base / "work").exists() and any((ctx.base / "work").iterdir()):
        return "stage folders were written before the error"
    return None


def says(*words: str) -> Callable[[Context, Outcome], str | None]:
    def check(ctx: Context, out: Outcome) -> str | None:
        text = out.stdout + out.stderr
        missing = [w.format(data=ctx.data, base=ctx.base) for w in words if w.format(data=ctx.data, base=ctx.base)
                   not in text]
        return f"message lacks {missing}" if missing else None
    return check


def both(*checks: Callable[[Context, Outcome], str | None]) -> Callable[[Context, Outcome], str | None]:
    def check(ctx: Context, out: Outcome) -> str | None:
        for one in checks:
            problem = one(ctx, out)
            if problem:
                return problem
        return None
    return check


def write_members(path: Path, members: list[tuple[str, bytes]], compression: int = zipfile.ZIP_DEFLATED) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names are the point of one case
        with zipfile.ZipFile(path, "w", compression=compression) as archive:
            for name, data in members:
                archive.writestr(name, data)


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array)
    return buffer.getvalue()


def read_members(path: Path) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(path) as archive:
        return [(name, archive.read(name)) for name in archive.namelist()]


def zero_bomb(path: Path, source: Path, key: str, shape: tuple[int, ...], dtype: str = "<i8") -> None:
    """Replace ``key`` of ``source`` by zeros of ``shape`` streamed through deflate (tiny on disk)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, data in read_members(source):
            if name != f"{key}.npy":
                archive.writestr(name, data)
        with archive.open(f"{key}.npy", "w", force_zip64=True) as stream:
            np.lib.format.write_array_header_1_0(stream, {"descr": dtype, "fortran_order": False, "shape": shape})
            left = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            chunk = bytes(1 << 24)
            while left:
                stream.write(chunk[: min(left, len(chunk))])
                left -= min(left, len(chunk))


def csv_unchanged(ctx: Context, out: Outcome) -> str | None:
    return None if ctx.csv.read_text().startswith("ID,TopConfigs") else "the submission was overwritten"


class _Payload:
    """Unpickling this runs ``touch MARKER``: what a planted model or checkpoint file would do."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def payload_bytes(marker: Path) -> bytes:
    import pickle

    return pickle.dumps({"format": 1, "model": _Payload(marker)}, protocol=2)


def private_work(ctx: Context, source: Path | None = None, subs: Path | None = None) -> Path:
    """A copy of a baseline work dir in the case's folder; run manifests under ``subs`` are pointed at it."""
    source = source or ctx.work
    work = ctx.base / "work"
    shutil.copytree(source, work)
    for manifest in (subs or ctx.subs).glob("*/manifest.json"):
        manifest.write_text(manifest.read_text().replace(str(source.resolve()), str(work.resolve()))
                            .replace(str(source), str(work)))
    return work


def reseal(target: Path, data: bytes) -> None:
    """Write ``data`` to a stage output file and record its size and SHA-256 in the stage manifest (and in
    the fold-model hashes of a training stage), as someone who can write the work dir could."""
    target.write_bytes(data)
    folder = next(p for p in target.parents if (p / "manifest.json").is_file())
    manifest = json.loads((folder / "manifest.json").read_text())
    rel = target.relative_to(folder).as_posix()
    digest = hashlib.sha256(data).hexdigest()
    for item in manifest["outputs"]:
        if item["path"] == rel:
            item["bytes"], item["sha256"] = len(data), digest
    for entry in (manifest.get("metrics") or {}).get("models") or []:
        if rel in (entry.get("sha256") or {}):
            entry["sha256"][rel] = digest
    (folder / "manifest.json").write_text(json.dumps(manifest))


def stage_file(work: Path, stage: str, pattern: str) -> Path:
    return sorted(p for p in (work / stage).glob(f"*/{pattern}") if not p.parts[-2].startswith("."))[0]


def same_csv(ctx: Context, out: Outcome) -> str | None:
    """The run published the baseline's exact submission bytes."""
    published = [p for p in (ctx.base / "subs").glob("*/submission.csv") if p.parent.name not in ctx.runs_before]
    if len(published) != 1:
        return f"expected one new run folder, found {len(published)}"
    return None if published[0].read_bytes() == ctx.csv.read_bytes() else "the submission bytes differ"


def no_new_run(ctx: Context, out: Outcome) -> str | None:
    published = [p.name for p in (ctx.base / "subs").iterdir() if p.name not in ctx.runs_before]
    return f"published {published}" if published else None


def warns(*words: str) -> Callable[[Context, Outcome], str | None]:
    return both(says("warning", *words))


def no_more_than(seconds: float) -> Callable[[Context, Outcome], str | None]:
    return lambda ctx, out: None if out.wall_s <= seconds else f"took {out.wall_s:.1f} s (> {seconds} s)"


def not_said(*words: str) -> Callable[[Context, Outcome], str | None]:
    def check(ctx: Context, out: Outcome) -> str | None:
        found = [w for w in words if w in out.stdout + out.stderr]
        return f"message says {found}" if found else None
    return check


def edit_labels(ctx: Context, change: Callable[[dict, int], None]) -> None:
    path = sorted((ctx.data / "labels" / "npz" / "tile" / "xla" / "test").glob("*.npz"))[0]
    with np.load(path) as archive:
        arrays = {name: archive[name] for name in archive.files}
    change(arrays, arrays["runtime"].shape[0])
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)


def edit_member(path: Path, key: str, change: Callable[[np.ndarray], np.ndarray]) -> None:
    write_members(path, [(n, npy_bytes(change(np.load(io.BytesIO(d)))) if n == f"{key}.npy" else d)
                         for n, d in read_members(path)])


def layout(ctx: Context, collection: str, split: str) -> Path:
    return ctx.data.joinpath("npz_all", "npz", "layout", *collection.split(":"), split)


def long_chain_graph(path: Path, n: int) -> None:
    """A layout train file whose n nodes are one long chain of elementwise adds between a few dots (the
    shape that made the chain search cubic), written in the Kaggle format."""
    from pipelines.data.tpugraphs import LayoutGraph, save_graph

    rng = np.random.default_rng(0)
    node_feat = np.zeros((n, 140), np.float32)
    node_feat[:, 13] = 1  # f32
    node_feat[:, 21:23] = (8, 128)
    node_feat[:, 27], node_feat[:, 28] = 136, 1024
    node_feat[:, 134:136] = (1, 0)
    opcode = np.full(n, 2, np.uint8)  # add
    opcode[0] = 63  # parameter
    config_ids = np.arange(1, n, max(1, n // 8))[:8]
    opcode[config_ids] = 34  # dot
    edges = np.stack([np.arange(1, n), np.arange(n - 1)], axis=1)
    configs = rng.integers(-1, 2, size=(16, config_ids.size, 18)).astype(np.int8)
    configs[:, :, 2:] = -1
    save_graph(path, LayoutGraph(path.stem, node_feat, opcode, edges, config_ids, configs,
                                 rng.integers(10**6, 10**9, 16), np.array([[0, n]])))


def start_beside(ctx: Context, args: list[str], delay: float) -> None:
    """Start ``python -m pipelines ARGS`` now (in the background) and wait ``delay`` seconds."""
    ctx.background.append(subprocess.Popen([sys.executable, "-m", "pipelines", *args], cwd=ctx.base,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                           env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True))
    time.sleep(delay)


def both_runs_same_csv(ctx: Context, out: Outcome) -> str | None:
    """The background run also succeeded, and both published the baseline's bytes."""
    for process in ctx.background:
        _, err = process.communicate(timeout=600)
        if process.returncode != 0:
            return f"the other run failed (rc {process.returncode}): {err.strip().splitlines()[-1:]}"
    csvs = sorted((ctx.base / "race").glob("*/*/submission.csv"))
    if len(csvs) != 2:
        return f"expected two published runs, found {len(csvs)}"
    return None if all(c.read_bytes() == ctx.csv.read_bytes() for c in csvs) else "the submission bytes differ"


def race_args(ctx: Context, i: int) -> list[str]:
    return ["run", "--data-root", str(ctx.data), "--work-dir", str(ctx.base / "work"), "--submissions-dir",
            str(ctx.base / "race" / str(i)), "--models", "random", *FAST]


def kill_when_checkpointed(ctx: Context, args: list[str], timeout: float) -> Path | None:
    """Run ``args`` and SIGKILL it once a GNN epoch checkpoint exists in a fold job's folder; the checkpoint."""
    child = subprocess.Popen([sys.executable, "-m", "pipelines", *args], cwd=ctx.base, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)},
                             start_new_session=True)
    started, found = time.perf_counter(), None
    while child.poll() is None and time.perf_counter() - started < timeout:
        found = next(iter((ctx.base / "work").glob("train-gnn/.folds-*/*.ckpt/*.pt")), None)
        if found is not None:
            os.killpg(child.pid, signal.SIGKILL)
            break
        time.sleep(0.002)
    child.wait()
    return found
