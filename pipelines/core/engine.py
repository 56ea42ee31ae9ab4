"""The stage engine: content-keyed, atomically published, provenance-recording stage outputs.

A stage output lives in ``<work_dir>/<stage>/<key>/`` where ``key`` fingerprints everything that
shapes the result: the stage name, the resolved config, the keys of the stage's inputs, the source
code the stage runs (:func:`code_fingerprint`) and the versions of the libraries that shape results
(:data:`LIBRARIES`), so changing any of them gives a new folder and a stale result is never reused.

Code granularity: a stage names its *code roots*, the modules whose functions it runs. Each root and
every ``pipelines`` module it imports, transitively (static imports, lazy ones inside functions too),
is fingerprinted by its syntax tree with docstrings removed: an edit that changes what the code does
(a constant, a line of logic) changes the key, while a comment, docstring or formatting edit does not,
nor does an edit to a module the stage never imports. Orchestration modules that import every stage
(``shallow`` roots: ``pipelines.flows.prepare``) are hashed themselves without following their imports, so
an edit to one stage's module recomputes that stage and its consumers only; so are the config module
and the engine wherever they are imported (:data:`NOT_FOLLOWED`).

A folder counts as complete only when its ``manifest.json`` names the same stage and key and every output file it lists is present with the
recorded size and SHA-256; the manifest is the last thing written, before the folder is renamed into place.
The content hashes are checked every time a cached output is reused or loaded, so a flipped bit in a
cached file (same size) is never served: the stage is recomputed with a warning naming the file.

Work happens in ``<work_dir>/<stage>/.tmp-<key>-<random>/``. The running process holds an exclusive
``flock`` on ``.lock`` inside that folder for as long as it works there, so a later run can tell an
abandoned folder (its process was killed: the kernel dropped the lock) from a live one and delete
only the former. Folders replaced by ``force`` are first renamed to ``.trash-*`` and then deleted.

Only the standard library is imported here: the command line imports this module at start-up.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import errno
import functools
import importlib.util
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import re
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePath
from typing import Any, Callable, Iterable, Iterator, Mapping

from pipelines.core.atomic import write_text_atomic
from pipelines.core.errors import PipelineError
from pipelines.core.logs import with_tag

logger = logging.getLogger(__name__)

try:  # POSIX only; elsewhere abandoned folders are recognised by age alone
    import fcntl
except ImportError:  # pragma: no cover - not exercised on Linux
    fcntl = None  # type: ignore[assignment]

MANIFEST = "manifest.json"
LOCK = ".lock"
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
MANIFEST_FORMAT = 1
# A work folder with no usable lock (none, or no pid written yet) is presumed abandoned after this.
STALE_AFTER_S = 3600.0
# Distribution names whose versions every manifest records (import names differ for some).
LIBRARIES = {
    "numpy": "numpy",
    "polars": "polars",
    "lightgbm": "lightgbm",
    "torch": "torch",
    "torch_geometric": "torch_geometric",
    "sklearn": "scikit-learn",
    "joblib": "joblib",
}
# errno values that can only mean "this folder cannot be written": reported as a PipelineError naming
# it. Permission errors are added only around the engine's own writes (compute may fail to READ).
_FULL_OR_READ_ONLY = frozenset({errno.ENOSPC, errno.EROFS, getattr(errno, "EDQUOT", errno.ENOSPC)})
_NOT_WRITABLE = _FULL_OR_READ_ONLY | {errno.EACCES, errno.EPERM}
# Less free space than this on a disk whose writer failed with a foreign error counts as "disk full".
LOW_SPACE_BYTES = 1 << 20
_STAGE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


# ----------------------------------------------------------------------------- fingerprints


def to_jsonable(obj: Any) -> Any:
    """Convert ``obj`` to plain JSON data: dataclasses to dicts, paths to POSIX strings, tuples to lists.

    Mappings must have string keys; sets become sorted lists; numpy scalars become Python numbers.
    Anything else that JSON cannot hold raises TypeError, so a fingerprint never silently ignores data.
    """
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, PurePath):
        return obj.as_posix()
    if isinstance(obj, enum.Enum):
        return to_jsonable(obj.value)
    if isinstance(obj, Mapping):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TypeError(f"cannot fingerprint a mapping with non-string key {k!r}")
            out[k] = to_jsonable(v)
        return out
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        items = [to_jsonable(v) for v in obj]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    # numpy scalars (checked by duck typing: numpy is not imported here)
    if type(obj).__module__ == "numpy" and getattr(obj, "ndim", None) == 0 and hasattr(obj, "item"):
        return to_jsonable(obj.item())
    raise TypeError(f"cannot fingerprint an object of type {type(obj).__name__}: {obj!r:.80}")


def canonical_json(obj: Any) -> str:
    """The canonical JSON text of ``obj`` (sorted keys, no whitespace) that fingerprints hash."""
    return json.dumps(to_jsonable(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint(obj: Any) -> str:
    """First 16 hex digits of the SHA-256 of ``obj``'s canonical JSON."""
    return hashlib.sha256(canonical_json(obj).encode("utf-8")).hexdigest()[:16]


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def code_fingerprint(roots: Iterable[str], shallow: Iterable[str] = ()) -> str:
    """Fingerprint of the source the stage with these code roots runs (see the module docstring).

    ``roots`` are dotted module names followed through their ``pipelines`` imports; ``shallow`` ones
    are hashed without following theirs. Computed once per process for each set of roots.
    """
    return _code_fingerprint(tuple(sorted(set(roots))), tuple(sorted(set(shallow))))


# Modules whose own source counts but whose imports are not followed: what the config module shapes
# reaches a key as resolved values (it imports every model's config and the feature names, for its
# checks), and the engine only stores results.
NOT_FOLLOWED = frozenset({"pipelines.config.settings", "pipelines.core.engine"})


@functools.lru_cache(maxsize=None)
def _code_fingerprint(roots: tuple[str, ...], shallow: tuple[str, ...]) -> str:
    digests: dict[str, str] = {}
    pending = list(roots) + list(shallow)
    while pending:
        name = pending.pop()
        if name in digests:
            continue
        digest, imported = _module_source(name)
        digests[name] = digest
        if name not in shallow and name not in NOT_FOLLOWED:
            pending.extend(m for m in imported if m not in digests)
    return fingerprint(digests)


@functools.lru_cache(maxsize=None)
def _module_source(name: str) -> tuple[str, tuple[str, ...]]:
    """(digest of the module's docstring-free syntax tree, the ``pipelines`` modules it imports)."""
    path = _module_file(name) or _plugin_file(name)
    if path is None:
        raise PipelineError(f"cannot fingerprint the code of {name!r}: no such module in {_PACKAGE_DIR}")
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    imported: set[str] = set()
    # Imports under ``if TYPE_CHECKING:`` never run: they do not shape results, so they are not followed.
    type_only = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node.test)
                 for statement in node.body for inner in ast.walk(statement)}
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                body[0] = ast.Pass()  # a docstring does not shape results
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            imported.add(base)
            imported.update(f"{base}.{alias.name}" for alias in node.names)  # ``from pkg import module``
    own = tuple(sorted(m for m in imported if _module_file(m) is not None))
    return hashlib.sha256(ast.dump(tree).encode("utf-8")).hexdigest(), own


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


# The folder of the ``pipelines`` package: modules are located by path, never imported, to fingerprint.
_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _module_file(name: str) -> Path | None:
    """The source file of ``pipelines`` module ``name`` (a package's ``__init__.py``), else None."""
    parts = name.split(".")
    if parts[0] != _PACKAGE_DIR.name or not all(p.isidentifier() for p in parts):
        return None
    base = _PACKAGE_DIR.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py") if len(parts) > 1 else None, base / "__init__.py"):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def _plugin_file(name: str) -> Path | None:
    """The source file of a model module registered from outside the package (its own source counts;
    its imports outside ``pipelines`` are not followed, like any library's)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    return origin if origin is not None and origin.suffix == ".py" and origin.is_file() else None


def data_fingerprint(paths: Iterable[Path], root: Path) -> str:
    """Cheap key of raw input files: their paths relative to ``root``, sizes and modification times.

    File contents are not read (real inputs are tens of GB); copying files without preserving
    modification times therefore changes the key, which costs a recomputation, never a stale result.
    """
    root = Path(root)
    entries = []
    for path in paths:
        path = Path(path)
        try:
            rel = path.relative_to(root).as_posix()
        except ValueError:
            raise PipelineError(f"{path}: input file is not under the data root {root}") from None
        try:
            st = path.stat()
        except OSError as exc:
            raise PipelineError(f"{path}: cannot read input file ({exc.strerror})") from None
        entries.append((rel, st.st_size, st.st_mtime_ns))
    return fingerprint(sorted(entries))


# ----------------------------------------------------------------------------- provenance


def code_version() -> dict:
    """``{"commit": sha | None, "dirty": bool | None}`` of the git checkout holding this package."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain")  # untracked, not ignored, files count: new modules matter
    return {"commit": commit.strip(), "dirty": None if status is None else bool(status.strip())}


def library_versions() -> dict:
    """Installed versions of the libraries that shape results (None where absent), and Python's."""
    return dict(_library_versions())


@functools.lru_cache(maxsize=None)
def _library_versions() -> dict:
    versions: dict[str, str | None] = {}
    for name, dist in LIBRARIES.items():
        try:
            versions[name] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    versions["python"] = platform.python_version()
    return versions


# ----------------------------------------------------------------------------- stage outputs


@dataclass(frozen=True)
class StageOutput:
    """A complete stage output folder and its manifest."""

    stage: str
    key: str
    path: Path
    manifest: dict
    # True when the call that returned this found it complete and did not run ``compute``.
    cached: bool = dataclasses.field(default=False, compare=False)

    def file(self, name: str) -> Path:
        """``path / name``; a missing file raises a PipelineError naming the stage output."""
        target = self.path / name
        if not target.exists():
            listed = ", ".join(o["path"] for o in self.manifest.get("outputs", [])[:20]) or "none"
            raise PipelineError(
                f"{self.path}: output of stage {self.stage!r} has no file {name!r} (files: {listed})"
            )
        return target

    @property
    def metrics(self) -> dict:
        return dict(self.manifest.get("metrics") or {})


@dataclass(frozen=True)
class Code:
    """The code a stage runs, for its key: see :func:`code_fingerprint` for ``roots`` and ``shallow``."""

    roots: tuple[str, ...]
    shallow: tuple[str, ...] = ()

    def fingerprint(self) -> str:
        return code_fingerprint(self.roots, self.shallow)


def stage_key(stage: str, config: Any, inputs: Mapping[str, str], code: Code) -> str:
    """The cache key of a stage run: fingerprint of stage name, resolved config, input keys, the source
    of the code it runs and the versions of the libraries that shape results."""
    _check_stage_name(stage)
    for name, key in inputs.items():
        if not isinstance(name, str) or not isinstance(key, str):
            raise TypeError(f"inputs must map names to key strings, got {name!r}: {key!r}")
    return fingerprint({"stage": stage, "config": config, "inputs": dict(inputs), "code": code.fingerprint(),
                        "libraries": library_versions()})


def run_stage(
    *,
    work_dir: Path,
    stage: str,
    config: Any,
    inputs: Mapping[str, str],
    code: Code,
    compute: Callable[[Path], Mapping[str, Any] | None],
    seeds: Mapping[str, int] | None = None,
    force: bool = False,
) -> StageOutput:
    """Return the output of ``stage`` for this config and these inputs, computing it if not cached.

    ``compute(folder)`` writes its files into ``folder`` and returns JSON-able metrics or None.
    ``seeds`` are recorded in the manifest, not keyed: whatever changes results belongs in ``config``
    or ``inputs``. A cached output recorded with different seeds is therefore a caller bug and raises.
    """
    key = stage_key(stage, config, inputs, code)
    stage_dir = Path(work_dir) / stage
    final = stage_dir / key
    seeds = dict(seeds) if seeds is not None else None

    if not force:
        cached = _read_complete(final, stage, key)
        if cached is not None:
            _check_seeds(cached, seeds)
            clean_abandoned(stage_dir)  # work folders of killed runs go also when the stage is reused
            logger.info(with_tag(f"[{stage}] cached {key}"))
            return StageOutput(stage, key, final, cached, cached=True)

    with _guard_writes(stage_dir):
        stage_dir.mkdir(parents=True, exist_ok=True)
    clean_abandoned(stage_dir)

    staging = make_locked_folder(stage_dir, key)
    work = staging.path
    try:
        logger.info(with_tag(f"[{stage}] computing {key}"))
        started = datetime.now(timezone.utc)
        t0 = time.perf_counter()
        with _guard_writes(work, _FULL_OR_READ_ONLY):
            metrics = compute(work)
        wall = time.perf_counter() - t0
        finished = datetime.now(timezone.utc)
        manifest = {
            "manifest_format": MANIFEST_FORMAT,
            "stage": stage,
            "key": key,
            "code": {"roots": list(code.roots), "shallow": list(code.shallow), "fingerprint": code.fingerprint()},
            "config": to_jsonable(config),
            "inputs": dict(inputs),
            "seeds": to_jsonable(seeds or {}),
            "code_version": code_version(),
            "library_versions": library_versions(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": started.isoformat(timespec="milliseconds"),
            "finished": finished.isoformat(timespec="milliseconds"),
            "wall_time_s": round(wall, 3),
            "outputs": _list_outputs(work),
            "metrics": to_jsonable(dict(metrics or {})),
        }
        with _guard_writes(work):
            write_json_atomic(work / MANIFEST, manifest)
        published = _publish(work, final, stage, key, force)
    except BaseException:
        staging.discard()
        raise
    if published:
        staging.release(final)
        logger.info(with_tag(f"[{stage}] done {key} in {wall:.1f}s"))
        return StageOutput(stage, key, final, manifest)
    # Another process completed the same key first: its output is equivalent, keep it.
    staging.discard()
    theirs = _read_complete(final, stage, key)
    if theirs is None:  # pragma: no cover - only if a third party deletes it in between
        raise PipelineError(f"{final}: output of stage {stage!r} vanished while publishing")
    logger.info(with_tag(f"[{stage}] {key} was completed concurrently by another run; using it"))
    return StageOutput(stage, key, final, theirs)


def load_stage(work_dir: Path, stage: str, key: str) -> StageOutput:
    """The complete output of ``stage`` with ``key``; PipelineError if absent or incomplete."""
    _check_stage_name(stage)
    path = Path(work_dir) / stage / key
    manifest, why = _check_complete(path, stage, key)
    if manifest is None:
        raise PipelineError(f"{path}: no complete output of stage {stage!r} with key {key} ({why})")
    return StageOutput(stage, key, path, manifest)


def list_stages(work_dir: Path, verify_content: bool = True, follow_links: bool = True) -> list[dict]:
    """One dict per stage output folder (complete or not) and per work folder, for ``status``.

    Keys: stage, key, state ("complete", "incomplete", "running" or "interrupted"), complete, path,
    created (ISO time), wall_time_s, config, inputs, metrics (the last four empty when incomplete).
    ``verify_content=False`` checks the outputs' sizes but does not read them through for their SHA-256
    (for a listing that only needs the manifests, like a run's ETA from earlier wall times: reading every
    output of the work dir again cost as much as the cache check of the run itself).
    ``follow_links=False`` lists no stage folder or output folder that is a symbolic link (``gc``: what
    it lists it may delete, and a link's target is never its to delete).
    """
    work_dir = Path(work_dir)
    rows: list[dict] = []
    if not work_dir.is_dir():
        return rows
    for stage_dir in sorted(p for p in work_dir.iterdir() if p.is_dir() and not p.name.startswith(".")
                            and (follow_links or not p.is_symlink())):
        stage = stage_dir.name
        for entry in sorted(stage_dir.iterdir()):
            if not entry.is_dir() or entry.name.startswith(TRASH_PREFIX) or (entry.is_symlink() and not follow_links):
                continue
            if entry.name.startswith(TMP_PREFIX):
                key = entry.name[len(TMP_PREFIX):].split("-", 1)[0]
                state = "running" if _is_locked(entry / LOCK) else "interrupted"
                manifest = None
            elif entry.name.startswith("."):
                continue
            else:
                key = entry.name
                manifest = _check_complete(entry, stage, key, verify_content)[0]
                state = "complete" if manifest is not None else "incomplete"
            rows.append(_status_row(stage, key, state, entry, manifest))
    rows.sort(key=lambda r: (r["stage"], r["created"] or "", r["key"]))
    return rows


def clean_abandoned(stage_dir: Path) -> list[Path]:
    """Delete work folders of dead runs and leftover trash in ``stage_dir``; returns what was removed.

    A ``.tmp-*`` folder is abandoned when nobody holds its lock and its pid was written (the owner
    writes its pid only after locking), or when it has been untouched for ``STALE_AFTER_S``.
    """
    removed = []
    if not stage_dir.is_dir():
        return removed
    now = time.time()
    for entry in stage_dir.iterdir():
        if entry.name.startswith(TRASH_PREFIX):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
        elif entry.name.startswith(TMP_PREFIX) and entry.is_dir() and _is_abandoned(entry, now):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as sorted, indented JSON to ``path`` via a temporary file and ``os.replace``."""
    write_text_atomic(path, json.dumps(to_jsonable(obj), sort_keys=True, indent=2, ensure_ascii=False) + "\n")


# ----------------------------------------------------------------------------- status table


def format_status(rows: list[dict], width: int = 60) -> str:
    """Render ``list_stages`` rows as a text table; the config column shows what differs per stage."""
    if not rows:
        return "no stage outputs"
    summaries = _config_summaries(rows, width)
    header = ("STAGE", "KEY", "STATE", "CREATED", "WALL", "INPUTS", "CONFIG")
    table = [header]
    for row, summary in zip(rows, summaries):
        created = (row["created"] or "")[:16].replace("T", " ")
        wall = "" if row["wall_time_s"] is None else _format_seconds(row["wall_time_s"])
        inputs = " ".join(f"{k}={v[:8]}" for k, v in sorted(row["inputs"].items())) or "-"
        table.append((row["stage"], row["key"], row["state"], created, wall, inputs, summary))
    widths = [max(len(r[i]) for r in table) for i in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1] for r in table]
    return "\n".join(line.rstrip() for line in lines)


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and scalars are leaves."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, name + "."))
        else:
            out[name] = v
    return out


def _config_summaries(rows: list[dict], width: int) -> list[str]:
    """Per row: the flattened config values that differ between outputs of the same stage, or,
    when nothing differs (or the stage has one output), its first few config values."""
    flat = [flatten(r["config"]) if isinstance(r["config"], Mapping) else {} for r in rows]
    by_stage: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_stage.setdefault(r["stage"], []).append(i)
    summaries = [""] * len(rows)
    for indices in by_stage.values():
        known = [i for i in indices if rows[i]["config"] is not None]
        keys = sorted({k for i in known for k in flat[i]})
        differing = [k for k in keys if len({json.dumps(flat[i].get(k), sort_keys=True) for i in known}) > 1]
        for i in indices:
            if rows[i]["config"] is None:
                summaries[i] = "-"
                continue
            shown = differing or list(flat[i])
            text = " ".join(f"{k}={json.dumps(flat[i].get(k))}" for k in shown)
            summaries[i] = text if len(text) <= width else text[: width - 3] + "..."
    return summaries


def _format_seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _status_row(stage: str, key: str, state: str, path: Path, manifest: dict | None) -> dict:
    if manifest is not None:
        created = manifest.get("finished")
    else:
        try:
            created = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).isoformat(timespec="seconds")
        except OSError:
            created = None
    manifest = manifest or {}
    return {
        "stage": stage,
        "key": key,
        "state": state,
        "complete": state == "complete",
        "path": str(path),
        "created": created,
        "wall_time_s": manifest.get("wall_time_s"),
        "config": manifest.get("config"),
        "inputs": dict(manifest.get("inputs") or {}),
        "metrics": dict(manifest.get("metrics") or {}),
    }


# ----------------------------------------------------------------------------- internals


def _check_stage_name(stage: str) -> None:
    if not isinstance(stage, str) or not _STAGE_NAME.fullmatch(stage):
        raise ValueError(f"stage name must be a plain folder name ([A-Za-z0-9_.-], not hidden), got {stage!r}")


def _check_seeds(manifest: dict, seeds: dict | None) -> None:
    recorded = manifest.get("seeds") or {}
    if seeds is not None and to_jsonable(seeds) != recorded:
        raise PipelineError(
            f"stage {manifest.get('stage')!r} key {manifest.get('key')}: cached output was made with "
            f"seeds {recorded}, this run asks for {seeds}; seeds that change results must be in the config"
        )


def _read_complete(path: Path, stage: str, key: str) -> dict | None:
    """The manifest of ``path`` if it is a complete output of ``stage``/``key``, else None."""
    return _check_complete(path, stage, key)[0]


def _check_complete(path: Path, stage: str, key: str, verify_content: bool = True) -> tuple[dict | None, str]:
    """(the manifest, "") if ``path`` is a complete output of ``stage``/``key``, else (None, why not);
    without ``verify_content`` the outputs' sizes are checked, not their SHA-256."""
    if not path.exists():
        return None, "absent"
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, f"incomplete: {path / MANIFEST} is missing or unreadable"
    if not isinstance(manifest, dict) or manifest.get("stage") != stage or manifest.get("key") != key:
        return None, f"incomplete: {path / MANIFEST} names another stage or key"
    outputs = manifest.get("outputs")
    if not isinstance(outputs, list):
        return None, f"incomplete: {path / MANIFEST} lists no outputs"
    for item in outputs:
        try:
            target = path / item["path"]
            size = target.stat().st_size
            item["sha256"]  # an output recorded without its hash is not trusted
        except OSError:
            return None, f"incomplete: {target} is missing"
        except (KeyError, TypeError):
            return None, f"incomplete: {path / MANIFEST} lists an output without its size and SHA-256"
        if size != item["bytes"]:
            why = f"damaged: {target} has {size} bytes, its manifest recorded {item['bytes']}"
            logger.warning(with_tag(f"warning: [{stage}] {why}; not served"))
            return None, why
    for item in outputs if verify_content else ():  # sizes first (cheap): only what could be complete is read
        target = path / item["path"]
        try:
            actual = _verified_sha256(target)
        except OSError:
            return None, f"incomplete: {target} is unreadable"
        if actual != item["sha256"]:
            why = f"damaged: {target}: content does not match its manifest (SHA-256 {actual[:12]}, " \
                  f"recorded {str(item['sha256'])[:12]})"
            logger.warning(with_tag(f"warning: [{stage}] {why}; not served"))
            return None, why
    return manifest, ""


def _verified_sha256(path: Path) -> str:
    """``file_sha256(path)``, read through once per process while the file is unchanged (same inode, size
    and modification time): a run checks its stages' outputs, then its report loads some of them again."""
    st = path.stat()
    return _sha256_of_version(str(path), st.st_ino, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=1 << 16)
def _sha256_of_version(path: str, inode: int, size: int, mtime_ns: int) -> str:
    return file_sha256(Path(path))


def _list_outputs(folder: Path) -> list[dict]:
    outputs = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(folder).as_posix()
            if rel in (MANIFEST, LOCK):
                continue
            outputs.append({"path": rel, "bytes": full.stat().st_size, "sha256": file_sha256(full)})
    return outputs


@dataclass(frozen=True)
class LockedFolder:
    """A ``.tmp-<key>-<random>`` folder whose lock this process holds: :func:`clean_abandoned` leaves
    it alone until the process dies. The owner fills it, renames it into place, then calls
    :meth:`release` with the new path; or calls :meth:`discard` to delete it."""

    path: Path
    lock_fd: int

    def release(self, published: Path) -> None:
        """After ``path`` was renamed to ``published``: remove its lock file (still locked), drop the lock."""
        _release(self.lock_fd, published / LOCK)

    def discard(self) -> None:
        """Delete the folder (ours: nothing else lives there) and drop the lock."""
        shutil.rmtree(self.path, ignore_errors=True)
        _release(self.lock_fd, None)


def make_locked_folder(parent: Path, key: str) -> LockedFolder:
    """A new locked staging folder in ``parent`` (see :class:`LockedFolder`); stages and published
    runs are written in one, so an interrupted writer leaves only a folder the next cleaner removes."""
    return LockedFolder(*_make_work_dir(parent, key))


def _make_work_dir(stage_dir: Path, key: str) -> tuple[Path, int]:
    """Create ``.tmp-<key>-<random>`` and hold its lock; the pid is written only after locking."""
    with _guard_writes(stage_dir):
        work = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{key}-", dir=stage_dir))
        fd = None
        try:
            work.chmod(0o755)  # mkdtemp makes it private; published outputs should be readable
            fd = os.open(work / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
            if fcntl is not None:
                # Blocking: a cleaner may hold a shared lock for an instant while it sees no pid yet.
                fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, f"{os.getpid()}\n".encode())
        except BaseException:
            if fd is not None:
                os.close(fd)
            shutil.rmtree(work, ignore_errors=True)
            raise
    return work, fd


def _release(fd: int | None, lock_path: Path | None) -> None:
    """Remove the published folder's lock file (while still locked), then drop the lock."""
    if lock_path is not None:
        lock_path.unlink(missing_ok=True)
    if fd is not None:
        os.close(fd)


def _is_locked(lock_path: Path) -> bool:
    """True if a live process holds the lock at ``lock_path``."""
    if fcntl is None:
        return False
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def _is_abandoned(work: Path, now: float) -> bool:
    try:
        age = now - work.stat().st_mtime
    except OSError:
        return False  # already gone
    if fcntl is None:
        return age > STALE_AFTER_S
    try:
        fd = os.open(work / LOCK, os.O_RDONLY)
    except OSError:
        return age > STALE_AFTER_S  # lock not created yet, or the owner died before creating it
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return False  # a live run holds it
        has_pid = bool(os.read(fd, 32).strip())
        return has_pid or age > STALE_AFTER_S
    finally:
        os.close(fd)


def _publish(work: Path, final: Path, stage: str, key: str, force: bool) -> bool:
    """Rename ``work`` to ``final``; False if a complete output by another run was kept instead."""
    with _guard_writes(final.parent):
        for _ in range(5):
            if rename_if_free(work, final):
                return True
            if not force and _read_complete(final, stage, key) is not None:
                return False
            # An incomplete folder, or the one ``force`` replaces: move it aside, then delete it.
            trash = final.parent / f"{TRASH_PREFIX}{key}-{os.urandom(4).hex()}"
            try:
                os.rename(final, trash)
            except FileNotFoundError:
                continue  # another run moved it first; try again
            try:
                if rename_if_free(work, final):
                    return True
            finally:
                shutil.rmtree(trash, ignore_errors=True)
    raise PipelineError(f"{final}: could not publish the output of stage {stage!r}: too many concurrent writers")


def rename_if_free(src: Path, dst: Path) -> bool:
    """``os.rename`` a folder; False (nothing moved) when ``dst`` exists and is not empty."""
    try:
        os.rename(src, dst)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        raise
    return True


@contextmanager
def _guard_writes(folder: Path, errnos: frozenset[int] = _NOT_WRITABLE) -> Iterator[None]:
    """Turn OSErrors with these errnos raised inside the block into PipelineErrors naming ``folder``."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in errnos:
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        raise PipelineError(f"{folder}: cannot write stage output: {exc.strerror or exc}{where}") from exc
    except PipelineError:
        raise  # already says what went wrong (a bad input file, ...), whatever the disk's state
    except Exception as exc:
        # Some writers report a failed write in their own exception type without the errno (polars'
        # parquet sink on a full disk: "Invalid thrift: transport error"): ask the disk itself.
        problem = _disk_problem(folder)
        if problem is None:
            raise
        raise PipelineError(f"{folder}: cannot write stage output: {problem} ({type(exc).__name__}: {exc})") from exc


def _disk_problem(folder: Path) -> str | None:
    """"Read-only file system" or "No space left on device" if the disk holding ``folder`` is so, else None."""
    for candidate in (folder, *folder.parents):
        try:
            st = os.statvfs(candidate)
        except OSError:
            continue
        if st.f_flag & os.ST_RDONLY:
            return os.strerror(errno.EROFS)
        if st.f_bavail * st.f_frsize < LOW_SPACE_BYTES:
            return os.strerror(errno.ENOSPC)
        return None
    return None
