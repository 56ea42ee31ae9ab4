"""The cases of issue 78's attack for the replay (``python -m benchmarks.attack --item 78``), less its item 3
(featurize/rank on hostile HLO, replayed with those commands).

Classes (the case's ``item``):

* 78.1 gc deletes only stage outputs no run needs (a check that finds run folders, trained stages or raw
  data gone says "data lost", a verdict of its own);
* 78.2 ``runs rm`` and run names: text that names two runs, names shaped like run-ids;
* 78.4 ``submit`` and ``submissions sync`` against hostile Kaggle answers and records (a fake ``kaggle``
  package on the case's PYTHONPATH answers and logs uploads);
* 78.5 MLflow stores: checked in seconds, before a run trains; ``file:`` stores; a second ``runs track``;
* 78.6 ``--set`` and config values: linear time, no traceback;
* 78.L leftovers of the previous attack: ``LOKY_MAX_CPU_COUNT=abc``, a run manifest without ``work_dir``,
  a resumed GNN fold's saved models.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

from benchmarks.attack import (FAST, REPO, Context, Outcome, both, kill_when_checkpointed, no_more_than,
                               nothing_written, private_work, says, warns)

DATA_LOST = "data lost"  # a check's problem starting so is judged "data lost"

FAKE_KAGGLE = '''
import json, os, types


class KaggleApi:
    """Answers from $FAKE_KAGGLE_PAGES (a JSON list of pages); uploads logged to $FAKE_KAGGLE_LOG."""

    def authenticate(self):
        pass

    def competition_submissions(self, competition, group=None, sort=None, page_number=1, page_token="", page_size=20):
        pages = json.loads(open(os.environ["FAKE_KAGGLE_PAGES"]).read())
        page = pages[page_number - 1] if page_number <= len(pages) else []
        if isinstance(page, list):
            return [types.SimpleNamespace(**item) if isinstance(item, dict) else item for item in page]
        return page

    def competition_submit(self, file_name, message, competition, quiet=False):
        with open(os.environ["FAKE_KAGGLE_LOG"], "a") as log:
            log.write(json.dumps([file_name, message]) + "\\n")
        return types.SimpleNamespace(message="Successfully submitted to Predict AI Model Runtime")
'''


def fake_kaggle(ctx: Context, pages: list | None = None) -> None:
    """Put the fake kaggle package on this case's PYTHONPATH, answering ``pages``."""
    package = ctx.base / "fake-kaggle" / "kaggle" / "api"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "kaggle_api_extended.py").write_text(FAKE_KAGGLE)
    (ctx.base / "pages.json").write_text(json.dumps(pages or []))
    ctx.env.update({"PYTHONPATH": f"{ctx.base / 'fake-kaggle'}{os.pathsep}{REPO}", "KAGGLE_USERNAME": "attacker",
                    "KAGGLE_KEY": "not-a-key", "FAKE_KAGGLE_PAGES": str(ctx.base / "pages.json"),
                    "FAKE_KAGGLE_LOG": str(ctx.base / "uploads.log"), "HOME": str(ctx.base)})


def no_upload(ctx: Context, out: Outcome) -> str | None:
    log = ctx.base / "uploads.log"
    return f"uploaded: {log.read_text().strip()}" if log.exists() and log.read_text().strip() else None


def kaggle_item(description: str, score) -> dict:
    return {"ref": 1, "date": "2026-12-01T12:00:00", "description": description, "file_name": "submission.csv",
            "public_score": score, "private_score": None, "status": "COMPLETE", "error_description": None}


def run_stages(ctx: Context, work: Path) -> list[Path]:
    """The training and ensemble stage folders of the case's run, in ``work`` (read from the baseline's own
    run folder, which no case touches)."""
    manifest = json.loads((ctx.work.parent / "subs" / ctx.run_id / "manifest.json").read_text())
    folders = []
    for entry in manifest["stages"].values():
        folders += [work / ref["stage"] / ref["key"] for ref in entry["train"].values()]
        folders.append(work / "ensemble" / entry["ensemble"])
    return folders


def kept(*places: Callable[[Context], list[Path]]) -> Callable[[Context, Outcome], str | None]:
    """A check: every path ``places`` name still exists (else "data lost", naming the first gone)."""
    def check(ctx: Context, out: Outcome) -> str | None:
        gone = [p for place in places for p in place(ctx) if not p.exists()]
        return f"{DATA_LOST}: {len(gone)} gone, e.g. {gone[0]}" if gone else None
    return check


def the_run(ctx: Context) -> list[Path]:
    return [ctx.subs / ctx.run_id / "manifest.json", ctx.subs / ctx.run_id / "submission.csv"]


def the_raw_data(ctx: Context) -> list[Path]:
    return [ctx.data / "npz_all" / "npz" / "tile" / "xla" / "train", ctx.data / "labels" / "npz",
            ctx.data / "sample_submission.csv"]


def the_stages(ctx: Context) -> list[Path]:
    return run_stages(ctx, ctx.base / "work")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def same_fold_models(ctx: Context, out: Outcome) -> str | None:
    """The resumed stage's saved fold models are the uninterrupted (``clean``) stage's bytes."""
    resumed = sorted((ctx.base / "work" / "train-gnn").glob("*/models/*.pt"))
    clean = {p.relative_to(ctx.base / "clean"): p for p in (ctx.base / "clean" / "train-gnn").glob("*/models/*.pt")}
    if not resumed or len(resumed) != len(clean):
        return f"expected the same fold models, found {len(resumed)} resumed and {len(clean)} clean"
    differ = [p.name for p in resumed if clean.get(p.relative_to(ctx.base / "work")) is None
              or clean[p.relative_to(ctx.base / "work")].read_bytes() != p.read_bytes()]
    return f"resumed fold models differ in bytes: {differ}" if differ else None


def issue78_cases(add: Callable) -> None:
    # data lost is checked first: it is the verdict whatever the message said
    gc_refused = lambda *words: both(kept(the_run, the_raw_data, the_stages), says(*words))  # noqa: E731

    # 78.1 gc never loses data
    @add("78.1", "gc --delete with --work-dir set to the data root", check=gc_refused("data root"), fast=True)
    def _(ctx):
        private_work(ctx)
        return ["gc", "--work-dir", str(ctx.data), "--submissions-dir", str(ctx.subs), "--delete"]

    @add("78.1", "gc --delete with a work dir holding the data root and the submissions", check=gc_refused(
        "contains"), fast=True)
    def _(ctx):
        private_work(ctx)
        return ["gc", "--work-dir", str(ctx.base), "--submissions-dir", str(ctx.subs), "--delete"]

    @add("78.1", "gc --delete with a symlink to the data root inside the work dir", check=gc_refused("link"),
         fast=True)
    def _(ctx):
        (private_work(ctx) / "raw").symlink_to(ctx.data)
        return ["gc", "--work-dir", str(ctx.base / "work"), "--submissions-dir", str(ctx.subs), "--delete"]

    @add("78.1", "gc --delete with an existing submissions folder holding none of the work dir's runs",
         check=gc_refused("--submissions-dir"), fast=True)
    def _(ctx):
        private_work(ctx)
        (ctx.base / "elsewhere").mkdir()
        return ["gc", "--work-dir", str(ctx.base / "work"), "--submissions-dir", str(ctx.base / "elsewhere"),
                "--delete"]

    @add("78.1", "gc --delete with the run's manifest.json garbled", check=gc_refused("manifest.json"), fast=True)
    def _(ctx):
        private_work(ctx)
        (ctx.subs / ctx.run_id / "manifest.json").write_text("{ garbled")
        return ["gc", "--work-dir", str(ctx.base / "work"), "--submissions-dir", str(ctx.subs), "--delete"]

    @add("78.1", "run with the data root inside the work dir", check=says("contains the data root"))
    def _(ctx):
        inside = ctx.base / "work" / "raw"
        shutil.copytree(ctx.data, inside, symlinks=True)
        return ["run", "--data-root", str(inside), "--work-dir", str(ctx.base / "work"), "--submissions-dir",
                str(ctx.base / "subs"), "--models", "random", *FAST]

    @add("78.1", "run with the submissions folder inside the work dir", check=both(
        says("inside the work dir"), nothing_written))
    def _(ctx):
        return ["run", "--data-root", str(ctx.data), "--work-dir", str(ctx.base / "work"), "--submissions-dir",
                str(ctx.base / "work" / "subs"), "--models", "random", *FAST]

    # 78.2 runs rm and names
    def two_runs(ctx: Context, name: str, second_id: str) -> None:
        shutil.copytree(ctx.subs / ctx.run_id, ctx.subs / second_id)
        path = ctx.subs / ctx.run_id / "manifest.json"
        manifest = json.loads(path.read_text())
        path.write_text(json.dumps({**manifest, "name": name}))

    @add("78.2", "runs rm NAME where NAME is also a prefix of another run's id", check=both(
        kept(the_run, lambda c: [c.subs / "20261203T000000Z-cafe0001"]), says("names 2 runs")), fast=True)
    def _(ctx):
        two_runs(ctx, "cafe", "20261203T000000Z-cafe0001")
        return ["runs", "rm", "cafe", "--submissions-dir", str(ctx.subs), "--yes"]

    @add("78.2", "runs rm NAME where two runs have that name", check=both(kept(the_run), says("names 2 runs")),
         fast=True)
    def _(ctx):
        two_runs(ctx, "best", "20261203T000000Z-00000002")
        path = ctx.subs / "20261203T000000Z-00000002" / "manifest.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "name": "best"}))
        return ["runs", "rm", "best", "--submissions-dir", str(ctx.subs), "--yes"]

    @add("78.2", "run --name shaped like a run-id", check=both(says("looks like a run-id"), nothing_written))
    def _(ctx):
        return ["run", "--data-root", str(ctx.data), "--work-dir", str(ctx.base / "work"), "--submissions-dir",
                str(ctx.subs), "--models", "random", *FAST, "--name", ctx.run_id[:11]]

    # 78.4 submit and submissions sync
    for label, page in (("an integer page", 7), ("a string page", "20261201T000000Z CV 0.5")):
        @add("78.4", f"submissions sync with Kaggle answering {label}", check=both(
            says("not a list of submissions"), lambda c, o: "leaderboard.json written" if list(
                c.subs.glob("*/leaderboard.json")) else None), fast=True)
        def _(ctx, page=page):
            fake_kaggle(ctx, [page])
            return ["submissions", "sync", "--submissions-dir", str(ctx.subs)]

    @add("78.4", "submissions sync with NaN and infinite public scores", expect="accept", check=both(
        warns("not a finite number"), lambda c, o: _strict_json(c.subs / c.run_id / "leaderboard.json")), fast=True)
    def _(ctx):
        fake_kaggle(ctx, [[kaggle_item(f"{ctx.run_id} CV 0.5", "NaN"), kaggle_item(f"{ctx.run_id} CV 0.5", "inf")]])
        return ["submissions", "sync", "--submissions-dir", str(ctx.subs)]

    @add("78.4", "submit a run whose submitted.json is garbled", check=both(says("submitted.json"), no_upload),
         fast=True)
    def _(ctx):
        fake_kaggle(ctx)
        (ctx.subs / ctx.run_id / "submitted.json").write_text("{ garbled")
        return ["submit", ctx.run_id, "--submissions-dir", str(ctx.subs), "--allow-synthetic"]

    @add("78.4", "submit a file without --data-root", check=both(says("--data-root"), no_upload), fast=True)
    def _(ctx):
        fake_kaggle(ctx)
        return ["submit", str(ctx.csv), "-m", "unchecked"]

    # 78.5 MLflow
    @add("78.5", "runs track to a tracking server where nothing listens", check=both(
        says("MLflow store"), no_more_than(30)), fast=True)
    def _(ctx):
        return ["runs", "track", ctx.run_id, "--submissions-dir", str(ctx.subs), "--uri",
                f"http://127.0.0.1:{free_port()}"]

    @add("78.5", "runs track to a SQLite store that is not a database", check=both(
        says("MLflow store"), no_more_than(30)), fast=True)
    def _(ctx):
        (ctx.base / "garbage.db").write_bytes(b"not a database " * 100)
        return ["runs", "track", ctx.run_id, "--submissions-dir", str(ctx.subs), "--uri",
                f"sqlite:///{ctx.base / 'garbage.db'}"]

    @add("78.5", "run --track mlflow with a store that cannot be opened", check=both(
        says("MLflow store"), nothing_written, no_more_than(60)))
    def _(ctx):
        return ["run", "--data-root", str(ctx.data), "--work-dir", str(ctx.base / "work"), "--submissions-dir",
                str(ctx.base / "new-subs"), "--models", "random", *FAST, "--track", "mlflow", "--track-uri",
                f"http://127.0.0.1:{free_port()}"]

    @add("78.5", "runs track to a file: store (documented)", expect="accept", check=lambda c, o: None if (
        c.subs / c.run_id / "tracking.json").is_file() else "no tracking.json")
    def _(ctx):
        return ["runs", "track", ctx.run_id, "--submissions-dir", str(ctx.subs), "--uri", f"file:{ctx.base / 'mlruns'}"]

    @add("78.5", "runs track of a run tracked before updates its MLflow run", expect="accept",
         check=lambda c, o: _same_mlflow_run(c))
    def _(ctx):
        import subprocess
        import sys

        uri = f"sqlite:///{ctx.base / 'mlflow.db'}"
        first = subprocess.run([sys.executable, "-m", "pipelines", "runs", "track", ctx.run_id, "--submissions-dir",
                                str(ctx.subs), "--uri", uri], capture_output=True, text=True, cwd=ctx.base,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
        if first.returncode != 0:
            raise RuntimeError(f"the first runs track failed: {first.stderr.strip()[-300:]}")
        (ctx.base / "first.json").write_text((ctx.subs / ctx.run_id / "tracking.json").read_text())
        return ["runs", "track", ctx.run_id, "--submissions-dir", str(ctx.subs), "--uri", uri]

    # 78.6 --set and config values
    @add("78.6", "config --set with a 100 kB key", check=both(says("run."), no_more_than(10)), fast=True)
    def _(ctx):
        return ["config", "--set", "run." + "a" * 100_000 + "=1"]

    @add("78.6", "config --set with a 100 kB value", check=both(says("run.n_jobs"), no_more_than(10)), fast=True)
    def _(ctx):
        return ["config", "--set", "run.n_jobs=" + "x" * 100_000 + " y"]

    @add("78.6", "config --set with arrays nested 5,000 deep", check=says("nested too deep"), fast=True)
    def _(ctx):
        return ["config", "--set", "run.seeds=" + "[" * 5000 + "]" * 5000]

    @add("78.6", "config --set with a 5,000-digit integer", check=says("too many digits"), fast=True)
    def _(ctx):
        return ["config", "--set", "run.n_jobs=" + "7" * 5000]

    # 78.L leftovers of the previous attack
    @add("78.L", "prepare with LOKY_MAX_CPU_COUNT=abc and two jobs", expect="accept",
         check=warns("LOKY_MAX_CPU_COUNT"))
    def _(ctx):
        ctx.env["LOKY_MAX_CPU_COUNT"] = "abc"
        return ["prepare", "--data-root", str(ctx.data), "--work-dir", str(ctx.base / "work"), "--collections",
                "tile:xla", *FAST, "--set", "run.n_jobs=2"]

    for command in ("report", "ensemble"):
        @add("78.L", f"{command} of a run whose manifest has no work_dir", check=says("--work-dir", "no work dir"),
             fast=True)
        def _(ctx, command=command):
            path = ctx.subs / ctx.run_id / "manifest.json"
            manifest = json.loads(path.read_text())
            del manifest["work_dir"]
            path.write_text(json.dumps(manifest))
            if command == "report":
                return ["report", ctx.run_id, "--submissions-dir", str(ctx.subs), "--out", str(ctx.base / "r.html")]
            return ["ensemble", "--runs", ctx.run_id, "--submissions-dir", str(ctx.subs)]

    @add("78.L", "a GNN fold killed after a checkpoint, resumed: its saved models are the uninterrupted bytes",
         expect="accept", check=same_fold_models)
    def _(ctx):
        import subprocess
        import sys

        def args(work: Path) -> list[str]:
            return ["train", "--model", "gnn", "--collections", "tile:xla", "--data-root", str(ctx.data),
                    "--work-dir", str(work), "--config", "smoke", "--set", "gnn.epochs=40"]

        subprocess.run([sys.executable, "-m", "pipelines", *args(ctx.base / "clean")], check=True, capture_output=True,
                       cwd=ctx.base, env={**os.environ, "PYTHONPATH": str(REPO)})
        if kill_when_checkpointed(ctx, args(ctx.base / "work"), 300) is None:
            raise RuntimeError("no checkpoint was written before the fit finished")
        return args(ctx.base / "work")


def _strict_json(path: Path) -> str | None:
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    try:
        record = json.loads(path.read_text(), parse_constant=refuse)
    except (OSError, ValueError) as exc:
        return f"{path.name}: {exc}"
    scores = [s.get("public_score") for s in record.get("submissions", [])]
    return None if scores and all(s is None for s in scores) else f"scores kept: {scores}"


def _same_mlflow_run(ctx: Context) -> str | None:
    first = json.loads((ctx.base / "first.json").read_text())["mlflow_run_id"]
    second = json.loads((ctx.subs / ctx.run_id / "tracking.json").read_text())["mlflow_run_id"]
    return None if first == second else f"a second MLflow run {second} (first {first})"
