"""Sizes of stage outputs and garbage collection of the stage cache (``status``, ``gc``).

A stage output is kept while something references it: a run folder's manifest (its ``stages`` index:
data, training and ensemble stages, companions included; predict and re-blend runs too) or, through
its manifest's ``inputs``, a stage that is kept. Everything else that is provably a stage output (a
key-named folder of a pipeline stage, or one whose manifest says so: complete outputs no run uses,
incomplete folders, folders of interrupted stages, and what a killed ``gc`` left) is garbage; a stage
being computed (its work folder locked) is never touched, nor anything else (a symbolic link, a folder
of other files), and gc refuses a work dir mixed with raw data or run folders. Keys are content
fingerprints, so a key referenced by a run recorded elsewhere keeps the same key here too (the safe
side). Runs published from a work dir are recorded in it (``.published-to``), so gc can say where the
runs are that a given ``--submissions-dir`` misses.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pipelines.core.engine import TRASH_PREFIX, list_stages
from pipelines.core.errors import ConfigError, PipelineError
from pipelines.outputs.run_folders import (PUBLISHED_LEDGER, RUN_MANIFEST, is_run_id,  # noqa: F401 (the ledger's name)
                                           manifest_work_dirs, recorded_submissions_dirs, run_manifest_problem)

logger = logging.getLogger(__name__)

_KEY = re.compile(r"[0-9a-f]{16,64}")


def folder_size(path: Path | str) -> int:
    """Bytes of the files under ``path`` (links not followed, each file once)."""
    total, seen = 0, set()
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                info = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_size
    return total


def format_size(size: int) -> str:
    """``812 B``, ``3.4 kB``, ``12.0 MB``, ``1.2 GB`` (powers of 1000)."""
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"  # pragma: no cover


def _keys_in(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        if _KEY.fullmatch(value):
            yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _keys_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _keys_in(item)


_STAGE_KEY = re.compile(r"[0-9a-f]{16}")  # the engine's keys (pipelines.core.engine.fingerprint)
_OUTPUT_STATES = ("complete", "incomplete")  # a key folder (not a work folder of a running or killed stage)


def stage_names() -> frozenset[str]:
    """The stage folder names the pipeline writes: the data stages, the ensemble, and ``train-<model>``
    of every registered model (``train-feature`` is matched as a prefix: ``train-feature.f_x``)."""
    from pipelines.config.registry import MODELS
    from pipelines.data.features import FEATURES
    from pipelines.data.folds import FOLDS
    from pipelines.data.node_arrays import NODE_ARRAYS
    from pipelines.data.prune import PRUNE
    from pipelines.training.ensemble import ENSEMBLE_STAGE
    from pipelines.training.fit import stage_name

    return frozenset({PRUNE.name, FEATURES.name, NODE_ARRAYS.name, FOLDS.name, ENSEMBLE_STAGE,
                      *(stage_name(model) for model in MODELS)})


def is_stage_name(name: str, names: frozenset[str]) -> bool:
    return name in names or name.partition(".")[0] in names and name.startswith("train-")


def data_root_sign(folder: Path) -> str | None:
    """What shows that ``folder`` is a data root (raw TpuGraphs data), or None."""
    from pipelines.synth.world import MARKER

    for sign in ("npz_all", "npz/tile", "npz/layout"):
        if (folder / sign).is_dir():
            return f"it holds {sign}/"
    for sign in ("sample_submission.csv", MARKER):
        if (folder / sign).is_file():
            return f"it holds {sign}"
    return None


def submissions_sign(folder: Path) -> str | None:
    """What shows that ``folder`` holds published run folders, or None."""
    try:
        children = sorted(folder.iterdir())
    except OSError:
        return None
    found = next((c.name for c in children if is_run_id(c.name) and (c / RUN_MANIFEST).is_file()), None)
    return f"it holds the run folder {found}" if found else None


def read_runs(submissions_dirs: Iterable[Path | str]) -> list[tuple[Path, dict]]:
    """``(run folder, manifest)`` of every run folder under ``submissions_dirs`` (folders that are absent
    are skipped). A manifest that cannot be read or is no run manifest is a ConfigError naming it: the
    stages that run keeps would be unknown, and treating them as unused would delete them."""
    runs = []
    for folder in submissions_dirs:
        folder = Path(folder)
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob(f"*/{RUN_MANIFEST}")):
            if path.parent.name.startswith("."):
                continue  # a staging folder (its run is not published yet) or a removal in progress
            try:
                manifest = json.loads(path.read_text(encoding="utf-8"))
                problem = run_manifest_problem(manifest)
            except (OSError, ValueError) as exc:
                problem = f"unreadable: {exc}"
            if problem is not None:
                raise ConfigError(f"gc: {path}: not a readable run manifest ({problem}); gc keeps the stages each "
                                  "run names, so it must read every run manifest: restore it, or remove that run "
                                  f"folder (runs rm {path.parent.name} --submissions-dir {folder}), then run gc again")
            runs.append((path.parent, manifest))
    return runs


def run_references(submissions_dirs: Iterable[Path | str]) -> set[str]:
    """Every stage key named by the ``stages`` index of a run manifest under ``submissions_dirs``
    (a ConfigError for a manifest that cannot be read: :func:`read_runs`)."""
    return {key for _, manifest in read_runs(submissions_dirs) for key in _keys_in(manifest.get("stages"))}


def check_work_dir(work_dir: Path, submissions_dirs: Iterable[Path], runs: list[tuple[Path, dict]]) -> None:
    """A ConfigError when ``work_dir`` is, lies inside, contains or links to a data root or a folder of run
    folders: gc deletes folders of the work dir, and raw data or published runs must never be among them."""
    if not work_dir.is_dir():
        return
    here = work_dir.resolve()
    fix = "keep raw data and run folders outside the work dir (gc deletes only stage outputs, and refuses to guess)"
    for folder in (here, *here.parents):
        sign = data_root_sign(folder)
        if sign:
            where = "is a data root" if folder == here else f"is inside the data root {folder}"
            raise ConfigError(f"gc: the work dir {work_dir} {where} ({sign}); {fix}")
    sign = submissions_sign(here)
    if sign:
        raise ConfigError(f"gc: the work dir {work_dir} is a submissions folder ({sign}); {fix}")
    named = {Path(d).resolve(): "the submissions folder" for d in submissions_dirs}
    for _, manifest in runs:
        for field in (manifest.get("data_root"), (manifest.get("submission") or {}).get("validated_against")):
            if isinstance(field, str) and field:
                named.setdefault(Path(field).resolve(), "the data root")
    for path, what in named.items():
        if path == here or here in path.parents:
            raise ConfigError(f"gc: the work dir {work_dir} contains {what} {path}; {fix}")
    for entry in sorted(here.iterdir()):
        target = entry.resolve() if entry.is_symlink() else entry
        if not target.is_dir():
            continue
        sign = data_root_sign(target) or submissions_sign(target)
        what = named.get(target)
        if sign is None and what is None:
            continue
        kind = what or ("a data root" if data_root_sign(target) else "a submissions folder")
        how = f"holds a link, {entry.name}, to {kind} {target}" if entry.is_symlink() else f"contains {kind} {entry}"
        raise ConfigError(f"gc: the work dir {work_dir} {how} ({sign or 'a run records it'}); {fix}")


def garbage(rows: list[dict], referenced: set[str]) -> list[dict]:
    """The ``list_stages`` rows to remove: every folder that is not running and whose key is neither
    referenced nor an input (transitively) of a referenced stage. A referenced stage folder is kept even
    when damaged or incomplete (the run that names it decides), and its inputs with it: read from its
    manifest, which must then be readable (a ConfigError names it otherwise)."""
    kept = set(referenced)
    outputs = [r for r in rows if r["state"] in _OUTPUT_STATES]
    while True:
        more = {k for r in outputs if r["key"] in kept for k in _keys_in(_inputs(r))} - kept
        if not more:
            break
        kept |= more
    return [r for r in rows if r["state"] != "running" and not (r["state"] in _OUTPUT_STATES and r["key"] in kept)]


def _inputs(row: dict) -> Any:
    if row["complete"]:
        return row["inputs"]
    path = Path(row["path"]) / "manifest.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        return manifest["inputs"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"gc: {path}: unreadable stage manifest ({type(exc).__name__}: {exc}), and a run uses "
                          f"this {row['stage']} output: gc cannot tell which stages it was made from, so it keeps "
                          "everything; re-run that run (which recomputes the stage), or remove the run, then run gc "
                          "again") from None


def _candidates(work_dir: Path) -> list[dict]:
    """The ``list_stages`` rows gc may consider (links never followed): key-named folders, and work folders
    of a key, in folders named like a pipeline stage or holding a complete stage output; plus the
    ``.trash-*`` folders a killed removal left there (state ``trash``)."""
    names = stage_names()
    rows = list_stages(work_dir, follow_links=False)
    proven = {r["stage"] for r in rows if r["complete"]}
    chosen = [r for r in rows if _STAGE_KEY.fullmatch(r["key"]) and (is_stage_name(r["stage"], names)
                                                                     or r["stage"] in proven)
              and (r["state"] not in _OUTPUT_STATES or Path(r["path"]).name == r["key"])]
    for stage in sorted({r["stage"] for r in rows} | {n for n in names if (work_dir / n).is_dir()}):
        folder = work_dir / stage
        if folder.is_symlink() or not folder.is_dir():
            continue
        for entry in sorted(folder.iterdir()):
            if entry.name.startswith(TRASH_PREFIX) and not entry.is_symlink() and entry.is_dir():
                chosen.append({"stage": stage, "key": entry.name[len(TRASH_PREFIX):], "state": "trash",
                               "complete": False, "path": str(entry), "inputs": {}})
    return chosen


def _runs_using(work_dir: Path, runs: list[tuple[Path, dict]], present: set[str]) -> list[Path]:
    """The run folders among ``runs`` that name a stage key present in ``work_dir`` or record it as theirs."""
    here = work_dir.resolve()
    return [folder for folder, manifest in runs
            if here in {p.resolve() for p in manifest_work_dirs(manifest)}
            or present & set(_keys_in(manifest.get("stages")))]


def _runs_elsewhere(work_dir: Path, given: list[Path], present: set[str]) -> tuple[list[str] | None, dict[str, str]]:
    """The submissions folders the work dir's ledger records (None: it keeps none) and, of those not among
    ``given``, the ones holding a run that uses it: {folder: the first such run (or why it may)}."""
    recorded = recorded_submissions_dirs(work_dir)
    chosen = {Path(d).resolve() for d in given}
    elsewhere: dict[str, str] = {}
    for folder in recorded or []:
        if Path(folder).resolve() in chosen or not Path(folder).is_dir():
            continue
        try:
            users = _runs_using(work_dir, read_runs([folder]), present)
        except ConfigError:
            elsewhere[folder] = "one of its run manifests is unreadable"
            continue
        if users:
            elsewhere[folder] = f"run {users[0].name}" + (f" and {len(users) - 1} more" if len(users) > 1 else "")
    return recorded, elsewhere


def collect(work_dir: Path | str, submissions_dirs: Iterable[Path | str], *, delete: bool = False) -> list[dict]:
    """The garbage of ``work_dir`` (rows of ``list_stages`` with ``size`` in bytes), removed when ``delete``:
    each folder is first renamed out of the cache's names (so no reader sees a half-deleted output), then
    deleted; a removal cut short leaves a ``.trash-*`` folder the next ``gc`` lists and removes.

    Refused with a ConfigError, before anything is removed (the dry run too, for the first two):

    * the work dir is, lies in, contains or links to a data root or run folders (:func:`check_work_dir`);
    * a run manifest under ``submissions_dirs``, or the manifest of a stage a run uses, cannot be read;
    * with ``delete``: runs recorded as published from this work dir to another submissions folder use its
      stages (the message names it), or no given run uses it and it records no submissions folder at all
      (the dry run warns instead). A missing submissions folder is a PipelineError with ``delete``.
    """
    work_dir = Path(work_dir)
    given = [Path(d) for d in submissions_dirs]
    missing = [d for d in given if not d.is_dir()]
    if missing and delete:  # deleting everything because a path was mistyped would be a loss
        raise PipelineError(f"{', '.join(map(str, missing))}: no such submissions folder; gc --delete keeps the "
                            "stages of the runs there, so it must exist")
    runs = read_runs(given)
    check_work_dir(work_dir, given, runs)
    rows = _candidates(work_dir)
    present = {r["key"] for r in rows if r["state"] in _OUTPUT_STATES}
    recorded, elsewhere = _runs_elsewhere(work_dir, given, present) if work_dir.is_dir() else (None, {})
    problem = None
    if elsewhere:
        listed = "; ".join(f"{folder} ({why})" for folder, why in elsewhere.items())
        problem = (f"runs published from the work dir {work_dir} to another submissions folder use its stages: "
                   f"{listed}; pass each with --submissions-dir as well (repeatable), or remove those runs first")
    elif recorded is None and any(r["complete"] for r in rows) and not _runs_using(work_dir, runs, present):
        problem = (f"no run under {', '.join(map(str, given))} uses a stage of the work dir {work_dir}, and it "
                   "records no submissions folder its runs were published to: removing every stage could remove "
                   "the trained models of runs kept elsewhere; pass --submissions-dir where its runs are, or, "
                   f"to drop the whole cache, delete the folder {work_dir} itself")
    if problem and delete:
        raise ConfigError(f"gc --delete refused: {problem}")
    if problem:
        logger.warning(f"warning: {problem}")
    referenced = {key for _, manifest in runs for key in _keys_in(manifest.get("stages"))}
    rows = garbage(rows, referenced)
    for row in rows:
        path = Path(row["path"])
        row["size"] = folder_size(path)
        if not delete:
            continue
        if row["state"] == "trash":
            shutil.rmtree(path, ignore_errors=True)
            continue
        trash = path.parent / f"{TRASH_PREFIX}gc-{row['key']}-{os.urandom(4).hex()}"
        try:
            os.rename(path, trash)
        except OSError:
            continue
        shutil.rmtree(trash, ignore_errors=True)
    return rows


def format_garbage(rows: list[dict], *, deleted: bool) -> str:
    """The table ``gc`` prints: stage, key, state, size, then the total and what to do next."""
    if not rows:
        return "nothing to collect: every stage output is referenced by a run (or by a stage a run uses)"
    lines = [f"{'STAGE':<14} {'KEY':<18} {'STATE':<12} {'SIZE':>10}"]
    lines += [f"{r['stage']:<14} {r['key']:<18} {r['state']:<12} {format_size(r['size']):>10}" for r in rows]
    total = format_size(sum(r["size"] for r in rows))
    if deleted:
        lines.append(f"removed {len(rows)} stage folder(s), {total}")
    else:
        lines.append(f"{len(rows)} stage folder(s) no run references, {total} (dry run: nothing removed; "
                     "add --delete to remove them)")
    return "\n".join(lines)
