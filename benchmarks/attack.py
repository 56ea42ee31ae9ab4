"""Replay the black-box attacks of issues 13 and 71 (and more) against the command line, and print a table.

Usage: python -m benchmarks.attack [--out DIR] [--keep] [--only SUBSTRING] [--timeout S] [--fast]

``--fast`` replays only the quick cases (``Case.fast``), the subset ``tests/test_attack_replay.py`` runs.
Items ``71.N`` are the classes of issue 71: 1 code from files, 2 corrupt cache, 3 tracebacks, 4 accepted
wrongly, 5 super-linear time, 6 races, 7 messages. Items ``78.N`` are issue 78's: 3a-3e hostile HLO (below),
and in ``benchmarks.attack_issue78`` 1 gc, 2 runs rm and names, 4 submit and sync, 5 MLflow, 6 --set, L leftovers
of issue 71.

Every case is one hostile input or fault, run as ``python -m pipelines ...`` in a fresh subprocess on
a private copy of the ``tiny`` synthetic world. Each is classified:

* rejected cleanly: exit code 1 (a data or pipeline error) or 2 (a usage error), as the command line
  documents (``EXIT_CODES_HELP``), an ``error:`` message, no traceback (plus the case's own check,
  e.g. "the CSV is unchanged", "no stage folder was written", "the message names the path");
* accepted as intended: exit 0 where that is the right answer (``data.on_bad_file=skip``, ...),
  with the case's check passing;
* traceback: a Python traceback on stderr; timeout: killed after ``--timeout`` seconds;
* accepted wrongly: exit 0 where a rejection was due, or a case check that failed;
* code executed: a pickle payload the case planted (in a model or checkpoint file) ran;
* too slow: longer than the case's bound (time super-linear in the input);
* setup failed: the harness could not build the case's input (counted as a failure, never a pass);
* data lost: a case's check found run folders, trained stages or raw data gone;
* raw data changed: the data root's listing, sizes, times or bytes differ afterwards.

Peak RSS is the child's own (``wait4``). The table (and a JSON of every case) goes to stdout and
``--out`` (default ``benchmarks/results/``). Needs Linux; the full-disk cases need ``mount``
(root) and are reported as skipped otherwise.
"""

from __future__ import annotations

import argparse
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


# ----------------------------------------------------------------------------- running one case


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


# ----------------------------------------------------------------------------- cases


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


def build_cases(bombs: Path) -> list[Case]:
    cases: list[Case] = []

    def add(item: str, name: str, expect: str = "reject", check=lambda ctx, out: None, needs_mount: bool = False,
            **options):
        def register(prepare: Callable[[Context], list[str]]) -> Callable[[Context], list[str]]:
            cases.append(Case(item, name, prepare, expect, check, needs_mount, **options))
            return prepare
        return register

    # 1. report --out
    def report_to(target: Callable[[Context], Path], expect="reject", check=csv_unchanged):
        def prepare(ctx: Context) -> list[str]:
            return ["report", ctx.run_id, "--submissions-dir", str(ctx.subs), "--out", str(target(ctx))]
        return prepare, expect, check

    for name, target in {
        "report --out the run's submission.csv": lambda c: c.csv,
        "report --out the run's manifest.json": lambda c: c.csv.with_name("manifest.json"),
        "report --out a foreign file": lambda c: _touch(c.base / "notes.txt", "mine"),
        "report --out a directory": lambda c: c.base,
        "report --out a symlink to the submission": lambda c: _link(c.base / "link.html", c.csv),
    }.items():
        prepare, expect, check = report_to(target)
        cases.append(Case("1", name, prepare, expect, check))
    prepare, _, _ = report_to(lambda c: c.base / "new" / "report.html")
    cases.append(Case("1", "report --out a new file (allowed)", prepare, "accept"))

    # 2. incomplete submissions and sample_submission.csv
    @add("2", "validate a CSV missing the row of a deleted test file", check=says("has no test file"))
    def _(ctx):
        partial = csv_without_first_tile_test(ctx)
        first_npz(tile(ctx, "test")).unlink()
        return ["validate-submission", "--data-root", str(ctx.data), str(partial)]

    @add("2", "validate with a test file replaced by a dangling symlink", check=says("dangling symlink"))
    def _(ctx):
        partial = csv_without_first_tile_test(ctx)
        victim = first_npz(tile(ctx, "test"))
        victim.unlink()
        victim.symlink_to(ctx.base / "gone.npz")
        return ["validate-submission", "--data-root", str(ctx.data), str(partial)]

    @add("2", "validate with sample_submission.csv deleted", check=says("sample_submission.csv"))
    def _(ctx):
        (ctx.data / "sample_submission.csv").unlink()
        return ["validate-submission", "--data-root", str(ctx.data), str(ctx.csv)]

    @add("2", "validate with sample_submission.csv full of garbage", check=says("sample_submission.csv"))
    def _(ctx):
        (ctx.data / "sample_submission.csv").write_bytes(os.urandom(5000))
        return ["validate-submission", "--data-root", str(ctx.data), str(ctx.csv)]

    @add("2", "validate with an extra ID in sample_submission.csv", check=says("has no test file"))
    def _(ctx):
        with open(ctx.data / "sample_submission.csv", "a") as handle:
            handle.write("tile:xla:ffffffffffffffffffffffffffffffff,0;1;2;3;4\n")
        return ["validate-submission", "--data-root", str(ctx.data), str(ctx.csv)]

    @add("2", "run with one test file deleted", check=both(nothing_written, says("has no test file")))
    def _(ctx):
        first_npz(tile(ctx, "test")).unlink()
        return run_args(ctx)

    # 3. unreadable split entries
    for kind in ("dangling symlink", "symlink loop", "directory", "FIFO"):
        def plant(ctx, kind=kind) -> Path:
            entry = tile(ctx, "train") / "zz_bad.npz"
            if kind == "dangling symlink":
                entry.symlink_to(ctx.base / "nowhere.npz")
            elif kind == "symlink loop":
                entry.symlink_to(entry)
            elif kind == "directory":
                entry.mkdir()
            else:
                os.mkfifo(entry)
            return entry

        cases.append(Case("3", f"prepare with a {kind} named *.npz in train", lambda ctx, plant=plant: (
            plant(ctx), prepare_args(ctx))[1], "reject", both(nothing_written, says("zz_bad.npz"))))
        cases.append(Case("3", f"prepare --set data.on_bad_file=skip with a {kind} in train",
                          lambda ctx, plant=plant: (plant(ctx), prepare_args(ctx, "--set", "data.on_bad_file=skip"))[1],
                          "accept", _skipped_recorded))

    # 4. structural problems before the first stage
    @add("4", "run with a collection directory missing", check=both(nothing_written, says("layout/nlp/random")))
    def _(ctx):
        shutil.rmtree(ctx.data / "npz_all" / "npz" / "layout" / "nlp" / "random")
        return run_args(ctx)

    @add("4", "run with an empty test split", check=both(nothing_written, says("tile/xla/test")))
    def _(ctx):
        for path in tile(ctx, "test").iterdir():
            path.unlink()
        return run_args(ctx)

    @add("4", "run with a split directory missing", check=both(nothing_written, says("valid")))
    def _(ctx):
        shutil.rmtree(tile(ctx, "valid"))
        return run_args(ctx)

    # 5. decompression bombs (built once, copied in)
    for bomb in ("edges-200M.npz", "edges-20M.npz", "node-feat-2M.npz", "config-feat-100M.npz"):
        cases.append(Case("5", f"prepare with a bomb in train: {bomb}", lambda ctx, bomb=bomb: (
            shutil.copy(bombs / bomb, tile(ctx, "train") / f"zz_{bomb}"), prepare_args(ctx))[1], "reject",
            both(no_stage_output, says("refusing")), needs_bombs=True))

    @add("5", "prepare with a lying npy header (10**8 configs declared)", check=says("declared shape"))
    def _(ctx):
        victim = first_npz(tile(ctx, "train"))
        members = read_members(victim)
        out = []
        for name, data in members:
            if name == "config_feat.npy":
                array = np.load(io.BytesIO(data))
                buffer = io.BytesIO()
                np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False,
                                                              "shape": (10**8, 24)})
                data = buffer.getvalue() + array.astype("<f4").tobytes()
            out.append((name, data))
        write_members(victim, out)
        return prepare_args(ctx)

    # 6. zero normalizer, 7. duplicate member
    @add("6", "prepare with a 0 in config_runtime_normalizers of a train file", check=says("normalizers"))
    def _(ctx):
        victim = first_npz(tile(ctx, "train"))
        members = [(n, npy_bytes(np.where(np.arange(np.load(io.BytesIO(d)).shape[0]) == 0, 0, np.load(io.BytesIO(d)))
                                  .astype(np.int64)) if n == "config_runtime_normalizers.npy" else d)
                   for n, d in read_members(victim)]
        write_members(victim, members)
        return prepare_args(ctx)

    @add("7", "prepare with config_runtime.npy twice in a train file", check=says("duplicate"))
    def _(ctx):
        victim = first_npz(tile(ctx, "train"))
        members = read_members(victim)
        runtime = next(d for n, d in members if n == "config_runtime.npy")
        write_members(victim, members + [("config_runtime.npy", npy_bytes(np.load(io.BytesIO(runtime))[::-1].copy()))])
        return prepare_args(ctx)

    # 8. raw tracebacks
    @add("8", "prepare --work-dir FILE", check=says("not a directory"))
    def _(ctx):
        afile = _touch(ctx.base / "passwd", "root:x:0:0\n")
        return ["prepare", "--data-root", str(ctx.data), "--work-dir", str(afile), *FAST]

    @add("8", "prepare --work-dir /proc/foo", check=says("/proc/foo"))
    def _(ctx):
        return ["prepare", "--data-root", str(ctx.data), "--work-dir", "/proc/foo", *FAST]

    @add("8", "run --set gbdt.exclude_features=[\"f_\"]", check=both(nothing_written, says("exclude_features")))
    def _(ctx):
        return [*run_args(ctx), "--models", "gbdt", "--set", 'gbdt.exclude_features=["f_"]']

    @add("8", "prepare with a stage folder replaced by a file", check=says("folds"))
    def _(ctx):
        shutil.copytree(ctx.work, ctx.base / "work")
        stage = next(p for p in (ctx.base / "work" / "folds").iterdir() if not p.name.startswith("."))
        shutil.rmtree(stage)
        stage.write_text("in the way")
        return ["prepare", "--data-root", str(ctx.world), "--work-dir", str(ctx.base / "work"), *FAST]

    @add("8", "status --work-dir FILE", expect="accept")
    def _(ctx):
        return ["status", "--work-dir", str(_touch(ctx.base / "afile", "x")), "--submissions-dir", str(ctx.subs)]

    # 9. debris after kill -9
    @add("9", "status cleans a run folder holding only .draft/.tmp debris", expect="accept", check=_debris_gone)
    def _(ctx):
        debris = ctx.subs / "20260101T000000Z-0123abcd"
        debris.mkdir()
        _touch(debris / ".submission.csv.draft", "ID,TopConfigs\n")
        _touch(debris / ".submission.csv.k2j3.tmp", "ID,TopConfigs\n")
        staging = ctx.subs / ".tmp-run-0badc0de"
        staging.mkdir()
        _touch(staging / ".lock", "999999\n")
        return ["status", "--work-dir", str(ctx.work), "--submissions-dir", str(ctx.subs)]

    @add("9", "status lists a run folder with a CSV but no manifest", expect="accept", check=says("incomplete run"))
    def _(ctx):
        (ctx.subs / ctx.run_id / "manifest.json").unlink()
        return ["status", "--work-dir", str(ctx.work), "--submissions-dir", str(ctx.subs)]

    for command in ("report", "ensemble"):
        @add("9", f"{command} on a run folder without manifest", check=says("incomplete run folder"))
        def _(ctx, command=command):
            (ctx.subs / ctx.run_id / "manifest.json").unlink()
            runs = [ctx.run_id] if command == "report" else ["--runs", ctx.run_id]
            return [command, *runs, "--submissions-dir", str(ctx.subs)]

    @add("9", "a dead run's .tmp-<key> stage folder goes when the stage is reused", expect="accept",
         check=_tmp_stage_gone)
    def _(ctx):
        shutil.copytree(ctx.work, ctx.base / "work")
        prune = ctx.base / "work" / "prune"
        key = next(p.name for p in prune.iterdir() if not p.name.startswith("."))
        leftover = prune / f".tmp-{key}-killed99"
        leftover.mkdir()
        _touch(leftover / ".lock", "999999\n")
        return ["prepare", "--data-root", str(ctx.world), "--work-dir", str(ctx.base / "work"), *FAST]

    @add("9", "a run killed (SIGKILL) while publishing, then run again", expect="accept", check=_killed_publish)
    def _(ctx):
        shutil.copytree(ctx.work, ctx.base / "work")
        return ["run", "--data-root", str(ctx.world), "--work-dir", str(ctx.base / "work"), "--submissions-dir",
                str(ctx.base / "subs"), "--models", "random", *FAST]

    # 10. oversized submissions
    for command in ("validate-submission", "score"):
        @add("10", f"{command} on a 200 MB CSV", check=says("refused without reading"))
        def _(ctx, command=command):
            big = ctx.base / "big.csv"
            with open(big, "wb") as handle:
                handle.write(ctx.csv.read_bytes())
                line = b"tile:xla:x," + b"0;" * 1_000_000 + b"0\n"
                for _ in range(100):
                    handle.write(line)
            if command == "score":
                return ["score", "--data-root", str(ctx.data), str(big)]
            return ["validate-submission", "--data-root", str(ctx.data), str(big)]

    # 11. config bounds
    for override in ("gbdt.learning_rate=nan", "gbdt.learning_rate=inf", "gbdt.lambda_l2=-inf"):
        cases.append(Case("11", f"config --set {override}", lambda ctx, o=override: ["config", "--set", o],
                          "reject", says("finite")))
    cases.append(Case("11", "config --config /dev/zero", lambda ctx: ["config", "--config", "/dev/zero"], "reject",
                      says("/dev/zero")))
    cases.append(Case("11", "config --config a 50 MB file", lambda ctx: ["config", "--config", str(
        _big_file(ctx.base / "big.toml", b'extends = "base"\n', b"#", 50 << 20))], "reject", says("larger than")))
    cases.append(Case("11", "config --config a directory", lambda ctx: ["config", "--config", str(ctx.base) + "/"],
                      "reject"))

    # 12. work dir inside the data root
    for where in (".", "work", "npz_all/npz/work"):
        cases.append(Case("12", f"prepare --work-dir DATA_ROOT/{where}", lambda ctx, w=where: [
            "prepare", "--data-root", str(ctx.data), "--work-dir", str(ctx.data / w), *FAST], "reject",
            says("inside the data root")))
    cases.append(Case("12", "run --submissions-dir DATA_ROOT/subs", lambda ctx: [
        *run_args(ctx), "--submissions-dir", str(ctx.data / "subs")], "reject", says("inside the data root")))

    # 13. messages
    @add("13", "validate a CSV with a negative index", check=says("negative index -1"))
    def _(ctx):
        lines = ctx.csv.read_text().splitlines()
        sid, top = lines[1].split(",")
        lines[1] = f"{sid},-1;{top.split(';', 1)[1]}"
        return ["validate-submission", "--data-root", str(ctx.data), str(_touch(ctx.base / "neg.csv",
                                                                               "\n".join(lines) + "\n"))]

    @add("13", "validate a CSV with a UTF-8 BOM", check=says("byte-order mark"))
    def _(ctx):
        bom = ctx.base / "bom.csv"
        bom.write_bytes(b"\xef\xbb\xbf" + ctx.csv.read_bytes())
        return ["validate-submission", "--data-root", str(ctx.data), str(bom)]

    @add("13", "run with a full submissions disk", needs_mount=True,
         check=both(says("{base}/full", "No space left on device"), _no_run_folder_in_full))
    def _(ctx):
        shutil.copytree(ctx.work, ctx.base / "work")
        full = ctx.base / "full"
        full.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], check=True)
        subprocess.run(["dd", "if=/dev/zero", f"of={full}/filler", "bs=4k"], capture_output=True)
        return ["run", "--data-root", str(ctx.world), "--work-dir", str(ctx.base / "work"), "--submissions-dir",
                str(full), "--models", "random", *FAST]

    @add("13", "run --scheduler with a password in the address", check=_no_password)
    def _(ctx):
        return [*run_args(ctx), "--scheduler", "tcp://alice:hunter2@127.0.0.1:1"]

    # + our additions
    @add("+", "prepare --data-root a file", check=says("no TpuGraphs data"))
    def _(ctx):
        return ["prepare", "--data-root", str(_touch(ctx.base / "afile", "x")), *FAST]

    @add("+", "validate with sample_submission.csv a FIFO", check=says("FIFO"))
    def _(ctx):
        (ctx.data / "sample_submission.csv").unlink()
        os.mkfifo(ctx.data / "sample_submission.csv")
        return ["validate-submission", "--data-root", str(ctx.data), str(ctx.csv)]

    @add("+", "validate with a 70 MB sample_submission.csv", check=says("sample_submission.csv"))
    def _(ctx):
        sample = ctx.data / "sample_submission.csv"
        _big_file(sample, sample.read_bytes(), b"#", 70 << 20)
        return ["validate-submission", "--data-root", str(ctx.data), str(ctx.csv)]

    @add("+", "validate a submission that is a FIFO", check=says("FIFO"))
    def _(ctx):
        os.mkfifo(ctx.base / "pipe.csv")
        return ["validate-submission", "--data-root", str(ctx.data), str(ctx.base / "pipe.csv")]

    @add("+", "validate a CSV with CRLF line ends (allowed)", expect="accept")
    def _(ctx):
        crlf = ctx.base / "crlf.csv"
        crlf.write_bytes(ctx.csv.read_bytes().replace(b"\n", b"\r\n"))
        return ["validate-submission", "--data-root", str(ctx.data), str(crlf)]

    @add("+", "validate a CSV with a NUL byte", check=says("non-integer"))
    def _(ctx):
        nul = ctx.base / "nul.csv"
        nul.write_bytes(ctx.csv.read_bytes().replace(b";", b";\x00", 1))
        return ["validate-submission", "--data-root", str(ctx.data), str(nul)]

    @add("+", "validate a CSV with a non-ASCII byte", check=says("not an ASCII"))
    def _(ctx):
        latin = ctx.base / "latin.csv"
        latin.write_bytes(ctx.csv.read_bytes().replace(b";", b"\xe9", 1))
        return ["validate-submission", "--data-root", str(ctx.data), str(latin)]

    @add("+", "prepare with a bzip2-compressed member", check=says("compression"))
    def _(ctx):
        victim = first_npz(tile(ctx, "train"))
        write_members(victim, read_members(victim), zipfile.ZIP_BZIP2)
        return prepare_args(ctx)

    @add("+", "prepare with a train file that is an empty file", check=says("zz_empty.npz"))
    def _(ctx):
        _touch(tile(ctx, "train") / "zz_empty.npz", "")
        return prepare_args(ctx)

    @add("+", "prepare with a test file that is a directory, on_bad_file=skip", check=says("zz_dir.npz"))
    def _(ctx):
        (tile(ctx, "test") / "zz_dir.npz").mkdir()
        return prepare_args(ctx, "--set", "data.on_bad_file=skip")

    @add("+", "report of a run-id with path traversal", check=says("not a run-id"))
    def _(ctx):
        return ["report", "../../etc", "--submissions-dir", str(ctx.subs)]

    issue71_cases(add)
    issue78_hlo_cases(add)
    from benchmarks.attack_issue78 import issue78_cases

    issue78_cases(add)
    return cases


# ----------------------------------------------------------------------------- issue 71: the second attack

# Item labels: 71.<class> of issue 71: 1 code from files, 2 corrupt cache, 3 tracebacks, 4 accepted wrongly,
# 5 super-linear time, 6 races, 7 messages.


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


def issue71_cases(add: Callable) -> None:
    # 71.1 code from files: a planted pickle payload must never run
    @add("71.1", "predict with a pickle payload planted as a saved GNN model (hashes resealed)", needs_gnn=True,
         check=says("cannot read GNN model"))
    def _(ctx):
        run_id, subs, work = ctx.gnn
        shutil.copytree(subs, ctx.base / "gnn-subs")
        mine = private_work(ctx, work, ctx.base / "gnn-subs")
        reseal(stage_file(mine, "train-gnn", "models/*.pt"), payload_bytes(ctx.code_marker))
        return ["predict", "--run", run_id, "--data-root", str(ctx.data), "--submissions-dir",
                str(ctx.base / "gnn-subs")]

    @add("71.1", "train resuming from a pickle payload planted as its epoch checkpoint (hash resealed)",
         needs_gnn=True, check=says("cannot read GNN checkpoint", "to train this fold afresh"))
    def _(ctx):
        args = ["train", "--model", "gnn", "--collections", "tile:xla", "--data-root", str(ctx.data), "--work-dir",
                str(ctx.base / "work"), "--config", "smoke", "--set", "gnn.epochs=40"]
        checkpoint = kill_when_checkpointed(ctx, args, 300)
        if checkpoint is None:
            raise RuntimeError("no checkpoint was written before the fit finished")
        checkpoint.write_bytes(payload_bytes(ctx.code_marker))
        checkpoint.with_name(checkpoint.name + ".sha256").write_text(
            hashlib.sha256(checkpoint.read_bytes()).hexdigest() + "\n")  # a planted file that matches its hash
        return args

    # 71.2 corrupt cache: never served; recomputed with a warning, or an error naming the file
    @add("71.2", "rerun with one bit flipped in a cached ensemble predictions.parquet", expect="accept",
         check=both(warns("does not match its manifest"), same_csv), fast=True)
    def _(ctx):
        target = stage_file(private_work(ctx), "ensemble", "predictions.parquet")
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 1
        target.write_bytes(bytes(data))
        return run_args(ctx)

    @add("71.2", "rerun with a cached features table truncated", expect="accept",
         check=both(warns("bytes, its manifest recorded"), same_csv))
    def _(ctx):
        target = stage_file(private_work(ctx), "features", "train/graph_features.parquet")
        target.write_bytes(target.read_bytes()[:100])
        return run_args(ctx)

    @add("71.2", "a features table written as garbage, its hash resealed, read by a new model",
         check=says("unreadable stage output table", "graph_features.parquet"))
    def _(ctx):
        target = stage_file(private_work(ctx), "features", "train/graph_features.parquet")
        reseal(target, os.urandom(target.stat().st_size))
        return [*run_args(ctx), "--models", "feature"]

    @add("71.2", "a node-arrays file written truncated, its hash resealed, read by the GNN",
         check=says("unreadable cached graph arrays"))
    def _(ctx):
        target = stage_file(private_work(ctx), "node_arrays", "train/*.npz")
        reseal(target, target.read_bytes()[: target.stat().st_size // 2])
        return [*run_args(ctx), "--models", "gnn"]

    # 71.3 tracebacks instead of errors
    @add("71.3", "run --models feature:f_nope (no such column)", check=both(nothing_written, says("f_cfg_0")),
         fast=True)
    def _(ctx):
        return [*run_args(ctx), "--models", "feature:f_nope"]

    @add("71.3", "runs list with one manifest hand-edited into a list", expect="accept",
         check=both(warns("not a valid run manifest"), says("{base}")), fast=True)
    def _(ctx):
        other = ctx.subs / "20260101T000000Z-badbadba"
        shutil.copytree(ctx.subs / ctx.run_id, other)
        manifest = other / "manifest.json"
        manifest.write_text(json.dumps([json.loads(manifest.read_text())]))
        return ["runs", "list", "--submissions-dir", str(ctx.subs)]

    @add("71.3", "report of a run whose manifest has a string for a collection's stages",
         check=says("not a valid run manifest", "stages.tile:xla"), fast=True)
    def _(ctx):
        path = ctx.subs / ctx.run_id / "manifest.json"
        manifest = json.loads(path.read_text())
        manifest["stages"]["tile:xla"] = "x"
        path.write_text(json.dumps(manifest))
        return ["report", ctx.run_id, "--submissions-dir", str(ctx.subs), "--out", str(ctx.base / "r.html")]

    @add("71.3", "evaluate with label runtimes stored as strings", check=says("expected integers"), fast=True)
    def _(ctx):
        edit_labels(ctx, lambda a, n: a.update(runtime=np.array(["a"] * n)))
        return ["evaluate", ctx.run_id, "--data-root", str(ctx.data), "--submissions-dir", str(ctx.subs),
                "--no-models"]

    @add("71.3", "evaluate with labels.json a list", check=says("labels.json", "not a label record"), fast=True)
    def _(ctx):
        marker = ctx.data / "labels" / "labels.json"
        marker.write_text(json.dumps([json.loads(marker.read_text())]))
        return ["evaluate", ctx.run_id, "--data-root", str(ctx.data), "--submissions-dir", str(ctx.subs),
                "--no-models"]

    for command in ("validate-submission", "score"):
        @add("71.3", f"{command} with a 5,000-digit index", check=says("index of 5000 digits"), fast=True)
        def _(ctx, command=command):
            if command == "score":  # a submission for the valid split (score refuses the test split's)
                ids = [f"tile:xla:{p.stem}" for p in sorted(tile(ctx, "valid").glob("*.npz"))]
                lines = ["ID,TopConfigs", *(f"{sid},0;1;2;3;4" for sid in ids)]
            else:
                lines = ctx.csv.read_text().splitlines()
            sid, top = lines[1].split(",")
            lines[1] = f"{sid},{'9' * 5000};{top.split(';', 1)[1]}"
            return [command, "--data-root", str(ctx.data), str(_touch(ctx.base / "digits.csv",
                                                                       "\n".join(lines) + "\n"))]

    @add("71.3", "run with a test file named ab;cd.npz (listed so in sample_submission.csv)",
         check=both(nothing_written, says("ab;cd.npz", "cannot carry")), fast=True)
    def _(ctx):
        victim = first_npz(tile(ctx, "test"))
        victim.rename(victim.with_name("ab;cd.npz"))
        sample = ctx.data / "sample_submission.csv"
        sample.write_text(sample.read_text().replace(f"tile:xla:{victim.stem},", "tile:xla:ab;cd,"))
        return run_args(ctx)

    @add("71.3", "train with gbdt.seed = 2^32-1 and run.seeds = [0, 2^32-1]", expect="accept")
    def _(ctx):
        return ["train", "--model", "gbdt", "--collections", "tile:xla", "--data-root", str(ctx.data), "--work-dir",
                str(ctx.base / "work"), *FAST, "--set", "gbdt.seed=4294967295", "--set", "run.seeds=[0, 4294967295]"]

    @add("71.3", "config --set gbdt.num_leaves=1000000 (above LightGBM's limit)", check=says("num_leaves"),
         fast=True)
    def _(ctx):
        return ["config", "--set", "gbdt.num_leaves=1000000"]

    @add("71.3", "config --set run.seeds=[18446744073709551616]", check=says("run.seeds"), fast=True)
    def _(ctx):
        return ["config", "--set", "run.seeds=[18446744073709551616]"]

    @add("71.3", "config with a chain of 1,200 extends files", check=says("extends"), fast=True)
    def _(ctx):
        for i in range(1200):
            _touch(ctx.base / f"c{i}.toml", f'extends = "{ctx.base / f"c{i + 1}.toml"}"\n' if i < 1199 else
                   'extends = "base"\n')
        return ["config", "--config", str(ctx.base / "c0.toml")]

    # 71.4 accepted wrongly
    @add("71.4", "run with data.on_bad_file=skip and every tile train file garbage",
         check=both(says("every train file"), no_new_run), fast=True)
    def _(ctx):
        for path in tile(ctx, "train").glob("*.npz"):
            path.write_bytes(b"garbage" * 30)
        return [*run_args(ctx), "--set", "data.on_bad_file=skip"]

    @add("71.4", "run with data.on_bad_file=skip and a garbage test file in the last collection",
         check=both(nothing_written, says("corrupt or truncated archive")), fast=True)
    def _(ctx):
        first_npz(layout(ctx, "nlp:random", "test")).write_bytes(b"garbage" * 30)
        return [*run_args(ctx), "--set", "data.on_bad_file=skip"]

    @add("71.4", "prepare with boolean runtimes in a tile train file", check=says("bool"), fast=True)
    def _(ctx):
        edit_member(first_npz(tile(ctx, "train")), "config_runtime", lambda a: a > 0)
        return prepare_args(ctx)

    @add("71.4", "prepare with a self-loop edge in a tile train file", check=says("u > v"), fast=True)
    def _(ctx):
        edit_member(first_npz(tile(ctx, "train")), "edge_index", lambda a: np.vstack([a, [[1, 1]]]).astype(a.dtype))
        return prepare_args(ctx)

    @add("71.4", "evaluate with boolean label runtimes", check=says("bool"), fast=True)
    def _(ctx):
        edit_labels(ctx, lambda a, n: a.update(runtime=np.ones(n, bool)))
        return ["evaluate", ctx.run_id, "--data-root", str(ctx.data), "--submissions-dir", str(ctx.subs),
                "--no-models"]

    # 71.5 super-linear time
    @add("71.5", "validate-submission with a 1,000,000-digit index", check=both(says("digits"), no_more_than(5)),
         fast=True)
    def _(ctx):
        lines = ctx.csv.read_text().splitlines()
        sid, top = lines[1].split(",")
        lines[1] = f"{sid},{'7' * 1_000_000};{top.split(';', 1)[1]}"
        return ["validate-submission", "--data-root", str(ctx.data), str(_touch(ctx.base / "long.csv",
                                                                               "\n".join(lines) + "\n"))]

    @add("71.5", "prepare a layout train graph of one 20,000-node elementwise chain", expect="accept",
         check=no_more_than(60))
    def _(ctx):
        long_chain_graph(layout(ctx, "xla:default", "train") / "zz_chain.npz", 20_000)
        return ["prepare", "--data-root", str(ctx.data), "--work-dir", str(ctx.base / "work"), "--collections",
                "layout:xla:default", *FAST]

    # 71.6 races: two runs on one work dir
    for delay in (0.0, 1.0):
        @add("71.6", f"two runs on one work dir started {delay:g} s apart", expect="accept",
             check=both_runs_same_csv)
        def _(ctx, delay=delay):
            start_beside(ctx, race_args(ctx, 0), delay)
            return race_args(ctx, 1)

    # 71.7 messages
    @add("71.7", "report with a saved model file one byte longer", check=both(says("damaged", "random-f0-s0.json"),
                                                                                not_said("gone")), fast=True)
    def _(ctx):
        model = stage_file(private_work(ctx), "train-random", "models/random-f0-s0.json")
        model.write_bytes(model.read_bytes() + b" ")
        return ["report", ctx.run_id, "--submissions-dir", str(ctx.subs), "--out", str(ctx.base / "r.html")]

    @add("71.7", "ensemble --runs of a predict run", check=both(says("is a 'predict' run", "source run"),
                                                                 not_said("in the prepared data")))
    def _(ctx):
        done = run_cli(["predict", "--run", ctx.run_id, "--data-root", str(ctx.data), "--submissions-dir",
                        str(ctx.subs)], ctx.base, 300)
        if done.rc != 0:
            raise RuntimeError(f"predict failed: {done.stderr[-500:]}")
        predicted = Path(done.stdout.strip().splitlines()[-1]).parent.name
        return ["ensemble", "--runs", predicted, "--submissions-dir", str(ctx.subs)]

    @add("71.7", "ensemble --runs with a stage folder deleted says gone", check=says("is gone"), fast=True)
    def _(ctx):
        shutil.rmtree(stage_file(private_work(ctx), "train-random", "manifest.json").parent)
        return ["ensemble", "--runs", ctx.run_id, "--submissions-dir", str(ctx.subs)]


def _big_file(path: Path, head: bytes, fill: bytes, size: int) -> Path:
    """Write ``head`` then ``fill`` up to ``size`` bytes in chunks (the driver's own memory stays small)."""
    with open(path, "wb") as handle:
        handle.write(head)
        chunk = fill * (1 << 20)
        for _ in range(size // len(chunk)):
            handle.write(chunk)
    return path


def _touch(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _link(path: Path, target: Path) -> Path:
    path.symlink_to(target)
    return path


def _skipped_recorded(ctx: Context, out: Outcome) -> str | None:
    manifests = list((ctx.base / "work" / "prune").glob("*/manifest.json"))
    if len(manifests) != 1:
        return "no prune manifest"
    skipped = json.loads(manifests[0].read_text())["metrics"]["skipped_files"]
    if [Path(s["path"]).name for s in skipped] != ["zz_bad.npz"]:
        return f"skipped_files = {skipped}"
    return None if "warning" in out.stdout + out.stderr else "no warning printed"


def _debris_gone(ctx: Context, out: Outcome) -> str | None:
    left = [p.name for p in ctx.subs.iterdir() if p.name != ctx.run_id]
    return f"left behind: {left}" if left else None


def _tmp_stage_gone(ctx: Context, out: Outcome) -> str | None:
    left = list((ctx.base / "work" / "prune").glob(".tmp-*"))
    return f"left behind: {left}" if left else None


def _no_run_folder_in_full(ctx: Context, out: Outcome) -> str | None:
    full = ctx.base / "full"
    left = [p.name for p in full.iterdir() if p.name != "filler"]
    subprocess.run(["umount", str(full)], check=False)
    return f"left behind: {left}" if left else None


def _no_password(ctx: Context, out: Outcome) -> str | None:
    return "the password was echoed" if "hunter2" in out.stdout + out.stderr else None


def _killed_publish(ctx: Context, out: Outcome) -> str | None:
    """Run once more, killed with SIGKILL the moment its staging folder appears; then the case's run
    (already done) must have left exactly one complete run folder and no staging folder."""
    subs = ctx.base / "subs"
    runs = [p for p in subs.iterdir() if not p.name.startswith(".")]
    if not all((p / "manifest.json").is_file() and (p / "submission.csv").is_file() for p in runs):
        return f"incomplete run folders: {runs}"
    if any(p.name.startswith(".") for p in subs.iterdir()):
        return "a staging folder survived the run"
    ours = [p for p in runs if str(ctx.base) in (p / "manifest.json").read_text()]  # not the copied baseline
    if len(ours) != 1:
        return f"expected one new run folder (the rerun), found {ours}"
    return None


def _kill_while_publishing(ctx: Context, args: list[str], timeout: float) -> str:
    """Start the run, SIGKILL it as soon as a ``.tmp-run-*`` staging folder exists (or a run folder, too late)."""
    subs = ctx.base / "subs"
    child = subprocess.Popen([sys.executable, "-m", "pipelines", *args], cwd=ctx.base, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)},
                             start_new_session=True)
    started = time.perf_counter()
    state = "finished before a staging folder was seen"
    while child.poll() is None and time.perf_counter() - started < timeout:
        # kill once the staging folder holds the CSV: in the middle of publishing
        if subs.is_dir() and any(p.name.startswith(".tmp-run-") and (p / "submission.csv").exists()
                                 for p in subs.iterdir()):
            os.killpg(child.pid, signal.SIGKILL)
            state = "killed while publishing (staging folder with its CSV, no manifest)"
            break
        time.sleep(0.001)
    child.wait()
    return state


# ----------------------------------------------------------------------------- driver


def build_bombs(folder: Path, world: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    source = first_npz(world / "npz_all" / "npz" / "tile" / "xla" / "train")
    zero_bomb(folder / "edges-200M.npz", source, "edge_index", (200_000_000, 2))
    zero_bomb(folder / "edges-20M.npz", source, "edge_index", (20_000_000, 2))
    zero_bomb(folder / "node-feat-2M.npz", source, "node_feat", (2_000_000, 140), "<f4")
    zero_bomb(folder / "config-feat-100M.npz", source, "config_feat", (10_000_000, 24), "<f4")


# The command line's documented exit codes for a clean rejection (pipelines.cli.EXIT_CODES_HELP).
REJECTION_CODES = (1, 2)


def judge(expect: str, outcome: Outcome, problem: str | None, code_ran: bool = False,
          max_wall_s: float | None = None) -> str:
    """The verdict on one case: ``expect`` is "reject" or "accept"; ``problem`` the case check's complaint;
    ``code_ran``: the case's planted payload left its marker; ``max_wall_s``: slower is "too slow"."""
    if code_ran:
        return "code executed"
    if outcome.timed_out:
        return "timeout"
    if "Traceback (most recent call last)" in outcome.stdout + outcome.stderr:
        return "traceback"
    if max_wall_s is not None and outcome.wall_s > max_wall_s:
        return "too slow"
    if problem and problem.startswith("data lost"):  # run folders, trained stages or raw data gone (issue 78)
        return "data lost"
    if expect == "reject":
        clean = outcome.rc in REJECTION_CODES and "error:" in outcome.stderr and not problem
        return "rejected cleanly" if clean else "accepted wrongly"
    return "accepted as intended" if outcome.rc == 0 and not problem else "accepted wrongly"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--scratch", type=Path, default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("--only", default=None, help="run only cases whose name contains this")
    parser.add_argument("--skip", action="append", default=[],
                        help="leave out cases whose name contains this (repeatable; e.g. to spare an old "
                             "version the inputs that exhaust its memory)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds before a case is killed")
    parser.add_argument("--item", default=None, help="run only cases whose item starts with this (e.g. 71.2)")
    parser.add_argument("--fast", action="store_true",
                        help="only the quick cases (the subset the test suite replays, ~30 s)")
    args = parser.parse_args(argv)

    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="tpugraphs-attack-"))
    scratch.mkdir(parents=True, exist_ok=True)
    can_mount = os.geteuid() == 0 and shutil.which("mount") is not None
    try:
        world = scratch / "world"
        if not world.exists():
            print("generating the tiny world, a baseline run and the bombs ...", flush=True)
            setup = run_cli(["synth", "--out", str(world), "--scale", "tiny", "--seed", "0"], scratch, 600)
            assert setup.rc == 0, setup.stderr
        baseline = run_cli(["run", "--data-root", str(world), "--work-dir", str(scratch / "work"), "--submissions-dir",
                            str(scratch / "subs"), "--models", "random", *FAST], scratch, 600)
        assert baseline.rc == 0, baseline.stderr
        run_id = Path(baseline.stdout.strip().splitlines()[-1]).parent.name
        chosen = [(index, case) for index, case in enumerate(build_cases(scratch / "bombs"))
                  if not (args.only and args.only not in case.name) and not any(w in case.name for w in args.skip)
                  and (case.fast or not args.fast) and (args.item is None or case.item.startswith(args.item))]
        if any(case.needs_bombs for _, case in chosen) and not (scratch / "bombs").exists():
            build_bombs(scratch / "bombs", world)
        gnn = None
        if any(case.needs_gnn for _, case in chosen):
            print("training a baseline GNN run ...", flush=True)
            done = run_cli(["run", "--data-root", str(world), "--work-dir", str(scratch / "gnn-work"),
                            "--submissions-dir", str(scratch / "gnn-subs"), "--models", "gnn", *FAST], scratch, 1200)
            assert done.rc == 0, done.stderr
            gnn = (Path(done.stdout.strip().splitlines()[-1]).parent.name, scratch / "gnn-subs", scratch / "gnn-work")
        pristine = snapshot(world)

        rows = []
        for index, case in chosen:
            base = scratch / "cases" / f"{index:03d}"
            shutil.rmtree(base, ignore_errors=True)
            base.mkdir(parents=True)
            shutil.copytree(world, base / "data", symlinks=True)
            shutil.copytree(scratch / "subs", base / "subs")
            ctx = Context(base, base / "data", world, run_id, base / "subs", scratch / "work",
                          base / "subs" / run_id / "submission.csv", gnn)
            if case.needs_mount and not can_mount:
                rows.append({"item": case.item, "case": case.name, "verdict": "skipped (needs root and mount)"})
                continue
            try:
                cli_args = case.prepare(ctx)
            except Exception as exc:  # the harness could not build the input: never a silent pass
                rows.append({"item": case.item, "case": case.name, "verdict": "setup failed",
                             "problem": f"{type(exc).__name__}: {exc}"})
                print(f"[{case.item:>4}] setup failed          {case.name}  <- {exc}", flush=True)
                continue
            before = snapshot(ctx.data)
            ctx.runs_before = set(os.listdir(ctx.subs)) if ctx.subs.is_dir() else set()
            if case.check is _killed_publish:
                note = _kill_while_publishing(ctx, cli_args, args.timeout)
            outcome = run_cli(cli_args, base, args.timeout, env=ctx.env or None)
            changed = snapshot(ctx.data) != before or snapshot(world) != pristine
            try:
                problem = case.check(ctx, outcome)
            finally:
                for process in ctx.background:  # a race case's other run: waited for by its check
                    if process.poll() is None:
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
            code_ran = ctx.code_marker.exists()
            verdict = judge(case.expect, outcome, problem, code_ran, case.max_wall_s)
            message = (outcome.stderr.strip().splitlines() or [""])[0] if outcome.rc else \
                (outcome.stdout.strip().splitlines() or [""])[-1]
            row = {"item": case.item, "case": case.name, "verdict": verdict, "rc": outcome.rc,
                   "raw_data_changed": changed, "code_executed": code_ran, "wall_s": round(outcome.wall_s, 2),
                   "peak_rss_mb": round(outcome.peak_rss_mb, 1), "problem": problem, "message": message[:300]}
            if case.check is _killed_publish:
                row["note"] = note
            rows.append(row)
            print(f"[{case.item:>4}] {verdict:<21} rss {outcome.peak_rss_mb:7.1f} MB {outcome.wall_s:6.2f}s  "
                  f"{case.name}" + (f"  <- {problem}" if problem else ""), flush=True)
    finally:
        if not args.keep and args.scratch is None:
            subprocess.run(["bash", "-c", f"umount {scratch}/cases/*/full 2>/dev/null; true"])
            shutil.rmtree(scratch, ignore_errors=True)

    table = summary(rows)
    print()
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "attack.json").write_text(json.dumps(rows, indent=2) + "\n")
    (args.out / "attack.txt").write_text(table + "\n")
    return 1 if any(is_bad(r) for r in rows) else 0


BAD_VERDICTS = ("traceback", "timeout", "accepted wrongly", "code executed", "too slow", "setup failed", "data lost")


def is_bad(row: dict) -> bool:
    return row["verdict"] in BAD_VERDICTS or bool(row.get("raw_data_changed")) or bool(row.get("code_executed"))


def summary(rows: list[dict]) -> str:
    ran = [r for r in rows if not r["verdict"].startswith("skipped")]
    count = lambda verdict: sum(r["verdict"] == verdict for r in ran)  # noqa: E731
    peak = max((r.get("peak_rss_mb") or 0.0 for r in ran), default=0.0)
    lines = [
        "| inputs tried | rejected cleanly | accepted as intended | tracebacks | timeouts | accepted wrongly "
        "| code executed | too slow | setup failed | data lost | raw data changed | skipped | max peak RSS (MB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {len(ran)} | {count('rejected cleanly')} | {count('accepted as intended')} | {count('traceback')} "
        f"| {count('timeout')} | {count('accepted wrongly')} | {count('code executed')} | {count('too slow')} "
        f"| {count('setup failed')} | {count('data lost')} | {sum(bool(r.get('raw_data_changed')) for r in ran)} "
        f"| {len(rows) - len(ran)} | {peak:.0f} |",
        "",
        *by_class(ran),
        "",
        "| item | case | verdict | peak RSS (MB) | wall (s) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['item']} | {r['case']} | {r['verdict']}{' (raw data changed!)' if r.get('raw_data_changed') else ''}"
                     f" | {r.get('peak_rss_mb', '')} | {r.get('wall_s', '')} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- issue 78.3: hostile HLO

# Item labels 78.3<class>: a XLA accepts the text, then refuses it; b nesting and dims beyond XLA's own
# limits (it crashed); c numeric options; d one --out shared by two processes; e hostile tuning records.


def _hlo_file(ctx: Context, name: str, text: str) -> Path:
    return _touch(ctx.base / name, text)


def _hlo_module(shape: str, printed: str | None = None) -> str:
    return f"HloModule hostile\n\nENTRY %main (p: {shape}) -> {shape} {{\n  ROOT %p = {printed or shape} parameter(0)\n}}\n"


def _hlo_nested(depth: int) -> str:
    return "(" * depth + "f32[]" + ")" * depth


def _hlo_program(ctx: Context, name: str = "mlp.txt") -> Path:
    """A small program jax lowers here: two dots and a reshape (configurable nodes for rank)."""
    import jax
    import jax.numpy as jnp

    def mlp(w1, w2, x):
        return jnp.sum(jnp.tanh(x @ w1) @ w2).reshape(1)

    text = jax.jit(mlp).lower(jnp.ones((8, 16)), jnp.ones((16, 4)), jnp.ones((5, 8))).compiler_ir("hlo").as_hlo_text()
    return _hlo_file(ctx, name, text)


def _hlo_rank_args(ctx: Context, program: Path, out: Path, *extra: str) -> list[str]:
    return ["rank", "--run", ctx.run_id, str(program), "--submissions-dir", str(ctx.subs), "--work-dir",
            str(ctx.base / "work"), "--out", str(out), "--configs", "5", *extra]


def _hlo_hold_lock(ctx: Context, folder: Path, command: str) -> None:
    """Another process holding ``folder``'s ``--out`` lock, as a second ``command`` would (until the case ends)."""
    ready = ctx.base / f"{command}.lock-held"
    code = ("import sys, time, pathlib; from pipelines.hlo import out_folder_lock\n"
            f"with out_folder_lock(sys.argv[1], {command!r}):\n"
            "    pathlib.Path(sys.argv[2]).touch(); time.sleep(600)\n")
    ctx.background.append(subprocess.Popen([sys.executable, "-c", code, str(folder), str(ready)], cwd=ctx.base,
                                           env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    _hlo_wait_for(ready, 120)


def _hlo_wait_for(path: Path, seconds: float) -> None:
    started = time.perf_counter()
    while not path.exists():
        if time.perf_counter() - started > seconds:
            raise RuntimeError(f"{path} did not appear within {seconds:g} s")
        time.sleep(0.05)


def _hlo_nothing_in(folder: Path, allowed: tuple[str, ...] = ()) -> Callable[[Context, Outcome], str | None]:
    def check(ctx: Context, out: Outcome) -> str | None:
        found = sorted(p.name for p in folder.iterdir() if p.name not in allowed) if folder.exists() else []
        return f"{folder} holds {found}" if found else None
    return check


def _hlo_other_rank_completed(ctx: Context, out: Outcome) -> str | None:
    """The first rank, let go again, finished cleanly, and its rank.json is whole and scores the data it built."""
    for process in ctx.background:
        os.killpg(process.pid, signal.SIGCONT)
        _, err = process.communicate(timeout=600)
        if process.returncode != 0:
            return f"the other rank failed (rc {process.returncode}): {err.strip().splitlines()[-1:]}"
    report = json.loads((ctx.base / "ranked" / "rank.json").read_text())
    layout = report.get("layout") or {}
    if not layout or any(part["configs"] != report["layout_candidates"]["distinct"] for part in layout.values()):
        return "the finished rank's report does not match the candidates it built"
    return None


def _hlo_proto_nested(ctx: Context, depth: int) -> Path:
    """A serialized module whose entry parameter's shape is a tuple nested ``depth`` deep (wire bytes built here)."""
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            byte, n = n & 0x7F, n >> 7
            out.append(byte | (0x80 if n else 0))
            if not n:
                return bytes(out)

    def field(number: int, payload: bytes) -> bytes:
        return varint(number << 3 | 2) + varint(len(payload)) + payload

    shape = b"\x10\x0b"  # element_type F32
    for _ in range(depth):
        shape = b"\x10\x0d" + field(4, shape)  # a tuple of the shape so far
    instruction = field(1, b"p") + field(2, b"parameter") + field(3, shape) + b"\x98\x02\x01"  # id (35) = 1
    computation = field(1, b"main") + field(2, instruction) + b"\x28\x01\x30\x01"  # id 1, root_id 1
    path = ctx.base / "nested.pb"
    path.write_bytes(field(1, b"hostile") + field(2, b"main") + field(3, computation) + b"\x30\x01")
    return path


def issue78_hlo_cases(add: Callable) -> None:
    # 78.3a: XLA's parser accepts, its proto checks refuse: a clean error naming the file (were tracebacks)
    for name, text in {"a dim of 2^62": _hlo_module("f32[4611686018427387904]", "f32[4611686018427387904]{0}"),
                       "a layout {5,0} on a rank-2 shape": _hlo_module("f32[2,3]", "f32[2,3]{5,0}"),
                       "tuples nested 1,000 deep": _hlo_module(_hlo_nested(1000))}.items():
        @add("78.3a", f"featurize HLO with {name}", check=both(says("{base}/hostile.txt"),
                                                                _hlo_nothing_in_out), fast=name.startswith("a dim"))
        def _(ctx, text=text):
            return ["featurize", str(_hlo_file(ctx, "hostile.txt", text)), "--out", str(ctx.base / "out")]

    @add("78.3a", "rank HLO with a layout {5,0} on a rank-2 shape", check=says("{base}/hostile.txt"))
    def _(ctx):
        return _hlo_rank_args(ctx, _hlo_file(ctx, "hostile.txt", _hlo_module("f32[2,3]", "f32[2,3]{5,0}")),
                              ctx.base / "ranked")

    # 78.3b: nesting beyond XLA's recursion (SIGSEGV) and dims beyond any tensor, refused before XLA reads them
    @add("78.3b", "featurize HLO text with tuples nested 20,000 deep", check=both(says("{base}/deep.txt", "nested"),
                                                                                 _hlo_nothing_in_out), fast=True)
    def _(ctx):
        return ["featurize", str(_hlo_file(ctx, "deep.txt", _hlo_module(_hlo_nested(20_000)))), "--out",
                str(ctx.base / "out")]

    @add("78.3b", "featurize a serialized module whose shape is nested 20,000 deep", check=says("{base}/nested.pb"))
    def _(ctx):
        return ["featurize", str(_hlo_proto_nested(ctx, 20_000)), "--out", str(ctx.base / "out")]

    @add("78.3b", "rank HLO text with tuples nested 20,000 deep", check=says("{base}/deep.txt", "nested"))
    def _(ctx):
        return _hlo_rank_args(ctx, _hlo_file(ctx, "deep.txt", _hlo_module(_hlo_nested(20_000))), ctx.base / "ranked")

    # 78.3c: numeric options out of range are usage errors (were tracebacks, or a tile graph the reader refuses)
    for option in (["--seed", "-1"], ["--tile-configs", "-3"], ["--tile-configs", "0"]):
        @add("78.3c", f"featurize {' '.join(option)}", check=both(says(option[0]), _hlo_nothing_in_out),
             fast=option[1] == "0")
        def _(ctx, option=option):
            return ["featurize", str(_hlo_program(ctx)), "--out", str(ctx.base / "out"), *option]

    for option in (["--seed", "-1"], ["--tile-configs", "-3"]):
        @add("78.3c", f"rank {' '.join(option)}", check=says(option[0]))
        def _(ctx, option=option):
            return _hlo_rank_args(ctx, _hlo_program(ctx), ctx.base / "ranked", *option)

    # 78.3d: one --out, two processes: the second is refused, the first's output stays whole
    @add("78.3d", "two ranks into one --out, the second started while the first builds its data",
         check=both(says("another `rank`"), _hlo_other_rank_completed))
    def _(ctx):
        private_work(ctx)
        program = _hlo_program(ctx)
        start_beside(ctx, _hlo_rank_args(ctx, program, ctx.base / "ranked"), 0.0)
        _hlo_wait_for(ctx.base / "ranked" / "data" / ".built-by-rank", 300)
        os.killpg(ctx.background[-1].pid, signal.SIGSTOP)  # frozen mid-build (the check lets it go on)
        return _hlo_rank_args(ctx, _hlo_program(ctx, "other.txt"), ctx.base / "ranked")

    @add("78.3d", "featurize into an --out another featurize holds",
         check=both(says("another `featurize`"), _hlo_nothing_in_out_but_lock("featurize")))
    def _(ctx):
        _hlo_hold_lock(ctx, ctx.base / "out", "featurize")
        return ["featurize", str(_hlo_program(ctx)), "--out", str(ctx.base / "out")]

    @add("78.3d", "records into an --out another records holds",
         check=both(says("another `records`"), _hlo_nothing_in_out_but_lock("records")))
    def _(ctx):
        _hlo_hold_lock(ctx, ctx.base / "out", "records")
        return ["records", str(_hlo_records(ctx)), "--out", str(ctx.base / "out")]

    # 78.3e: hostile tuning records: clean errors, nothing written, never into a data root
    @add("78.3e", "records of a truncated tuning record", check=both(says("{base}/cut.pb"), _hlo_nothing_in_out),
         fast=True)
    def _(ctx):
        data = _hlo_records(ctx).read_bytes()
        return ["records", str(_touch_bytes(ctx.base / "cut.pb", data[: len(data) // 2])), "--out",
                str(ctx.base / "out")]

    @add("78.3e", "records --out the tiny world's data root", check=says("not a data root `records` made"))
    def _(ctx):
        return ["records", str(_hlo_records(ctx)), "--out", str(ctx.data)]

    @add("78.3e", "rank --out the tiny world's data root", check=says("a data root"))
    def _(ctx):
        return _hlo_rank_args(ctx, _hlo_program(ctx), ctx.data)


def _hlo_nothing_in_out(ctx: Context, out: Outcome) -> str | None:
    return _hlo_nothing_in(ctx.base / "out")(ctx, out)


def _hlo_nothing_in_out_but_lock(command: str) -> Callable[[Context, Outcome], str | None]:
    def check(ctx: Context, out: Outcome) -> str | None:
        return _hlo_nothing_in(ctx.base / "out", (f".{command}.lock",))(ctx, out)
    return check


def _touch_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _hlo_records(ctx: Context) -> Path:
    """A small TuningData: one kernel of three tile runs (the program jax lowers here), written by our schema."""
    import jax
    import jax.numpy as jnp

    from pipelines.hlo.schema import tuning_message

    module = jax.jit(lambda x: jnp.tanh(x) * 2).lower(jnp.ones((8, 128))).compiler_ir("hlo")
    record = tuning_message("ModuleTuningData")(module=module.as_serialized_hlo_module_proto(), fingerprint=12345)
    for k in range(3):
        run = record.runs.add(is_default=k == 0)
        run.profile.compute_time_ns = 1000 + 10 * k
        run.op_config.tile_size_config.output_bounds.extend([8, 128 >> k])
    records = tuning_message("TuningData")()
    records.modules.append(record)
    return _touch_bytes(ctx.base / "records.pb", records.SerializeToString())


CLASS_COLUMNS = ("rejected cleanly", "accepted as intended", "traceback", "timeout", "accepted wrongly",
                 "code executed", "too slow", "setup failed", "data lost")


def by_class(rows: list[dict]) -> list[str]:
    """The verdicts counted per item (class), as table lines: the figures an issue's closing note gives."""
    items = list(dict.fromkeys(r["item"] for r in rows))
    lines = ["| item | cases | " + " | ".join(CLASS_COLUMNS) + " |", "|---|---|" + "---|" * len(CLASS_COLUMNS)]
    for item in items:
        mine = [r for r in rows if r["item"] == item]
        lines.append(f"| {item} | {len(mine)} | " + " | ".join(str(sum(r["verdict"] == v for r in mine))
                                                             for v in CLASS_COLUMNS) + " |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
