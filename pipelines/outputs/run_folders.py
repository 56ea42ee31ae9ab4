"""Run folders under a submissions folder: their ids, publishing one atomically, tidying what an
interrupted publish left, and reading a run's manifest.

A run folder ``<submissions_dir>/<run-id>/`` holds ``submission.csv`` and ``manifest.json`` (and,
later, ``report.html``, ``evaluation.json``, ``submitted.json``). It is published in one rename of a
locked staging folder, so it is seen complete or not at all, and an existing folder is never replaced.
Only the standard library and the engine are imported at module level (``runs list`` imports this).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipelines.core.engine import TRASH_PREFIX, fingerprint, write_json_atomic
from pipelines.core.errors import ConfigError, FormatError, PipelineError

logger = logging.getLogger(__name__)

SUBMISSION_FILE = "submission.csv"
RUN_MANIFEST = "manifest.json"
RUN_ID_ATTEMPTS = 100  # suffixes tried when two runs of one config start in the same second
_RUN_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{8}(-\d+)?")
# The file in a work dir listing the submissions folders its runs were published to, one absolute path a
# line (appended before each run folder appears): gc reads it to find runs that use the work dir elsewhere.
PUBLISHED_LEDGER = ".published-to"
# Files an interrupted publish of an earlier version could leave in a run folder (never a submission).
_PUBLISH_DEBRIS = re.compile(r"\.(submission\.csv\.draft|(submission\.csv|manifest\.json)\..*\.tmp|lock)")


def is_run_id(name: str) -> bool:
    """True for a run folder's name (``20261122T120000Z-1a2b3c4d``, ``...-2``)."""
    return bool(_RUN_ID.fullmatch(name))


def new_run_id(payload: Any, now: datetime) -> str:
    """``<UTC time>-<8 hex of the payload's fingerprint>`` (config and stage keys of the run)."""
    return f"{now.astimezone(timezone.utc):%Y%m%dT%H%M%SZ}-{fingerprint(payload)[:8]}"


def _publish_run_folder(staging: Path, submissions_dir: Path, base: str, manifest: dict[str, Any]) -> tuple[str, Path]:
    """Write the manifest (with its run-id) into the finished staging folder and rename it to
    ``<base>`` (or ``<base>-N`` when taken): one atomic step, so a run folder is seen complete or not
    at all; an existing non-empty folder (or file) is never replaced."""
    for attempt in range(RUN_ID_ATTEMPTS):
        run_id = base if attempt == 0 else f"{base}-{attempt + 1}"
        target = submissions_dir / run_id
        if target.exists() or target.is_symlink():
            continue
        manifest["run_id"] = run_id
        write_json_atomic(staging / RUN_MANIFEST, manifest)
        try:
            os.rename(staging, target)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                continue  # taken meanwhile by a concurrent run
            raise
        return run_id, target
    raise PipelineError(f"{submissions_dir}: could not create a new run folder for {base} (all suffixes taken)")


def record_submissions_dir(work_dirs: Sequence[Path | str], submissions_dir: Path | str) -> None:
    """Append ``submissions_dir`` to the :data:`PUBLISHED_LEDGER` of each work dir (once): a run about to be
    published there uses stages of these work dirs. One short ``O_APPEND`` write per work dir, so runs
    publishing at once never lose each other's line. A work dir that cannot be written is warned about:
    gc then refuses to delete there without the runs it cannot find."""
    line = str(Path(submissions_dir).resolve())
    for work_dir in dict.fromkeys(Path(w) for w in work_dirs):
        if not work_dir.is_dir():
            continue  # a work dir that is gone holds no stage gc could remove
        try:
            if line in (recorded_submissions_dirs(work_dir) or []):
                continue
            fd = os.open(work_dir / PUBLISHED_LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (line + "\n").encode("utf-8", "surrogateescape"))
            finally:
                os.close(fd)
        except (OSError, PipelineError) as exc:
            logger.warning(f"warning: {work_dir / PUBLISHED_LEDGER}: cannot record that runs of this work dir are "
                           f"published to {line} ({getattr(exc, 'strerror', None) or exc}); gc of this work dir "
                           f"will need --submissions-dir {line}")


def recorded_submissions_dirs(work_dir: Path | str) -> list[str] | None:
    """The submissions folders :func:`record_submissions_dir` recorded for ``work_dir`` (absolute paths, in
    order, each once), or None when it records none (a work dir no run was published from, or one made
    by an earlier version, which kept no such record)."""
    try:
        text = (Path(work_dir) / PUBLISHED_LEDGER).read_bytes().decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PipelineError(f"{Path(work_dir) / PUBLISHED_LEDGER}: unreadable ({exc.strerror or exc})") from None
    return list(dict.fromkeys(line for line in text.splitlines() if line.startswith("/")))


def manifest_work_dirs(manifest: Mapping[str, Any]) -> list[Path]:
    """The work dirs whose stages a run manifest names: its own ``work_dir`` and those its training stage
    references record (a re-blend reads stages of several work dirs)."""
    places = [manifest.get("work_dir")]
    stages = manifest.get("stages")
    for entry in stages.values() if isinstance(stages, Mapping) else ():
        train = entry.get("train") if isinstance(entry, Mapping) else None
        for ref in train.values() if isinstance(train, Mapping) else ():
            places.append(ref.get("work_dir") if isinstance(ref, Mapping) else None)
    return list(dict.fromkeys(Path(p) for p in places if isinstance(p, str) and p))


def tidy_submissions(submissions_dir: Path | str) -> list[dict[str, Any]]:
    """Clean what interrupted publishes left in ``submissions_dir`` and list the incomplete run folders.

    Removed: staging folders of dead runs (``.tmp-*`` whose lock nobody holds) and run folders that
    hold only publishing debris (no CSV, no manifest). Kept, and listed with ``state="incomplete"``:
    a run folder with files but no manifest (e.g. a CSV): it is never deleted, never counted as a run.
    """
    from pipelines.core.engine import clean_abandoned

    submissions_dir = Path(submissions_dir)
    if not submissions_dir.is_dir():
        return []
    clean_abandoned(submissions_dir)
    incomplete = []
    for entry in sorted(submissions_dir.iterdir()):
        if not _RUN_ID.fullmatch(entry.name) or entry.is_symlink() or not entry.is_dir():
            continue
        if (entry / RUN_MANIFEST).is_file():
            continue
        names = sorted(child.name for child in entry.iterdir())
        if all(_PUBLISH_DEBRIS.fullmatch(name) for name in names):
            shutil.rmtree(entry, ignore_errors=True)
            continue
        incomplete.append({"run_id": entry.name, "path": str(entry), "state": "incomplete", "files": names})
    return incomplete


def publish_submission(rows: Mapping[str, Sequence[int]], manifest: dict[str, Any], *, data_root: Path,
                       submissions_dir: Path,
                       split: str = "test") -> tuple[str, Path, dict[str, Any]]:
    """Validate ``rows`` against the test split of ``data_root``, then publish them with the manifest.

    Returns ``(run_id, submission path, final manifest)``. The CSV and the manifest are written and
    validated in a locked staging folder ``.tmp-run-*`` of ``submissions_dir``, which is then renamed
    to the new run folder: a run folder always holds both, a killed publish leaves only a staging
    folder that the next publish (or ``status``) removes.
    """
    from pipelines.core.engine import make_locked_folder
    from pipelines.data.submission import format_submission, validate_submission, write_submission

    text = format_submission(rows)
    try:
        submissions_dir.mkdir(parents=True, exist_ok=True)
        tidy_submissions(submissions_dir)
        staging = make_locked_folder(submissions_dir, "run")
    except OSError as exc:
        raise PipelineError(f"{submissions_dir}: cannot create a run folder: {exc.strerror or exc}") from None
    base = new_run_id({"config": manifest.get("config"), "stages": manifest.get("stages")}, datetime.now(timezone.utc))
    try:
        path = write_submission(staging.path / SUBMISSION_FILE, rows)
        count = validate_submission(path, data_root, split=split)
        manifest = {**manifest, "run_id": base, "data_world": world_origin(data_root),
                    "submission": {"file": SUBMISSION_FILE, "rows": count, "validated_against": str(data_root),
                                   "sha256": hashlib.sha256(text.encode("ascii")).hexdigest()}}
        record_submissions_dir(manifest_work_dirs(manifest), submissions_dir)  # before the run can be seen
        try:
            run_id, run_dir = _publish_run_folder(staging.path, submissions_dir, base, manifest)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM):
                raise
            raise PipelineError(f"{submissions_dir}: cannot write the run folder: {exc.strerror or exc}") from None
    except BaseException:
        staging.discard()
        raise
    staging.release(run_dir)
    path = run_dir / SUBMISSION_FILE
    logger.info(f"submission {path}: {count} rows, valid")
    return run_id, path, manifest


def resolve_run_id(submissions_dir: Path | str, text: str) -> str:
    """The run folder ``text`` names under ``submissions_dir``: its full run-id, or a unique prefix of
    the run-id or of its 8-hex part (``e155685e`` for ``20261122T120000Z-e155685e``), or the ``name``
    a run was given (``run --name``). Anything else (unknown) is returned unchanged, so the caller's
    own message about a missing run applies. Text that names more than one run, in any of these ways
    (a name that is also a prefix of another run's id, two runs of one name...), is a PipelineError
    listing the candidates: a command that removes or uploads a run must never pick one of them."""
    submissions_dir = Path(submissions_dir)
    if not text or not submissions_dir.is_dir() or Path(text).name != text or text in (".", ".."):
        return text
    exact = (submissions_dir / text).is_dir()
    names = sorted(e.name for e in submissions_dir.iterdir() if e.is_dir() and not e.name.startswith("."))
    found = [text] if exact else [n for n in names if n.startswith(text) or n.partition("-")[2].startswith(text)]
    for name in names:
        if name in found:
            continue
        try:
            manifest = json.loads((submissions_dir / name / RUN_MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(manifest, dict) and manifest.get("name") == text:
            found.append(name)
    if len(found) > 1:
        raise PipelineError(f"{text!r} names {len(found)} runs under {submissions_dir}: {', '.join(found[:8])}"
                            + (" ..." if len(found) > 8 else "") + " (by run-id, prefix or name); give more of "
                            "the run-id")
    return found[0] if found else text


# What ``run --name`` refuses: a name that could be read as a run-id or a prefix of one (digits first, in
# the shape of ``20261122T120000Z-1a2b3c4d-2``) or as the 8-hex part of one or a prefix of it (``a``, ``beef``:
# one run in sixteen has a hex part starting with ``a``, and the name would then name two runs).
_ID_LIKE_NAME = re.compile(r"\d{1,8}|\d{8}T\d{0,6}|\d{8}T\d{6}Z(-([0-9a-f]{0,8}(-\d*)?)?)?|[0-9a-f]{1,8}(-\d+)?")


def check_run_name(name: str) -> None:
    """A ConfigError for a ``run --name`` that looks like a run-id (a prefix of one, or its hex part):
    every command that takes a run-id takes a name too, and such a name would also match runs by id."""
    if _ID_LIKE_NAME.fullmatch(name):
        raise ConfigError(f"--name {name!r} looks like a run-id (or the start of one): commands that take a run "
                          "take its name too, so it would name other runs as well; choose a name with a letter "
                          "that is not a hex digit (e.g. 'baseline', 'gnn-v2')")


def world_origin(data_root: Path | str) -> dict[str, Any]:
    """What a run's data root is, for its manifest: ``{"synthetic": True, "marker": {...}}`` when the
    root holds the marker a synthetic world carries (``synth.json``, pipelines.synth.world.MARKER),
    else ``{"synthetic": False}``. ``submit`` refuses a synthetic one unless forced."""
    from pipelines.synth.world import MARKER

    path = Path(data_root) / MARKER
    if not path.is_file():
        return {"synthetic": False}
    try:
        marker = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        marker = {}
    return {"synthetic": True, "marker_file": MARKER,
            "marker": {k: v for k, v in marker.items() if isinstance(v, (str, int, float, bool))}
            if isinstance(marker, dict) else {}}


# What each entry of a run manifest holds, as every reader of one expects it (runs list, report,
# predict, ensemble, evaluate, submit...): a type (a tuple: any of them; ``None`` allowed only where
# listed), ``[item]`` a list of such items, ``{key: spec}`` an object whose listed keys, where present,
# hold that (``"*"``: every value). Only ``stages`` is required (manifests of older versions lack others).
_NUMBER = (int, float, type(None))
_STAGE_REF = {"stage": str, "key": str, "work_dir": str}
_CONFIG = {"run": {"seeds": [int]}, "folds": {"k": int}, "ensemble": {"method": str, "models": ([str], None)}}
RUN_MANIFEST_SCHEMA: dict[str, Any] = {
    "stages": {"*": {"prepare": {"*": str}, "train": {"*": _STAGE_REF}, "ensemble": str,
                     "companions": {"*": {"*": str}}}},
    "run_id": str, "kind": str, "created": str, "data_root": str, "work_dir": str, "command": str, "name": str,
    "note": str, "source_run": str, "split": str, "wall_time_s": _NUMBER,
    "models": [str], "collections": [str], "source_runs": [str], "stages_computed": [str],
    "config": {**_CONFIG, "source_runs": {"*": (_CONFIG, None)}},  # a re-blend keeps each source run's config
    "cv_scores": {"*": {"blend": {"*": _NUMBER},
                        "training": {"*": {"oof_score": _NUMBER, "oof_score_std": _NUMBER,
                                           "oof_score_by_seed": {"*": _NUMBER}}}}},
    "combined_oof": {"*": {"value": _NUMBER, "complete": bool}},
    "ensemble_weights": {"*": {"*": (int, float)}},
    "submission": {"file": str, "rows": int, "sha256": str, "validated_against": str},
    "data_world": {"synthetic": bool, "marker": dict, "marker_file": str},
    "library_versions": dict, "code_version": dict,
}
_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", dict: "an object",
               list: "a list", type(None): "null"}


def run_manifest_problem(manifest: Any) -> str | None:
    """What makes ``manifest`` (parsed JSON) no run manifest of this project, or None: the first entry
    that lacks or breaks :data:`RUN_MANIFEST_SCHEMA` (``stages.tile:xla.train: expected an object, got
    a list``)."""
    if not isinstance(manifest, dict):
        return f"expected a JSON object, got {_json_type(manifest)}"
    if "stages" not in manifest:
        return "no 'stages' table"
    return _schema_problem(manifest, RUN_MANIFEST_SCHEMA, "")


def _schema_problem(value: Any, spec: Any, where: str) -> str | None:
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return f"{where or 'the manifest'}: expected an object, got {_json_type(value)}"
        for key, item in value.items():
            inner = spec.get(key, spec.get("*"))
            if inner is not None:
                problem = _schema_problem(item, inner, f"{where}.{key}" if where else key)
                if problem:
                    return problem
        return None
    if isinstance(spec, list):
        if not isinstance(value, list):
            return f"{where}: expected a list, got {_json_type(value)}"
        for index, item in enumerate(value):
            problem = _schema_problem(item, spec[0], f"{where}[{index}]")
            if problem:
                return problem
        return None
    choices = tuple(type(None) if c is None else c for c in (spec if isinstance(spec, tuple) else (spec,)))
    for choice in choices:
        if isinstance(choice, (list, dict)):
            if isinstance(value, type(choice)):  # the right container: what is wrong inside it
                return _schema_problem(value, choice, where)
        elif isinstance(value, choice) and not (isinstance(value, bool) and choice in (int, float)):
            return None
    names = ["a list" if isinstance(c, list) else "an object" if isinstance(c, dict) else _TYPE_NAMES[c]
             for c in choices if not (c is int and float in choices)]
    return f"{where}: expected {' or '.join(names)}, got {_json_type(value)}"


def _json_type(value: Any) -> str:
    """``integer 5``, ``list [1, 2]``, ``null``: a parsed JSON value as a message shows it."""
    if value is None:
        return "null"
    kind = ("boolean" if isinstance(value, bool) else "integer" if isinstance(value, int) else "number"
            if isinstance(value, float) else "string" if isinstance(value, str) else "list"
            if isinstance(value, list) else "object" if isinstance(value, dict) else type(value).__name__)
    shown = json.dumps(value, default=str)
    return f"{kind} {shown if len(shown) <= 40 else shown[:37] + '...'}"


def similar_runs(submissions_dir: Path | str, text: str, limit: int = 3) -> list[str]:
    """Runs under ``submissions_dir`` that ``text`` (naming none) was probably meant to name: their
    run-id, 8-hex part or name (``run --name``) close to it, as ``run-id`` or ``run-id (name 'x')``."""
    import difflib

    by_word: dict[str, str] = {}  # what a user may type -> how the run is shown
    try:
        folders = sorted(e.name for e in Path(submissions_dir).iterdir() if e.is_dir() and _RUN_ID.fullmatch(e.name))
    except OSError:
        return []
    for run_id in folders:
        by_word.setdefault(run_id, run_id)
        by_word.setdefault(run_id.partition("-")[2], run_id)
        try:
            name = json.loads((Path(submissions_dir) / run_id / RUN_MANIFEST).read_text(encoding="utf-8")).get("name")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(name, str) and name:
            by_word.setdefault(name, f"{run_id} (name {name!r})")
    close = difflib.get_close_matches(text, list(by_word), n=limit, cutoff=0.6)
    return list(dict.fromkeys(by_word[word] for word in close))


def read_run_manifest(submissions_dir: Path | str, run_id: str) -> dict[str, Any]:
    """The manifest of a run (``run_id``: a run-id or what :func:`resolve_run_id` accepts)."""
    run_id = resolve_run_id(submissions_dir, run_id)
    if not run_id or run_id in (".", "..") or Path(run_id).name != run_id:
        raise PipelineError(f"{run_id!r} is not a run-id (a folder name under {submissions_dir})")
    path = Path(submissions_dir) / run_id / RUN_MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if _RUN_ID.fullmatch(run_id) and path.parent.is_dir():
            raise PipelineError(f"{path.parent}: incomplete run folder (no {RUN_MANIFEST}: its publishing was "
                                "interrupted); it is not a validated run, run the pipeline again") from None
        close = similar_runs(submissions_dir, run_id)
        raise PipelineError(f"{path}: no such run manifest (is {run_id!r} a run-id under {submissions_dir}?)"
                            + (f"; did you mean {' or '.join(close)}?" if close else "")) from None
    except (OSError, ValueError) as exc:
        raise FormatError(path, f"unreadable run manifest ({exc})") from None
    problem = run_manifest_problem(manifest)
    if problem is not None:
        raise FormatError(path, f"not a valid run manifest ({problem}): was it edited by hand? restore it, or "
                                f"remove the run folder (runs rm {run_id})")
    return manifest


def recorded_folder(manifest: Mapping[str, Any], field: str, given: Path | str | None = None) -> Path:
    """``given`` when not None (the folder moved), else the folder a run manifest records under ``field``
    (``work_dir``, ``data_root``); a PipelineError naming the run and the option to pass when it records
    none (a manifest edited by hand, or of an early version): never a KeyError."""
    if given is not None:
        return Path(given)
    value = manifest.get(field)
    if not isinstance(value, str) or not value:
        what = "work dir (where its stages are)" if field == "work_dir" else field.replace("_", " ")
        raise PipelineError(f"run {manifest.get('run_id') or '?'}: its manifest records no {what}; pass "
                            f"--{field.replace('_', '-')}")
    return Path(value)


def training_stage_dir(ref: Mapping[str, Any], manifest: Mapping[str, Any], work_dir: Path | str | None = None) -> Path:
    """The work dir holding a training stage that a run manifest names (``ref``, one of its
    ``stages.<collection>.train`` entries): ``work_dir`` when given (the cache moved), else the folder
    the run recorded for that stage (a re-blend of several runs reads stages from several work dirs),
    else the run's own work dir."""
    if work_dir is not None:
        return Path(work_dir)
    return Path(ref["work_dir"]) if ref.get("work_dir") else recorded_folder(manifest, "work_dir")


def training_stage_dirs(ref: Mapping[str, Any], manifest: Mapping[str, Any],
                        work_dir: Path | str | None = None) -> list[Path]:
    """Where to look for a training stage a run manifest names, in order: ``work_dir`` when given (a
    moved cache, or another work dir for new stages), then the folder the run recorded for the stage,
    then the run's own work dir (each once)."""
    places = [Path(work_dir)] if work_dir is not None else []
    places += [Path(p) for p in (ref.get("work_dir"), manifest.get("work_dir")) if p]
    return list(dict.fromkeys(places))


def check_trained(manifest: Mapping[str, Any], run_id: str, command: str) -> None:
    """A ConfigError unless the run trained models (kind ``run``) or re-blended such runs (``ensemble``):
    a ``predict`` run only ranked new graphs with another run's fold models, so it has no out-of-fold
    training predictions to blend (its stages name that run's training stages, but not its graphs)."""
    kind = manifest.get("kind", "run")
    if kind in ("run", "ensemble"):
        return
    source = manifest.get("source_run")
    origin = f" (it ranked {manifest.get('data_root') or 'new graphs'} with the fold models of run {source})" \
        if source else ""
    instead = f"; {command} its source run {source} instead" if source else ""
    raise ConfigError(f"run {run_id} is a {kind!r} run{origin}: it has no training predictions of its own for "
                      f"{command}{instead}")


def load_named_stage(where: Path | str, stage: str, key: str, what: str) -> Any:
    """The complete stage output a run manifest names (``what``: "run X: the saved gbdt output of
    tile:xla"); a PipelineError that says whether it is gone (no folder) or damaged or incomplete
    (the engine's reason, naming the file: resized, content not matching its SHA-256, missing)."""
    from pipelines.core.engine import load_stage

    path = Path(where) / stage / key
    try:
        return load_stage(Path(where), stage, key)
    except PipelineError as exc:
        if not path.exists():
            raise PipelineError(f"{what} is gone: {path} (was the work dir cache deleted? re-run the run, or pass "
                                "--work-dir where its stages are)") from None
        raise PipelineError(f"{what} cannot be used: {exc} (re-run the run to compute it again)") from None


def check_removable(submissions_dir: Path | str, run_id: str) -> None:
    """Only run folders are removed: a PipelineError unless ``run_id`` (resolved) is one, its manifest
    valid, or present but damaged by hand (which its error suggests removing)."""
    try:
        read_run_manifest(submissions_dir, run_id)
    except FormatError:
        if not (_RUN_ID.fullmatch(run_id) and (Path(submissions_dir) / run_id / RUN_MANIFEST).is_file()):
            raise


def remove_run_folder(submissions_dir: Path | str, run_id: str, *, force: bool = False) -> Path:
    """Delete the run folder of ``run_id`` (a run-id or what :func:`resolve_run_id` accepts); its
    stages stay in the work dir. A run that was submitted (it has a ``submitted.json``) is kept
    unless ``force``: what Kaggle scored must stay traceable. The folder is first renamed to a
    hidden name, so a removal cut short never leaves a half run that lists."""
    submissions_dir = Path(submissions_dir)
    run_id = resolve_run_id(submissions_dir, run_id)
    check_removable(submissions_dir, run_id)
    run_dir = submissions_dir / run_id
    if (run_dir / "submitted.json").exists() and not force:
        raise PipelineError(f"run {run_id} was submitted to Kaggle (see {run_dir / 'submitted.json'}); "
                            "refusing to remove it without --force")
    trash = submissions_dir / f"{TRASH_PREFIX}rm-{run_id}-{os.getpid()}"  # tidy_submissions reclaims it
    os.rename(run_dir, trash)
    shutil.rmtree(trash, ignore_errors=True)
    logger.info(f"removed run folder {run_dir} (its stages stay in the work dir)")
    return run_dir
